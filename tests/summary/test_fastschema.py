"""fastschema agrees with jsonschema on our schemas, and refuses keywords it does not know."""

from __future__ import annotations

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gate.strategies import json_values, mutated_summaries
from traceml_ci.summary.fastschema import Checker, Unsupported, checker_for
from traceml_ci.summary.schema import SUMMARY_SCHEMA, load_schema


def reference(name):
    return jsonschema.Draft202012Validator(load_schema(name))


SUMMARY_REF = reference(SUMMARY_SCHEMA)
RULES_REF = reference("rules.schema.json")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_summaries())
def test_agrees_with_jsonschema_on_mutated_summaries(doc):
    ours = checker_for(SUMMARY_SCHEMA).problems(doc)
    assert (ours == []) == SUMMARY_REF.is_valid(doc), ours


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
        "tolerances": st.dictionaries(st.text(max_size=12), rule_values, max_size=3) | json_values,
        "extra": json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(rules_docs)
def test_agrees_with_jsonschema_on_rules_documents(doc):
    ours = checker_for("rules.schema.json").problems(doc)
    assert (ours == []) == RULES_REF.is_valid(doc), ours


def test_problems_carry_json_paths():
    doc = {"tolerances": {"step_time.*_pct": {"abs": -1}}}
    assert checker_for("rules.schema.json").problems(doc) == [
        ('$.tolerances["step_time.*_pct"].abs', "-1 is less than the minimum of 0")
    ]


def test_integers_accept_integral_floats_like_jsonschema():
    c = Checker({"type": "integer"})
    assert c.is_valid(3) and c.is_valid(3.0) and not c.is_valid(3.5) and not c.is_valid(True)


@pytest.mark.parametrize(
    "schema",
    [
        {"patternProperties": {}},
        {"if": {}},
        {"$ref": "https://example.com/x"},
        {"properties": {"a": {"dependentRequired": {}}}},
    ],
)
def test_unknown_keywords_are_refused_up_front(schema):
    with pytest.raises(Unsupported):
        Checker(schema)


def test_finds_the_sameschema_files_as_the_summary_package():
    from traceml_ci.summary.fastschema import schema_file
    from traceml_ci.summary.schema import schema_path

    for name in (SUMMARY_SCHEMA, "rules.schema.json"):
        assert schema_file(name) == schema_path(name)
