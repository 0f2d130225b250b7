"""The input pipeline's row (summary ``counters.input``, tracer/inputs.py): ATen ops per batch
in ``Dataset.__getitem__`` and ``collate_fn`` together, compared exactly -- a heavier
augmentation or a heavier collate regresses, a lighter one improves.

Not judged (said, never failed) where the two runs' counts do not measure the same thing: a
batch of another size (ops per batch follow it; the batch_size setting row names that change),
or ``num_workers`` 0 on one side and more on the other (torch's default collate stacks into
shared memory in a worker: other ops, same code; the num_workers row names it). Nor across
torch minor versions (gate/counted/counters.py: its decompositions change).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from traceml_ci.gate.metrics import Kind
from traceml_ci.gate.results import COUNTERS_PREFIX, Evidence, Row, Status, Tolerance
from traceml_ci.gate.rules import Direction, Rule
from traceml_ci.summary.view import finite, op_kind_moves

#: The row's name.
NAME = COUNTERS_PREFIX + "input_ops_per_batch"
#: Op kinds named in a note (the largest moves first).
KINDS_NAMED = 3
#: The block's parts, and how a note names where each runs.
PARTS = ("fetch", "collate")
#: What to do about more work in each part (the PyTorch Performance Tuning Guide's words).
FETCH_FIX = ("move fixed transforms off the per-sample path (compute them once, or on the whole "
             "batch on the device) (Tuning Guide: enable async data loading and augmentation)")
COLLATE_FIX = ("keep per-sample Python and tensor work out of collate_fn; torch's default "
               "collate stacks a batch in one op (into shared memory with workers) (Tuning "
               "Guide: enable async data loading and augmentation)")

_EXACT = Rule(abs=0.0, direction=Direction.WORSE)


def _int(x: Any) -> int | None:
    v = finite(x)
    return None if v is None else int(v)


def _total(block: Mapping[str, Any]) -> int | None:
    parts = [block.get(p) for p in PARTS]
    if not all(isinstance(p, Mapping) for p in parts):
        return None
    counts = [_int(p.get("per_batch")) for p in parts]  # type: ignore[union-attr]
    return None if any(n is None for n in counts) else sum(counts)  # type: ignore[arg-type]


def _where(block: Mapping[str, Any], part: str) -> str:
    if part == "collate":
        return "collate_fn"
    name = block.get("dataset")
    return str(name) if isinstance(name, str) and name else "Dataset.__getitem__"


def _moves(b: Mapping[str, Any], h: Mapping[str, Any]) -> list[tuple[int, str, str, str]]:
    """(change, op, line, part) per op kind and part that surely moved (summary/view.py's
    ``op_kind_moves``; the change: the least it moved by). The line is the side's that gained
    (lost) the ops: the line that ran the most of that kind -- "" where the other side names
    another line for it (a kind run at several lines: which of them moved the summary does
    not say)."""
    moves = []
    for part in PARTS:
        bp, hp = b.get(part), h.get(part)
        if not isinstance(bp, Mapping) or not isinstance(hp, Mapping):
            continue
        for m in op_kind_moves(bp, hp):
            other = m.base if m.change > 0 else m.head
            at = "" if other is not None and other[1] != m.line else m.line
            moves.append((m.change, m.op, at, part))
    return moves


def _per(d: int, samples: int | None) -> str:
    """``+1 convolution per sample`` when the batch's samples divide the move, else per batch."""
    if samples and d % samples == 0:
        return f"{d // samples:+d} {{op}} per sample"
    return f"{d:+d} {{op}} per batch"


def input_row(b: Mapping[str, Any], h: Mapping[str, Any]) -> Row | None:
    """ATen ops per batch in the input pipeline: more regress, naming the op kinds that rose
    most, their lines and where they run (the Dataset's method, or collate_fn), with the Tuning
    Guide's fix; fewer improve."""
    bn, hn = _total(b), _total(h)
    if bn is None or hn is None:
        return None
    tol = Tolerance(_EXACT, Kind.SLOPE, "ops/batch")
    unit = "ops/batch"
    bs, hs = _int(b.get("samples")), _int(h.get("samples"))
    bw, hw = _int(b.get("workers")) or 0, _int(h.get("workers")) or 0
    unlike = ""
    if bs is not None and hs is not None and bs != hs:
        unlike = f"not judged: batches of {bs} → {hs} samples"
    elif (bw == 0) != (hw == 0):
        unlike = f"not judged: num_workers {bw} → {hw} (a worker's collate runs other ops)"
    if unlike:
        return Row(NAME, bn, hn, float(hn - bn), tol, Status.OK, unit, unit, None,
                   unlike if hn != bn else "", "", Evidence.COUNT)
    moves = _moves(b, h)
    # the largest moves the way the total went first; of equal ones, those with a sure line
    moves.sort(key=lambda m: (-m[0] if hn >= bn else m[0], not m[2], m[3], m[1]))
    samples = hs if hs == bs else None
    named = [_per(d, samples).format(op=op) + (f" at {at}" if at else "")
             + f" in {_where(h if d > 0 else b, part)}" for d, op, at, part in moves[:KINDS_NAMED]]
    cause = why = ""
    if hn != bn:
        cause = (f"{hn - bn:+d} ATen ops per batch in the input pipeline"
                 + (f" ({'; '.join(named)})" if named else ""))
        if hn > bn:
            # the part whose ops per batch grew most (a Python collate's many small ops may
            # all be among the kinds not listed)
            part = max(("fetch", "collate"), key=lambda p: _part_ops(h, p) - _part_ops(b, p))
            if part == "collate":
                why = f": a heavier collate_fn -- {COLLATE_FIX}"
            else:
                place = " in the workers" if hw else ""
                why = f": heavier augmentation{place} -- {FETCH_FIX}"
    elif named:
        cause = f"same ops per batch in the input pipeline, other kinds: {'; '.join(named)}"
    status = Status.REGRESSED if hn > bn else Status.IMPROVED if hn < bn else Status.OK
    note = cause + why if cause else ""
    return Row(NAME, bn, hn, float(hn - bn), tol, status, unit, unit, None, note, cause,
               Evidence.COUNT)


def _part_ops(block: Mapping[str, Any], part: str) -> int:
    """The ATen ops per batch of one part (``fetch``, ``collate``) of an input block."""
    entry = block.get(part)
    value = entry.get("per_batch") if isinstance(entry, Mapping) else None
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0
