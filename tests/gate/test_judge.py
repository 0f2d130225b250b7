"""judge(): the one decision of "one run each, or sets key by key" that diff, report and the
plugin share; and compare() reading each side through one parsed view."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.gate.summaries import DATA, make, real, shift
from tests.gate.test_modules_named import with_modules
from traceml_ci.cli.main import main
from traceml_ci.gate import (
    DEFAULT_RULES,
    Comparison,
    SetComparison,
    Verdict,
    compare,
    compare_sets,
    judge,
    write_baseline_set,
)
from traceml_ci.summary.view import SummaryView


def _json(result: Comparison | SetComparison) -> dict[str, Any]:
    return json.loads(json.dumps(result.to_dict()))


def test_one_run_each_is_one_comparison_whatever_the_keys() -> None:
    base, head = make(name="a"), make(shift(dataloader=4.0), name="b")
    result = judge({"a": base}, {"renamed": head})
    assert isinstance(result, Comparison) and result.verdict is Verdict.REGRESSION
    assert _json(result) == _json(compare(base, head))


def test_more_than_one_key_is_compared_key_by_key() -> None:
    base = {"t1": make(), "t2": make()}
    head = {"t1": make(shift(dataloader=4.0)), "t3": make()}
    result = judge(base, head)
    assert isinstance(result, SetComparison)
    assert result.verdict is Verdict.REGRESSION
    assert (list(result.items), result.added, result.removed) == (["t1"], ["t3"], ["t2"])
    assert _json(result) == _json(compare_sets(base, head))


def test_an_empty_set_against_one_run_has_no_key_in_common() -> None:
    result = judge({}, {"run": make()})
    assert isinstance(result, SetComparison) and result.verdict is Verdict.INCOMPARABLE
    assert result.reasons[0] == "no key in common"


def test_rules_and_env_mismatch_reach_the_comparison() -> None:
    base, head = make(device_type="cuda"), make(shift(forward=9.0), device_type="cpu")
    strict = judge({"r": base}, {"r": head}, DEFAULT_RULES)
    allowed = judge({"r": base}, {"r": head}, DEFAULT_RULES, allow_env_mismatch=True)
    assert "step_time.step_ms.median" in strict.skipped
    assert "step_time.step_ms.median" not in allowed.skipped
    loose = judge(
        {"r": make()},
        {"r": make(shift(dataloader=4.0))},
        DEFAULT_RULES.with_tolerances({"step_time.*_pct": {"abs": 50.0}}),
    )
    assert loose.verdict is not Verdict.REGRESSION


@pytest.fixture
def views_built(monkeypatch) -> list[int]:
    """How many SummaryViews were built (one entry per construction)."""
    built: list[int] = []
    original = SummaryView.__init__

    def counting(self, doc):
        built.append(1)
        original(self, doc)

    monkeypatch.setattr(SummaryView, "__init__", counting)
    return built


def test_compare_parses_each_side_once(views_built) -> None:
    """Every step -- context, each metric, every guard, the modules named -- reads the one view
    per side: two views for a pair of dicts, none for a pair of views."""
    base = with_modules(make(), encoder__layer__3=1.0, embed=0.5)
    head = with_modules(make(shift(forward=3.0)), encoder__layer__3=4.0, embed=0.5)
    by_dicts = compare(base, head)
    assert len(views_built) == 2
    # Every guard ran: the module guard named the module beside the regressed share.
    assert "encoder.layer.3" in by_dicts.row("step_time.forward_pct").note
    views_built.clear()
    by_views = compare(SummaryView(base), SummaryView(head))
    assert len(views_built) == 2  # the two built right here, none inside
    assert _json(by_views) == _json(by_dicts)


def _spy(monkeypatch) -> list[tuple[int, int]]:
    """Replace judge() with a recording pass-through; the sizes of each call's sides."""
    module = importlib.import_module("traceml_ci.gate.judge")  # the package shadows the name
    calls: list[tuple[int, int]] = []
    real_judge = module.judge

    def spy(base, head, *args, **kwargs):
        calls.append((len(base), len(head)))
        return real_judge(base, head, *args, **kwargs)

    monkeypatch.setattr(module, "judge", spy)
    return calls


@pytest.mark.parametrize("as_set", [False, True])
def test_diff_decides_through_judge(as_set: bool, tmp_path: Path, monkeypatch, capsys) -> None:
    a, b = DATA / "input_bound_a.json", DATA / "compute_bound.json"
    if as_set:
        a, b = tmp_path / "a.json", tmp_path / "b.json"
        write_baseline_set(a, {"t1": real("input_bound_a"), "t2": real("input_bound_b")})
        write_baseline_set(b, {"t1": real("compute_bound"), "t2": real("input_bound_b")})
    calls = _spy(monkeypatch)
    assert main(["diff", str(a), str(b), "--format", "json"]) == 1
    assert calls == ([(2, 2)] if as_set else [(1, 1)])
    assert json.loads(capsys.readouterr().out)["kind"] == ("set" if as_set else "comparison")


def test_report_decides_through_judge(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
    calls = _spy(monkeypatch)
    out = tmp_path / "r.html"
    args = ["report", str(DATA / "input_bound_a.json"), str(DATA / "compute_bound.json")]
    assert main([*args, "-o", str(out)]) == 0
    assert calls == [(1, 1)] and "regression" in out.read_text(encoding="utf-8").lower()
