"""`traceml-ci show` on a distributed summary: the per-rank table, the straggler marked, its
cause and next step."""

from __future__ import annotations

import json
from typing import Any

from tests.gate.summaries import make, shift
from traceml_ci.cli.main import main
from traceml_ci.summary.ranks import merge_ranks


def job(*rank_ms: dict[str, float], hosts: tuple[str, ...] = ("node-a", "node-b"),
        failed: tuple[int, ...] = ()) -> dict[str, Any]:
    docs = []
    for r, ms in enumerate(rank_ms):
        doc = make(ms, name="ddp")
        doc["run"].update(rank=r, local_rank=0, node_rank=r, host=hosts[r],
                          world_size=len(rank_ms) + len(failed))
        docs.append(doc)
    return merge_ranks(docs, world_size=len(rank_ms) + len(failed), nodes=len(rank_ms),
                       backend="gloo", failed=failed)


def show(tmp_path, doc: dict[str, Any], capsys) -> str:
    (tmp_path / "final_summary.json").write_text(json.dumps(doc))
    assert main(["show", str(tmp_path), "--width", "100"]) == 0
    return capsys.readouterr().out


def _row(out: str, rank: int, host: str) -> str:
    return next(line for line in out.splitlines()
                if line.strip("│ ▶").split()[:1] == [str(rank)] and host in line)


def test_show_prints_one_row_per_rank_and_marks_the_input_straggler(tmp_path, capsys) -> None:
    out = show(tmp_path, job(shift(backward=6.0), shift(dataloader=6.0)), capsys)
    assert "Ranks (2 ranks, 2 node(s), gloo)" in out
    for header in ("rank", "node", "host", "status", "step ms", "own ms", "data %", "bwd %",
                   "peak MB"):
        assert header in out
    rank0, rank1 = _row(out, 0, "node-a"), _row(out, 1, "node-b")
    assert "▶ 1" in rank1 and "▶" not in rank0
    # Own work: rank 1's 18 ms against rank 0's 12 ms (its extra backward is waiting).
    assert "18.00" in rank1 and "12.00" in rank0 and "38.5" in rank1  # dataloader share
    assert "INPUT_STRAGGLER: rank 1 +50.0 % own work" in out and "mostly dataloader" in out
    assert "uneven shards" in out  # the next step


def test_show_balanced_ranks_has_no_marker(tmp_path, capsys) -> None:
    out = show(tmp_path, job(shift(), shift(forward=0.1)), capsys)
    assert "RANKS_BALANCED" in out and "▶" not in out


def test_show_names_failed_ranks(tmp_path, capsys) -> None:
    out = show(tmp_path, job(shift(), shift(), failed=(2,)), capsys)
    assert "2/3 ranks reported, failed: 2" in out


def test_show_escapes_host_names(tmp_path, capsys) -> None:
    out = show(tmp_path, job(shift(), shift(), hosts=("\x1b[2Jevil", "\n::error::x")), capsys)
    assert "\x1b" not in out and "\\x1b" in out  # shown escaped (the cell may wrap)
    assert not any(line.startswith("::error::") for line in out.splitlines())


def test_show_single_process_has_no_rank_table(tmp_path, capsys) -> None:
    assert "Ranks (" not in show(tmp_path, make(), capsys)
