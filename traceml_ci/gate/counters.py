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
from traceml_ci.gate.input_counts import input_row
from traceml_ci.gate.metrics import Kind
from traceml_ci.gate.results import COUNTERS_PREFIX, Evidence, Row, Status, Tolerance
from traceml_ci.gate.rules import Direction, Rule
from traceml_ci.summary.view import SummaryLike, as_view, finite, op_kind_moves

#: Row names start with this.
PREFIX = COUNTERS_PREFIX
#: FLOPs per step may move this much (percent, either way) before it regresses.
FLOPS_REL_PCT = 1.0
#: Sites (and modules) named in a note (the largest changes first).
SITES_NAMED = 3
#: A module is named beside the one whose FLOPs moved most only when its own move is at least
#: this fraction of that one's (a bias or a norm that moved with it is not news).
MODULE_MOVE_SHARE = 0.1

_EXACT = Rule(abs=0.0, direction=Direction.WORSE)
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
    for make in (_syncs, _ops, _allocs, _leak, _graph, _eval_grad, _collectives, _h2d,
                 _python, _input, _compile, _optimizer, _flops, _params):
        bb, hh = b.get(make.__name__.strip("_")), h.get(make.__name__.strip("_"))
        if isinstance(bb, Mapping) and isinstance(hh, Mapping):
            row = make(bb, hh)
            if row is not None and make in _BY_TORCH and torches[0] != torches[1]:
                # torch's decompositions change between minor versions: other ops, same code
                row = _not_judged(row, "torch", torches)
            elif row is not None and make in (_python, _compile) and pythons[0] != pythons[1]:
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


def _row(
    name: str,
    b: Any,
    h: Any,
    delta: float | None,
    rule: Rule | None,
    kind: Kind,
    unit: str,
    delta_unit: str,
    worse: bool,
    better: bool,
    cause: str,
    why: str = "",
    evidence: Evidence = Evidence.COUNT,
) -> Row:
    """A counter's row; its note is ``cause`` and then ``why`` (empty when nothing changed)."""
    status = Status.REGRESSED if worse else Status.IMPROVED if better else Status.OK
    tol = Tolerance(rule, kind, unit) if rule is not None else None
    note = cause + why if cause else ""
    return Row(PREFIX + name, b, h, delta, tol, status, unit, delta_unit, None, note, cause,
               evidence)


def _int(x: Any) -> int | None:
    v = finite(x)
    return None if v is None else int(v)


