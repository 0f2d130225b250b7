"""The counters of the PyTorch Performance Tuning Guide's (and FAQ's) items, compared
exactly: autograd history kept across steps, eval-mode forwards with autograd on, collectives,
host-to-device copies, torch.compile's graph breaks and recompiles, and Python calls per step
(past a floor). Each regressed row says the guide's fix."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from traceml_ci.gate.counted.rows import (
    EXACT,
    SITES_NAMED,
    byte_size,
    count,
    counter_row,
    plural,
    sites_of,
    top_at,
)
from traceml_ci.gate.metrics import Kind
from traceml_ci.gate.rules import Direction, Rule

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


def graph(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    """Autograd graph nodes a step made that are alive steps later: more regress, naming the
    line of the newest (what holds the history) and the lines that made the most."""
    bn, hn = count(b.get("nodes_kept_per_step")), count(h.get("nodes_kept_per_step"))
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
        after = count(side.get("after_steps")) or 0
        if hn > bn:
            note = (f"keeps {plural(hn - bn, 'autograd graph node')} more of each step alive "
                    f"{after} steps later (most made{top_at(h, 'top')}{held})")
            why = f": something holds each step's graph -- {HISTORY_FIX}"
        else:
            note = f"keeps {plural(bn - hn, 'autograd graph node')} fewer of each step alive"
    return counter_row("graph_nodes_kept_per_step", bn, hn, float(hn - bn), EXACT, Kind.SLOPE,
                "nodes/step", "nodes/step", hn > bn, hn < bn, note, why)


def eval_grad(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    """A traced model's eval-mode forwards with autograd on, per step: more regress."""
    bn, hn = count(b.get("per_step")), count(h.get("per_step"))
    if bn is None or hn is None:
        return None
    note = why = ""
    if hn > bn:
        note = (f"adds {plural(hn - bn, 'eval-mode forward')} with autograd on per step"
                f"{top_at(h)}")
        why = f": a graph built that no backward uses -- {EVAL_GRAD_FIX}"
    elif hn < bn:
        note = f"{plural(bn - hn, 'eval-mode forward')} per step no longer builds a graph"
    return counter_row("eval_forwards_with_grad_per_step", bn, hn, float(hn - bn), EXACT,
                Kind.SLOPE, "forwards/step", "forwards/step", hn > bn, hn < bn, note, why)


