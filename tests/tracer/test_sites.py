"""Where a call came from, as a report prints it (tracer/sites.py): the nearest frame of the
user's own code -- not traceml-ci's, torch's, an installed library's or the standard library's
-- relative to the run's root; a library's or the standard library's frame, when no user frame
is on the stack, relative to its own folder. Never an absolute path (issue 31: a leak named a
line of transformers with the runner's virtualenv path, not the user's ``kept.append``)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn

import traceml_ci as traceml
from tests.tracer import fakelib
from tests.tracer.conftest import finish_and_load, marked_line
from traceml_ci.tracer import sites

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().relative_to(REPO).as_posix()
B, IN, OUT = 8, 16, 4


@pytest.fixture(autouse=True)
def _no_compile_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    from traceml_ci.tracer import flops

    monkeypatch.setattr(flops, "compile_in_use", lambda models=(), frames_before=0: False)


@pytest.fixture
def lib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return fakelib.install(tmp_path, monkeypatch)


def _line(marker: str) -> int:
    return marked_line(__file__, marker)


USER_SOURCE = "def call(fn):\n    return fn()\n"


def _user_module(path: Path) -> ModuleType:
    """``path`` (USER_SOURCE) loaded as the user's own module."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(USER_SOURCE)
    spec = importlib.util.spec_from_file_location("users_train", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the run's root ------------------------------------------------------------------------------

def test_the_root_is_the_git_top_level_else_the_nearest_pyproject_else_the_cwd(tmp_path) -> None:
    repo = tmp_path / "repo"
    (repo / "sub" / "pkg" / "deep").mkdir(parents=True)
    (repo / "sub" / "pyproject.toml").write_text("")
    assert sites.run_root(str(repo / "sub" / "pkg" / "deep")) == str(repo / "sub")
    (repo / ".git").mkdir()  # a git checkout above the pyproject.toml: its top level
    assert sites.run_root(str(repo / "sub" / "pkg" / "deep")) == str(repo)
    (repo / "sub" / "pkg" / ".git").write_text("gitdir: elsewhere\n")  # a worktree, a submodule
    assert sites.run_root(str(repo / "sub" / "pkg" / "deep")) == str(repo / "sub" / "pkg")
    bare = tmp_path / "bare" / "x"
    bare.mkdir(parents=True)
    assert sites.run_root(str(bare)) == str(bare)


# -- one file, as a report shows it --------------------------------------------------------------

def test_each_kind_of_file_is_shown_relative_to_its_own_folder(tmp_path, lib) -> None:
    root = tmp_path / "repo"
    finder = sites.Sites(root)
    assert finder.where(str(root / "mlrepo" / "train.py")) == (sites.USER, "mlrepo/train.py")
    assert finder.where(lib.__file__) == (sites.LIBRARY, "fakelib/__init__.py")
    assert finder.where(json.decoder.__file__) == (sites.STDLIB, "<stdlib>/json/decoder.py")
    assert finder.where(nn.Linear.forward.__code__.co_filename) == (
        sites.LIBRARY, "torch/nn/modules/linear.py")
    assert finder.where(sites.__file__)[0] == sites.OWN
    assert finder.where("<frozen runpy>") == (sites.STDLIB, "<frozen runpy>")
    assert finder.where("<string>") == (sites.USER, "<string>")
    # the user's code outside the root: relative to the sys.path entry it was imported from
    outside = tmp_path / "elsewhere" / "tools"
    assert finder.where(str(outside / "helper.py"), path=[str(outside.parent)]) == (
        sites.USER, "tools/helper.py")
    assert finder.where(str(outside / "helper.py"), path=[]) == (sites.USER, "helper.py")


def test_the_nearest_user_frame_is_named_past_a_library_and_torch(tmp_path, lib) -> None:
    root = tmp_path / "repo"
    user = _user_module(root / "mlrepo" / "train.py")
    # user -> this test's lambda -> library -> here
    frame = user.call(lambda: lib.call(lib.here))  # marker:lambda
    finder = sites.Sites(root)
    # the lambda is this test file's (outside the root, imported from the repo): user code too
    assert finder.site(frame) == f"{HERE}:{_line('marker:lambda')}"
    frame = user.call(lib.here)
    assert finder.site(frame) == "mlrepo/train.py:2"


def test_no_user_frame_names_the_library_frame_never_its_absolute_path(lib) -> None:
    """A library's thread (its frames, then threading's): the library's line, relative to its
    site-packages folder."""
    frames: list = []
    worker = threading.Thread(target=lib.frame_into, args=(frames,))
    worker.start()
    worker.join()
    at = sites.Sites(REPO).site(frames[0])
    assert at == f"fakelib/__init__.py:{fakelib.line('out.append')}"
    assert not os.path.isabs(at.split(":")[0])


# -- a real traced step ----------------------------------------------------------------------------

def test_a_read_and_a_leak_inside_a_library_are_named_at_the_users_line(fresh_tracer, lib) -> None:
    """The user calls a library that reads the loss and makes the tensor the user keeps: both
    are the user's lines, relative to the root (this checkout), not the library's."""
    tracer = fresh_tracer(warmup_steps=5, root_dir=REPO)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN, OUT))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(B, IN), torch.randn(B, OUT)
    kept: list = []
    for _ in range(12):
        with traceml.trace_step(model):
            optimizer.zero_grad(set_to_none=True)
            out = model(x)
            loss = ((out - y) ** 2).mean()
            loss.backward()
            optimizer.step()
            lib.read(loss)  # marker:lib-read
            kept.append(lib.scaled(out.detach()))  # marker:lib-keep
    c = finish_and_load(tracer)["counters"]
    assert c["syncs"] == {
        "per_step": 1,
        "sites": [{"at": f"{HERE}:{_line('marker:lib-read')}", "op": "item", "count": 1}],
    }
    assert c["leak"]["top"] == [
        {"op": "mul", "at": f"{HERE}:{_line('marker:lib-keep')}", "bytes": B * OUT * 4}
    ]
    assert sys.prefix not in json.dumps(c) and str(REPO) not in json.dumps(c)
