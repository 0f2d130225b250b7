"""history: collecting summaries, the DataFrame, trends and the run where a metric moved."""

from __future__ import annotations

import json

import pytest

from tests.gate.summaries import make, shift
from traceml_ci.errors import InputError
from traceml_ci.gate.inputs.files import write_baseline_set
from traceml_ci.gate.inputs.history import collect, find_move, frame, render_history, sparkline
from traceml_ci.gate.metrics import BY_NAME


def _runs(tmp_path, splits):
    for i, ms in enumerate(splits):
        doc = make(ms, name="train")
        doc["run"]["started_at"] = f"2026-11-{10 + i:02d}T08:00:00Z"
        folder = tmp_path / "runs" / f"main-{i:02d}"
        folder.mkdir(parents=True)
        (folder / "final_summary.json").write_text(json.dumps(doc))
    return tmp_path / "runs"


def test_collect_orders_by_start_time_and_labels_by_folder(tmp_path):
    root = _runs(tmp_path, [None] * 3)
    (root / "notes.json").write_text('{"not": "a summary"}')  # skipped inside folders
    points = collect([root])
    assert [p.label for p in points] == ["main-00", "main-01", "main-02"]
    assert {p.series for p in points} == {"train"}


def test_frame_has_one_row_per_run_and_a_column_per_metric(tmp_path):
    df = frame(collect([_runs(tmp_path, [None, shift(dataloader=4.0)])]))
    assert list(df["run"]) == ["main-00", "main-01"]
    assert df["step_time.dataloader_pct"].tolist() == pytest.approx([20.0, 33.33], abs=0.01)


def test_markdown_names_the_run_where_the_dataloader_moved(tmp_path):
    splits = [None] * 4 + [shift(dataloader=4.0)] * 3
    md = render_history(collect([_runs(tmp_path, splits)]))
    line = next(x for x in md.splitlines() if x.startswith("| step_time.dataloader_pct"))
    assert "main-04: 20.0% → 33.3% (+13.3 pp)" in line
    assert "▁▁▁▁███" in line
    optimizer = next(x for x in md.splitlines() if x.startswith("| step_time.optimizer_pct"))
    assert optimizer.split("|")[6].strip() == "—"  # moved < 5 pp: no move reported
    # The level now: the median of the last five runs (two before the move, three after).
    assert line.split("|")[4].strip() == "33.3%"


def test_the_rolling_median_is_pandas_over_the_last_five_runs() -> None:
    from traceml_ci.gate.inputs.history import rolling_median

    assert rolling_median([1.0, 2.0, 100.0, 3.0, 4.0, 5.0]) == 4.0  # 2,100,3,4,5 -> 4
    assert rolling_median([None, 7.0]) == 7.0
    assert rolling_median([None]) is None


def test_csv_has_a_header_and_a_row_per_run(tmp_path):
    csv = render_history(collect([_runs(tmp_path, [None, None])]), output="csv")
    lines = csv.strip().splitlines()
    assert lines[0].startswith("series,run,started_at,path,step_time.diagnosis,")
    assert len(lines) == 3


def test_baseline_sets_give_one_series_per_key(tmp_path):
    for i in range(2):
        write_baseline_set(tmp_path / f"b{i}.json", {"t::a": make(), "t::b": make()})
    points = collect([tmp_path / "b0.json", tmp_path / "b1.json"])
    assert sorted({p.series for p in points}) == ["t::a", "t::b"]
    md = render_history(points)
    assert "### t::a" in md and "### t::b" in md


def test_find_move_labels_and_thresholds():
    m = BY_NAME["step_time.diagnosis"]
    move = find_move(["A", "A", "B", "B"], ["r0", "r1", "r2", "r3"], m)
    assert (move.at, move.before, move.after) == ("r2", "A", "B")
    pct = BY_NAME["step_time.dataloader_pct"]
    assert find_move([20, 21, 22, 21], list("abcd"), pct) is None  # under 5 pp
    assert find_move([20, None, 30, 31], list("abcd"), pct).at == "c"


def test_sparkline():
    assert sparkline([1, 2, 3]) == "▁▅█"
    assert sparkline([5, None, 5]) == "▁·▁"
    assert sparkline([None]) == ""


def test_an_explicit_bad_file_is_an_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    with pytest.raises(InputError, match="got a JSON array"):
        collect([bad])
    with pytest.raises(InputError, match="no such file or folder"):
        collect([tmp_path / "nope"])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no summaries found"):
        collect([empty])
