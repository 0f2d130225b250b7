"""The deterministic counters (summary ``counters``) compared exactly: no noise rule, no
tolerance tiers but the FLOPs' 1 %. A counter absent on either side (an older summary, a
traceml-ai one, a run too short to sample) makes no row.

Defaults: an added scalar read per step, or bytes retained from each step, regress; so does a
change of optimizer (or of its state per parameter) and a FLOP count per step that moved beyond
``FLOPS_REL_PCT`` either way. A change of parameters is said, never judged. Each row's note is
the sentence that says what changed; ``compare()`` puts it in the reasons (docs/gate.md). Its
``cause`` is that sentence's first part, what a headline names (gate/causes.py): the note only
adds why it matters or what to do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from traceml_ci.gate import fmt
from traceml_ci.gate.counted.guide import (
    collectives,
    compile_breaks,
    eval_grad,
    graph,
    h2d,
    python,
)
from traceml_ci.gate.counted.input_pipeline import input_row
from traceml_ci.gate.counted.rows import (
    EXACT,
    PREFIX,
    SITES_NAMED,
    byte_size,
    count,
    counter_row,
    phase_moves,
    plural,
    sites_of,
)
from traceml_ci.gate.metrics import Kind
from traceml_ci.gate.results import Evidence, Row, Status
from traceml_ci.gate.rules import Direction, Rule
from traceml_ci.summary.view import SummaryLike, as_view, finite, op_kind_moves

#: FLOPs per step may move this much (percent, either way) before it regresses.
FLOPS_REL_PCT = 1.0
#: A module is named beside the one whose FLOPs moved most only when its own move is at least
#: this fraction of that one's (a bias or a norm that moved with it is not news).
MODULE_MOVE_SHARE = 0.1

_ANY = Rule(direction=Direction.ANY)
_FLOPS = Rule(rel=FLOPS_REL_PCT, direction=Direction.ANY)


def counter_rows(
    base: SummaryLike, head: SummaryLike
) -> list[Row]:
    """The counters' rows, for what both summaries measured."""
    bv, hv = as_view(base), as_view(head)
    b, h = bv.counters, hv.counters
    torches = (_minor(bv.doc, "torch"), _minor(hv.doc, "torch"))
    pythons = (_minor(bv.doc, "python"), _minor(hv.doc, "python"))
    rows: list[Row] = []
    for key, make in ROWS.items():
        bb, hh = b.get(key), h.get(key)
        if isinstance(bb, Mapping) and isinstance(hh, Mapping):
            row = make(bb, hh)
            if row is not None and make in _BY_TORCH and torches[0] != torches[1]:
                # torch's decompositions change between minor versions: other ops, same code
                row = _not_judged(row, "torch", torches)
            elif row is not None and make in (python, compile_breaks) and pythons[0] != pythons[1]:
                row = _not_judged(row, "Python", pythons)
            if row is not None:
                rows.append(row)
    return _fixes_first(rows)


#: Rows that follow from most other changes (gate/causes.py names them last): the ATen ops,
#: the Python calls, the allocations.
ECHO_ROWS = (PREFIX + "ops_per_step", PREFIX + "python_calls_per_step",
             PREFIX + "allocs_per_step")


#: The ops and allocations a fix may add, in % of the step's, and still be its own cost.
FIX_COST_PCT = 5.0


def _fixes_first(rows: list[Row]) -> list[Row]:
    """A fix costs a few ops: ``total = total + loss.detach()`` keeps no history (its graph row
    improves) and runs 4 ``detach`` more of 382 (its ops row rises). Where a surer counter
    improved and none regressed, a rise of the ops or allocations within ``FIX_COST_PCT`` is
    the fix's own cost: said, not failed. (The Python calls are the user's code: never.)"""
    sure = [r for r in rows if r.name not in ECHO_ROWS]
    improved = [r for r in sure if r.status is Status.IMPROVED]
    if not improved or any(r.status is Status.REGRESSED for r in sure):
        return rows
    said = f"; follows {improved[0].name.removeprefix(PREFIX)}, which improved"

    def costs(r: Row) -> bool:
        base, delta = finite(r.base), finite(r.delta)
        return (r.name != PREFIX + "python_calls_per_step" and r.status is Status.REGRESSED
                and base is not None and delta is not None
                and delta <= FIX_COST_PCT / 100 * base)

    return [dataclasses.replace(r, status=Status.OK, cause="", note=r.note + said)
            if costs(r) else r for r in rows]


