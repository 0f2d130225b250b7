"""One judgement for every front door: base and head summaries by key in, the comparison out.

``diff``, ``report`` and the pytest plugin all call :func:`judge`, so "one run each, or baseline
sets key by key" is decided here once (the Action reads the plugin's comparison back).
"""

from __future__ import annotations

from collections.abc import Mapping

from traceml_ci.gate.results import Comparison, SetComparison
from traceml_ci.gate.rules import DEFAULT_RULES, Rules
from traceml_ci.summary.view import SummaryLike

Summaries = Mapping[str, SummaryLike]


def judge(
    base: Summaries,
    head: Summaries,
    rules: Rules = DEFAULT_RULES,
    *,
    allow_env_mismatch: bool = False,
) -> Comparison | SetComparison:
    """Compare ``head`` with ``base``, each a mapping of summaries by key (as
    ``LoadedInput.summaries``: a single summary is one entry, keyed by its run name or file
    stem).

    One summary on each side -- two runs, or a baseline set of one -- is one Comparison of the
    two, whatever their keys (the same job, renamed or not). Otherwise a SetComparison, key by
    key: keys only in head are added, keys only in base removed.
    """
    # The modules are looked up at call time, so what they export is what runs (a test
    # replacing ``traceml_ci.gate.compare.compare`` reaches every front door).
    if len(base) == 1 and len(head) == 1:
        from traceml_ci.gate.compare import compare

        (b,), (h,) = base.values(), head.values()
        return compare(b, h, rules, allow_env_mismatch=allow_env_mismatch)
    from traceml_ci.gate.sets import compare_sets

    return compare_sets(base, head, rules, allow_env_mismatch=allow_env_mismatch)
