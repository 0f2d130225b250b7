"""summary/profile.py: the top-ops document (per-step ranking, read/write, bad files) and deltas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traceml_ci.errors import InputError
from traceml_ci.summary.profile import (
    MAX_NAME_CHARS,
    SUMMARY_KEY,
    op_deltas,
    read_top_ops,
    summary_top_ops,
    top_ops,
    with_top_ops,
    write_top_ops,
)


def _top(*rows: tuple[str, float], steps: int = 1) -> object:
    return top_ops([(n, ms, None, 1) for n, ms in rows], steps=steps, device="cpu")


def test_ops_are_ranked_per_step_with_their_share_and_cut_to_the_limit() -> None:
    rows = [("aten::mm", 30.0, 10.0, 6), ("aten::relu", 4.0, 2.0, 3), ("x" * 500, 1.0, None, 3)]
    top = top_ops(rows, steps=2, device="cuda", limit=2)
    assert [o.name for o in top.ops] == ["aten::mm", "aten::relu"]
    mm = top.ops[0]
    assert (mm.host_self_ms, mm.device_self_ms, mm.calls) == (15.0, 5.0, 3.0)  # per step
    assert top.total_self_ms == pytest.approx((30 + 10 + 4 + 2 + 1) / 2)
    assert mm.share_pct == pytest.approx(100 * 40 / 47)
    assert len(top_ops(rows, steps=1, device="cpu").ops[2].name) == MAX_NAME_CHARS


def test_a_document_round_trips_and_rides_in_a_summary(tmp_path: Path) -> None:
    top = top_ops([("aten::mm", 3.0, None, 2), ("aten::add", 1.0, None, 1)], steps=2,
                  device="cpu")
    path = write_top_ops(tmp_path / "profile" / "top_ops.json", top)
    assert read_top_ops(path) == top
    summary = with_top_ops({"schema_version": "1.0"}, top)
    assert summary_top_ops(summary) == top and summary_top_ops({}) is None
    assert json.loads(json.dumps(summary))[SUMMARY_KEY]["ops"][0]["name"] == "aten::mm"


@pytest.mark.parametrize(("content", "problem"), [
    ("{", "not valid JSON"),
    ('{"kind": "something else"}', "not a top-ops document"),
    ('{"kind": "traceml-ci.top-ops", "schema_version": "9.0"}', "schema_version"),
    ('{"kind": "traceml-ci.top-ops", "schema_version": "1.0", "steps": 0, "device": "cpu",'
     ' "total_self_ms": 1, "ops": []}', "steps must be an integer >= 1"),
    ('{"kind": "traceml-ci.top-ops", "schema_version": "1.0", "steps": 1, "device": "cpu",'
     ' "total_self_ms": 1, "ops": [{"name": "a", "host_self_ms": "fast"}]}', "ops[0] needs"),
])
def test_a_bad_file_is_one_error_naming_it(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "top_ops.json"
    path.write_text(content)
    with pytest.raises(InputError) as info:
        read_top_ops(path)
    assert str(path) in str(info.value) and problem in str(info.value)
    assert "\n" not in str(info.value)


def test_a_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="top_ops.json"):
        read_top_ops(tmp_path / "top_ops.json")


def test_deltas_match_ops_by_name_include_new_and_gone_and_sort_by_size() -> None:
    base = _top(("aten::mm", 2.0), ("aten::relu", 1.0), ("aten::add", 0.5))
    head = _top(("aten::mm", 2.2), ("aten::add", 3.5), ("aten::conv2d", 0.4))
    got = [(d.name, d.base_ms, d.head_ms, round(d.delta_ms, 6)) for d in op_deltas(base, head)]
    assert got == [
        ("aten::add", 0.5, 3.5, 3.0),
        ("aten::relu", 1.0, None, -1.0),  # gone from the head's top ops
        ("aten::conv2d", None, 0.4, 0.4),  # new
        ("aten::mm", 2.0, 2.2, 0.2),
    ]
