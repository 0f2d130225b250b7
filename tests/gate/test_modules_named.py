"""A forward share that regressed names the sampled submodules whose share of the step moved."""

from __future__ import annotations

from typing import Any

from tests.gate.summaries import make, shift
from traceml_ci.gate import compare, render_markdown
from traceml_ci.gate.compare import module_movers


def with_modules(doc: dict[str, Any], layer3_ms: float, embed_ms: float) -> dict[str, Any]:
    fwd = doc["step_time"]["phase_ms"]["forward"]
    doc["modules"] = {"sampled_steps": 5, "every_s": 0.5, "forward_ms": fwd, "forward": [
        {"name": "encoder.layer.3", "ms": layer3_ms, "share_pct": 100 * layer3_ms / fwd},
        {"name": "embed", "ms": embed_ms, "share_pct": 100 * embed_ms / fwd},
    ]}
    return doc


def test_a_slower_submodule_is_named_beside_the_forward_share() -> None:
    base = with_modules(make(), layer3_ms=1.0, embed_ms=0.5)  # forward 6 ms of 20
    head = with_modules(make(shift(forward=3.0)), layer3_ms=4.0, embed_ms=0.5)
    c = compare(base, head)
    row = c.row("step_time.forward_pct")
    assert row.status.value == "regressed"
    assert "encoder.layer.3 +" in row.note and row.note.index("encoder.layer.3") < (
        row.note.index("embed") if "embed" in row.note else len(row.note))
    movers = dict(module_movers(base, head))
    step_b, step_h = 20.0, 23.0
    assert abs(movers["encoder.layer.3"] - (100 * 4.0 / step_h - 100 * 1.0 / step_b)) < 0.2
    assert "encoder.layer.3 +" in render_markdown(c)


def test_no_modules_no_names_and_never_a_verdict_of_their_own() -> None:
    base, head = make(), make()
    assert module_movers(base, head) == []
    moved = with_modules(make(), 4.0, 0.5)
    assert compare(with_modules(make(), 1.0, 0.5), moved).verdict.value == "pass"
