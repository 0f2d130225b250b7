"""``traceml-ci report``: one self-contained HTML file per call, for one run, a diff, a set and
many runs; escaping; bad input; and that ``diff`` never loads matplotlib.

That a browser draws the page is checked in tests/browser/test_render_in_chromium.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from html.parser import HTMLParser

import pytest

from tests.gate.summaries import DATA, make, real, shift
from traceml_ci.cli.main import main
from traceml_ci.errors import ExitCode, install_hint
from traceml_ci.gate import write_baseline_set

pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")

A, B, C = DATA / "input_bound_a.json", DATA / "input_bound_b.json", DATA / "compute_bound.json"
HOSTILE = '<script>alert(1)</script> & "$x$" \u202e'


class _Page(HTMLParser):
    """The tags, headings and text of a page, as a browser's parser reads them."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.headings: list[str] = []
        self.text: list[str] = []
        self._in: str | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag in ("h2", "h3"):
            self._in = tag

    def handle_endtag(self, tag):
        if tag == self._in:
            self._in = None

    def handle_data(self, data):
        self.text.append(data)
        if self._in:
            self.headings.append(data)

    def count(self, tag: str) -> int:
        return sum(1 for t, _ in self.tags if t == tag)


def report(tmp_path, capsys, *inputs, out="report.html"):
    target = tmp_path / out
    code = main(["report", *map(str, inputs), "-o", str(target)])
    stdout, err = capsys.readouterr()
    return code, target, stdout, err


def test_one_run_gets_its_split_step_times_memory_and_diagnoses(tmp_path, capsys):
    code, target, out, err = report(tmp_path, capsys, A)
    assert code == 0 and out == "" and err.startswith(f"wrote {target}")
    page = _Page(target.read_text(encoding="utf-8"))
    assert page.count("svg") == 3  # split, step time, memory
    assert page.count("script") == 0 and page.count("img") == 0
    headings = [h for h in page.headings if h != "input_bound"]
    assert headings == ["Where the step time goes", "Step time distribution", "Memory",
                        "Diagnoses"]
    text = " ".join(page.text)
    for d in real()["diagnoses"]:
        assert d["message"] in text
    # The split chart's bar widths are the summary's shares (matplotlib draws them as paths
    # with ids; the legend names every phase).
    for phase in ("dataloader", "forward", "backward", "optimizer", "other"):
        assert phase in text


def test_the_file_fetches_nothing(tmp_path, capsys):
    _, target, _, _ = report(tmp_path, capsys, A, B)
    html = target.read_text(encoding="utf-8")
    assert "default-src 'none'" in html  # the page's policy: no script, no fetch
    refs = re.findall(r'(?:src|href)\s*=\s*"([^"]*)"', html)
    assert all(r.startswith("#") for r in refs), refs  # only links inside the page (SVG)
    assert "@import" not in html and "url(http" not in html


def test_two_runs_are_compared_side_by_side(tmp_path, capsys):
    base = make(name="main")
    head = make(shift(dataloader=4.0), name="pr-42")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(base))
    b.write_text(json.dumps(head))
    code, target, _, _ = report(tmp_path, capsys, a, b)
    assert code == 0  # a regression is drawn, not an exit code: report is not the gate
    html = target.read_text(encoding="utf-8")
    page = _Page(html)
    assert "regression" in " ".join(page.text)
    assert "Compared" in page.headings
    assert "main → pr-42" in page.headings
    for side in ("base", "head"):  # every chart labels both sides (SVG text)
        assert html.count(f">{side}<") >= 3
    assert page.count("svg") == 3  # each chart holds both sides


def test_a_set_against_a_set_draws_a_section_per_job(tmp_path, capsys):
    base, head = tmp_path / "base.json", tmp_path / "head.json"
    write_baseline_set(base, {"t::a": make(), "t::b": make()})
    write_baseline_set(head, {"t::a": make(), "t::b": make(shift(other=6.0))})
    code, target, _, _ = report(tmp_path, capsys, base, head)
    assert code == 0
    page = _Page(target.read_text(encoding="utf-8"))
    jobs = [h for h in page.headings if h.startswith("t::")]
    assert jobs == ["t::b", "t::a"]  # the regressed job first
    assert page.count("svg") == 6


def test_many_runs_get_the_trend_first(tmp_path, capsys):
    code, target, _, _ = report(tmp_path, capsys, A, B, C, tmp_path / "..")
    assert code == ExitCode.BAD_INPUT  # a folder without a summary is bad input
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "final_summary.json").write_text(C.read_text())
    code, target, _, _ = report(tmp_path, capsys, A, B, C, run_dir)
    assert code == 0
    page = _Page(target.read_text(encoding="utf-8"))
    assert page.headings[0] == "Trend"
    assert page.count("svg") == 1 + 4 * 3


def test_input_text_is_escaped_in_the_page_and_the_charts(tmp_path, capsys):
    doc = make(name=HOSTILE)
    doc["diagnoses"][0]["message"] = HOSTILE
    path = tmp_path / "x.json"
    path.write_text(json.dumps(doc))
    code, target, _, _ = report(tmp_path, capsys, path, path, path)
    assert code == 0
    html = target.read_text(encoding="utf-8")
    page = _Page(html)
    assert page.count("script") == 0
    assert "<script>alert" not in html and "&lt;script&gt;" in html
    assert re.search(r'<text [^>]*>&lt;script&gt;[^<]*"\$x\$"', html)  # SVG text, no mathtext
    assert "\u202e" not in html and "\\u202e" in html  # the override shown, not obeyed


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, target, out, err = report(tmp_path, capsys, bad)
    assert code == ExitCode.BAD_INPUT and not target.exists()
    assert err.count("\n") == 1 and str(bad) in err and "Traceback" not in err


def test_unwritable_output_is_bad_input(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = main(["report", str(A), "-o", str(blocker / "report.html")])
    err = capsys.readouterr().err
    assert code == ExitCode.BAD_INPUT and "report.html" in err


def test_without_matplotlib_it_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails, as if not installed
    code, target, _, err = report(tmp_path, capsys, A)
    assert code == ExitCode.MISSING_DEPENDENCY and install_hint("report") in err
    assert not target.exists()


def test_diff_and_the_markdown_chart_never_load_matplotlib():
    probe = (
        "import io, contextlib, sys\nfrom traceml_ci.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main(['diff', '--format', 'markdown', {str(A)!r}, {str(C)!r}])\n"
        "print('matplotlib' in sys.modules, 'numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.split() == ["False", "False"]


def test_runs_recorded_in_a_history_database_are_drawn_with_their_trend(tmp_path, capsys):
    db = tmp_path / "history.sqlite"
    for path in (A, B, C):
        assert main(["record", str(path), "--db", str(db), "--branch", "main"]) == 0
    assert main(["record", str(A), "--db", str(db), "--branch", "feature"]) == 0
    capsys.readouterr()
    code, target, stdout, _ = report(tmp_path, capsys, "--db", db, "--branch", "main")
    assert code == 0, stdout
    page = _Page(target.read_text(encoding="utf-8"))
    assert page.headings[0] == "Trend"
    assert page.count("svg") == 1 + 3 * 3  # the trend, and three runs of main (not feature's)
    code, _, _, err = report(tmp_path, capsys, "--db", tmp_path / "none.sqlite")
    assert code == ExitCode.BAD_INPUT and "none.sqlite" in err
    code, _, _, err = report(tmp_path, capsys)
    assert code == ExitCode.BAD_INPUT  # no inputs at all: one line, exit 2
