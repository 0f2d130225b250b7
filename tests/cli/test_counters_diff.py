"""End to end: real traced runs of one script, run from its checkout: with and without a scalar
read each step, with a leak, another optimizer and a wider layer at once, and with a read and a
kept tensor made inside an installed library (five child processes, started together, once per
test session), through ``traceml-ci diff`` (its ``main``, in this process): the deterministic
counters regress with the sentence that says what changed, and the same code twice passes them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.scripts import kill_group
from tests.pytest_plugin.shared import once_per_session
from traceml_ci.cli.main import main

REPO = Path(__file__).resolve().parents[2]

#: ``mlrepo/train.py`` (argv: its --out folder, then flags), run from its checkout (a
#: pyproject.toml at its top), calling a library installed in a virtualenv outside it.
SCRIPT = """\
import sys
import torch
import fakelib
import traceml_ci as traceml
torch.set_num_threads(1)
torch.manual_seed(0)
wide = 64 if "wide" in sys.argv else 32
model = torch.nn.Sequential(torch.nn.Linear(16, wide), torch.nn.ReLU(), torch.nn.Linear(wide, 4))
opt = (torch.optim.AdamW if "adamw" in sys.argv else torch.optim.SGD)(model.parameters(), lr=0.01)
kept = []
traceml.init(out_dir=sys.argv[1], warmup_steps=5, run_name="counters")
x = torch.randn(8, 16)
for step in range(25):
    with traceml.trace_step(model):
        out = model(x)
        loss = out.square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if "item" in sys.argv:
            print(loss.item())
        if "leak" in sys.argv:
            kept.append(out.detach())
        if "lib" in sys.argv:
            fakelib.read(loss)
            kept.append(fakelib.scaled(out.detach()))
traceml.finish()
"""
ITEM_LINE = SCRIPT.splitlines().index("            print(loss.item())") + 1
MODEL_LINE = SCRIPT.splitlines().index("        out = model(x)") + 1
LIB_READ_LINE = SCRIPT.splitlines().index("            fakelib.read(loss)") + 1
LIB_KEEP_LINE = SCRIPT.splitlines().index(
    "            kept.append(fakelib.scaled(out.detach()))") + 1


#: The leak, the optimizer and the wider layer share one head run (a process costs seconds):
#: each test reads its own row's sentence, which the other two changes leave as it is (three
#: runs apart said the same). The scalar read has a run of its own: it heads the diff alone;
#: so have the library's calls (their sites are the point).
VARIANTS = {"base": [], "again": [], "item": ["item"], "changed": ["leak", "adamw", "wide"],
            "lib": ["lib"]}


def _run_all(root: Path) -> dict[str, str]:
    """Each variant's real traced run, started together, each in its own process group, and
    every one killed however this ends: name -> its final_summary.json."""
    from tests.tracer import fakelib

    site = root / "venv" / "lib" / "python3" / "site-packages"
    (site / "fakelib").mkdir(parents=True)
    (site / "fakelib" / "__init__.py").write_text(fakelib.SOURCE)
    checkout = root / "checkout"
    (checkout / "mlrepo").mkdir(parents=True)
    (checkout / "pyproject.toml").write_text("[project]\nname = 'mlrepo'\n")
    (checkout / "mlrepo" / "train.py").write_text(SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO), env.get("PYTHONPATH", "")])
    procs: dict[str, subprocess.Popen] = {}
    try:
        for name, flags in VARIANTS.items():
            procs[name] = subprocess.Popen(
                [sys.executable, "mlrepo/train.py", f"out-{name}", *flags], cwd=checkout,
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 300
        for name, proc in procs.items():
            _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            assert proc.returncode == 0, f"{name}: {err}"
    finally:
        for proc in procs.values():
            kill_group(proc)
    return {name: str(checkout / f"out-{name}" / "final_summary.json") for name in VARIANTS}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name -> final_summary.json of each variant's run, once per test session (whichever
    xdist worker asks first runs them; the others read the same files)."""
    done = once_per_session(tmp_path_factory, "counters_diff_runs",
                            lambda: _run_all(tmp_path_factory.mktemp("counters")))
    return {name: Path(path) for name, path in done.items()}


