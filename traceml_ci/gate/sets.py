"""Set comparison: baseline sets (one summary per key, e.g. per test id) compared key by key,
and the one verdict of a set from its per-key comparisons.
"""

from __future__ import annotations

from collections.abc import Mapping

from traceml_ci.gate.compare import compare
from traceml_ci.gate.results import Comparison, SetComparison, Verdict
from traceml_ci.gate.rules import DEFAULT_RULES, Rules
from traceml_ci.summary.view import SummaryLike

#: Reasons list at most this many keys, then "(+N more)".
MAX_KEYS_LISTED = 10


def _keys(keys: list[str]) -> str:
    shown = ", ".join(keys[:MAX_KEYS_LISTED])
    return shown + (
        f" (+{len(keys) - MAX_KEYS_LISTED} more)" if len(keys) > MAX_KEYS_LISTED else ""
    )


def compare_sets(
    base: Mapping[str, SummaryLike],
    head: Mapping[str, SummaryLike],
    rules: Rules = DEFAULT_RULES,
    *,
    allow_env_mismatch: bool = False,
) -> SetComparison:
    """Compare baseline sets key by key. Keys only in head are *added* (no baseline yet: fine);
    keys only in base are *removed* (a warning). Any regressed key makes a regression."""
    common = [k for k in base if k in head]
    items = {
        k: compare(base[k], head[k], rules, allow_env_mismatch=allow_env_mismatch) for k in common
    }
    added = [k for k in head if k not in base]
    removed = [k for k in base if k not in head]
    return set_comparison(items, added, removed, rules.source)


def set_comparison(
    items: Mapping[str, Comparison],
    added: list[str],
    removed: list[str],
    rules_source: str = "defaults",
    notes: list[str] | None = None,
) -> SetComparison:
    """A SetComparison from per-key comparisons already made (``compare_sets``, or the pytest
    plugin, which compares each test as it finishes and must not compare it again).
    ``notes``: extra reasons, listed last (e.g. baseline keys a test session did not run)."""
    items = dict(items)
    reasons: list[str] = []
    verdicts = [c.verdict for c in items.values()]
    regressed = [k for k, c in items.items() if c.verdict is Verdict.REGRESSION]
    if regressed:
        verdict = Verdict.REGRESSION
        reasons.append(f"{len(regressed)} of {len(items)} regressed: " + _keys(regressed))
    elif not items or all(v is Verdict.INCOMPARABLE for v in verdicts):
        verdict = Verdict.INCOMPARABLE
        reasons.append("no key in common" if not items else "no key could be compared")
    elif removed or any(v in (Verdict.WARN, Verdict.INCOMPARABLE) for v in verdicts):
        verdict = Verdict.WARN
    else:
        verdict = Verdict.PASS
    incomparable = [k for k, c in items.items() if c.verdict is Verdict.INCOMPARABLE]
    if incomparable and verdict is not Verdict.INCOMPARABLE:
        reasons.append("not comparable: " + _keys(incomparable))
    if added:
        reasons.append(f"{len(added)} added (no baseline yet): " + _keys(added))
    if removed:
        reasons.append(f"{len(removed)} removed (in base, not in head): " + _keys(removed))
    reasons += notes or []
    return SetComparison(verdict, items, list(added), list(removed), reasons, rules_source)
