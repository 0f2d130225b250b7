"""gate/render/ops.py: the top-op and delta tables, escaped for their medium; no torch in the
gate."""

from __future__ import annotations

import subprocess
import sys

from traceml_ci.gate.render.ops import ProfiledRun, markdown_section, text_section
from traceml_ci.summary.profile import top_ops

HOSTILE = "evil|</table>@team #1 [x](https://e.vil) `code`\x1b[2J\n::error::boom"


def _run(base: bool = True, device: bool = False) -> ProfiledRun:
    dev = 2.0 if device else None
    head = top_ops([("aten::addmm", 9.0, dev, 6), (HOSTILE, 3.0, dev, 3)], steps=3,
                   device="cuda" if device else "cpu")
    old = top_ops([("aten::addmm", 3.0, dev, 6), ("aten::relu", 1.5, dev, 3)], steps=3,
                  device="cpu") if base else None
    return ProfiledRun("tests/t.py::test_x", head, old, "/out/profile/trace.json", 2.25, 345_000)


def test_markdown_tables_name_ops_and_show_deltas() -> None:
    md = markdown_section([_run()])
    assert md.startswith("### Profiles of regressed tests")
    assert "#### tests/t.py::test_x" in md
    assert "3 profiled steps on cpu, re-run 2.2 s, trace 345 kB" in md
    lines = md.splitlines()
    addmm = next(x for x in lines if x.startswith("| aten::addmm") and "%" in x)
    assert "| 3.00 " in addmm and "| 2.00 " in addmm and "75.0%" in addmm
    assert "Largest changes, base → head (new, gone: not in the other side's top ops):" in md
    delta = next(x for x in lines if x.startswith("| aten::addmm") and "%" not in x)
    assert "| 1.00 " in delta and "| 3.00 " in delta and "| +2.00" in delta
    assert any(x.startswith("| aten::relu (gone)") and "| −0.5" in x for x in lines)
    assert "device ms/step" not in md


def test_a_hostile_op_name_is_inert_in_markdown() -> None:
    md = markdown_section([_run()])
    row = next(x for x in md.splitlines() if "evil" in x)
    assert row.count("|") == 5 + 0  # op, host, calls, share: no cell break from the name
    for raw in ("</table>", "@team", " #1", "](", "https://", "`", "\x1b", "\n::error"):
        assert raw not in row
    assert "&lt;/table&gt;" in row and "&#124;" in row


def test_terminal_text_escapes_controls_and_shows_the_trace() -> None:
    text = text_section(_run(device=True))
    assert "\x1b" not in text and "\n::error" not in text
    assert "\\x1b[2J\\n::error::boom" in text  # visible, on one line
    assert "trace: /out/profile/trace.json" in text
    assert "device ms/step" in text and "largest changes, base -> head:" in text


def test_no_runs_no_section_and_no_base_no_deltas() -> None:
    assert markdown_section([]) == ""
    assert "Largest changes" not in markdown_section([_run(base=False)])
    assert "largest changes" not in text_section(_run(base=False))


def test_the_renderer_imports_no_torch() -> None:
    code = ("import sys, traceml_ci.gate.render.ops, traceml_ci.summary.profile; "
            "print([m for m in ('torch', 'pandas', 'tabulate') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
