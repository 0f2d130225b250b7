"""A summary cannot widen its own tolerance without bound: the noise allowance is capped."""

from __future__ import annotations

import json

import pytest

from tests.gate.summaries import make, shift
from traceml_ci.cli.main import main
from traceml_ci.gate.compare import NOISE_CAP_TOLERANCES, Status, compare
from traceml_ci.gate.rules import DEFAULT_RULES


def _claiming(doc: dict, iqr: float) -> dict:
    for spread in doc["step_time"]["noise"]["pct"].values():
        spread["iqr"] = iqr
    return doc


# 35 pp is a valid (if absurd) spread for a share and is capped; 1e6 cannot be the spread of a
# 0-100 share, so the schema refuses the file: bad input (2), never a pass.
@pytest.mark.parametrize(("iqr", "expected"), [(35.0, 1), (1e6, 2)])
def test_a_head_reporting_huge_noise_still_fails_a_30pp_regression(tmp_path, monkeypatch,
                                                                   capsys, iqr, expected):
    monkeypatch.chdir(tmp_path)
    base = tmp_path / "base.json"
    head = tmp_path / "head.json"
    base.write_text(json.dumps(make()))
    head.write_text(json.dumps(_claiming(make(shift(dataloader=12.0)), iqr)))  # +30 pp
    code = main(["diff", str(base), str(head)])
    out = capsys.readouterr().out
    assert code == expected, out
    assert "within noise" not in out


def test_the_allowance_is_at_most_the_cap_and_symmetric():
    cap = NOISE_CAP_TOLERANCES * DEFAULT_RULES.rule_for("step_time.dataloader_pct").abs
    head = _claiming(make(shift(dataloader=12.0)), 1e6)
    row = compare(make(), head).row("step_time.dataloader_pct")
    assert row.noise == pytest.approx(cap)
    # The base's spread weighs exactly as the head's: swapping them changes nothing.
    a = compare(_claiming(make(), 2.0), _claiming(make(shift(dataloader=2.2)), 0.5))
    b = compare(_claiming(make(), 0.5), _claiming(make(shift(dataloader=2.2)), 2.0))
    assert a.row("step_time.dataloader_pct").noise == b.row("step_time.dataloader_pct").noise


def test_honest_noise_below_the_cap_still_turns_a_failure_into_a_warning():
    row = compare(_claiming(make(), 6.0), _claiming(make(shift(dataloader=2.2)), 6.0)).row(
        "step_time.dataloader_pct")  # +8 pp, noise hypot(6, 6) = 8.5 pp < cap 10 pp
    assert row.status is Status.WARN and "within noise" in row.note


def test_a_relative_rule_caps_at_its_relative_tolerance():
    base = make()
    head = make(shift(backward=12.0))  # step 20 -> 32 ms: +60 %
    head["step_time"]["noise"]["step_ms"]["iqr"] = 1e6
    row = compare(base, head).row("step_time.step_ms.median")
    rule = DEFAULT_RULES.rule_for("step_time.step_ms.median")
    assert row.noise == pytest.approx(NOISE_CAP_TOLERANCES * rule.rel / 100 * 20.0)
    assert row.status is not Status.OK
