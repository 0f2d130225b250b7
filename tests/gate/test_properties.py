"""Property tests: diff never crashes on generated summaries, and diff(x, x) always passes."""

from __future__ import annotations

import copy
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gate.strategies import mutated_summaries, summaries
from traceml_ci.gate import (
    Status,
    Verdict,
    compare,
    compare_sets,
    render_json,
    render_markdown,
    render_text,
)
from traceml_ci.gate.inputs.files import summary_problem
from traceml_ci.gate.render.comparison import MARKER

SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
#: Rendering through rich costs ~50 ms an example: fewer of them.
RENDER_SETTINGS = settings(max_examples=50, deadline=None,
                           suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(summaries())
def test_generated_summaries_are_valid(doc):
    assert summary_problem(doc) is None


@RENDER_SETTINGS
@given(summaries(), summaries(), st.booleans())
def test_compare_and_every_renderer_never_crash(base, head, allow):
    c = compare(base, head, allow_env_mismatch=allow)
    assert c.verdict in Verdict
    for row in c.rows:
        assert row.status in Status
    md = render_markdown(c)
    assert md.startswith(MARKER + "\n")
    render_text(c, width=80)
    assert json.loads(render_json(c))["verdict"] == c.verdict.value


@SETTINGS
@given(summaries())
def test_diff_of_a_summary_with_itself_passes(doc):
    c = compare(doc, copy.deepcopy(doc))
    # nothing moved: only rows that cannot be judged at all may differ from ok
    assert all(r.status is Status.OK for r in c.rows)
    assert c.verdict in (Verdict.PASS, Verdict.INCOMPARABLE, Verdict.WARN)
    if doc["run"]["status"] == "completed":
        assert c.verdict in (Verdict.PASS, Verdict.INCOMPARABLE)
    if doc["run"]["status"] == "completed" and doc["step_time"]["dataloader_pct"] is not None:
        assert c.verdict is Verdict.PASS


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.text(max_size=10), summaries(), max_size=3),
       st.dictionaries(st.text(max_size=10), summaries(), max_size=3))
def test_compare_sets_never_crashes_and_renders(base, head):
    s = compare_sets(base, head)
    assert set(s.items) | set(s.added) == set(head)
    assert set(s.items) | set(s.removed) == set(base)
    assert render_markdown(s).startswith(MARKER + "\n")
    render_text(s, width=60)
    json.loads(render_json(s))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.text(max_size=10), summaries(), min_size=1, max_size=3))
def test_a_set_against_itself_does_not_regress(docs):
    s = compare_sets(docs, copy.deepcopy(docs))
    assert s.verdict is not Verdict.REGRESSION
    assert s.added == [] and s.removed == []


@SETTINGS
@given(mutated_summaries())
def test_any_mutated_summary_loads_or_raises_input_error_and_then_compares(doc):
    import tempfile
    from pathlib import Path

    from traceml_ci.errors import InputError
    from traceml_ci.gate import load_input

    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "doc.json"
        f.write_text(json.dumps(doc))
        try:
            loaded = load_input(f)
        except InputError as exc:
            assert exc.path == str(f) and "\n" not in exc.problem
            return
    for summary in loaded.values():
        c = compare(summary, summary)
        assert c.verdict is not Verdict.REGRESSION