def _sites(block: Mapping[str, Any], key: str, value: str) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    items = block.get(key)
    for s in items if isinstance(items, list) else ():
        if isinstance(s, Mapping) and isinstance(s.get("at"), str):
            n = _int(s.get(value))
            if n is not None:
                out[(str(s["at"]), str(s.get("op") or "?"))] = n
    return out


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _syncs(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    bn, hn = _int(b.get("per_step")), _int(h.get("per_step"))
    if bn is None or hn is None:
        return None
    bs, hs = _sites(b, "sites", "count"), _sites(h, "sites", "count")
    moves = sorted(
        ((hs.get(k, 0) - bs.get(k, 0), k) for k in set(bs) | set(hs)),
        key=lambda m: (-abs(m[0]), m[1]),
    )
    added = [
        f"{_plural(d, 'scalar read')} per step at {at} ({op})" for d, (at, op) in moves if d > 0
    ][:SITES_NAMED]
    removed = [
        f"{_plural(-d, 'scalar read')} per step at {at} ({op})" for d, (at, op) in moves if d < 0
    ][:SITES_NAMED]
    parts = ([f"adds {'; '.join(added)}"] if added else []) + (
        [f"removes {'; '.join(removed)}"] if removed else []
    )
    note = ", ".join(parts)
    if hn > bn and not added:
        note = f"adds {_plural(hn - bn, 'scalar read')} per step"
    if hn == bn and note:
        note = f"same count, moved: {note}"
    return _row(
        "syncs_per_step",
        bn,
        hn,
        float(hn - bn),
        _EXACT,
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
    bn, hn = _int(b.get("per_step")), _int(h.get("per_step"))
    if bn is None or hn is None:
        return None
    moves = op_kind_moves(b, h)
    # the largest moves the way the total went first; of equal ones, a kind with a known fix
    moves.sort(key=lambda m: (-m.change if hn >= bn else m.change, m.op not in OP_FIXES, m.op))
    named = [f"{m.said()} {m.op} per step at {m.line}" for m in moves[:SITES_NAMED]]
    note = why = ""
    if hn != bn:
        phases = _phase_moves(b.get("by_phase"), h.get("by_phase"))
        note = (f"{hn - bn:+d} ATen ops per step{phases}"
                + (f" ({'; '.join(named)})" if named else ""))
        fixes = [OP_FIXES[m.op] for m in moves if m.change > 0 and m.op in OP_FIXES]
        if hn > bn:
            why = f": {fixes[0]}" if fixes else ": the step runs more ops than its baseline"
    elif named:
        note = f"same ops per step, other kinds: {'; '.join(named)}"
    return _row("ops_per_step", bn, hn, float(hn - bn), _EXACT, Kind.SLOPE, "ops/step",
                "ops/step", hn > bn, hn < bn, note, why)


def _phase_moves(b: Any, h: Any, index: int | None = None) -> str:
    """`` in optimizer +8, backward +2``: the phases whose figure moved, the largest first
    (``index``: of a ``[count, bytes]`` pair); "" when either side has none."""
    if not isinstance(b, Mapping) or not isinstance(h, Mapping):
        return ""

    def at(block: Mapping[str, Any], phase: str) -> int:
        v = block.get(phase)
        if index is not None:
            v = v[index] if isinstance(v, list) and len(v) > index else None
        return _int(v) or 0

    moves = sorted(((at(h, p) - at(b, p), p) for p in set(b) | set(h)),
                   key=lambda m: (-abs(m[0]), m[1]))
    said = [f"{p} {d:+d}" for d, p in moves if d]
    return f" in {', '.join(said)}" if said else ""


def _allocs(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    """Allocations (new storages) per step, judged by their count -- the bytes follow the
    batch's shapes and are said, not judged: more regress, by phase."""
    bn, hn = _int(b.get("per_step")), _int(h.get("per_step"))
    if bn is None or hn is None:
        return None
    note = why = ""
    if hn != bn:
        moved = (_int(h.get("bytes_per_step")) or 0) - (_int(b.get("bytes_per_step")) or 0)
        size = f", {'+' if moved >= 0 else '-'}{_bytes(abs(moved))}" if moved else ""
        note = (f"{hn - bn:+d} allocations per step{size}"
                f"{_phase_moves(b.get('by_phase'), h.get('by_phase'), 0)}")
        if hn > bn:
            why = (": the step makes more tensors than its baseline (a copy, an upcast, a "
                   "graph built for nothing?)")
    return _row("allocs_per_step", bn, hn, float(hn - bn), _EXACT, Kind.SLOPE, "allocs/step",
                "allocs/step", hn > bn, hn < bn, note, why)


def _bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _leak(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    bn, hn = _int(b.get("retained_bytes_per_step")), _int(h.get("retained_bytes_per_step"))
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
        after = _int(h.get("after_steps")) or 0
        if hn > bn:
            note = f"retains {_bytes(hn - bn)} more per step{where}"
            why = f": made in a step, still alive {after} steps later"
        else:
            note = f"retains {_bytes(bn - hn)} less per step{where}"
    return _row(
        "retained_bytes_per_step",
        bn,
        hn,
        float(hn - bn),
        _EXACT,
        Kind.SLOPE,
        "B/step",
        "B/step",
        hn > bn,
        hn < bn,
        note,
        why,
    )


def _top_at(block: Mapping[str, Any], key: str = "sites") -> str:
    """`` at file:line`` of a block's first listed site ("" when none)."""
    top = block.get(key)
    first = top[0] if isinstance(top, list) and top and isinstance(top[0], Mapping) else {}
    return f" at {first['at']}" if isinstance(first.get("at"), str) else ""


#: What to do about autograd history kept across steps (the PyTorch FAQ's first item).
HISTORY_FIX = ("accumulate `loss.item()` or `loss.detach()`, keep outputs `.detach()`ed (PyTorch "
               "FAQ: don't accumulate history across your training loop)")
#: What to do about a validation forward with autograd on.
EVAL_GRAD_FIX = ("wrap validation in `torch.no_grad()` or `torch.inference_mode()` (Tuning "
                 "Guide: disable gradient calculation for validation or inference)")
#: What to do about more collectives per step.
COLLECTIVES_FIX = ("under gradient accumulation, run all but the last micro-batch's backward in "
                   "`model.no_sync()` (Tuning Guide: skip unnecessary all-reduce if training "
                   "with DDP and gradient accumulation)")


def _graph(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    """Autograd graph nodes a step made that are alive steps later: more regress, naming the
    line of the newest (what holds the history) and the lines that made the most."""
    bn, hn = _int(b.get("nodes_kept_per_step")), _int(h.get("nodes_kept_per_step"))
    if bn is None or hn is None:
        return None
    note = why = ""
    if hn != bn:
        side = h if hn > bn else b
        newest, holder = side.get("newest"), side.get("held_by")
        held = (f"; the newest made at {newest['at']} ({newest.get('op', '?')})"
                if isinstance(newest, Mapping) and isinstance(newest.get("at"), str) else "")
        if isinstance(holder, Mapping) and isinstance(holder.get("at"), str):
            held = f"; held by `{holder.get('name', '?')}` at {holder['at']}"
        after = _int(side.get("after_steps")) or 0
        if hn > bn:
            note = (f"keeps {_plural(hn - bn, 'autograd graph node')} more of each step alive "
                    f"{after} steps later (most made{_top_at(h, 'top')}{held})")
            why = f": something holds each step's graph -- {HISTORY_FIX}"
        else:
            note = f"keeps {_plural(bn - hn, 'autograd graph node')} fewer of each step alive"
    return _row("graph_nodes_kept_per_step", bn, hn, float(hn - bn), _EXACT, Kind.SLOPE,
                "nodes/step", "nodes/step", hn > bn, hn < bn, note, why)


def _eval_grad(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    """A traced model's eval-mode forwards with autograd on, per step: more regress."""
    bn, hn = _int(b.get("per_step")), _int(h.get("per_step"))
    if bn is None or hn is None:
        return None
    note = why = ""
    if hn > bn:
        note = (f"adds {_plural(hn - bn, 'eval-mode forward')} with autograd on per step"
                f"{_top_at(h)}")
        why = f": a graph built that no backward uses -- {EVAL_GRAD_FIX}"
    elif hn < bn:
        note = f"{_plural(bn - hn, 'eval-mode forward')} per step no longer builds a graph"
    return _row("eval_forwards_with_grad_per_step", bn, hn, float(hn - bn), _EXACT,
                Kind.SLOPE, "forwards/step", "forwards/step", hn > bn, hn < bn, note, why)


def _collectives(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    """Collectives (c10d ops) per step, judged by the bytes they move, then by their count:
    more regress. (A count alone can mislead: DDP's one-time bucket rebuild broadcasts twice
    in whichever step it lands on, and under ``no_sync()`` that is the sampled one.) The note
    names the kinds that moved, their line and the bytes."""
    bn, hn = _int(b.get("per_step")), _int(h.get("per_step"))
    bb, hb = _int(b.get("bytes_per_step")), _int(h.get("bytes_per_step"))
    if bn is None or hn is None or bb is None or hb is None:
        return None
    bs, hs = _sites(b, "sites", "count"), _sites(h, "sites", "count")
    moves = sorted(((hs.get(k, 0) - bs.get(k, 0), k) for k in set(bs) | set(hs)),
                   key=lambda m: (-m[0], m[1]))
    moves = [(d, k) for d, k in moves if d]
    worse = (hb, hn) > (bb, bn) if hb != bb or hn != bn else False
    note = why = ""
    if moves or hn != bn or hb != bb:
        named = [f"{d:+d} {op} per step" + (f" at {at}" if d > 0 else "")
                 for d, (at, op) in moves[:SITES_NAMED]]
        size = f" ({'+' if hb >= bb else '-'}{_bytes(abs(hb - bb))} per step)" if hb != bb else ""
        note = f"collectives: {'; '.join(named) or f'{hn - bn:+d} per step'}{size}"
        if worse:
            why = f": {COLLECTIVES_FIX}"
    return _row("collectives_per_step", bn, hn, float(hn - bn), _EXACT, Kind.SLOPE,
                "calls/step", "calls/step", worse, not worse and (hb, hn) != (bb, bn), note, why)


#: What to do about more host-to-device copies, or copies from unpinned memory.
H2D_FIX = ("copy each batch once, from pinned memory: DataLoader(pin_memory=True) and "
           "`.to(device, non_blocking=True)` (Tuning Guide: use pinned memory and non_blocking "
           "host-to-device copies)")


def _h2d(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    """Host-to-device copies per step: more copies, or more of them from unpinned memory,
    regress; a run on a CPU on both sides says there is no device."""
    bn, hn = _int(b.get("per_step")), _int(h.get("per_step"))
    if bn is None or hn is None:
        return None
    bu, hu = _int(b.get("unpinned_per_step")) or 0, _int(h.get("unpinned_per_step")) or 0
    note = why = ""
    worse = hn > bn or hu > bu  # more copies, or more of them from unpinned memory
    better = not worse and (hn < bn or hu < bu)
    if b.get("device") == "cpu" and h.get("device") == "cpu" and not (bn or hn):
        row = _row("h2d_copies_per_step", bn, hn, 0.0, _EXACT, Kind.SLOPE, "copies/step",
                   "copies/step", False, False, "")
        return dataclasses.replace(row, note="no device: nothing to copy to")  # said, no cause
    if hn != bn or hu != bu:
        moved = (_int(h.get("bytes_per_step")) or 0) - (_int(b.get("bytes_per_step")) or 0)
        size = f", {'+' if moved >= 0 else '-'}{_bytes(abs(moved))}" if moved else ""
        unpinned = f", {hu - bu:+d} of them from unpinned memory" if hu != bu else ""
        count = f"{hn - bn:+d}" if hn != bn else str(hn)
        note = (f"{count} host-to-device copies per step{size}{unpinned}"
                f"{_top_at(h if hn >= bn else b)}")
        if worse:
            why = f": {H2D_FIX}"
    return _row("h2d_copies_per_step", bn, hn, float(hn - bn), _EXACT, Kind.SLOPE,
                "copies/step", "copies/step", worse, better, note, why)


#: What to do about more graph breaks or recompiles under torch.compile.
COMPILE_FIX = ("each graph break runs Python between compiled graphs and each recompile compiles "
               "again: remove the breaking call or move it out of the compiled code, keep shapes "
               "fixed or mark them dynamic (torch.compile troubleshooting: graph breaks, "
               "recompilation)")


def _compile(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    """torch.compile over the run: more graph breaks, or more frames compiled (recompiles),
    regress, naming the new breaks' reasons."""
    bn, hn = _int(b.get("graph_breaks")), _int(h.get("graph_breaks"))
    bf, hf = _int(b.get("frames")), _int(h.get("frames"))
    if bn is None or hn is None or bf is None or hf is None:
        return None
    worse = hn > bn or hf > bf  # either rose: more breaks, or more recompiles
    better = not worse and (hn < bn or hf < bf)
    note = why = ""
    if (hn, hf) != (bn, bf):
        parts = [f"{hn - bn:+d} graph breaks"] if hn != bn else []
        parts += [f"{hf - bf:+d} frames compiled (recompiles)"] if hf != bf else []
        old = {str(x.get("reason")) for x in b.get("top_breaks") or [] if isinstance(x, Mapping)}
        new = [str(x.get("reason")) for x in h.get("top_breaks") or []
               if isinstance(x, Mapping) and str(x.get("reason")) not in old]
        note = "torch.compile: " + ", ".join(parts) + (f" ({new[0]})" if new and worse else "")
        if worse:
            why = f": {COMPILE_FIX}"
    return _row("compile_graph_breaks", bn, hn, float(hn - bn), _EXACT, Kind.SLOPE, "breaks",
                "breaks", worse, better, note, why)


#: Python calls per step may move this much before the row is judged, the user's own and the
#: libraries' apart (the larger of each pair). The user's code runs the same calls on every run
#: but for a signal handler or a finalizer of theirs; the libraries' follow what the code asks
#: of them -- torch's foreach ``clip_grad_norm_`` groups tensors in Python, 65 calls more than
#: its per-parameter loop though it runs 54 ops fewer -- so only a large move of theirs (an
#: anomaly mode's hooks) is news. tracer/pycalls.py leaves out traceml-ci's own housekeeping
#: and the DataLoader's polling, which moved unchanged code by 14 calls before.
PY_USER_FLOOR = 5
PY_USER_FLOOR_PCT = 2.0
PY_LIBRARY_FLOOR = 200
PY_LIBRARY_FLOOR_PCT = 25.0
_PY_CALLS = Rule(abs=PY_USER_FLOOR, rel=PY_USER_FLOOR_PCT, direction=Direction.WORSE)


def _past(b: int, h: int, floor: int, pct: float) -> bool:
    return abs(h - b) > max(floor, pct / 100 * b)


def _python(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    """Python calls per step: more in the user's code or in the libraries, each past its floor,
    regress, naming the user's functions whose calls rose (else the libraries' share); a move
    within the floors is said."""
    bn, hn = _int(b.get("per_step")), _int(h.get("per_step"))
    if bn is None or hn is None:
        return None
    note = why = ""
    if hn != bn:
        def funcs(block: Mapping[str, Any]) -> dict[tuple[str, str], int]:
            out: dict[tuple[str, str], int] = {}
            items = block.get("top_user")
            for f in items if isinstance(items, list) else ():
                n = _int(f.get("calls")) if isinstance(f, Mapping) else None
                if n is not None and isinstance(f.get("at"), str):
                    out[(str(f.get("function") or "?"), f["at"])] = n
            return out

        bf, hf = funcs(b), funcs(h)
        moves = sorted(((hf.get(k, 0) - bf.get(k, 0), k) for k in set(bf) | set(hf)),
                       key=lambda m: (-abs(m[0]), m[1]))
        named = [f"{d:+d} {name}() at {at}" for d, (name, at) in moves if d][:SITES_NAMED]
        parts = [f"user code {hu - bu:+d}" for bu, hu in [(_int(b.get("user")) or 0,
                                                             _int(h.get("user")) or 0)] if hu != bu]
        parts += [f"libraries {hl - bl:+d}" for bl, hl in [(_int(b.get("library")) or 0,
                                                            _int(h.get("library")) or 0)]
                  if hl != bl]
        detail = "; ".join(named) or ", ".join(parts)
        note = f"{hn - bn:+d} Python calls per step" + (f" ({detail})" if detail else "")
    bu, hu = _int(b.get("user")) or 0, _int(h.get("user")) or 0
    bl, hl = _int(b.get("library")) or 0, _int(h.get("library")) or 0
    user_past = _past(bu, hu, PY_USER_FLOOR, PY_USER_FLOOR_PCT)
    library_past = _past(bl, hl, PY_LIBRARY_FLOOR, PY_LIBRARY_FLOOR_PCT)
    worse = (user_past and hu > bu) or (library_past and hl > bl)
    better = not worse and ((user_past and hu < bu) or (library_past and hl < bl))
    past = worse or better
    if worse:
        why = (": per-step Python work no ATen op shows -- move it out of the step, or "
               "batch it into tensor ops")
    row = _row("python_calls_per_step", bn, hn, float(hn - bn), _PY_CALLS, Kind.SLOPE,
               "calls/step", "calls/step", worse, better, note if past else "", why)
    if note and not past:  # said, no cause: what the same code may do
        row = dataclasses.replace(row, note=f"within the floor: {note}")
    return row


def _input(b: Mapping[str, Any], h: Mapping[str, Any]) -> Row | None:
    """ATen ops per batch in the input pipeline (``counters.input``; gate/input_counts.py)."""
    return input_row(b, h)


#: Rows whose counts follow torch's own Python (its decompositions, its modules' code): not
#: judged across torch minor versions.
_BY_TORCH = (_ops, _allocs, _graph, _python, _input, _compile)


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
    return _row("optimizer", bn, hn, None, _ANY, Kind.LABEL, "", "", bool(note), False, note, why,
                Evidence.SETTING)


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
    return _row("flops_per_step", bn, hn, rel, _FLOPS, Kind.RATE, "FLOP", "%", moved, False, note)


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
    bn, hn = _int(b.get("elements")), _int(h.get("elements"))
    if bn is None or hn is None:
        return None
    note = f"parameters {bn:,} → {hn:,}" if bn != hn else ""
    return _row(
        "parameters", float(bn), float(hn), None, None, Kind.SLOPE, "", "", False, False, note
    )
