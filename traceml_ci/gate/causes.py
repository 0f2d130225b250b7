"""What a comparison knows changed between base and head, named the way a headline names it:
a setting (gate/counted/settings.py), a new straggler (which rank, in which phase, who waits
for it), the
optimizer, the FLOPs per step and the modules that moved them, the scalar reads per step and
their lines, the bytes kept from each step, the parameters.

Pure: two summaries and the comparison's rows in, short plain strings out, the surest first.
The counters' wording is theirs (each counter row's ``cause``, gate/counted/counters.py),
defined once;
only the DataLoader's is written here. The strings hold text from the summaries (module names,
file paths): each renderer escapes them for its medium.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from traceml_ci.gate.counted.counters import ECHO_ROWS
from traceml_ci.gate.counted.settings import PREFIX as SETTINGS_PREFIX
from traceml_ci.gate.counted.settings import SETTINGS, Setting
from traceml_ci.gate.results import COUNTERS_PREFIX, Row, Status
from traceml_ci.summary.ranks import BALANCED, phase_excess_ms
from traceml_ci.summary.view import SummaryLike, as_view, finite

#: The DataLoader's settings (``step_time.dataloader``), named together in one cause, in the
#: order gate/counted/settings.py compares them. ``device`` is the run's, not the loader's: a
#: changed
#: device is the environment fingerprint's (gate/context.py).
DATALOADER_SETTINGS: tuple[Setting, ...] = tuple(
    s for s in SETTINGS if s.block == ("step_time", "dataloader")
)

#: The counter rows whose causes are named, in priority order: what the code was told to do
#: differently (optimizer), the collectives and validation forwards a step adds, how much work
#: a step does (FLOPs), then what it does per step that costs (scalar reads, the input
#: pipeline's ops per batch, ATen ops, bytes and graphs kept, Python calls), then the model's
#: size (said, never judged). A row that regressed is named before one that did not, whatever
#: its place here.
COUNTER_ORDER: tuple[str, ...] = tuple(
    COUNTERS_PREFIX + name
    for name in (
        "optimizer",
        "compile_graph_breaks",
        "collectives_per_step",
        "h2d_copies_per_step",
        "eval_forwards_with_grad_per_step",
        "flops_per_step",
        "syncs_per_step",
        "input_ops_per_batch",
        "graph_nodes_kept_per_step",
        "ops_per_step",
        "allocs_per_step",
        "retained_bytes_per_step",
        "python_calls_per_step",
        "parameters",
    )
)


#: The ATen ops, Python calls and allocations rows follow from most other changes (AdamW runs
#: more ops, more of torch's Python and more allocations than SGD; a .item() runs
#: _local_scalar_dense): they name the cause only where nothing surer did (a
#: zero_grad(set_to_none=False), a foreach=False clip, a copy or a log line each step), and
#: then only the first of them in this order. Their rows are judged all the same.
OPS_ROW = COUNTERS_PREFIX + "ops_per_step"


def surest(rows: Iterable[Row]) -> list[Row]:
    """``rows`` less the rows that echo another, the regressed rows and the others each on
    their own (an improved row never hides the one regression): every echo row where another
    row is there to name the change, else all echo rows but the first (``ECHO_ROWS``'
    order). The regressed first."""
    rows = list(rows)
    regressed = [r for r in rows if r.status is Status.REGRESSED]
    return _unechoed(regressed) + _unechoed([r for r in rows if r.status is not Status.REGRESSED])


def _unechoed(rows: list[Row]) -> list[Row]:
    if any(r.name not in ECHO_ROWS for r in rows):
        return [r for r in rows if r.name not in ECHO_ROWS]
    present = [name for name in ECHO_ROWS if any(r.name == name for r in rows)]
    return [r for r in rows if r.name == present[0]] if present else rows


def known_causes(
    base: SummaryLike,
    head: SummaryLike,
    rows: Iterable[Row],
) -> list[str]:
    """The causes the summaries name, in priority order: the DataLoader's changed settings,
    a straggler head has and base had not, then each counter row that changed (its ``cause``).
    Empty when nothing known changed."""
    causes = []
    loader = dataloader_change(base, head)
    if loader:
        causes.append(loader)
    straggler = straggler_change(base, head)
    if straggler:
        causes.append(straggler)
    loader_rows = {SETTINGS_PREFIX + x.name for x in DATALOADER_SETTINGS}
    rows = list(rows)
    causes += [r.cause for r in rows
               if r.name.startswith(SETTINGS_PREFIX) and r.name not in loader_rows and r.cause]
    by_name = {r.name: r for r in rows}
    named = [r for r in (by_name.get(name) for name in COUNTER_ORDER)
             if r is not None and r.cause]
    if causes:  # a setting or a straggler names it already: the echo rows would only echo it
        named = [r for r in named if r.name not in ECHO_ROWS]
    return causes + [r.cause for r in surest(named)]


def label(count: int, *, passed: bool) -> str:
    """What a headline calls its ``count`` causes: the ``cause``/``causes`` of a regression, a
    warning or an undecided result; on a pass only what ``changed`` (nothing to fix)."""
    if not count:
        return ""
    if passed:
        return "changed"
    return "cause" if count == 1 else "causes"


def _value(x: Any) -> str:
    return "none" if x is None else str(x)


def dataloader_change(
    base: SummaryLike, head: SummaryLike
) -> str:
    """``DataLoader num_workers 2 → 0, pin_memory True → False``; ``DataLoader in base only``
    when head recorded that it iterated none (and the other way); empty when nothing changed or
    either side does not say (an older or a mapped summary)."""
    st_b, st_h = as_view(base).step_time, as_view(head).step_time
    if "dataloader" not in st_b or "dataloader" not in st_h:
        return ""
    b, h = st_b.get("dataloader"), st_h.get("dataloader")
    if isinstance(b, Mapping) and isinstance(h, Mapping):
        changed = [
            f"{s.key} {_value(b.get(s.key))} → {_value(h.get(s.key))}"
            for s in DATALOADER_SETTINGS
            if s.key in b and s.key in h and b.get(s.key) != h.get(s.key)
            and s.applies(b) and s.applies(h)
        ]
        return "DataLoader " + ", ".join(changed) if changed else ""
    if isinstance(b, Mapping) and h is None:
        return "DataLoader in base only (head recorded none)"
    if b is None and isinstance(h, Mapping):
        return "DataLoader in head only (base recorded none)"
    return ""


#: Ranks named one by one as the ones that wait; beyond this, counted ("the other 7 ranks").
WAITERS_NAMED = 4


def _straggler(summary: SummaryLike) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    """A merged summary's ``distributed`` block and its straggler analysis; None for one
    process or a summary that names no straggler."""
    block = as_view(summary).at(("distributed",))
    if not isinstance(block, Mapping):
        return None
    s = block.get("straggler")
    if not isinstance(s, Mapping) or s.get("label") in (None, BALANCED):
        return None
    if isinstance(s.get("rank"), bool) or not isinstance(s.get("rank"), int):
        return None
    return block, s


def _waiters(block: Mapping[str, Any], rank: int) -> str:
    """The ranks that wait for ``rank``: ``rank 0``, ``ranks 0, 2, 3`` or ``the other 7
    ranks``, with the verb that goes with them."""
    rows = [r for r in block.get("ranks") or [] if isinstance(r, Mapping)]
    others = [r.get("rank") for r in rows if r.get("rank") != rank]
    reported = block.get("ranks_reported")
    count = reported - 1 if isinstance(reported, int) and reported > len(rows) else len(others)
    if count == len(others) and 0 < count <= WAITERS_NAMED:
        if count == 1:
            return f"rank {others[0]} waits"
        return "ranks " + ", ".join(str(x) for x in others) + " wait"
    return f"the other {count} ranks wait"


def straggler_change(base: SummaryLike, head: SummaryLike) -> str:
    """``rank 1 straggles in backward (+6.2 ms per step over the other ranks), rank 0 waits
    7.9 ms per step for it`` when head's merged summary names a straggler base did not (none,
    another rank or another phase); empty otherwise, or for single-process summaries."""
    b, h = _straggler(base), _straggler(head)
    key_b = None if b is None else (b[1].get("rank"), b[1].get("cause"))
    key_h = None if h is None else (h[1].get("rank"), h[1].get("cause"))
    # A straggler that went away is no cause of anything: the straggler row says it improved.
    if h is None or key_b == key_h:
        return ""
    block, s = h
    rank, cause = s["rank"], s.get("cause")
    rows = [r for r in block.get("ranks") or [] if isinstance(r, Mapping)]
    mine = next((r for r in rows if r.get("rank") == rank), None)
    others = [r for r in rows if r is not mine]
    excess = (
        phase_excess_ms(mine, others, cause) if mine is not None and others and cause else None
    )
    where = f"in {cause}" if cause else "in its own work"
    text = f"rank {rank} straggles {where}"
    if excess is not None:
        text += f" ({excess:+.1f} ms per step over the other ranks)"
    late = finite(s.get("lateness_ms"))
    waits = _waiters(block, rank)
    if late is not None:
        return f"{text}, {waits} {late:.1f} ms per step for it"
    return f"{text}, {waits} for it"
