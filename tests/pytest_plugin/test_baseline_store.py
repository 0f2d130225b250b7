"""The baseline file: loading, merging, and concurrent updates that never lose or corrupt."""

from __future__ import annotations

import json
import multiprocessing
import tempfile
from pathlib import Path
from typing import Any

import pytest

from pytest_plugin.baseline import BaselineError, load_baseline, merge_into, save_set


def test_a_missing_baseline_is_empty(tmp_path: Path) -> None:
    assert load_baseline(tmp_path / "none.json") == {}


def test_an_unusable_baseline_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "base.json"
    path.write_text('{"schema_version": "1.0", "summaries": {"k": {"step_time": 1}}}')
    with pytest.raises(BaselineError, match=rf"^traceml: unusable baseline file {path}: "):
        load_baseline(path)


def test_merge_replaces_its_keys_and_keeps_the_others(
    tmp_path: Path, summary_doc: dict[str, Any]
) -> None:
    path = tmp_path / "sub" / "base.json"
    save_set(path, {"a": summary_doc, "b": summary_doc})
    newer = json.loads(json.dumps(summary_doc))
    newer["run"]["name"] = "newer"
    assert merge_into(path, {"b": newer, "c": summary_doc}) == 3
    merged = load_baseline(path)
    assert sorted(merged) == ["a", "b", "c"]
    assert merged["b"]["run"]["name"] == "newer"
    assert [p.name for p in path.parent.iterdir()] == ["base.json"]  # no temp or lock files


def _merge_many(path: str, doc: dict[str, Any], worker: int, count: int) -> None:
    for i in range(count):
        merge_into(Path(path), {f"w{worker}-{i}": doc})


def test_concurrent_merges_keep_every_entry(tmp_path: Path, summary_doc: dict[str, Any]) -> None:
    path = tmp_path / "base.json"
    temp_before = set(Path(tempfile.gettempdir()).iterdir())
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_merge_many, args=(str(path), summary_doc, w, 8))
             for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(load_baseline(path)) == 24
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.json"]
    left = {p for p in set(Path(tempfile.gettempdir()).iterdir()) - temp_before
            if p.name.startswith("traceml-ci")}
    assert not left  # the lock is the folder's: nothing is left behind anywhere
