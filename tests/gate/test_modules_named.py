"""A forward or backward share that moved names the sampled submodules whose share of the step
moved beyond their noise; modules never decide a verdict of their own."""

from __future__ import annotations

from typing import Any

from tests.gate.summaries import make, shift
from traceml_ci.gate import compare, render_markdown, render_text
from traceml_ci.gate.timing.modules import module_movers
from traceml_ci.summary.keys import TOP_MODULES


def with_modules(doc: dict[str, Any], phase: str = "forward", noise: float = 0.2,
                 **module_ms: float) -> dict[str, Any]:
    """``module_ms``: name (``__`` for ``.``) -> ms of the phase, listed slowest first."""
    total = doc["step_time"]["phase_ms"][phase]
    rows = [{"name": name.replace("__", "."), "ms": ms, "share_pct": 100 * ms / total,
             "noise_pp": noise}
            for name, ms in sorted(module_ms.items(), key=lambda kv: -kv[1])]
    mods = doc.setdefault("modules", {"sampled_steps": 5, "every_s": 0.5, "forward": []})
    mods[phase] = rows
    mods[f"{phase}_ms"] = total
    return doc


def test_a_slower_submodule_is_named_beside_the_forward_share() -> None:
    base = with_modules(make(), encoder__layer__3=1.0, embed=0.5)  # forward 6 ms of 20
    head = with_modules(make(shift(forward=3.0)), encoder__layer__3=4.0, embed=0.5)
    c = compare(base, head)
    row = c.row("step_time.forward_pct")
    assert row.status.value == "regressed"
    # Its move in pp of the step, and its share of forward in head (4 ms of 9); embed moved
    # less than the floor.
    assert row.note.endswith("encoder.layer.3 +12.4 pp (44 % of forward)")
    movers = dict(module_movers(base, head))
    step_b, step_h = 20.0, 23.0
    assert abs(movers["encoder.layer.3"] - (100 * 4.0 / step_h - 100 * 1.0 / step_b)) < 0.1
    assert "encoder.layer.3 +" in render_markdown(c)


def test_a_parent_that_moved_with_its_child_is_left_to_the_child() -> None:
    base = with_modules(make(), encoder=4.0, encoder__layer__3=1.0, embed=1.0)
    head = with_modules(make(shift(forward=3.0)), encoder=7.0, encoder__layer__3=4.0, embed=1.0)
    names = [n for n, _ in module_movers(base, head)]
    assert names == ["encoder.layer.3", "embed"]  # embed: the same ms of a longer step
    note = compare(base, head).row("step_time.forward_pct").note
    assert note.endswith("encoder.layer.3 +12.4 pp (44 % of forward)")  # moved the same way


def test_module_noise_alone_names_nothing() -> None:
    base = with_modules(make(), noise=40.0, encoder__layer__3=1.0, embed=0.5)
    head = with_modules(make(shift(forward=3.0)), noise=40.0, encoder__layer__3=4.0, embed=0.5)
    assert module_movers(base, head) == []
    row = compare(base, head).row("step_time.forward_pct")
    assert row.status.value == "regressed" and "encoder" not in (row.note or "")


def test_backward_names_its_modules_too() -> None:
    base = with_modules(make(), "backward", layer__1=1.0, layer__2=1.0)
    head = with_modules(make(shift(backward=4.0)), "backward", layer__1=5.0, layer__2=1.0)
    row = compare(base, head).row("step_time.backward_pct")
    assert row.status.value == "regressed" and "layer.1 +" in row.note


def test_time_that_moved_within_a_steady_phase_is_context() -> None:
    base = with_modules(make(), layer__1=1.0, layer__3=4.0)
    head = with_modules(make(), layer__1=4.0, layer__3=1.0)
    c = compare(base, head)
    assert c.verdict.value == "pass"
    line = next(r for r in c.reasons if r.startswith("time moved within forward"))
    assert "layer.1 +50.0 pp" in line and "layer.3 -50.0 pp" in line  # of forward's 6 ms


def test_a_phase_that_only_lost_share_moves_none_of_its_modules() -> None:
    base = with_modules(make(), layer__1=1.0, layer__3=4.0)
    head = with_modules(make(shift(dataloader=6.0)), layer__1=1.0, layer__3=4.0)
    c = compare(base, head)
    assert not any("within forward" in r for r in c.reasons)


def test_a_module_below_a_cut_list_is_taken_at_the_lists_shortest_entry() -> None:
    """A full list (TOP_MODULES) hides slower-than-listed modules; one that is new in head's
    list is compared against base's shortest entry, which understates its move."""
    fillers = {f"f{i}": 1.0 for i in range(TOP_MODULES - 1)}
    base = with_modules(make(), slow=1.2, **fillers)
    head = with_modules(make(shift(forward=3.0)), slow=1.2, newcomer=4.0,
                        **dict(list(fillers.items())[:-1]))
    movers = dict(module_movers(base, head))
    assert 0 < movers["newcomer"] < 100 * 4.0 / 23.0


def test_no_modules_no_names_and_never_a_verdict_of_their_own() -> None:
    base, head = make(), make()
    assert module_movers(base, head) == []
    moved = with_modules(make(), encoder__layer__3=4.0, embed=0.5)
    assert compare(with_modules(make(), encoder__layer__3=1.0, embed=0.5),
                   moved).verdict.value == "pass"


def test_a_changed_flop_count_is_said_as_context() -> None:
    def counted(doc: dict[str, Any], flops: float) -> dict[str, Any]:
        doc["efficiency"] = {"flops_per_step": flops, "achieved_tflops": 0.1}
        return doc

    same = compare(counted(make(), 1.0e9), counted(make(), 1.0e9))
    assert not any("FLOPs per step" in r for r in same.reasons)
    grown = compare(counted(make(), 1.0e9), counted(make(), 1.25e9))
    assert grown.verdict.value == "pass"  # information, never a verdict
    assert ("FLOPs per step changed 1 GFLOP → 1.25 GFLOP (+25.0 %): the model or its input shapes "
            "changed, not only how fast it runs") in grown.reasons


def test_time_moved_between_modules_names_both_beside_a_phase_that_moved() -> None:
    """Issue #23: time moved from layer.3 to layer.1 while backward grew: both are named,
    one up, one down, in the text and markdown a PR comment shows."""
    base = with_modules(make(), "backward", layer__1=1.0, layer__3=4.0, layer__2=0.5)
    head = with_modules(make(shift(backward=4.0)), "backward", layer__1=8.0, layer__3=1.0,
                        layer__2=0.5)
    c = compare(base, head)
    row = c.row("step_time.backward_pct")
    assert row.status.value == "regressed"
    note = row.note
    assert "layer.1 +" in note and "layer.3 -" in note, note
    assert note.index("layer.1 +") < note.index("layer.3 -")  # the phase's way first
    # layer.2 kept its time: the longer step only diluted its share, it is not named.
    assert "layer.2" not in note, note
    for text in (render_markdown(c), render_text(c, width=300)):
        assert "layer.1 +" in text and "layer.3 -" in text, text


def test_every_module_that_moved_is_named() -> None:
    base = with_modules(make(), layer__1=1.0, layer__2=1.0, layer__3=4.0)
    head = with_modules(make(), layer__1=2.5, layer__2=2.5, layer__3=1.0)
    line = next(r for r in compare(base, head).reasons
                if r.startswith("time moved within forward"))
    for name in ("layer.1 +", "layer.2 +", "layer.3 -"):
        assert name in line, line
