"""Reading summaries: one clear InputError per bad file; writing is atomic."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.summary.builders import summary_doc
from traceml_ci.errors import InputError
from traceml_ci.summary.io import load_summary, read_json, write_summary
from traceml_ci.summary.schema import schema_path, summary_problems


@pytest.fixture
def good() -> dict:
    return summary_doc({"dataloader": 4.7, "forward": 3.1, "backward": 1.8, "optimizer": 0.4})


def _write(tmp_path: Path, content: str | bytes, name: str = "s.json") -> Path:
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return p


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("", "file is empty"),
        ("   \n", "file is empty"),
        ("{not json", "not valid JSON"),
        (b"\xff\xfe\x00", "not UTF-8"),
        ('{"a": NaN}', "NaN is not valid JSON"),
        ('{"a": Infinity}', "Infinity is not valid JSON"),
    ],
)
def test_unreadable_content(tmp_path, content, problem) -> None:
    path = _write(tmp_path, content)
    with pytest.raises(InputError) as err:
        read_json(path)
    assert problem in str(err.value) and str(path) in str(err.value)
    assert err.value.exit_code == 2


def test_missing_file_and_directory(tmp_path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        read_json(tmp_path / "nope.json")
    with pytest.raises(InputError, match="is a directory"):
        read_json(tmp_path)


def test_huge_file_is_refused_without_reading_it(tmp_path) -> None:
    path = tmp_path / "big.json"
    with open(path, "wb") as fh:
        fh.truncate(100 * 1024 * 1024)
    with pytest.raises(InputError, match="over the 10 MB limit"):
        read_json(path)


def _mutate(doc: dict, dotted: str, value) -> dict:
    doc = json.loads(json.dumps(doc))
    *parents, last = dotted.split(".")
    node = doc
    for key in parents:
        node = node[key]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return doc


_DELETE = object()


@pytest.mark.parametrize(
    ("dotted", "value", "where"),
    [
        ("step_time", _DELETE, "'step_time' is a required property"),
        ("step_time.forward_pct", "31.0", "$.step_time.forward_pct"),
        ("step_time.step_ms.median", -3.0, "$.step_time.step_ms.median"),
        ("step_time.dataloader_pct", 197.0, "$.step_time.dataloader_pct"),
        ("run.status", "exploded", "$.run.status"),
    ],
)
def test_schema_problems_name_the_path(good, dotted, value, where) -> None:
    problems = summary_problems(_mutate(good, dotted, value))
    assert problems and any(where in str(p) for p in problems), problems


def test_pcts_must_add_up_to_100(good) -> None:
    doc = _mutate(good, "step_time.forward_pct", good["step_time"]["forward_pct"] + 50)
    assert any("add up to" in str(p) for p in summary_problems(doc))


def test_a_json_array_and_a_newer_major_version(good) -> None:
    assert "expected a JSON object" in str(summary_problems([good])[0])
    problems = summary_problems(_mutate(good, "schema_version", "2.0"))
    assert len(problems) == 1 and "newer than this traceml-ci reads" in str(problems[0])
    assert summary_problems(_mutate(good, "schema_version", "1.7")) == []  # newer minor is fine


def test_load_summary_raises_one_line(tmp_path, good) -> None:
    path = _write(tmp_path, json.dumps(_mutate(good, "step_time.forward_pct", "x")))
    with pytest.raises(InputError) as err:
        load_summary(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path, good, monkeypatch) -> None:
    target = tmp_path / "out" / "final_summary.json"
    write_summary(target, good)
    assert json.loads(target.read_text()) == good

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        write_summary(target, {**good, "schema_version": "1.1"})
    assert json.loads(target.read_text()) == good  # the old file is intact
    assert [p.name for p in target.parent.iterdir()] == ["final_summary.json"]


def test_schema_is_found_and_is_draft_2020_12() -> None:
    schema = json.loads(schema_path("final_summary.schema.json").read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('{"a": 1e400}', "out of range"),
        ('{"a": -1e400}', "out of range"),
        ('{"a": ' + "9" * 400 + "}", "out of range"),
        ("[" * 200_000 + "]" * 200_000, "nested too deeply"),
    ],
)
def test_numbers_out_of_range_and_deep_nesting(tmp_path, content, problem) -> None:
    with pytest.raises(InputError, match=problem):
        read_json(_write(tmp_path, content))


def test_written_files_get_the_usual_mode(tmp_path, good) -> None:
    old = os.umask(0o022)
    try:
        path = write_summary(tmp_path / "s.json", good)
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644