@pytest.fixture
def diff(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    """``traceml-ci diff BASE HEAD ...`` in this process (main(argv), as the console script),
    from the runs' folder: no pyproject.toml rules apply. Returns (exit code, stdout, stderr)."""

    def run(base: Path, head: Path, *more: str) -> tuple[int, str, str]:
        monkeypatch.chdir(base.parent)
        code = main(["diff", str(base), str(head), *more])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def _rows(diff, base: Path, head: Path) -> dict[str, dict]:
    _, out, _ = diff(base, head, "--format", "json")
    return {r["name"]: r for r in json.loads(out)["rows"]}


def test_the_same_code_twice_passes_every_counter(runs, diff) -> None:
    rows = _rows(diff, runs["base"], runs["again"])
    counters = {n: r for n, r in rows.items() if n.startswith("counters.")}
    assert set(counters) == {
        "counters.syncs_per_step",
        "counters.ops_per_step",
        "counters.allocs_per_step",
        "counters.retained_bytes_per_step",
        "counters.graph_nodes_kept_per_step",
        "counters.eval_forwards_with_grad_per_step",
        "counters.collectives_per_step",
        "counters.h2d_copies_per_step",
        "counters.python_calls_per_step",
        "counters.optimizer",
        "counters.flops_per_step",
        "counters.parameters",
    }
    assert all(r["status"] == "ok" for r in counters.values())
    # nothing said but that a CPU run has no device to copy to
    assert {n: r["note"] for n, r in counters.items() if r["note"]} == {
        "counters.h2d_copies_per_step": "no device: nothing to copy to"}
    assert counters["counters.syncs_per_step"]["delta"] == 0


def test_an_added_item_each_step_regresses_at_its_line(runs, diff, tmp_path) -> None:
    code, out, err = diff(runs["base"], runs["item"])
    assert code == 1, out + err
    said = f"adds 1 scalar read per step at mlrepo/train.py:{ITEM_LINE} (item)"
    # named in the headline, right under the verdict, before the reasons and the table
    assert out.splitlines()[1] == f"cause: {said}"
    code, md, _ = diff(runs["base"], runs["item"], "--format", "markdown")
    assert code == 1 and md.splitlines()[3] == f"**Cause:** {said}"
    report = tmp_path / "report.md"  # (the runs' folders are shared: another test writes there)
    code, out, err = diff(runs["base"], runs["item"], "--format", "markdown", "-o", str(report))
    assert code == 1 and out == ""
    assert err == f"traceml-ci: regression: {said} (report in {report})\n"
    assert report.read_text() == md
    back = _rows(diff, runs["item"], runs["base"])
    assert back["counters.syncs_per_step"]["status"] == "improved"


def test_a_loop_that_keeps_its_outputs_regresses_with_the_bytes(runs, diff) -> None:
    code, out, err = diff(runs["base"], runs["changed"])
    assert code == 1, out + err
    text = " ".join(out.split())
    # 8×4 fp32
    assert f"retains 128 B more per step (addmm at mlrepo/train.py:{MODEL_LINE})" in text


def test_an_optimizer_change_regresses_and_says_so(runs, diff) -> None:
    code, out, err = diff(runs["base"], runs["changed"])
    assert code == 1, out + err
    assert "optimizer SGD → AdamW (+2 state tensors per parameter)" in " ".join(out.split())


def test_a_flop_change_names_the_module(runs, diff) -> None:
    row = _rows(diff, runs["base"], runs["changed"])["counters.flops_per_step"]
    assert row["status"] == "regressed"
    # Both layers double (16→32→4 becomes 16→64→4): +100 %. The first layer moved most: its
    # forward 2·8·16·32 and its weight's gradient as much again (its input needs none); the
    # second's forward 2·8·32·4 and both gradients, three times that.
    assert row["note"] == "FLOPs per step +100 % (0 Linear +16.4 kFLOP, 2 Linear +6.14 kFLOP)"
    assert _rows(diff, runs["base"], runs["changed"])["counters.parameters"]["note"] == (
        "parameters 676 → 1,348"
    )


# -- sites in the user's code, never the runner's paths (issue 31) --------------------------------


def test_a_read_and_a_leak_inside_a_library_name_the_users_lines(runs, diff) -> None:
    """Issue 31: the leak named a line inside transformers, with the runner's absolute
    virtualenv path, not the user's own line in mlrepo/train.py."""
    rows = _rows(diff, runs["base"], runs["lib"])
    assert rows["counters.syncs_per_step"]["note"] == (
        f"adds 1 scalar read per step at mlrepo/train.py:{LIB_READ_LINE} (item)")
    assert rows["counters.retained_bytes_per_step"]["note"].startswith(
        f"retains 128 B more per step (mul at mlrepo/train.py:{LIB_KEEP_LINE})")


def test_no_report_form_holds_an_absolute_path_of_the_runner(runs, diff) -> None:
    """Every form of the comparison -- text, markdown (the PR comment's body), JSON, the causes,
    a report file, the HTML report -- and the summaries themselves: none holds the checkout's
    or the virtualenv's absolute path."""
    checkout = runs["base"].parents[1]
    base, head = (os.path.relpath(runs[n], runs["base"].parent) for n in ("base", "lib"))
    forms = []
    for fmt_args in ([], ["--format", "markdown"], ["--format", "json"]):
        code, out, err = diff(runs["base"], runs["lib"], *fmt_args)
        assert code == 1, out + err
        forms.append(out + err)
    causes = json.loads(forms[-1])["causes"]
    code, out, err = diff(runs["base"], runs["lib"], "--format", "markdown", "-o", "report.md")
    forms += [out + err, (runs["base"].parent / "report.md").read_text()]
    assert main(["report", base, head, "-o", "report.html"]) == 0
    forms.append((runs["base"].parent / "report.html").read_text())
    forms += [runs[n].read_text() for n in ("base", "lib")]
    runner_paths = {str(checkout.parent), os.path.realpath(checkout.parent), sys.prefix,
                    os.path.realpath(sys.prefix), str(REPO)}
    for i, text in enumerate(forms):
        for path in runner_paths:
            assert path not in text, (i, path)
    assert [c for c in causes if "train.py" in c] == [
        f"adds 1 scalar read per step at mlrepo/train.py:{LIB_READ_LINE} (item)",
        f"retains 128 B more per step (mul at mlrepo/train.py:{LIB_KEEP_LINE})",
    ]
