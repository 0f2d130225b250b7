"""The environment is read in one module per layer (docs/architecture.md#environment-variables):
a new module that reads it fails here, and so does a listed one that no longer does."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from traceml_ci.childenv import child_env
from traceml_ci.cli import environment

ROOT = Path(__file__).resolve().parents[1]
#: The product's packages (benchmarks, examples and tests are scripts that set up their own).
PACKAGES = ("traceml_ci", "pytest_plugin")
#: One reader per layer: the tracer's settings, the front doors' variables, GitHub's, and the
#: copy a started process gets.
ALLOWED = {
    "traceml_ci/tracer/config.py",
    "traceml_ci/cli/environment.py",
    "traceml_ci/github/context.py",
    "traceml_ci/childenv.py",
}
READS = re.compile(r"\bos\.environ\b|\bgetenv(b)?\b|\bfrom os import\b[^\n]*\benviron\b|"
                   r"\bposix\.environ\b|\bos\.environb\b")


def _readers() -> set[str]:
    found = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if READS.search(path.read_text(encoding="utf-8")):
                found.add(path.relative_to(ROOT).as_posix())
    return found


def test_only_one_module_per_layer_reads_the_environment() -> None:
    readers = _readers()
    assert readers - ALLOWED == set(), (
        "these modules read the environment: ask tracer/config.py, cli/environment.py, "
        "github/context.py or childenv.child_env instead (or add a reader on purpose, and to "
        "the table in docs/architecture.md)"
    )
    assert ALLOWED - readers == set(), "a listed reader reads nothing now: take it off the list"


def test_the_pattern_catches_each_way_of_reading() -> None:
    """The check above is only as good as its pattern: each spelling of a read matches."""
    for line in ('os.environ.get("X")', 'os.getenv("X")', "from os import environ, sep",
                 "dict(os.environ)", 'os.environb[b"X"]'):
        assert READS.search(line), line
    assert not READS.search("environment_notes(diffs)")


def test_a_child_env_is_a_copy_with_the_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEML_CI_TEST_VAR", "ours")
    env = child_env(changes={"LC_ALL": "C"})
    assert env["TRACEML_CI_TEST_VAR"] == "ours" and env["LC_ALL"] == "C"
    env["TRACEML_CI_TEST_VAR"] = "theirs"  # a copy: ours is untouched
    assert os.environ["TRACEML_CI_TEST_VAR"] == "ours"
    given = {"PATH": "/bin"}
    assert child_env(given, {"A": "1"}) == {"PATH": "/bin", "A": "1"} and given == {"PATH": "/bin"}


@pytest.mark.parametrize(("value", "tty", "wanted"),
                         [(None, True, True), ("1", True, False), ("", True, False),
                          (None, False, False)])
def test_colour_only_on_a_terminal_without_no_color(monkeypatch: pytest.MonkeyPatch,
                                                    value: str | None, tty: bool,
                                                    wanted: bool) -> None:
    if value is None:
        monkeypatch.delenv("NO_COLOR", raising=False)
    else:
        monkeypatch.setenv("NO_COLOR", value)
    assert environment.colour(tty) is wanted


def test_front_door_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEML_CI_OUT", "")
    monkeypatch.setenv("TERM", "dumb")
    monkeypatch.delenv("TRACEML_CI_DEBUG", raising=False)
    assert environment.out_dir() is None and environment.dumb_terminal()
    assert not environment.debug()
    monkeypatch.setenv("TRACEML_CI_OUT", "elsewhere")
    monkeypatch.setenv("TRACEML_CI_DEBUG", "1")
    monkeypatch.setenv("TERM", "xterm")
    assert environment.out_dir() == "elsewhere" and environment.debug()
    assert not environment.dumb_terminal()
    assert environment.progress_interval_text({"TRACEML_CI_PROGRESS_INTERVAL": "3"}) == "3"
