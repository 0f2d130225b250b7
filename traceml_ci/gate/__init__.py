"""The regression gate: compare a head summary with a base, decide, render.

Imports neither torch nor pandas (``history`` imports pandas lazily, and is not re-exported).
"""

from __future__ import annotations

from traceml_ci.gate.compare import (
    Comparison,
    Row,
    SetComparison,
    Status,
    Verdict,
    compare,
)
from traceml_ci.gate.inputs.files import (
    BASELINE_SET_VERSION,
    load_input,
    read_baseline_set,
    write_baseline_set,
)
from traceml_ci.gate.judge import judge
from traceml_ci.gate.render.comparison import render_json, render_markdown, render_text
from traceml_ci.gate.rules import DEFAULT_RULES, Rule, Rules, load_rules
from traceml_ci.gate.sets import compare_sets, set_comparison

__all__ = [
    "BASELINE_SET_VERSION",
    "DEFAULT_RULES",
    "Comparison",
    "Row",
    "Rule",
    "Rules",
    "SetComparison",
    "Status",
    "Verdict",
    "compare",
    "compare_sets",
    "judge",
    "load_input",
    "load_rules",
    "read_baseline_set",
    "render_json",
    "render_markdown",
    "render_text",
    "set_comparison",
    "write_baseline_set",
]
