"""The per-rank section of ``diff``: folded in markdown, one straggler line per side in text."""

from __future__ import annotations

from typing import Any

from tests.gate.summaries import make, shift
from tests.gate.test_render import check_golden
from traceml_ci.gate import compare
from traceml_ci.gate.render.comparison import render_markdown, render_text
from traceml_ci.summary.ranks import merge_ranks


def job(*rank_ms: dict[str, float], host: str = "node-a") -> dict[str, Any]:
    docs = []
    for r, ms in enumerate(rank_ms):
        doc = make(ms, name="ddp")
        doc["run"].update(rank=r, local_rank=r, node_rank=0, host=host, world_size=len(rank_ms))
        docs.append(doc)
    return merge_ranks(docs, world_size=len(rank_ms), nodes=1, backend="gloo")


BALANCED = job(shift(), shift(forward=0.1))
#: Rank 1 waits for its data; rank 0 waits for rank 1 inside backward (the all-reduce).
STRAGGLER = job(shift(backward=6.0), shift(dataloader=6.0))


def test_balanced_to_straggler_markdown_golden() -> None:
    md = render_markdown(compare(BALANCED, STRAGGLER))
    check_golden("ranks_straggler.md", md)
    section = md[md.index("<details><summary>Ranks (2)</summary>"):]
    assert section.count("| rank ") == 2  # one table per side
    assert "RANKS_BALANCED" in section and "INPUT_STRAGGLER: rank 1" in section
    # The straggler's row, and only it, carries the mark.
    marked = [line for line in section.splitlines() if "◀ straggler" in line]
    assert len(marked) == 1 and marked[0].startswith("| 1 ")
    assert "dataloader" in section and "uneven shards" in section  # cause and next step


def test_text_has_one_straggler_line_per_side() -> None:
    text = render_text(compare(BALANCED, STRAGGLER), width=120)
    lines = [x for x in text.splitlines() if " ranks: " in x]
    assert [x.split(" ranks: ")[0] for x in lines] == ["base", "head"]
    assert "RANKS_BALANCED" in lines[0] and "INPUT_STRAGGLER: rank 1" in lines[1]


def test_hostile_host_names_are_escaped() -> None:
    md = render_markdown(compare(BALANCED, job(shift(), shift(), host="<img src=x>|@all")))
    assert "<img" not in md and "@all" not in md
    assert "&lt;img src=x&gt;&#124;@&#8203;all" in md
    text = render_text(compare(BALANCED, job(shift(), shift(), host="\x1b[2J")), width=120)
    assert "\x1b" not in text


def test_single_process_comparison_has_no_rank_section() -> None:
    c = compare(make(), make())
    assert "Ranks (" not in render_markdown(c) and " ranks: " not in render_text(c)


def test_a_world_size_change_shows_both_sides_ranks() -> None:
    four = job(shift(), shift(), shift(), shift(dataloader=6.0))
    c = compare(BALANCED, four)
    assert c.verdict.value == "incomparable"
    md = render_markdown(c)
    section = md[md.index("<details><summary>Ranks (4)</summary>"):]
    assert "2/2 ranks reported" in section and "4/4 ranks reported" in section
    assert "INPUT_STRAGGLER: rank 3" in section
    assert [line.split("|")[1].strip() for line in section.splitlines()
            if line.startswith("| ") and "node-a" in line] == ["0", "1", "0", "1", "2", "3"]