def collectives(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    """Collectives (c10d ops) per step, judged by the bytes they move, then by their count:
    more regress. (A count alone can mislead: DDP's one-time bucket rebuild broadcasts twice
    in whichever step it lands on, and under ``no_sync()`` that is the sampled one.) The note
    names the kinds that moved, their line and the bytes."""
    bn, hn = count(b.get("per_step")), count(h.get("per_step"))
    bb, hb = count(b.get("bytes_per_step")), count(h.get("bytes_per_step"))
    if bn is None or hn is None or bb is None or hb is None:
        return None
    bs, hs = sites_of(b, "sites", "count"), sites_of(h, "sites", "count")
    moves = sorted(((hs.get(k, 0) - bs.get(k, 0), k) for k in set(bs) | set(hs)),
                   key=lambda m: (-m[0], m[1]))
    moves = [(d, k) for d, k in moves if d]
    worse = (hb, hn) > (bb, bn) if hb != bb or hn != bn else False
    note = why = ""
    if moves or hn != bn or hb != bb:
        named = [f"{d:+d} {op} per step" + (f" at {at}" if d > 0 else "")
                 for d, (at, op) in moves[:SITES_NAMED]]
        size = (f" ({'+' if hb >= bb else '-'}{byte_size(abs(hb - bb))} per step)"
                if hb != bb else "")
        note = f"collectives: {'; '.join(named) or f'{hn - bn:+d} per step'}{size}"
        if worse:
            why = f": {COLLECTIVES_FIX}"
    return counter_row("collectives_per_step", bn, hn, float(hn - bn), EXACT, Kind.SLOPE,
                "calls/step", "calls/step", worse, not worse and (hb, hn) != (bb, bn), note, why)


#: What to do about more host-to-device copies, or copies from unpinned memory.
H2D_FIX = ("copy each batch once, from pinned memory: DataLoader(pin_memory=True) and "
           "`.to(device, non_blocking=True)` (Tuning Guide: use pinned memory and non_blocking "
           "host-to-device copies)")


def h2d(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    """Host-to-device copies per step: more copies, or more of them from unpinned memory,
    regress; a run on a CPU on both sides says there is no device."""
    bn, hn = count(b.get("per_step")), count(h.get("per_step"))
    if bn is None or hn is None:
        return None
    bu, hu = count(b.get("unpinned_per_step")) or 0, count(h.get("unpinned_per_step")) or 0
    note = why = ""
    worse = hn > bn or hu > bu  # more copies, or more of them from unpinned memory
    better = not worse and (hn < bn or hu < bu)
    if b.get("device") == "cpu" and h.get("device") == "cpu" and not (bn or hn):
        row = counter_row("h2d_copies_per_step", bn, hn, 0.0, EXACT, Kind.SLOPE, "copies/step",
                   "copies/step", False, False, "")
        return dataclasses.replace(row, note="no device: nothing to copy to")  # said, no cause
    if hn != bn or hu != bu:
        moved = (count(h.get("bytes_per_step")) or 0) - (count(b.get("bytes_per_step")) or 0)
        size = f", {'+' if moved >= 0 else '-'}{byte_size(abs(moved))}" if moved else ""
        unpinned = f", {hu - bu:+d} of them from unpinned memory" if hu != bu else ""
        copies = f"{hn - bn:+d}" if hn != bn else str(hn)
        note = (f"{copies} host-to-device copies per step{size}{unpinned}"
                f"{top_at(h if hn >= bn else b)}")
        if worse:
            why = f": {H2D_FIX}"
    return counter_row("h2d_copies_per_step", bn, hn, float(hn - bn), EXACT, Kind.SLOPE,
                "copies/step", "copies/step", worse, better, note, why)


#: What to do about more graph breaks or recompiles under torch.compile.
COMPILE_FIX = ("each graph break runs Python between compiled graphs and each recompile compiles "
               "again: remove the breaking call or move it out of the compiled code, keep shapes "
               "fixed or mark them dynamic (torch.compile troubleshooting: graph breaks, "
               "recompilation)")


def compile_breaks(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    """torch.compile over the run: more graph breaks, or more frames compiled (recompiles),
    regress, naming the new breaks' reasons."""
    bn, hn = count(b.get("graph_breaks")), count(h.get("graph_breaks"))
    bf, hf = count(b.get("frames")), count(h.get("frames"))
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
    return counter_row("compile_graph_breaks", bn, hn, float(hn - bn), EXACT, Kind.SLOPE, "breaks",
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


def _functions(block: Mapping[str, Any]) -> dict[tuple[str, str], int]:
    """(function, line of its def) -> calls per step of the user's functions listed."""
    out: dict[tuple[str, str], int] = {}
    items = block.get("top_user")
    for f in items if isinstance(items, list) else ():
        n = count(f.get("calls")) if isinstance(f, Mapping) else None
        if n is not None and isinstance(f.get("at"), str):
            out[(str(f.get("function") or "?"), f["at"])] = n
    return out


def _calls(block: Mapping[str, Any]) -> tuple[int, int]:
    """(the user's calls, the libraries') per step."""
    return count(block.get("user")) or 0, count(block.get("library")) or 0


def _python_note(b: Mapping[str, Any], h: Mapping[str, Any], moved: int) -> str:
    """``+9 Python calls per step (+9 progress() at train.py:17)``: the user's functions whose
    calls moved most, else how the user's and the libraries' calls moved."""
    bf, hf = _functions(b), _functions(h)
    moves = sorted(((hf.get(k, 0) - bf.get(k, 0), k) for k in set(bf) | set(hf)),
                   key=lambda m: (-abs(m[0]), m[1]))
    named = [f"{d:+d} {name}() at {at}" for d, (name, at) in moves if d][:SITES_NAMED]
    (bu, bl), (hu, hl) = _calls(b), _calls(h)
    parts = [f"user code {hu - bu:+d}"] if hu != bu else []
    parts += [f"libraries {hl - bl:+d}"] if hl != bl else []
    detail = "; ".join(named) or ", ".join(parts)
    return f"{moved:+d} Python calls per step" + (f" ({detail})" if detail else "")


def python(b: Mapping[str, Any], h: Mapping[str, Any]) -> Any:
    """Python calls per step: more in the user's code or in the libraries, each past its floor,
    regress, naming the user's functions whose calls rose (else the libraries' share); a move
    within the floors is said."""
    bn, hn = count(b.get("per_step")), count(h.get("per_step"))
    if bn is None or hn is None:
        return None
    note = _python_note(b, h, hn - bn) if hn != bn else ""
    (bu, bl), (hu, hl) = _calls(b), _calls(h)
    user_past = _past(bu, hu, PY_USER_FLOOR, PY_USER_FLOOR_PCT)
    library_past = _past(bl, hl, PY_LIBRARY_FLOOR, PY_LIBRARY_FLOOR_PCT)
    worse = (user_past and hu > bu) or (library_past and hl > bl)
    better = not worse and ((user_past and hu < bu) or (library_past and hl < bl))
    why = (": per-step Python work no ATen op shows -- move it out of the step, or batch it "
           "into tensor ops") if worse else ""
    row = counter_row("python_calls_per_step", bn, hn, float(hn - bn), _PY_CALLS, Kind.SLOPE,
                      "calls/step", "calls/step", worse, better,
                      note if worse or better else "", why)
    if note and not (worse or better):  # said, no cause: what the same code may do
        row = dataclasses.replace(row, note=f"within the floor: {note}")
    return row
