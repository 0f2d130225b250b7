"""Inputs: single summaries, baseline sets, traceml-ai summaries, and every bad input."""

from __future__ import annotations

import json
import os

import pytest

from tests.gate.summaries import TRACEML_AI, make, real
from traceml_ci.errors import InputError
from traceml_ci.gate import (
    BASELINE_SET_VERSION,
    Verdict,
    compare,
    load_input,
    read_baseline_set,
    write_baseline_set,
)
from traceml_ci.gate.inputs.files import InputKind, read_input, summary_problem
from traceml_ci.summary.schema import summary_problems


def write(path, doc):
    path.write_text(json.dumps(doc))
    return path


def test_single_summary_is_keyed_by_run_name_else_file_stem(tmp_path):
    f = write(tmp_path / "head.json", real())
    assert list(load_input(f)) == ["input_bound"]
    doc = real()
    doc["run"]["name"] = ""
    assert list(load_input(write(tmp_path / "head2.json", doc))) == ["head2"]
    assert read_input(f).kind is InputKind.SUMMARY


def test_baseline_set_round_trip_is_atomic_and_sorted(tmp_path):
    f = tmp_path / "sets" / "baseline.json"
    summaries = {"tests/test_b.py::test_b": make(), "tests/test_a.py::test_a[x|y]": make()}
    write_baseline_set(f, summaries)
    doc = json.loads(f.read_text())
    assert doc["schema_version"] == BASELINE_SET_VERSION
    assert list(doc["summaries"]) == sorted(summaries)
    assert os.listdir(f.parent) == ["baseline.json"]  # no temp file left behind
    assert read_baseline_set(f) == summaries
    assert load_input(f) == summaries
    assert read_input(f).kind is InputKind.SET


def test_write_baseline_set_refuses_non_string_keys(tmp_path):
    with pytest.raises(TypeError):
        write_baseline_set(tmp_path / "b.json", {1: make()})  # type: ignore[dict-item]


def test_read_baseline_set_refuses_a_single_summary(tmp_path):
    with pytest.raises(InputError, match="not a baseline set"):
        read_baseline_set(write(tmp_path / "s.json", real()))


def test_an_invalid_summary_inside_a_set_is_named_by_key(tmp_path):
    bad = make()
    del bad["step_time"]
    f = write(tmp_path / "set.json", {"schema_version": "1.0", "summaries": {"t::x": bad}})
    with pytest.raises(InputError) as info:
        load_input(f)
    assert info.value.path == str(f)
    assert info.value.problem.startswith('summaries["t::x"]: invalid summary: ')
    assert "'step_time' is a required property" in info.value.problem


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"schema_version": "2.0", "summaries": {}}, "newer than this traceml-ci reads"),
        ({"schema_version": 1, "summaries": {}}, "schema_version must be a string"),
        ({"schema_version": "1.0", "summaries": []}, "must be an object of summaries"),
    ],
)
def test_bad_baseline_sets(tmp_path, doc, problem):
    with pytest.raises(InputError, match=problem):
        load_input(write(tmp_path / "set.json", doc))


@pytest.mark.parametrize("name", ["input_bound", "compute_bound"])
def test_traceml_ai_summaries_map_to_valid_summaries(name):
    loaded = read_input(TRACEML_AI / f"{name}.json")
    assert loaded.kind is InputKind.TRACEML_AI
    (key, doc), = loaded.summaries.items()
    assert key == f"{name.split('_')[0]}_t1"
    # the full jsonschema agrees that the mapping is a valid summary
    assert summary_problems({k: v for k, v in doc.items()}) == []
    st = doc["step_time"]
    assert sum(st[f"{p}_pct"] for p in ("dataloader", "forward", "backward", "optimizer",
                                        "other")) == pytest.approx(100.0, abs=0.1)
    assert st["diagnosis"] == name.upper()
    unmapped = doc["mapped_from"]["unmapped"]
    assert "step_time.noise" in unmapped
    assert doc["mapped_from"]["tool"] == "traceml-ai"


def test_traceml_ai_input_bound_numbers():
    (doc,) = load_input(TRACEML_AI / "input_bound.json").values()
    st = doc["step_time"]
    assert st["dataloader_pct"] == pytest.approx(93.79, abs=0.02)  # 19.162 / 20.431 ms
    assert st["step_ms"]["median"] == pytest.approx(20.431, abs=0.001)
    assert doc["step_memory"]["peak_rss_mb"] == pytest.approx(330121216 / 2**20, abs=0.01)


