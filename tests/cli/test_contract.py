"""The CLI's exit-code contract: 1 means regression and nothing else; anything unexpected is one
line on stderr and exit 4, never a traceback; text from a file cannot break the line."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.summary.builders import summary_doc
from traceml_ci.cli.main import main
from traceml_ci.errors import ExitCode, TracemlError, one_line

PHASES = {"dataloader": 4.7, "forward": 3.1, "backward": 1.8, "optimizer": 0.4}
CLI = [sys.executable, "-m", "traceml_ci"]
#: A script whose file name is not UTF-8 (``train_\xff.py``) gets this run name.
SURROGATE_NAME = "train_\udcff.py"


def _file(path: Path, **run) -> str:
    doc = summary_doc(PHASES)
    doc["run"].update(run)
    # ensure_ascii writes a lone surrogate as the JSON escape \udcff, as the tracer does.
    path.write_text(json.dumps(doc), encoding="ascii")
    return str(path)


def _one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(autouse=True)
def _quiet_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no pyproject.toml rules from the repository


def test_the_table_is_defined_once_and_only_regression_is_1() -> None:
    assert [c for c in ExitCode if c == 1] == [ExitCode.REGRESSION]
    assert len({int(c) for c in ExitCode}) == len(ExitCode)  # no aliases
    assert TracemlError.exit_code == ExitCode.BAD_INPUT  # an unclassified error is not a verdict
    from traceml_ci.cli.diff import exit_code
    from traceml_ci.gate import Verdict

    # the verdicts (diff's and A/B's: one type) map onto the one table (no aliases of their own)
    assert [exit_code(v) for v in Verdict] == [0, 0, 1, 3, 0], list(Verdict)
    assert exit_code(Verdict.INCONCLUSIVE, "fail") == ExitCode.INCONCLUSIVE


def test_a_crash_inside_a_command_is_one_line_and_exit_4(tmp_path, monkeypatch, capsys) -> None:
    compare = importlib.import_module("traceml_ci.gate.compare")  # the package shadows the name

    def broken(*args, **kwargs):
        raise TypeError("unsupported operand\nsecond line \x1b[2J")

    monkeypatch.setattr(compare, "compare", broken)
    a = _file(tmp_path / "a.json")
    assert main(["diff", a, a]) == ExitCode.INTERNAL
    out, err = capsys.readouterr()
    line = _one_line(err)
    assert "internal error (TypeError: unsupported operand\\nsecond line \\x1b[2J)" in line
    assert "please report" in line and "\x1b" not in line and out == ""


@pytest.mark.parametrize(
    "raised",
    [KeyError("step_time"), RecursionError(), MemoryError(), SystemExit(1), SystemExit("msg")],
    ids=repr,
)
def test_any_unexpected_exception_or_stray_exit_is_4(raised, tmp_path, monkeypatch, capsys):
    from traceml_ci.cli import validate

    def boom(args):
        raise raised

    monkeypatch.setattr(validate, "run", boom)
    assert main(["validate", _file(tmp_path / "a.json")]) == ExitCode.INTERNAL
    assert type(raised).__name__ in _one_line(capsys.readouterr().err)


def test_an_undefined_return_code_is_not_passed_on(tmp_path, monkeypatch, capsys) -> None:
    from traceml_ci.cli import validate

    undefined = max(c for c in ExitCode if c < 128) + 1  # 7 is ab's inconclusive now
    monkeypatch.setattr(validate, "run", lambda args: undefined)
    assert main(["validate", _file(tmp_path / "a.json")]) == ExitCode.INTERNAL
    assert f"undefined exit code {undefined}" in _one_line(capsys.readouterr().err)


def test_typed_errors_keep_their_codes(tmp_path, monkeypatch, capsys) -> None:
    from traceml_ci.cli import validate
    from traceml_ci.errors import ApiError

    monkeypatch.setattr(validate, "run", lambda args: (_ for _ in ()).throw(ApiError("403")))
    assert main(["validate", "x"]) == ExitCode.API
    assert _one_line(capsys.readouterr().err) == "traceml-ci: error: 403"


def test_an_error_class_cannot_claim_the_regression_code(monkeypatch, capsys) -> None:
    from traceml_ci.cli import validate

    class Confused(TracemlError):
        exit_code = 1  # type: ignore[assignment]

    monkeypatch.setattr(validate, "run", lambda args: (_ for _ in ()).throw(Confused("oops")))
    assert main(["validate", "x"]) == ExitCode.INTERNAL
    assert "internal error (Confused: oops)" in _one_line(capsys.readouterr().err)


def test_a_closed_stdout_is_not_an_error_report(tmp_path, monkeypatch, capsys) -> None:
    from traceml_ci.cli import validate

    monkeypatch.setattr(validate, "run", lambda args: (_ for _ in ()).throw(BrokenPipeError()))
    assert main(["validate", "x"]) == ExitCode.BROKEN_PIPE
    assert capsys.readouterr().err == ""


def test_a_path_with_newline_and_escape_stays_on_one_line(tmp_path, capsys) -> None:
    path = str(tmp_path / "x\n::error ::forged\x1b[2J.json")
    assert main(["show", path]) == ExitCode.BAD_INPUT
    line = _one_line(capsys.readouterr().err)
    assert "x\\n::error ::forged\\x1b[2J.json" in line and "cannot read" in line


def test_real_process_crash_exits_4_without_traceback(tmp_path) -> None:
    """The console entry point, in a real interpreter: exit status 4, one line on stderr."""
    a = _file(tmp_path / "a.json")
    code = (
        "import importlib, sys\n"
        "c = importlib.import_module('traceml_ci.gate.compare')\n"
        "def broken(*a, **k): raise ZeroDivisionError('division by zero')\n"
        "c.compare = broken\n"
        "from traceml_ci.cli.main import entry\n"
        "sys.argv = ['traceml-ci', 'diff', sys.argv[1], sys.argv[1]]\n"
        "entry()\n"
    )
    res = subprocess.run([sys.executable, "-c", code, a], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert res.returncode == 4, res.stderr
    assert "internal error (ZeroDivisionError: division by zero)" in _one_line(res.stderr)


def _strict_env() -> dict[str, str]:
    """stdout as a CI runner has it: UTF-8 and strict, so an unescaped surrogate would crash."""
    env = dict(os.environ, PYTHONIOENCODING="utf-8:strict", PYTHONUTF8="0", LC_ALL="C.UTF-8")
    env.pop("TRACEML_CI_DEBUG", None)
    return env


def test_surrogate_run_name_and_file_name_validate_without_traceback(tmp_path) -> None:
    """A script named ``train_\\xff.py`` gives the run name 'train_\\udcff.py': a valid summary.
    ``validate`` says so, escaping what it prints; a file name with that byte too."""
    folder = os.fsencode(tmp_path)
    named = _file(Path(os.fsdecode(folder + b"/summary_\xff.json")), name=SURROGATE_NAME)
    bad_status = _file(tmp_path / "bad.json", name=SURROGATE_NAME, status="\udcff\n::error ::x")
    res = subprocess.run([*CLI, "validate", named, bad_status], capture_output=True,
                         env=_strict_env(), timeout=60, cwd=tmp_path)
    out, err = res.stdout.decode(), res.stderr.decode()
    assert res.returncode == ExitCode.BAD_INPUT, err
    assert out.splitlines() == [f"{tmp_path}/summary_\\udcff.json: valid"]
    line = _one_line(err)
    assert line.startswith(f"{bad_status}: $.run.status: ") and "\\udcff\\n::error ::x" in line


def test_surrogate_run_name_diff_never_crashes_or_reads_as_regression(tmp_path) -> None:
    """Reported consistently with validate: the same valid file is diffed in every format, to
    stdout (exit 0; what a stream cannot encode is escaped) and to --output (never exit 1 or a
    traceback; exit 0 once the renderers escape run names, until then 4 with one line)."""
    a = _file(tmp_path / "a.json", name=SURROGATE_NAME)
    for fmt in ("text", "markdown", "json"):
        res = subprocess.run([*CLI, "diff", "--format", fmt, a, a], capture_output=True,
                             env=_strict_env(), timeout=60, cwd=tmp_path)
        err = res.stderr.decode()
        assert res.returncode == ExitCode.OK, (fmt, err)
        assert "Traceback" not in err and b"\\udcff" in res.stdout
        out = tmp_path / f"report.{fmt}"
        res = subprocess.run([*CLI, "diff", "--format", fmt, "--output", str(out), a, a],
                             capture_output=True, env=_strict_env(), timeout=60, cwd=tmp_path)
        assert res.returncode in (ExitCode.OK, ExitCode.INTERNAL), (fmt, res.stderr)
        _one_line(res.stderr.decode())


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not os.path.exists("/dev/zero"), reason="POSIX")
def test_diff_refuses_devices_and_streams_at_once(tmp_path) -> None:
    """``diff /dev/zero x.json`` used to read forever; a real process must answer, exit 2."""
    a = _file(tmp_path / "a.json")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # a stream that stays open
    try:
        for bad, kind in (("/dev/zero", "a character device"), (str(fifo), "a named pipe")):
            res = subprocess.run([*CLI, "diff", bad, a], capture_output=True, text=True,
                                 timeout=60, cwd=tmp_path)
            assert res.returncode == ExitCode.BAD_INPUT, res.stderr
            assert f"{bad}: is {kind}" in _one_line(res.stderr)
    finally:
        os.close(writer)


def test_diff_on_a_9_mb_run_name_is_refused_fast(tmp_path, capsys) -> None:
    """Used to take 8-63 s; now one line and exit 2, well under a second quiet (stopwatch here;
    the bound leaves a loaded machine room, and still fails the 8 s it took)."""
    import time

    big = _file(tmp_path / "big.json", name="x" * 9_000_000)
    a = _file(tmp_path / "a.json")
    for argv in (["diff", a, big], ["diff", "--format", "markdown", big, a], ["show", big],
                 ["validate", big]):
        start = time.perf_counter()
        assert main(argv) == ExitCode.BAD_INPUT
        elapsed = time.perf_counter() - start
        line = _one_line(capsys.readouterr().err)
        assert "$.run.name is 9,000,000 characters long" in line and len(line) < 400
        assert elapsed < 4.0, (argv, elapsed)


@given(st.text())
def test_one_line_leaves_nothing_that_breaks_a_line_or_an_encoder(text) -> None:
    """Whatever a file holds, the escaped text is one printable line that UTF-8 can encode."""
    import unicodedata

    line = one_line(text, limit=10_000)
    line.encode("utf-8")  # strict: no lone surrogate left
    # No control character (newlines, ESC, C1's CSI), line/paragraph separator, or
    # bidirectional override/isolate that could reorder what a reader sees.
    for c in line:
        assert unicodedata.category(c) not in ("Cc", "Cs", "Zl", "Zp"), ascii(line)
        assert not ("\u202a" <= c <= "\u202e" or "\u2066" <= c <= "\u2069"), ascii(line)


def test_a_reader_that_stops_early_gets_141_and_no_noise(tmp_path) -> None:
    """``traceml-ci validate ... | head -1`` in a real process: far more output than a pipe
    holds, the reader closes after one line; exit 141, nothing on stderr."""
    a = _file(tmp_path / "a.json")
    proc = subprocess.Popen([*CLI, "validate", *[a] * 20_000], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        assert proc.stdout is not None and proc.stdout.readline().endswith(b": valid\n")
        proc.stdout.close()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == ExitCode.BROKEN_PIPE, err
    assert err == b""
