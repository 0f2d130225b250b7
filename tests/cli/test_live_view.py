"""The live view's frame and plain line, rendered from snapshots made the tracer's way.

Golden files (plain text of a 100-column frame) live in tests/cli/golden/live/. After an
intended change to the view, regenerate them and review the diff:

    TRACEML_CI_REGEN_GOLDEN=1 .venv/bin/pytest tests/cli/test_live_view.py
    git diff tests/cli/golden/live/
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from tests import golden
from tests.cli.live_snapshots import SPLITS, growth_diagnosis, rank_snapshot, snapshot, write
from traceml_ci.cli.live_view import (
    PHASE_STYLE,
    SPARK,
    plain_progress_line,
    rank_straggler,
    render_frame,
    sparkline,
    split_widths,
)
from traceml_ci.summary.keys import PHASES, PHASES_WITH_WAIT
from traceml_ci.summary.live import LIVE_VERSION, read_snapshots, snapshot_path
from traceml_ci.summary.ranks import merge_ranks

GOLDEN = Path(__file__).parent / "golden" / "live"
NOW = 1_000.4  # the snapshots' heartbeat is 1000.0: 0.4 s old


def text_of(snaps: list[dict[str, Any]], now: float = NOW, width: int = 100,
            height: int | None = None) -> str:
    console = Console(record=True, width=width, color_system=None, file=io.StringIO())
    console.print(render_frame(snaps, now=now, width=width, height=height))
    return console.export_text()


def segments(snaps: list[dict[str, Any]], now: float = NOW) -> list[Any]:
    console = Console(width=100, color_system="truecolor", file=io.StringIO())
    return list(console.render(render_frame(snaps, now=now, width=100)))


def check_golden(name: str, text: str) -> None:
    __tracebackhide__ = True
    golden.check_golden(GOLDEN / name, text, __file__)


# --- Golden frames ------------------------------------------------------------------------

@pytest.mark.parametrize("label", sorted(SPLITS))
def test_each_step_diagnosis_renders_as_recorded(label: str) -> None:
    snap = snapshot(label)
    assert snap["diagnosis"]["kind"] == label  # the summary's own rules gave this label
    text = text_of([snap])
    assert label in text and snap["diagnosis"]["next_step"][:30] in " ".join(text.split())
    check_golden(f"{label.lower()}.txt", text)


def test_gpu_memory_growth_is_flagged() -> None:
    snap = snapshot("COMPUTE_BOUND", memory={"rss_mb": 5120.0, "allocated_mb": 2648.0,
                                             "reserved_mb": 2900.0,
                                             "growth_mb_per_1k_steps": 212.5,
                                             "growth_basis": "allocated"})
    snap["memory_diagnosis"] = growth_diagnosis()
    snap["gpu_util_pct"] = 87.0
    text = text_of([snap])
    assert "allocated 2,648 MB · reserved 2,900 MB" in text
    assert "GROWING" in text and "MEMORY_GROWTH" in text and "GPU util" in text
    check_golden("gpu_memory_growth.txt", text)
    assert "growth (" not in text  # the basis goes without saying: it is what the row shows
    snap["memory"]["growth_basis"] = "rss"
    assert "growth (rss) +212.5 MB/1k steps" in text_of([snap])
    # Without the diagnosis, the same figures are not flagged: the summary's rules decide.
    snap["memory_diagnosis"] = {"kind": "BALANCED", "message": "ok", "next_step": "nothing"}
    assert "GROWING" not in text_of([snap])


def test_ranks_get_a_row_each_and_a_stale_heartbeat_is_flagged_red() -> None:
    snaps = [snapshot("INPUT_BOUND", rank=0, world_size=3, host="node-a", heartbeat=1000.0),
             snapshot("COMPUTE_BOUND", rank=1, world_size=3, host="node-b", heartbeat=999.8,
                      steps_done=1190),
             snapshot("INPUT_BOUND", rank=2, world_size=3, host="node-c", heartbeat=975.0,
                      steps_done=900)]
    text = text_of(snaps)
    rows = [line for line in text.splitlines() if "node-" in line][1:]  # after the title line
    assert len(rows) == 3
    assert "STALE 25s" in rows[2] and "STALE" not in rows[0] + rows[1]
    assert "stale: no heartbeat from rank 2" in text
    assert "rank 0 of 3" in text and "rank 0 in detail" in text
    check_golden("three_ranks_one_stale.txt", text)
    stale = [s for s in segments(snaps) if "STALE" in s.text]
    assert stale and all(s.style.color.name == "red" for s in stale)
    fresh = [s for s in segments(snaps) if s.text.strip() == "0.6s"]
    assert fresh and all(s.style.color is None or s.style.color.name != "red" for s in fresh)


def test_an_ended_run_shows_its_status_and_summary_path() -> None:
    snap = snapshot("BALANCED", status="crashed", summary_path="out/final_summary.json")
    text = text_of([snap], now=5_000.0)  # long after: an ended rank is never stale
    assert "ended: crashed · summary: out/final_summary.json" in text
    assert "stale" not in text.lower()
    check_golden("ended_crashed.txt", text)


def test_an_old_or_partial_snapshot_renders_with_dashes() -> None:
    text = text_of([{"live_version": LIVE_VERSION}])
    check_golden("partial.txt", text)
    assert "(unnamed run)" in text and "step -" in text
    assert "status -" in text  # neither running nor ended: said as it is


# --- What the frame shows, checked against the snapshot's own numbers ---------------------

@pytest.mark.parametrize("label", sorted(SPLITS))
def test_the_bar_gives_each_phase_its_share_of_the_width(label: str) -> None:
    snap = snapshot(label)
    pct = snap["window"]["pct"]
    counts = dict.fromkeys(PHASES, 0)
    colour = {PHASE_STYLE[p]: p for p in PHASES}
    for seg in segments([snap]):
        if set(seg.text) == {"█"} and seg.style and seg.style.color:
            counts[colour[seg.style.color.name]] += len(seg.text)
    bar = counts  # the legend's swatches ("█ ") are other segments
    width = sum(bar.values())
    assert width == 100 - 4 - 12  # the panel's frame and the label column
    for p in PHASES:
        assert abs(bar[p] - pct[p] / 100 * width) <= 1, (p, bar, pct)


def test_split_widths_is_proportional_and_fills_the_bar() -> None:
    w = split_widths({"dataloader": 47, "forward": 31, "backward": 18, "optimizer": 4,
                      "other": 0}, 50)
    assert sum(w.values()) == 50 and w["dataloader"] in (23, 24) and w["other"] == 0
    assert sum(split_widths({"dataloader": None}, 50).values()) == 0
    assert sum(split_widths({"forward": float("nan"), "backward": -3, "optimizer": 1}, 7)
               .values()) == 7


def test_the_sparkline_follows_the_history() -> None:
    rising = sparkline([1, 2, 3, 4, 5, 6, 7, 8])
    assert rising == SPARK
    assert sparkline([5.0] * 4) == SPARK[3] * 4
    assert sparkline(["x", None, 1.0, float("inf"), 2.0]) == SPARK[0] + SPARK[-1]
    assert sparkline(range(100), width=10) == sparkline(range(90, 100))
    snap = snapshot(history_ms=[10.0, 20.0, 30.0])
    assert "▁▅█  10.00–30.00 ms" in text_of([snap])


def test_moves_since_the_start_are_shown_with_arrows() -> None:
    text = text_of([snapshot("INPUT_BOUND")])
    assert "dl 31%→47% ▲16" in text and "fwd 30%→31% ▲1" in text and "bwd 25%→18% ▼7" in text
    assert "(no first window yet)" in text_of([snapshot(first_window_pct=None)])


def test_a_move_agrees_with_the_rounded_numbers_it_follows() -> None:
    """3.4 % -> 2.6 % shows as 3 % -> 3 %: no move, not "3%→3% ▼1"; 2.4 -> 3.6 is ▲2 (2 -> 4)."""
    snap = snapshot("INPUT_BOUND")
    snap["window"]["pct"].update(forward=2.6, optimizer=3.6)
    snap["first_window_pct"] = {**snap["first_window_pct"], "forward": 3.4, "optimizer": 2.4}
    text = text_of([snap])
    assert "fwd 3%→3% =" in text, text
    assert "opt 2%→4% ▲2" in text, text


def test_phase_colours_stay_distinct_on_a_16_colour_terminal() -> None:
    """TERM=xterm: rich brings colours down to the 16 standard ones; each phase keeps its own."""
    from rich.color import ColorSystem
    from rich.style import Style

    for system in (ColorSystem.STANDARD, ColorSystem.EIGHT_BIT, ColorSystem.TRUECOLOR):
        shown = {p: Style.parse(PHASE_STYLE[p]).color.downgrade(system).name for p in PHASES}
        assert len(set(shown.values())) == len(PHASES), (system, shown)
    # As painted: the bar's five phases in five different SGR colours.
    console = Console(width=100, color_system="standard", force_terminal=True,
                      file=io.StringIO())
    console.print(render_frame([snapshot("BALANCED")], now=NOW, width=100))
    bar_line = next(ln for ln in console.file.getvalue().splitlines() if "█" in ln)
    colours = set(re.findall(r"\x1b\[(\d+)m█", bar_line))
    assert len(colours) >= 4, repr(bar_line)


def test_labels_are_coloured_by_severity() -> None:
    def style_of(snap: dict[str, Any], word: str) -> str:
        return next(str(s.style) for s in segments([snap]) if s.text == word)

    assert "yellow" in style_of(snapshot("INPUT_BOUND"), "INPUT_BOUND")
    assert "green" in style_of(snapshot("BALANCED"), "BALANCED")
    crit = snapshot("INPUT_BOUND")
    crit["diagnosis"]["severity"] = "crit"  # a writer that carries the summary's severity
    assert "red" in style_of(crit, "INPUT_BOUND")


# --- Text from a snapshot is data -----------------------------------------------------------

HOSTILE = "[bold red]pwn[/] \x1b[2J\x1b]8;;http://x\x07::error::boom\nnext \u202eevil"


def test_hostile_strings_render_literally_and_harmlessly() -> None:
    snap = snapshot("INPUT_BOUND", run_name=HOSTILE, host="[link=http://x]h[/link]")
    snap["diagnosis"]["message"] = HOSTILE
    snap["diagnosis"]["kind"] = "[blink]X[/blink]"
    snap["summary_path"] = "::error::x"
    text = text_of([snap, dict(snap, rank=1)])
    assert "[bold red]pwn[/]" in text and "[link=http://x]h[/link]" in text
    assert "[blink]X[/blink]" in text
    assert "\\x1b[2J" in text and "\\n" in text and "\\u202e" in text
    for line in text.splitlines():
        assert not line.lstrip("│ ").startswith("::"), line
    console = Console(record=True, width=100, color_system="truecolor",
                      file=io.StringIO())
    console.print(render_frame([snap], now=NOW))
    styled = console.export_text(styles=True)
    # The only escape sequences are the view's own colours (SGR ... m).
    assert re.sub(r"\x1b\[[0-9;]*m", "", styled).count("\x1b") == 0
    line = plain_progress_line([snap])
    assert "\x1b" not in line and "\n" not in line and "[blink]X[/blink]" in line


# --- Never crash on what a file holds ----------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12,
)
KEYS = list(snapshot())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.dictionaries(st.sampled_from(KEYS), JSON, max_size=len(KEYS)), min_size=1,
                max_size=3),
       st.floats(allow_nan=True, allow_infinity=True), st.none() | st.integers(0, 40))
def test_any_values_in_any_field_render_without_raising(docs: list[dict], now: float,
                                                        height: int | None) -> None:
    snaps = [dict(d, live_version=LIVE_VERSION) for d in docs]
    text_of(snaps, now=now if now == now else NOW, height=height)
    assert "\n" not in plain_progress_line(snaps, now=now)


def test_every_field_of_a_real_snapshot_can_go_missing() -> None:
    full = snapshot("INPUT_BOUND")
    for key in full:
        if key == "live_version":
            continue
        partial = {k: v for k, v in full.items() if k != key}
        text_of([partial, dict(partial, rank=1)])
        plain_progress_line([partial])
        for inner in ("window", "memory", "diagnosis"):
            if isinstance(partial.get(inner), dict):
                for sub in list(partial[inner]):
                    broken = json.loads(json.dumps(partial))
                    broken[inner][sub] = "garbage"
                    text_of([broken])


def test_torn_and_garbage_files_beside_a_good_one_still_render(tmp_path: Path) -> None:
    write(tmp_path, snapshot())
    good = snapshot_path(tmp_path, 0).read_bytes()
    snapshot_path(tmp_path, 1).write_bytes(good[: len(good) // 2])  # torn
    snapshot_path(tmp_path, 2).write_bytes(b"\xff\xfe\x00garbage")
    snapshot_path(tmp_path, 3).write_text("[1, 2, 3]")
    snapshot_path(tmp_path, 4).write_text(json.dumps({"live_version": "9.0"}))
    snaps = read_snapshots(tmp_path)
    assert [s["rank"] for s in snaps] == [0]
    assert "train_resnet" in text_of(snaps)


# --- The plain line -------------------------------------------------------------------------

def test_the_plain_line_says_the_split_the_labels_and_stale_ranks() -> None:
    snap = snapshot("INPUT_BOUND")
    assert plain_progress_line([snap]) == (
        "traceml-ci: step 1200 · 14.2 steps/s · dl 47% fwd 31% bwd 18% opt 4% · INPUT_BOUND")
    grow = snapshot("INPUT_BOUND", rank=1, steps_done=1100, heartbeat=950.0)
    snap["memory_diagnosis"] = growth_diagnosis()
    line = plain_progress_line([snap, grow], now=NOW)
    assert line == ("traceml-ci: step 1100 · 14.2 steps/s · dl 47% fwd 31% bwd 18% opt 4% · "
                    "INPUT_BOUND · memory MEMORY_GROWTH · 2 ranks · STALE heartbeat: rank 1")
    done = snapshot("BALANCED", status="completed", summary_path="x.json")
    assert plain_progress_line([done]).endswith("BALANCED · ended (completed)")
    assert plain_progress_line([]) == "traceml-ci: waiting for the first steps"
    assert plain_progress_line([{}]) == "traceml-ci: step - · - steps/s · dl - fwd - bwd - " \
                                        "opt - · -"


def test_the_readme_picture_is_what_the_script_draws(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "live-view.svg"
    subprocess.run([sys.executable, "docs/render_live_frame.py", "--out", str(out)], cwd=repo,
                   check=True, timeout=120, capture_output=True)
    svg = out.read_text(encoding="utf-8")
    assert "INPUT_BOUND" in svg
    assert svg == (repo / "docs" / "live-view.svg").read_text(encoding="utf-8"), (
        "docs/live-view.svg is out of date: run `python docs/render_live_frame.py` and commit it")


@pytest.mark.parametrize("width", [40, 60, 80, 100, 160])
def test_the_frame_fits_the_terminal_and_keeps_a_stale_rank_visible(width: int) -> None:
    snaps = [snapshot(rank=0, world_size=2),
             snapshot("COMPUTE_BOUND", rank=1, world_size=2, heartbeat=NOW - 20)]
    text = text_of(snaps, width=width)
    assert max(len(line) for line in text.splitlines()) == width
    if width >= 60:
        rows = [line for line in text.splitlines() if "ci-" in line][1:]
        assert "STALE 20s" in rows[1] and rows[1].split()[1] == "1"


def _eight_ranks() -> list[dict[str, Any]]:
    return [snapshot(rank=i, world_size=8, host=f"node-{i}",
                     heartbeat=NOW - (30 if i in (5, 6) else 0.4)) for i in range(8)]


def test_a_short_terminal_gets_a_compact_frame_with_the_stale_ranks_first() -> None:
    snaps = _eight_ranks()
    text = text_of(snaps, height=16)
    lines = text.splitlines()
    assert len(lines) <= 16 < len(text_of(snaps).splitlines())
    rows = [line for line in lines if "node-" in line][1:]
    shown = [line.split()[1] for line in rows]
    assert "5" in shown and "6" in shown and "… 3 more ranks" in text
    assert "INPUT_BOUND · memory BALANCED" in text and "step 1,200 · 14.2 steps/s" in text
    check_golden("compact_eight_ranks.txt", text)
    single = text_of(snaps[:1], height=12)
    assert len(single.splitlines()) <= 12 and "→" not in single  # hints left out


@pytest.mark.parametrize("height", [1, 4, 9, 10, 13, 20, 30])
def test_the_frame_never_takes_more_rows_than_it_is_given(height: int) -> None:
    for snaps in (_eight_ranks(), _eight_ranks()[:1], []):
        text = text_of(snaps, height=height)
        assert len(text.splitlines()) <= max(height, 1), (height, text)
    assert text_of(_eight_ranks(), height=4).startswith("traceml-ci: step 1200 ")


# --- The wait phase, and ranks labelled as the final summary labels them -------------------

#: Two ranks of a DDP job: rank 1 computes its forward 6 ms slower, rank 0 waits for it.
WAITING = {"dataloader": 0.3, "forward": 3.0, "backward": 4.0, "optimizer": 0.5, "wait": 6.2}
LATE = {"dataloader": 0.3, "forward": 9.0, "backward": 4.0, "optimizer": 0.5, "wait": 0.2}


def test_a_run_with_the_wait_phase_shows_it_in_the_bar_legend_and_plain_line() -> None:
    snap = rank_snapshot(WAITING, rank=0, world_size=1)
    pct = snap["window"]["pct"]
    assert list(pct) == list(PHASES_WITH_WAIT) == list(snap["window"]["phase_ms"])
    assert abs(sum(pct.values()) - 100.0) < 0.05
    wait = round(pct["wait"])
    assert wait == 44  # 6.2 of 14 ms
    text = text_of([snap])
    assert f"█ wait {wait}%" in text
    line = plain_progress_line([snap])
    assert f"bwd {round(pct['backward'])}% wait {wait}% opt" in line
    widths = split_widths(pct, 80)
    assert sum(widths.values()) == 80 and abs(widths["wait"] - 0.44 * 80) <= 1
    waits = [s for s in segments([snap]) if s.style is not None and s.style.color is not None
             and s.style.color.name == PHASE_STYLE["wait"] and "█" in s.text]
    assert sum(len(s.text.strip()) for s in waits) > 0.4 * 80  # the bar's wait, coloured


def test_a_snapshot_without_the_wait_phase_has_no_wait_key_and_shows_none() -> None:
    snap = snapshot("COMPUTE_BOUND")
    assert list(snap["window"]["pct"]) == list(PHASES)
    assert "wait" not in text_of([snap]) and "wait" not in plain_progress_line([snap])


def test_ranks_are_labelled_by_the_final_summarys_straggler_rule() -> None:
    snaps = [rank_snapshot(WAITING, rank=0), rank_snapshot(LATE, rank=1, steps_done=1190)]
    # The final summary of the same windows names rank 1, slow in forward.
    merged = merge_ranks([s["window_summary"] for s in snaps], world_size=2)
    straggler = merged["distributed"]["straggler"]
    assert (straggler["label"], straggler["rank"], straggler["cause"]) == (
        "COMPUTE_STRAGGLER", 1, "forward")
    assert rank_straggler(snaps, NOW) == ("COMPUTE_STRAGGLER", 1)
    rows = {line.split()[1]: line for line in text_of(snaps).splitlines()
            if re.match(r"│ +[01]  node-a", line)}
    assert "COMPUTE_STRAGGLER" in rows["1"] and "waits for rank 1" in rows["0"]
    assert "COMPUTE_BOUND" not in rows["0"]  # the waiting rank's own window says no such thing
    assert "COMPUTE_STRAGGLER rank 1" in plain_progress_line(snaps, now=NOW)
    # Balanced ranks keep their windows' own labels.
    even = [rank_snapshot(WAITING, rank=0), rank_snapshot(WAITING, rank=1)]
    assert rank_straggler(even, NOW) is None
    assert "waits for" not in text_of(even) and "STRAGGLER" not in plain_progress_line(even)
    # A stale rank is left out: its window is old.
    stale = [snaps[0], dict(snaps[1], heartbeat=NOW - 60.0)]
    assert rank_straggler(stale, NOW) is None
