"""``traceml.run_script``: a script traced by ``traceml-ci run`` in a subprocess, gated like a
marked test."""

from __future__ import annotations

import time
from typing import Any

import pytest

from pytest_plugin import scripts
from tests.pytest_plugin.conftest import SmokeProject
from tests.pytest_plugin.script_sessions import script_sessions

#: No torch.optim: its first use costs seconds of imports, and this runs in a fresh process.
SCRIPT = '''
import sys

import torch
from torch import nn

import traceml_ci as traceml

torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
x, y = torch.randn(32, 64), torch.randn(32, 1)
for _ in range(int(sys.argv[1])):
    with traceml.trace_step(model):
        model.zero_grad(set_to_none=True)
        ((model(x) - y) ** 2).mean().backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
print("trained")
'''


@pytest.fixture(scope="module")
def script(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return script_sessions(request, tmp_path_factory)


def test_run_script_is_traced_gated_and_stored(script) -> None:
    """The script's summary reaches the test (its steps, the warmup asked for, its name: the
    test's assertions, script_sessions.SCRIPT_TEST, in each run), its runs are combined and
    stored under the test's node id (the session shared with test_confirm.py)."""
    result = script["recorded"]["result"]
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["UPDATED *test_smoke.py::test_script (×3 runs)  new entry*"])
    assert script["entries"] == ["test_smoke.py::test_script"]


READ_LINE = 'print(float(((model(x) - y) ** 2).mean()))'
#: SCRIPT, reading the loss each step: the counters name that line.
READING_SCRIPT = SCRIPT.replace("print(\"trained\")", " " * 8 + READ_LINE + "\nprint(\"trained\")")
SITE_TEST = """
def test_script(traceml):
    summary = traceml.run_script("scripts/train_script.py", 12, warmup_steps=3, cwd="scripts")
    assert summary["counters"]["syncs"]["sites"][0]["at"] == "scripts/train_script.py:{line}"
"""


def _read_line() -> int:
    return READING_SCRIPT.splitlines().index(" " * 8 + READ_LINE) + 1


def test_a_scripts_sites_are_relative_to_the_root_it_is_given(tmp_path) -> None:
    """Issue 31: run from a folder below the root, a script's line is the root's path to it,
    never the working directory's nor an absolute one."""
    script = tmp_path / "repo" / "mlrepo" / "train.py"
    script.parent.mkdir(parents=True)
    script.write_text(READING_SCRIPT)
    doc = scripts.traced_script(script, ["12"], out_dir=tmp_path / "out", run_name="k",
                                warmup_steps=3, cwd=script.parent, root_dir=tmp_path / "repo")
    assert doc["counters"]["syncs"]["sites"] == [
        {"at": f"mlrepo/train.py:{_read_line()}", "op": "float", "count": 1}]


def test_run_script_names_lines_relative_to_pytests_rootdir(smoke: SmokeProject) -> None:
    (smoke.path / "scripts").mkdir()
    (smoke.path / "scripts" / "train_script.py").write_text(READING_SCRIPT)
    smoke.tests(SITE_TEST.format(line=_read_line()))
    # One baseline run: each is a fresh process that imports torch, and the site is the point.
    result = smoke.run("--traceml-update-baseline", "--traceml-baseline-runs=1")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["UPDATED *test_smoke.py::test_script  new entry*"])


def test_a_failing_script_fails_the_test_with_its_output(tmp_path) -> None:
    # Real child processes; scripts that never import torch start in a fraction of a second.
    script = tmp_path / "s.py"
    script.write_text("import sys\nprint('step 1', flush=True)\nsys.exit('Boom: bad data')\n")
    with pytest.raises(scripts.ScriptFailed) as info:
        scripts.traced_script(script, [], out_dir=tmp_path / "out", run_name="k")
    lines = str(info.value).splitlines()
    assert lines[:3] == [f"traceml: {script} exited with code 1", "step 1", "Boom: bad data"]


def test_a_script_that_times_out(tmp_path) -> None:
    script = tmp_path / "s.py"
    script.write_text("import time\ntime.sleep(60)\n")
    started = time.monotonic()
    with pytest.raises(scripts.ScriptFailed, match="did not finish within 0.5 s"):
        scripts.traced_script(script, [], out_dir=tmp_path, run_name="k", timeout_s=0.5)
    assert time.monotonic() - started < 30  # killed, not waited for
