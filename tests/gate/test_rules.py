"""Tolerance rules: defaults, TOML files, pyproject.toml, and every way a rules file is wrong."""

from __future__ import annotations

import json

import pytest

from traceml_ci.errors import InputError
from traceml_ci.gate.metrics import METRIC_NAMES
from traceml_ci.gate.rules import (
    DEFAULT_NOISE_FACTOR,
    DEFAULT_RULES,
    Direction,
    describe,
    find_pyproject,
    load_rules,
)
from traceml_ci.summary.schema import load_schema


def test_defaults_match_the_documented_tolerances():
    r = DEFAULT_RULES
    pct = r.rule_for("step_time.dataloader_pct")
    assert (pct.abs, pct.warn_abs, pct.direction) == (5.0, 3.0, Direction.WORSE)
    step = r.rule_for("step_time.step_ms.median")
    assert (step.rel, step.warn_rel) == (25.0, 10.0)
    mem = r.rule_for("step_memory.peak_reserved_mb")
    assert (mem.rel, mem.abs, mem.warn_rel, mem.warn_abs) == (10.0, 16.0, 5.0, 8.0)
    info = r.rule_for("step_time.phase_ms.forward")
    assert not info.has_fail_tier and not info.has_warn_tier
    assert r.noise_factor == DEFAULT_NOISE_FACTOR == 1.0
    assert r.noise_rule == "beyond"
    assert r.source == "defaults"


def test_load_rules_without_arguments_is_the_defaults():
    assert load_rules() is DEFAULT_RULES


def test_rules_file_overrides_by_glob(tmp_path):
    f = tmp_path / "gate.toml"
    f.write_text(
        'noise_factor = 1.5\nnoise_rule = "margin"\n[tolerances]\n"step_time.*_pct" = {abs = 2.0}\n'
        '"step_time.step_ms.median" = {rel = 15, warn_rel = 8, direction = "any"}\n'
    )
    r = load_rules(f)
    assert r.noise_factor == 1.5 and r.noise_rule == "margin"
    assert r.rule_for("step_time.other_pct").abs == 2.0
    # The default warn tier (3 pp) would sit above the new fail tier: it is dropped.
    assert r.rule_for("step_time.other_pct").warn_abs is None
    step = r.rule_for("step_time.step_ms.median")
    assert (step.rel, step.warn_rel, step.direction) == (15.0, 8.0, Direction.ANY)
    assert r.source == str(f)


def test_pyproject_table_is_read(tmp_path):
    p = tmp_path / "pyproject.toml"
    p.write_text(
        '[project]\nname = "x"\n[tool.traceml-ci]\nnoise_factor = 1.5\n'
        '[tool.traceml-ci.tolerances]\n"step_memory.peak_rss_mb" = {skip = true}\n'
    )
    r = load_rules(pyproject=p)
    assert r.rule_for("step_memory.peak_rss_mb").skip and r.noise_factor == 1.5
    assert "[tool.traceml-ci]" in r.source
    # the same file given as --tolerances reads the same table
    assert load_rules(p).rule_for("step_memory.peak_rss_mb").skip


@pytest.mark.parametrize("given", [None, "as --tolerances"])
def test_an_unknown_key_under_tool_traceml_ci_is_an_error(tmp_path, given):
    p = tmp_path / "pyproject.toml"
    p.write_text('[tool.traceml-ci]\nbaseline = "b.json"\n')
    with pytest.raises(InputError, match=r"\$: unknown key 'baseline' \(allowed: "):
        load_rules(p) if given else load_rules(pyproject=p)


def test_pyproject_without_our_table_gives_defaults(tmp_path):
    p = tmp_path / "pyproject.toml"
    p.write_text('[project]\nname = "x"\n')
    assert load_rules(pyproject=p) is DEFAULT_RULES