def test_traceml_ai_base_against_traceml_ci_head_says_what_was_not_mapped():
    (base,) = load_input(TRACEML_AI / "input_bound.json").values()
    c = compare(base, real())
    assert c.verdict in (Verdict.PASS, Verdict.WARN, Verdict.REGRESSION)
    assert any(r.startswith("base was mapped from traceml-ai (schema 1.9); not mapped:")
               for r in c.reasons)


def test_newer_traceml_ai_schema_is_refused(tmp_path):
    doc = json.loads((TRACEML_AI / "input_bound.json").read_text())
    doc["schema_version"] = 2.1
    with pytest.raises(InputError, match="traceml-ai schema_version 2.1 is newer"):
        load_input(write(tmp_path / "ai.json", doc))


def test_traceml_ai_summary_without_step_times_is_refused(tmp_path):
    doc = json.loads((TRACEML_AI / "input_bound.json").read_text())
    doc["step_time"] = {}
    with pytest.raises(InputError, match="no step_time figures"):
        load_input(write(tmp_path / "ai.json", doc))


def _mutate(fn):
    doc = real()
    fn(doc)
    return doc


def _pct_strings(doc):
    doc["step_time"]["forward_pct"] = str(doc["step_time"]["forward_pct"])


def _negative_time(doc):
    doc["step_time"]["step_ms"]["median"] = -3.0


def _pcts_250(doc):
    for phase in ("dataloader", "forward", "backward", "optimizer", "other"):
        doc["step_time"][f"{phase}_pct"] = 50.0


BAD_DOCS = {
    "a JSON array": ([1, 2], "expected a JSON object (a summary or a baseline set), got a JSON "
                     "array"),
    "missing step_time": (_mutate(lambda d: d.pop("step_time")),
                          "invalid summary: $: 'step_time' is a required property"),
    "pct as string": (_mutate(_pct_strings), "$.step_time.forward_pct: '4.61' is not of type"),
    "negative time": (_mutate(_negative_time),
                      "$.step_time.step_ms.median: -3.0 is less than the minimum of 0"),
    "pcts sum to 250": (_mutate(_pcts_250), "the five *_pct add up to 250"),
    "newer major": (_mutate(lambda d: d.update(schema_version="2.0")),
                    "schema version 2.0 is newer than this traceml-ci reads"),
}


@pytest.mark.parametrize("case", sorted(BAD_DOCS))
def test_bad_documents_raise_one_line_naming_the_problem(tmp_path, case):
    doc, problem = BAD_DOCS[case]
    f = write(tmp_path / "bad.json", doc)
    with pytest.raises(InputError) as info:
        load_input(f)
    assert info.value.path == str(f)
    assert problem in info.value.problem
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "file is empty"),
        (b"   \n", "file is empty"),
        (b"{not json", "not valid JSON"),
        (b'{"a": NaN}', "NaN is not valid JSON"),
        (b'{"a": Infinity}', "Infinity is not valid JSON"),
        (b'{"a": -Infinity}', "-Infinity is not valid JSON"),
    ],
)
def test_unreadable_files(tmp_path, content, problem):
    f = tmp_path / "x.json"
    f.write_bytes(content)
    with pytest.raises(InputError, match=problem.replace("*", r"\*")):
        load_input(f)


def test_a_100_mb_file_is_refused_without_reading_it(tmp_path):
    f = tmp_path / "huge.json"
    with open(f, "wb") as fh:
        fh.truncate(100 * 1024 * 1024)  # sparse: no 100 MB written to disk
    with pytest.raises(InputError, match="104.9 MB, over the 10 MB limit"):
        load_input(f)


def test_a_missing_file_and_a_folder(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        load_input(tmp_path / "nope.json")
    with pytest.raises(InputError, match="is a directory"):
        load_input(tmp_path)


def test_summary_problem_agrees_with_the_validate_command_wording():
    doc = real()
    doc["step_time"]["clock"] = "sundial"
    ours = summary_problem(doc)
    theirs = summary_problems(doc)
    assert ours == str(theirs[0])
