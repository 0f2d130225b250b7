"""benchmarks/cisuite stays usable: every change of the corpus applies exactly once to the
template (and reverses back to it), the template's smoke tests collect, and the driver reads the
plugin's outputs. No gated session is run here (benchmarks/cisuite/run.py does that)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO

SUITE = REPO / "benchmarks" / "cisuite"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"cisuite_{name}", SUITE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


changes = _load("changes")
run = _load("run")


def _template(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(changes.TEMPLATE, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*.py"))}


@pytest.mark.parametrize("change", changes.CHANGES, ids=lambda c: c.name)
def test_each_change_applies_once_and_reverses(change, tmp_path: Path) -> None:
    root = _template(tmp_path)
    before = _files(root)
    change.apply(root)
    after = _files(root)
    touched = {k for k in before if before[k] != after[k]}
    assert touched == {e.path for e in change.edits}
    for edit in change.edits:
        diff = [(a, b) for a, b in zip(before[edit.path].splitlines(),
                                       after[edit.path].splitlines(), strict=False) if a != b]
        assert diff, "the edit changed no line"
        # one line changed, added or removed (a rename may touch the lines of one statement)
        grown = abs(len(after[edit.path].splitlines()) - len(before[edit.path].splitlines()))
        assert grown <= 1
        # the cause's line is the first changed one, in the changed file
        line = after[edit.path].splitlines()[edit.line() - 1]
        first_new = next(b for a, b in zip(before[edit.path].splitlines() + [""],
                                           after[edit.path].splitlines(), strict=False)
                         if a != b)
        assert line == first_new
        compile(after[edit.path], edit.path, "exec")  # still Python
    change.apply(root, reverse=True)  # the changed text is there exactly once
    assert _files(root) == before


def test_an_edit_that_does_not_apply_once_is_refused(tmp_path: Path) -> None:
    root = _template(tmp_path)
    twice = changes.Edit("mlrepo/train.py", "optimizer.step()", "optimizer.step()  # x")
    with pytest.raises(changes.EditError, match="found it 3 times"):
        twice.apply(root)
    with pytest.raises(changes.EditError, match="found it 0 times"):
        changes.Edit("mlrepo/train.py", "no such text", "x").apply(root)


def test_the_corpus_covers_both_issues() -> None:
    names = [c.name for c in changes.CHANGES]
    assert len(names) == len(set(names))
    issue32 = [c for c in changes.CHANGES if 32 in c.issue]
    assert len(issue32) >= 15
    assert {"item_per_step", "conv_5x5", "keep_logits", "sgd_to_adamw", "wider_model",
            "no_workers", "rename"} <= set(changes.GROUPS["issue31"])
    for c in changes.CHANGES:
        assert c.tests and set(c.tests) <= set(changes.TESTS), c.name
        assert c.harmless or c.expected_causes(), c.name  # a change names what to look for
    assert changes.select(["issue31", "rename"]) == [changes.BY_NAME[n]
                                                     for n in changes.GROUPS["issue31"]]
    with pytest.raises(KeyError):
        changes.select(["no-such-change"])


def test_the_template_smoke_tests_collect(tmp_path: Path) -> None:
    root = _template(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=root, capture_output=True, text=True, timeout=180, env=run.session_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    collected = {ln for ln in proc.stdout.splitlines() if "::" in ln}
    assert collected == set(changes.TESTS)


STORED_OUTPUT = """\
....F                                                                    [100%]
=================================== FAILURES ===================================
----------------------------------- traceml ------------------------------------
PASS              tests/test_smoke.py::test_cnn_trains  COMPUTE_BOUND, step 9.7 ms (base 9.9 ms)
WARN              tests/test_smoke.py::test_gpt2_trains  step 9 ms; warn: step_time.forward_pct
REGRESSION        tests/test_smoke.py::test_grad_accumulation (×3 runs)  cause: adds 1 scalar read
traceml: session verdict: regression (1 of 4 regressed: tests/test_smoke.py::test_grad_accumulation)
traceml: warning: could not profile x: y
traceml: comparison written: /tmp/c.json
=============================== warnings summary ===============================
tests/test_smoke.py::test_cnn_trains
  /usr/lib/python3/torch/utils/data/dataloader.py:683: UserWarning: pin_memory
    warnings.warn(warn_msg)