def _not_judged(row: Row, what: str, versions: tuple[str | None, str | None]) -> Row:
    return dataclasses.replace(row, status=Status.OK, cause="",
                               note=f"not judged: {what} {versions[0] or '?'} → "
                                    f"{versions[1] or '?'}")


def _minor(doc: Mapping[str, Any], package: str) -> str | None:
    """``2.13`` of a summary's ``env.torch`` (``2.13.0+cpu``) or ``env.python``, else None."""
    env = doc.get("env")
    version = env.get(package) if isinstance(env, Mapping) else None
    return ".".join(version.split("+")[0].split(".")[:2]) if isinstance(version, str) else None


def _syncs(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    bn, hn = count(b.get("per_step")), count(h.get("per_step"))
    if bn is None or hn is None:
        return None
    bs, hs = sites_of(b, "sites", "count"), sites_of(h, "sites", "count")
    moves = sorted(
        ((hs.get(k, 0) - bs.get(k, 0), k) for k in set(bs) | set(hs)),
        key=lambda m: (-abs(m[0]), m[1]),
    )
    added = [
        f"{plural(d, 'scalar read')} per step at {at} ({op})" for d, (at, op) in moves if d > 0
    ][:SITES_NAMED]
    removed = [
        f"{plural(-d, 'scalar read')} per step at {at} ({op})" for d, (at, op) in moves if d < 0
    ][:SITES_NAMED]
    parts = ([f"adds {'; '.join(added)}"] if added else []) + (
        [f"removes {'; '.join(removed)}"] if removed else []
    )
    note = ", ".join(parts)
    if hn > bn and not added:
        note = f"adds {plural(hn - bn, 'scalar read')} per step"
    if hn == bn and note:
        note = f"same count, moved: {note}"
    return counter_row(
        "syncs_per_step",
        bn,
        hn,
        float(hn - bn),
        EXACT,
        Kind.SLOPE,
        "reads/step",
        "reads/step",
        hn > bn,
        hn < bn,
        note,
    )


#: What to do about an op kind a step runs more of, where the Tuning Guide says (ATen names).
_ZERO = ("zero_grad(set_to_none=True), the default, drops the gradients instead of zeroing "
         "them (Tuning Guide: use parameter.grad = None instead of model.zero_grad())")
_NORM = ("a norm kernel per tensor: clip_grad_norm_ with foreach left to torch (or True) "
         "takes them in one multi-tensor op")
_COPY = ("a copy every step (a deepcopy or a state_dict copy in the loop?): keep checkpoints "
         "out of the step, or every N steps")
OP_FIXES: dict[str, str] = {
    "zero_": _ZERO, "_foreach_zero_": _ZERO,
    "linalg_vector_norm": _NORM, "norm": _NORM,
    "clone": _COPY, "copy_": _COPY, "_to_copy": _COPY,
}


def _ops(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    """ATen ops per step: more regress, naming the kinds that rose most and their lines (and
    the Tuning Guide's fix where it has one); fewer improve."""
    bn, hn = count(b.get("per_step")), count(h.get("per_step"))
    if bn is None or hn is None:
        return None
    moves = op_kind_moves(b, h)
    # the largest moves the way the total went first; of equal ones, a kind with a known fix
    moves.sort(key=lambda m: (-m.change if hn >= bn else m.change, m.op not in OP_FIXES, m.op))
    named = [f"{m.said()} {m.op} per step at {m.line}" for m in moves[:SITES_NAMED]]
    note = why = ""
    if hn != bn:
        phases = phase_moves(b.get("by_phase"), h.get("by_phase"))
        note = (f"{hn - bn:+d} ATen ops per step{phases}"
                + (f" ({'; '.join(named)})" if named else ""))
        fixes = [OP_FIXES[m.op] for m in moves if m.change > 0 and m.op in OP_FIXES]
        if hn > bn:
            why = f": {fixes[0]}" if fixes else ": the step runs more ops than its baseline"
    elif named:
        note = f"same ops per step, other kinds: {'; '.join(named)}"
    return counter_row("ops_per_step", bn, hn, float(hn - bn), EXACT, Kind.SLOPE, "ops/step",
                "ops/step", hn > bn, hn < bn, note, why)


def _allocs(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    """Allocations (new storages) per step, judged by their count -- the bytes follow the
    batch's shapes and are said, not judged: more regress, by phase."""
    bn, hn = count(b.get("per_step")), count(h.get("per_step"))
    if bn is None or hn is None:
        return None
    note = why = ""
    if hn != bn:
        moved = (count(h.get("bytes_per_step")) or 0) - (count(b.get("bytes_per_step")) or 0)
        size = f", {'+' if moved >= 0 else '-'}{byte_size(abs(moved))}" if moved else ""
        note = (f"{hn - bn:+d} allocations per step{size}"
                f"{phase_moves(b.get('by_phase'), h.get('by_phase'), 0)}")
        if hn > bn:
            why = (": the step makes more tensors than its baseline (a copy, an upcast, a "
                   "graph built for nothing?)")
    return counter_row("allocs_per_step", bn, hn, float(hn - bn), EXACT, Kind.SLOPE, "allocs/step",
                "allocs/step", hn > bn, hn < bn, note, why)


def _leak(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    bn, hn = count(b.get("retained_bytes_per_step")), count(h.get("retained_bytes_per_step"))
    if bn is None or hn is None:
        return None
    note = why = ""
    if hn != bn:
        top = h.get("top") if hn > bn else b.get("top")
        first = top[0] if isinstance(top, list) and top and isinstance(top[0], Mapping) else {}
        where = (
            f" ({first.get('op', '?')} at {first.get('at', '?')})"
            if isinstance(first.get("at"), str)
            else ""
        )
        after = count(h.get("after_steps")) or 0
        if hn > bn:
            note = f"retains {byte_size(hn - bn)} more per step{where}"
            why = f": made in a step, still alive {after} steps later"
        else:
            note = f"retains {byte_size(bn - hn)} less per step{where}"
    return counter_row(
        "retained_bytes_per_step",
        bn,
        hn,
        float(hn - bn),
        EXACT,
        Kind.SLOPE,
        "B/step",
        "B/step",
        hn > bn,
        hn < bn,
        note,
        why,
    )


def _input(b: Mapping[str, Any], h: Mapping[str, Any]) -> Row | None:
    """ATen ops per batch in the input pipeline (``counters.input``;
    gate/counted/input_pipeline.py)."""
    return input_row(b, h)


#: Rows whose counts follow torch's own Python (its decompositions, its modules' code): not
#: judged across torch minor versions.
_BY_TORCH = (_ops, _allocs, graph, python, _input, compile_breaks)


def _optimizer(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    def name(block: Mapping[str, Any]) -> str:
        classes = block.get("classes")
        return "+".join(str(c) for c in classes) if isinstance(classes, list) and classes else "?"

    bn, hn = name(b), name(h)
    bt, ht = finite(b.get("state_tensors_per_param")), finite(h.get("state_tensors_per_param"))
    state = ""
    if bt is not None and ht is not None and bt != ht:
        state = f"{ht - bt:+g} state tensors per parameter"
    note = ""
    if bn != hn:
        note = f"optimizer {bn} → {hn}" + (f" ({state})" if state else "")
    elif state:
        note = f"optimizer {hn}: {state}"
    why = "; accepted by updating the baseline"
    return counter_row("optimizer", bn, hn, None, _ANY, Kind.LABEL, "", "", bool(note), False,
                       note, why, Evidence.SETTING)


def _flops(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    bn, hn = finite(b.get("per_step")), finite(h.get("per_step"))
    if not bn or hn is None:
        return None
    rel = 100.0 * (hn - bn) / bn
    moved = abs(rel) > FLOPS_REL_PCT
    note = ""
    if moved:
        note = f"FLOPs per step {rel:+.0f} %"
        culprit = _flops_mover(b, h)
        if culprit:
            note += f" ({culprit})"
    return counter_row("flops_per_step", bn, hn, rel, _FLOPS, Kind.RATE, "FLOP", "%", moved,
                       False, note)


#: How a note names the FLOPs of forwards run again in backward (the tracer's ``recomputed``).
RECOMPUTED = "recomputed forward under activation checkpointing"


def _flops_mover(b: Mapping[str, Any], h: Mapping[str, Any]) -> str:
    """What moved the FLOPs: the listed modules whose own FLOPs moved most, with their change
    (one listed on one side counts as 0 on the other), and the forwards recomputed under
    activation checkpointing, with the modules recomputed; the larger move first. At most
    SITES_NAMED modules each, each at least MODULE_MOVE_SHARE of the largest move."""
    moves = _module_moves(b.get("top_modules"), h.get("top_modules"))
    again_b, again_h = (x if isinstance(x, Mapping) else {} for x in
                        (b.get("recomputed"), h.get("recomputed")))
    again = (finite(again_h.get("per_step")) or 0.0) - (finite(again_b.get("per_step")) or 0.0)
    largest = max([abs(again)] + [abs(d) for d, _, _ in moves[:1]])
    if not largest:
        return ""
    modules = _named(moves, largest)
    parts = [modules] if modules else []
    if again and abs(again) >= MODULE_MOVE_SHARE * largest:
        regions = _module_moves(again_b.get("top_modules"), again_h.get("top_modules"))
        named = _named(regions, abs(regions[0][0]) if regions else 0.0)
        said = f"{RECOMPUTED} {_signed(again)}" + (f": {named}" if named else "")
        first = not moves or abs(again) >= abs(moves[0][0])
        parts.insert(0 if first else len(parts), said)
    return "; ".join(parts)


def _module_moves(base: Any, head: Any) -> list[tuple[float, str, str]]:
    """(change, module, class) of each module listed on either side, the largest first."""

    def table(mods: Any) -> dict[str, tuple[float, str]]:
        out: dict[str, tuple[float, str]] = {}
        for m in mods if isinstance(mods, list) else ():
            if isinstance(m, Mapping) and isinstance(m.get("module"), str):
                n = finite(m.get("flops"))
                if n is not None:
                    out[m["module"]] = (n, str(m.get("type") or ""))
        return out

    bt, ht = table(base), table(head)
    moves = [
        (ht.get(k, (0.0, ""))[0] - bt.get(k, (0.0, ""))[0], k, (ht.get(k) or bt[k])[1])
        for k in set(bt) | set(ht)
    ]
    return sorted((m for m in moves if m[0] != 0), key=lambda m: (-abs(m[0]), m[1]))


def _named(moves: list[tuple[float, str, str]], largest: float) -> str:
    """The first SITES_NAMED moves at least MODULE_MOVE_SHARE of ``largest``: ``name Class
    +N FLOP`` (the traced model itself, named "", by its class alone)."""
    named = []
    for d, name, kind in moves[:SITES_NAMED]:
        if abs(d) < MODULE_MOVE_SHARE * largest:
            break
        named.append(f"{name} {kind}".strip() + f" {_signed(d)}")
    return ", ".join(named)


def _signed(d: float) -> str:
    return ("+" if d > 0 else "−") + fmt.flops(abs(d))


def _params(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    bn, hn = count(b.get("elements")), count(h.get("elements"))
    if bn is None or hn is None:
        return None
    note = f"parameters {bn:,} → {hn:,}" if bn != hn else ""
    return counter_row(
        "parameters", float(bn), float(hn), None, None, Kind.SLOPE, "", "", False, False, note
    )


#: Each block of the summary's ``counters`` and the row made of it, in the report's order.
ROWS = {
    "syncs": _syncs, "ops": _ops, "allocs": _allocs, "leak": _leak, "graph": graph,
    "eval_grad": eval_grad, "collectives": collectives, "h2d": h2d, "python": python,
    "input": _input, "compile": compile_breaks, "optimizer": _optimizer, "flops": _flops,
    "params": _params,
}
