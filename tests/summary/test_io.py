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


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX named pipes")
def test_streams_and_devices_are_refused_not_read(tmp_path) -> None:
    """A FIFO (even one a writer keeps open) or /dev/zero is refused by its type, at once."""
    fifo = tmp_path / "stream.json"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # a writer that never closes
    try:
        with pytest.raises(InputError, match=r"is a named pipe \(FIFO\), not a regular file"):
            read_json(fifo)
    finally:
        os.close(writer)
    if os.path.exists("/dev/zero"):
        with pytest.raises(InputError, match="/dev/zero: is a character device, not a regular"):
            read_json("/dev/zero")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="Linux /proc")
def test_a_file_longer_than_its_stat_size_is_bounded_while_reading() -> None:
    """/proc files report size 0: the limit holds on what is read, not on what stat said."""
    from traceml_ci.summary.io import read_text

    assert os.stat("/proc/self/status").st_size == 0
    with pytest.raises(InputError, match="over the 16 bytes limit"):
        read_text("/proc/self/status", max_bytes=16)


def test_very_long_strings_are_refused_naming_where(tmp_path, good) -> None:
    """A 9 MB run name (or key) is not a name: refused at once, its JSON path named."""
    from traceml_ci.summary.io import MAX_STRING_CHARS

    long_name = _write(tmp_path, json.dumps(_mutate(good, "run.name", "x" * 9_000_000)))
    with pytest.raises(InputError, match=r"the string at \$\.run\.name is 9,000,000 characters"):
        read_json(long_name)
    key = "k" * (MAX_STRING_CHARS + 1)
    long_key = _write(tmp_path, json.dumps({"summaries": {key: good}}), "set.json")
    with pytest.raises(InputError, match=r"a key in \$\.summaries is 65,537 characters"):
        read_json(long_key)
    at_limit = _mutate(good, "run.name", "x" * MAX_STRING_CHARS)
    assert read_json(_write(tmp_path, json.dumps(at_limit), "ok.json")) == at_limit


def test_null_shares_are_null_all_together_and_only_without_steps(good) -> None:
    """A null share cannot skip the sum-to-100 check: one null among numbers is invalid, five
    nulls are invalid once steps were analysed, and valid for a run with none."""
    one = summary_problems(_mutate(good, "step_time.forward_pct", None))
    assert [p.path for p in one] == ["$.step_time.forward_pct"]
    five = _mutate(good, "step_time", {**good["step_time"], **{
        f"{p}_pct": None for p in ("dataloader", "forward", "backward", "optimizer", "other")}})
    assert [str(p) for p in summary_problems(five)] == [
        "$.step_time: the five *_pct are null although 50 steps were analysed"]
    empty = summary_doc({"forward": 1.0}, steps=0)
    assert empty["step_time"]["forward_pct"] is None and summary_problems(empty) == []


@pytest.mark.parametrize(
    ("field", "value", "ok"),
    [("iqr", 35.0, True), ("iqr", 100.0, True), ("iqr", 100.5, False), ("iqr", 1e6, False),
     ("median", 101.0, False), ("median", -1.0, False)],
)
def test_a_share_cannot_claim_noise_beyond_its_0_100_range(good, field, value, ok) -> None:
    doc = summary_doc({"dataloader": 4.7, "forward": 3.1, "backward": 1.8, "optimizer": 0.4},
                      jitter=0.2)
    assert doc["step_time"]["noise"] is not None
    bad = _mutate(doc, f"step_time.noise.pct.dataloader.{field}", value)
    problems = [str(p) for p in summary_problems(bad)]
    assert (problems == []) is ok, problems
    if not ok:
        assert problems[0].startswith(f"$.step_time.noise.pct.dataloader.{field}: ")
    big_step_noise = _mutate(doc, "step_time.noise.step_ms.iqr", 1e6)  # milliseconds: no cap
    assert summary_problems(big_step_noise) == []


@pytest.mark.parametrize(
    ("content", "where"),
    [
        ('{"a": 1, "a": 2}', "duplicate key 'a' in $"),
        ('{"x": {"y": [{"k": 1, "j": 0, "k": 2}]}}', "duplicate key 'k' in $.x.y[0]"),
        ('{"odd key": {"m": 1, "m": 1}}', "duplicate key 'm' in $[\"odd key\"]"),
    ],
)
def test_a_duplicate_key_is_one_clear_error_naming_where(tmp_path, content, where) -> None:
    """JSON parsers keep either value of a repeated key (Python the last): which one a reader
    saw would be anyone's guess, so the file is refused, naming the key and its object."""
    with pytest.raises(InputError) as exc:
        read_json(_write(tmp_path, content))
    assert where in exc.value.problem, exc.value.problem


def test_a_summary_is_written_one_key_a_line_with_small_rows_on_one() -> None:
    from traceml_ci.summary.io import RECORD_CHARS, summary_text

    doc = {"ops": {"kinds": {"addmm": [12, 0]}, "sites": ["train.py:9, the loop"]},
           "modules": [{"name": "fc", "ms": 1.5}, {"name": "x" * RECORD_CHARS, "ms": 2.0}],
           "empty": {}, "text": "a,  b\u2028"}
    text = summary_text(doc)
    assert json.loads(text) == doc  # the same JSON
    lines = text.splitlines()
    # a short block on one line, a string's own text untouched
    assert ' "ops": {"kinds":{"addmm":[12,0]},"sites":["train.py:9, the loop"]},' in lines
    assert '  {"name":"fc","ms":1.5},' in lines
    assert '   "ms": 2.0' in lines  # too long for one line: a key a line
    with pytest.raises(ValueError):
        summary_text({"x": float("nan")})