tests/test_smoke.py::test_gpt2_trains
  /work/pytest_plugin/ab.py:1: PytestWarning: traceml: A/B inconclusive

-- Docs: https://docs.pytest.org/en/stable/how-to/capture-warnings.html
=========================== short test summary info ============================
FAILED tests/test_smoke.py::test_grad_accumulation - traceml: regression for ...
1 failed, 3 passed in 30.1s
"""


def test_the_driver_reads_the_terminal_section() -> None:
    term = run.read_terminal(STORED_OUTPUT)
    assert set(term.results) == {"tests/test_smoke.py::test_cnn_trains",
                                 "tests/test_smoke.py::test_gpt2_trains",
                                 "tests/test_smoke.py::test_grad_accumulation"}
    accum = term.results["tests/test_smoke.py::test_grad_accumulation"]
    assert (accum["label"], accum["runs"]) == ("REGRESSION", 3)
    assert accum["detail"] == "cause: adds 1 scalar read"
    assert term.results["tests/test_smoke.py::test_gpt2_trains"]["label"] == "WARN"
    assert term.verdict_line.startswith("session verdict: regression")
    assert term.traceml_warnings == ["warning: could not profile x: y"]
    # torch's own UserWarning is not traceml's; the plugin's is
    assert len(term.pytest_warnings) == 1 and "A/B inconclusive" in term.pytest_warnings[0]


def test_the_driver_counts_runs_from_the_plugins_folders(tmp_path: Path) -> None:
    bt = tmp_path / "bt"
    marked = bt / "traceml-test_cnn_trains0"
    (marked / "repeat-1").mkdir(parents=True)
    (marked / "repeat-2").mkdir()
    for p in (marked, marked / "repeat-1", marked / "repeat-2"):
        (p / "final_summary.json").write_text("{}")
    script = bt / "traceml-test_ddp_two_ranks0" / "run-0"
    script.mkdir(parents=True)
    for name in ("final_summary.json", "final_summary.rank0.json", "final_summary.rank1.json"):
        (script / name).write_text("{}")
    (bt / "traceml-test_cnn_trainscurrent").symlink_to(marked)  # pytest's link: not counted
    assert run.runs_from_folders(bt, "tests/test_smoke.py::test_cnn_trains") == 3
    assert run.runs_from_folders(bt, "tests/test_smoke.py::test_ddp_two_ranks") == 1
    assert run.runs_from_folders(bt, "tests/test_smoke.py::test_gpt2_trains") is None


def test_the_driver_judges_a_session_against_the_corpus() -> None:
    change = changes.BY_NAME["item_per_step"]
    line = change.expected_causes()[0]
    failed = {"exit_code": 1, "tests": {changes.CNN: {
        "failed": True, "causes": [f"adds 1 scalar read per step at mlrepo/{line} (item)"]}}}
    run.judge(failed, change, reverse=False)
    assert failed["as_expected"] and failed["cause_matched"]
    elsewhere = {"exit_code": 1, "tests": {changes.CNN: {
        "failed": True, "causes": ["step_time.forward_pct +6 pp"]}}}
    run.judge(elsewhere, change, reverse=False)
    assert not elsewhere["as_expected"] and elsewhere["cause_matched"] is False
    undecided = {"exit_code": 1, "tests": {changes.CNN: {
        "failed": True, "verdict": "inconclusive", "causes": [f"mlrepo/{line}"]}}}
    run.judge(undecided, change, reverse=False)
    assert not undecided["as_expected"]
    fixed = {"exit_code": 0, "tests": {changes.CNN: {"improved": ["counters.syncs_per_step"]}}}
    run.judge(fixed, change, reverse=True)
    assert fixed["expected"] == "improved" and fixed["as_expected"]
    # a faster step against a baseline recorded under load is no sign of the fix
    silent = {"exit_code": 0, "tests": {changes.CNN: {"improved": ["step_time.step_ms.median"]}}}
    run.judge(silent, change, reverse=True)
    assert not silent["as_expected"]
    harmless = {"exit_code": 0, "tests": {}}
    run.judge(harmless, changes.BY_NAME["rename"], reverse=False)
    assert harmless["expected"] == "pass" and harmless["as_expected"]
