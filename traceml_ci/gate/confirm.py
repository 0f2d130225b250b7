"""Evidence before a failure: when one more run of a job is worth its cost, and the sequential
procedure that gathers it (docs/gate.md, "Confirmation").

A single run on a shared machine is one sample of a noisy quantity: identical runs of a job
spread over several points of share, so a real +8 pp shift sometimes shows as +4 pp, and a
disturbed run sometimes shows a shift that is not there. The procedure, as in sequential
testing: judge the first run; if it is clean, stop (a clean change pays one run); if a
*measured* figure regressed, or came close (a device-clock share past its warn tier), run the
job again -- never for a count or a setting, which every run gives alike -- up to
``max_reruns`` times, judging all runs combined after each, and stop as soon as the combination
is clean. A combination that still regresses fails only if the re-runs on their own regress
too: one badly disturbed first run can outweigh clean re-runs in a mean of shares.

Pure: the caller supplies how to judge a list of runs and how to make one more.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from traceml_ci.gate.compare import Comparison, Verdict, contention_bound_pp
from traceml_ci.gate.metrics import Kind
from traceml_ci.gate.results import Status
from traceml_ci.gate.rules import Direction
from traceml_ci.summary.keys import DEFAULT_CONFIRM_RERUNS, PHASES
from traceml_ci.summary.view import SummaryView

R = TypeVar("R")
Doc = Mapping[str, Any]


def worth_confirming(comparison: Comparison, base: Doc, head: Doc) -> bool:
    """Whether one more run could change ``comparison``'s verdict: only a figure that was
    *measured* -- a time, memory -- can come out otherwise on another run. A count or a setting
    is the same on every run of the same code, so a regression they decide is not re-run for
    (nor is anything else then: the verdict stands), and a clean one costs one run.

    Worth it: a measured row regressed, or a phase share judged by its rule's own tiers (timed
    with device events, or a rule that says ``fail = true``) moved the worse way past its warn
    tier (the noise aside) by more than the contention either side measured can explain. On a
    host clock a share otherwise fails only past its band (gate/judging.py, HOST_BANDS): short
    of it, no re-run."""
    rows = comparison.rows
    if any(r.status is Status.REGRESSED and r.evidence.exact for r in rows):
        return False
    if comparison.verdict is Verdict.REGRESSION:
        return True
    base_wait = SummaryView(base).runqueue_wait_pct
    head_wait = SummaryView(head).runqueue_wait_pct
    for row in rows:
        tol = row.tolerance
        phase = row.name.removeprefix("step_time.").removesuffix("_pct")
        if (tol is None or not tol.fails or tol.kind is not Kind.PCT or phase not in PHASES
                or tol.informs  # judged by the host clock's band: short of it, nothing close
                or not all(_is_number(v) for v in (row.delta, row.base, row.head))):
            continue
        rule = tol.rule
        worse = abs(row.delta) if rule.direction is Direction.ANY else row.delta
        tier = rule.warn_abs if rule.warn_abs is not None else rule.abs
        if tier is None or worse < tier:
            continue
        if worse > contention_bound_pp(row.delta, row.base, row.head, base_wait, head_wait):
            return True
    return False


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Confirmation(Generic[R]):
    """What the procedure decided. ``result``: the final judgement (of all runs combined, or of
    the re-runs alone when the first run was the odd one out); ``docs``: every run made;
    ``reruns``: how many of them were re-runs."""

    result: R
    docs: list[Doc]
    reruns: int
    #: The judgement of the first run (or its repeats) alone.
    first: R
    #: The runs combined regressed, the re-runs alone did not: ``result`` is the re-runs'.
    first_run_discounted: bool = False


def confirm(
    docs: Sequence[Doc],
    judge: Callable[[Sequence[Doc]], R],
    *,
    regressed: Callable[[R], bool],
    suspect: Callable[[R], bool],
    rerun: Callable[[], Doc] | None,
    max_reruns: int = DEFAULT_CONFIRM_RERUNS,
) -> Confirmation[R]:
    """Judge ``docs`` (the first run, or its repeats), then gather evidence as the module says.

    ``judge``: runs -> judgement (combining several); ``regressed``: whether a judgement is a
    regression; ``suspect``: whether another run could change it (typically
    ``worth_confirming``: a measured regression, or a close share; never a count's);
    ``rerun``: one more run of the job (None: judge once)."""
    docs = list(docs)
    first = len(docs)
    result = first_result = judge(docs)
    reruns = 0
    while rerun is not None and reruns < max_reruns and suspect(result):
        docs.append(rerun())
        reruns += 1
        result = judge(docs)
    if reruns and regressed(result):
        alone = judge(docs[first:])
        if not regressed(alone):
            return Confirmation(alone, docs, reruns, first_result, first_run_discounted=True)
    return Confirmation(result, docs, reruns, first_result)
