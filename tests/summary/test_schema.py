"""The fast path (fastjsonschema, compiled from the schema files) agrees with jsonschema, which
words the problems; unknown keys and paths are named the way users read them."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gate.strategies import json_values, mutated_summaries, summaries
from traceml_ci.summary.schema import (
    SUMMARY_SCHEMA,
    Problem,
    document_problems,
    is_valid,
    load_schema,
    schema_path,
)

RULES_SCHEMA = "rules.schema.json"


def reference(name):
    """jsonschema, with format as an annotation (draft 2020-12's default), as the fast path."""
    return jsonschema.Draft202012Validator(load_schema(name))


SUMMARY_REF = reference(SUMMARY_SCHEMA)
RULES_REF = reference(RULES_SCHEMA)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_summaries() | summaries())
def test_fast_path_agrees_with_jsonschema_on_summaries(doc):
    before = copy.deepcopy(doc)
    fast = is_valid(doc, SUMMARY_SCHEMA)
    assert doc == before  # fastjsonschema fills in "default"s: our schemas must have none
    assert fast == SUMMARY_REF.is_valid(doc)
    assert (document_problems(doc, SUMMARY_SCHEMA) == []) == fast


rule_values = st.fixed_dictionaries(
    {},
    optional={
        "abs": json_values | st.floats(-5, 50),
        "rel": st.floats(-5, 50),
        "warn_abs": st.floats(0, 5),
        "direction": st.sampled_from(["worse", "any", "up"]),
        "fail": st.booleans() | st.integers(0, 1),
        "skip": st.booleans(),
        "bogus": json_values,
    },
)
rules_docs = st.fixed_dictionaries(
    {},
    optional={
        "noise_factor": st.floats(-1, 5) | json_values,
        "noise_rule": st.sampled_from(["beyond", "margin", "other"]),
        "tolerances": st.dictionaries(st.text(max_size=12), rule_values, max_size=3) | json_values,
        "extra": json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(rules_docs)
def test_fast_path_agrees_with_jsonschema_on_rules_documents(doc):
    assert is_valid(doc, RULES_SCHEMA) == RULES_REF.is_valid(doc)


@pytest.mark.parametrize(
    ("value", "valid"),
    [(3, True), (3.0, True), (3.5, False), (True, False), (None, False), ("3", False)],
)
def test_integers_and_booleans_are_judged_alike(value, valid) -> None:
    """Edge cases where hand-written checkers and libraries have differed: 3.0 is an integer,
    True is not a number."""
    from tests.summary.builders import summary_doc

    doc = summary_doc({"forward": 1.0})
    doc["env"]["gpu_count"] = value
    assert is_valid(doc, SUMMARY_SCHEMA) == SUMMARY_REF.is_valid(doc) == valid


def test_problems_carry_json_paths_and_name_unknown_keys() -> None:
    doc = {"colour": "red", "tolerances": {"step_time.*_pct": {"abs": -1, "typo": 2}, "x": {}}}
    assert document_problems(doc, RULES_SCHEMA) == [
        Problem("$", "unknown key 'colour'"),
        Problem('$.tolerances["step_time.*_pct"]', "unknown key 'typo'"),
        Problem('$.tolerances["step_time.*_pct"].abs', "-1 is less than the minimum of 0"),
        Problem("$.tolerances.x", "must not be empty"),
    ]


def test_format_is_an_annotation_in_both() -> None:
    """A date-time that is not one passes both (jsonschema checks formats only when asked and
    an optional package is installed): the result must not depend on what is installed."""
    from tests.summary.builders import summary_doc

    doc = summary_doc({"forward": 1.0})
    doc["run"]["started_at"] = "yesterday"
    assert is_valid(doc, SUMMARY_SCHEMA) and SUMMARY_REF.is_valid(doc)


def test_schema_files_are_found_and_are_draft_2020_12() -> None:
    for name in (SUMMARY_SCHEMA, RULES_SCHEMA):
        path = schema_path(name)
        assert path.is_file() and path.parent.name == "schemas"
        schema = json.loads(path.read_text())
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        jsonschema.Draft202012Validator.check_schema(schema)


def test_validating_a_valid_summary_imports_no_jsonschema(tmp_path) -> None:
    """The point of the fast path: jsonschema (~0.2 s) only for an invalid document."""
    from tests.summary.builders import summary_doc

    good = tmp_path / "s.json"
    good.write_text(json.dumps(summary_doc({"forward": 1.0})))
    code = ("import sys; from traceml_ci.summary.io import load_summary; "
            "load_summary(sys.argv[1]); print('jsonschema' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(good)], capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
