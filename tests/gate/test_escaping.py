"""Text from a summary is made safe for each output: lone surrogates never crash a report, and
in text output and ``show`` nothing can start a workflow command or move the cursor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gate.summaries import make, shift
from traceml_ci.gate import fmt

SURROGATE = "train_\udcff.py"
CRAFTED = "x\n::error ::x\r::add-mask::y\x1b[2J\u202eevil"
FORMATS = ("text", "markdown", "json")


def _write(path: Path, doc: dict) -> str:
    path.write_text(json.dumps(doc), encoding="ascii")  # \udcff survives as a JSON escape
    return str(path)


def _cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    return subprocess.run([sys.executable, "-m", "traceml_ci", *argv], cwd=cwd,
                          capture_output=True, timeout=60, env=env)


def _pair(tmp_path: Path, name: str) -> tuple[str, str]:
    base = _write(tmp_path / "base.json", make(name=name))
    head = _write(tmp_path / "head.json", make(shift(dataloader=4.0), name=name))
    return base, head


@pytest.mark.parametrize("form", FORMATS)
def test_a_lone_surrogate_in_a_run_name_never_crashes_diff(tmp_path, form):
    base, head = _pair(tmp_path, SURROGATE)
    out = _cli("diff", base, head, "--format", form, cwd=tmp_path)
    assert out.returncode == 1, out.stderr  # the regression, reported, not a crash
    assert b"Traceback" not in out.stderr
    if form == "json":
        assert json.loads(out.stdout)["head_run"] == "train_\\udcff.py"
    else:
        assert b"train_\\udcff.py" in out.stdout
    written = tmp_path / f"report.{form}"
    out = _cli("diff", base, head, "--format", form, "--output", str(written), cwd=tmp_path)
    assert out.returncode == 1 and b"Traceback" not in out.stderr
    if form != "json":
        assert "train_\\udcff.py" in written.read_text(encoding="utf-8")
    else:
        assert json.loads(written.read_text(encoding="utf-8"))["head_run"] == "train_\\udcff.py"


def test_a_lone_surrogate_in_a_run_name_never_crashes_show(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    _write(folder / "final_summary.json", make(name=SURROGATE))
    out = _cli("show", str(folder), "--width", "120", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert b"train_\\udcff.py" in out.stdout


def _no_command_or_escape(stdout: bytes) -> None:
    text = stdout.decode("utf-8")
    assert "\x1b" not in text and "\r" not in text and "\u202e" not in text
    for line in text.splitlines():
        assert not line.lstrip(" │•").startswith("::"), line


def test_text_output_cannot_start_a_workflow_command_or_move_the_cursor(tmp_path):
    base, head = _pair(tmp_path, CRAFTED)
    out = _cli("diff", base, head, cwd=tmp_path)
    assert out.returncode == 1
    _no_command_or_escape(out.stdout)
    assert b"x\\n::error ::x\\r::add-mask::y\\x1b[2J\\u202eevil" in out.stdout


def test_show_cannot_start_a_workflow_command_or_move_the_cursor(tmp_path):
    doc = make(name=CRAFTED)
    doc["env"]["device_name"] = "\n::error ::dev"
    doc["diagnoses"][0]["message"] = "\x1b[2J\n::warning ::msg"
    path = _write(tmp_path / "s.json", doc)
    out = _cli("show", path, "--width", "200", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    _no_command_or_escape(out.stdout)


def test_a_set_key_is_escaped_in_text_too(tmp_path):
    from traceml_ci.gate import write_baseline_set

    write_baseline_set(tmp_path / "b.json", {CRAFTED: make(), "ok": make()})
    write_baseline_set(tmp_path / "h.json", {CRAFTED: make(shift(dataloader=4.0)), "ok": make()})
    out = _cli("diff", str(tmp_path / "b.json"), str(tmp_path / "h.json"), cwd=tmp_path)
    assert out.returncode == 1
    _no_command_or_escape(out.stdout)


@pytest.mark.parametrize(("raw", "shown"), [
    ("a\nb", "a\\nb"), ("\x1b[2J", "\\x1b[2J"), ("\udcff", "\\udcff"), ("\u202e", "\\u202e"),
    ("\x85", "\\x85"), ("plain ünï", "plain ünï"),
])
def test_plain_escapes_what_a_terminal_acts_on(raw, shown):
    assert fmt.plain(raw) == shown


@pytest.mark.parametrize(("raw", "bad"), [
    ("fixes GH-7", "GH-7"), ("gh-12", "gh-12"), ("a\u202eb", "\u202e"), ("a\u2066b", "\u2066"),
    ("x\u202ay", "\u202a"), ("#3", "#3"), ("@me", "@me"), ("\udcff", "\udcff"),
])
def test_markdown_neutralises_references_and_bidi_overrides(raw, bad):
    out = fmt.markdown(raw)
    assert bad not in out
    out.encode("utf-8")  # encodable


def test_markdown_report_neutralises_them_end_to_end(tmp_path):
    base, head = _pair(tmp_path, "see GH-7 \u202eevil")
    out = _cli("diff", base, head, "--format", "markdown", cwd=tmp_path)
    text = out.stdout.decode("utf-8")
    assert "GH-7" not in text and "\u202e" not in text and "GH&#8203;-7" in text
