"""pytest-xdist: workers gate their own tests; the controller merges every worker's summaries
into one baseline, one save file and one report."""

from __future__ import annotations

import json

import pytest

from tests.pytest_plugin.conftest import SmokeProject

pytest.importorskip("xdist")

MORE_TESTS = '''
import pytest

from smoke_train import train


@pytest.mark.traceml(key="extra", max_steps=25)
def test_extra():
    train()
'''


def test_workers_results_merge_into_one_baseline_save_and_report(smoke: SmokeProject) -> None:
    smoke.monkeypatch.setenv("SMOKE_PLAIN_SGD", "1")  # lighter worker start-up
    smoke.tests()
    # One run an entry: what is merged is the point, not how many runs each entry combines.
    once = "--traceml-baseline-runs=1"
    smoke.run("--traceml-update-baseline", once).assert_outcomes(passed=3)  # in-process: quick
    smoke.tests(MORE_TESTS, name="test_more")
    save, report = smoke.path / "head.json", smoke.path / "report.md"

    result = smoke.run("-n", "2", "--traceml-update-baseline", once, f"--traceml-save={save}",
                       f"--traceml-report={report}", subprocess=True)

    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*created: 2/2 workers*"])
    keys = ["extra", "mlp-short", "test_smoke.py::test_mlp"]
    assert sorted(smoke.baseline_summaries()) == keys
    assert sorted(json.loads(save.read_text())["summaries"]) == keys
    assert smoke.baseline_summaries()["extra"]["step_time"]["steps_total"] == 25
    text = report.read_text()
    assert text.startswith("<!-- traceml-ci:report -->\n")
    assert "2 compared" in text and "1 added (no baseline yet): extra" in text
    out = result.stdout.str()
    section = out.split("- traceml -")[1]
    assert section.count("UPDATED") == 3
    result.stdout.fnmatch_lines([
        f"traceml: baseline updated: {smoke.baseline} (3 written, 3 in all)",
        f"traceml: summaries saved: {save} (3)",
        f"traceml: report written: {report}",
    ])