def test_find_pyproject_walks_up(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert find_pyproject(deep) == tmp_path / "pyproject.toml"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('tolerence = 3\n',
         "$: unknown key 'tolerence' (allowed: noise_factor, noise_rule, tolerances)"),
        ('[tolerances]\n"step_time.*_pct" = {abs = -1.0}\n',
         '$.tolerances["step_time.*_pct"].abs: -1.0 is less than the minimum of 0'),
        ('[tolerances]\n"step_time.*_pct" = {absolute = 2}\n',
         '$.tolerances["step_time.*_pct"]: unknown key \'absolute\''),
        ('[tolerances]\n"step_time.*_pct" = {direction = "up"}\n',
         "$.tolerances[\"step_time.*_pct\"].direction: 'up' is not one of ['worse', 'any']"),
        ('[tolerances]\n"step_time.*_pct" = {abs = "2"}\n', "is not of type 'number'"),
        ('[tolerances]\n"step_time.*_pct" = {}\n', "must not be empty"),
        ('[tolerances]\n"step_time.*_pct" = {abs = nan}\n', "nan is not a finite number"),
        ('[tolerances]\n"step_time.*_pct" = {rel = inf}\n', "inf is not a finite number"),
        ('noise_factor = -1\n', "$.noise_factor: -1 is less than the minimum of 0"),
        ('noise_rule = "either"\n', "$.noise_rule: 'either' is not one of ['beyond', 'margin']"),
        ('[tolerances]\n"step_tme.*" = {abs = 1}\n', "pattern matches no metric"),
        ('[tolerances]\n"step_time.*_pct" = {abs = 2, warn_abs = 4}\n',
         "warn_abs 4 is above abs 2; the warn tier must be the smaller"),
    ],
)
def test_invalid_rules_file_names_the_file_and_the_problem(tmp_path, text, problem):
    f = tmp_path / "rules.toml"
    f.write_text(text)
    with pytest.raises(InputError) as info:
        load_rules(f)
    assert info.value.path == str(f)
    assert info.value.problem.startswith("invalid rules: ")
    assert problem in info.value.problem
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("content", "problem"),
    [(b"[tolerances\n", "not valid TOML"), (b"\xff\xfe", "not UTF-8 text")],
)
def test_unparseable_rules_file(tmp_path, content, problem):
    f = tmp_path / "rules.toml"
    f.write_bytes(content)
    with pytest.raises(InputError, match=problem):
        load_rules(f)


def test_missing_rules_file(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        load_rules(tmp_path / "nope.toml")


def test_invalid_rules_in_pyproject_name_the_pyproject(tmp_path):
    p = tmp_path / "pyproject.toml"
    p.write_text('[tool.traceml-ci.tolerances]\n"step_time.*_pct" = {abs = -2}\n')
    with pytest.raises(InputError) as info:
        load_rules(pyproject=p)
    assert info.value.path == str(p)


def test_every_metric_has_a_rule_and_describe_is_json():
    described = describe(DEFAULT_RULES)
    assert list(described) == list(METRIC_NAMES)
    json.dumps(described)


def test_rules_schema_is_a_valid_draft_2020_12_schema():
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(load_schema("rules.schema.json"))


@pytest.mark.parametrize(
    "text",
    ['[tool.traceml-ci.tolerances]\n"step_time.*_pct" = {abs = 1.0}\n',
     '[tool."traceml-ci".tolerances]\n"step_time.*_pct" = {abs = 1.0}\n',
     '[tool]\ntraceml-ci = {tolerances = {"step_time.*_pct" = {abs = 1.0}}}\n',
     'tool.traceml-ci.tolerances."step_time.*_pct" = {abs = 1.0}\n'],
)
def test_every_spelling_of_the_tool_table_is_found(tmp_path, text):
    p = tmp_path / "pyproject.toml"
    p.write_text(text)
    assert load_rules(pyproject=p).rule_for("step_time.forward_pct").abs == 1.0


def test_a_pyproject_without_the_table_is_not_parsed(tmp_path, monkeypatch):
    import traceml_ci.gate.rules as rules_mod

    p = tmp_path / "pyproject.toml"
    p.write_text('[project]\nname = "x"\ndependencies = ["traceml-ci"]\n')
    monkeypatch.setattr(rules_mod, "_read_toml", lambda path: pytest.fail("parsed"))
    assert load_rules(pyproject=p) is DEFAULT_RULES


def test_tightening_a_fail_tier_drops_an_inherited_warn_tier_above_it():
    from traceml_ci.gate.rules import DEFAULT_RULES

    inherited = DEFAULT_RULES.rule_for("step_time.dataloader_pct")
    assert inherited.warn_abs is not None and inherited.warn_abs > 2.0  # the premise
    tight = DEFAULT_RULES.with_tolerances({"step_time.*_pct": {"abs": 2.0}})
    rule = tight.rule_for("step_time.dataloader_pct")
    assert rule.abs == 2.0 and rule.warn_abs is None
    loose = DEFAULT_RULES.with_tolerances({"step_time.*_pct": {"abs": 9.0}})
    assert loose.rule_for("step_time.dataloader_pct").warn_abs == inherited.warn_abs
