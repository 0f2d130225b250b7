"""The realistic smoke-test suite, measured: gated sessions of ``mlrepo/`` in a fresh git
repository, unchanged or with one change of the corpus (``changes.py``), beside CPU hogs.

    python benchmarks/cisuite/run.py --mode stored --sessions 2
    python benchmarks/cisuite/run.py --mode ab --sessions 2 --hogs 2
    python benchmarks/cisuite/run.py --mode stored --change issue32 --hogs 2 -o out.jsonl
    python benchmarks/cisuite/run.py --mode stored --change no_workers --reverse
    python benchmarks/cisuite/run.py --mode both --sessions 6 --hogs 2 --compare-wall
    python benchmarks/cisuite/run.py --summarize out.jsonl [more.jsonl ...]
    python benchmarks/cisuite/run.py --list

For each (change, direction) the driver copies the template into a temporary git repository and
commits it on ``main`` -- the original code, or, with ``--reverse``, the changed code (the fix
applied: the change's base is the broken code, its head the original). Stored mode records a
baseline there once (``pytest --traceml-baseline=main.json --traceml-update-baseline``), then
edits the working tree to the head and runs each gated session (``--traceml-baseline``,
``--traceml-comparison``, ``--traceml-report``, ``--traceml-save``); A/B mode runs
``pytest --traceml-ab=main --traceml-ab-json=...`` against that commit. ``--mode both``
alternates stored and A/B sessions, so that they see the same conditions.

``--hogs N`` starts N background busy loops (``python -c 'while 1: pass'``) on and off at random
moments, each with exponential on and off periods (``--hog-mean-s``, seeded by ``--seed``), for
the whole run, baseline recording included. Every child (pytest sessions and hogs) runs in its
own process group, killed on any exit: an error, Ctrl-C or SIGTERM.

Each session is one JSON line in ``--output``: mode, change, direction, session index, pytest's
exit code, wall seconds, the mean number of hogs running during it, and per test its verdict,
whether it failed (pytest's junit XML), the causes and reasons the gate named, how many traced
runs it took and what it improved; and whether the session had any traceml warning. The table
at the end (also ``--summarize``) gives per (mode, change, direction): sessions, failures,
sessions with a warning, mean runs per test, mean wall time, and how many sessions came out as
the corpus expects (a change: fails with its cause; reversed: passes showing ``improved``;
harmless or unchanged: passes).

How runs per test are counted (stored mode): the traced runs' own output folders, which the
plugin makes per test under ``--basetemp`` (``traceml-<test>N/``: a marked test's first run
writes ``final_summary.json`` there and each confirmation re-run ``repeat-K/final_summary.json``;
a ``run_script`` test one ``run-K/final_summary.json`` per run), so every run is counted, also
when the combined verdict left the first one out. Cross-checked against the ``repeats.count``
of the summary the plugin saved (``--traceml-save``) and the ``(×N runs)`` of its terminal line.
In A/B mode a test's runs are its child sessions: 2 per round (``ab.rounds`` in the A/B JSON).

Outputs are read defensively (the gate's verdict rules change): any field may be missing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parents[1]  # the traceml-ci tree whose plugin is measured
sys.path.insert(0, str(HERE))

import changes as corpus  # noqa: E402

UNCHANGED = "unchanged"
#: A session that runs longer than this is killed and recorded with exit code None.
DEFAULT_SESSION_TIMEOUT_S = 2400
#: Terminal lines of the plugin's traceml section: ``LABEL  nodeid [key k] (×N runs)  detail``.
_RESULT_LINE = re.compile(
    r"^(?P<label>(?:A/B )?[A-Z][A-Z /]*?)\s{2,}(?P<nodeid>\S+)(?: \[key (?P<key>[^\]]+)\])?"
    r"(?: \(×(?P<runs>\d+) runs\))?(?:\s{2}(?P<detail>.*))?$")
_SECTION = re.compile(r"^[-=]{3,} (?P<title>.+?) [-=]{3,}$")


# -- processes ---------------------------------------------------------------------------------

class Children:
    """Every process group this driver started; ``kill_all`` ends them (SIGTERM, then SIGKILL
    after a grace period), each by its own group id."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen[Any]] = []
        self._lock = threading.Lock()

    def popen(self, cmd: list[str], **kw: Any) -> subprocess.Popen[Any]:
        proc = subprocess.Popen(cmd, start_new_session=True, **kw)
        with self._lock:
            self._procs.append(proc)
        return proc

    def forget(self, proc: subprocess.Popen[Any]) -> None:
        with self._lock:
            if proc in self._procs:
                self._procs.remove(proc)

    @staticmethod
    def kill(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
        """End ``proc``'s process group: SIGTERM (pytest unwinds: an A/B worktree is removed),
        then SIGKILL for whatever is left after ``grace_s``."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=wait)
            if proc.poll() is not None and sig == signal.SIGTERM:
                # the leader is gone; its group may not be: SIGKILL the rest at once
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                return

    def kill_all(self) -> None:
        with self._lock:
            procs, self._procs = list(self._procs), []
        for proc in procs:
            self.kill(proc, grace_s=5.0)


CHILDREN = Children()


def _on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class Hogs:
    """``count`` busy loops, each switched on and off at random moments: exponential periods
    of mean ``mean_s`` each way, drawn from ``random.Random(seed + slot)``, so one seed gives
    one schedule (relative to the start). ``mean_running(t0, t1)``: the mean number of hogs
    that ran in that interval."""

    CMD = [sys.executable, "-c", "while 1: pass"]

    def __init__(self, count: int, seed: int, mean_s: float = 10.0) -> None:
        self.count, self.seed, self.mean_s = count, seed, mean_s
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._events: list[tuple[float, int]] = []  # (time, +1 on / -1 off)
        self._lock = threading.Lock()

    def __enter__(self) -> Hogs:
        for slot in range(self.count):
            t = threading.Thread(target=self._run, args=(slot,), daemon=True,
                                 name=f"hog-{slot}")
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)

    def _period(self, rng: random.Random) -> float:
        # ~5-15 s typically; never under 1 s, never over 4x the mean
        return min(max(rng.expovariate(1.0 / self.mean_s), 1.0), 4 * self.mean_s)

    def _run(self, slot: int) -> None:
        rng = random.Random(self.seed * 1000 + slot)
        running = rng.random() < 0.5
        while not self._stop.is_set():
            if not running:
                if self._stop.wait(self._period(rng)):
                    return
                running = True
                continue
            proc = CHILDREN.popen(self.CMD, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self._note(+1)
            try:
                self._stop.wait(self._period(rng))
            finally:
                CHILDREN.kill(proc, grace_s=1.0)
                CHILDREN.forget(proc)
                self._note(-1)
            running = False

    def _note(self, delta: int) -> None:
        with self._lock:
            self._events.append((time.monotonic(), delta))

    def mean_running(self, t0: float, t1: float) -> float:
        """The mean number of hogs running between monotonic times ``t0`` and ``t1``."""
        if t1 <= t0:
            return 0.0
        with self._lock:
            events = sorted(self._events)
        level, area, last = 0, 0.0, t0
        for t, d in events:
            if t <= t0:
                level += d
                continue
            if t >= t1:
                break
            area += level * (t - last)
            level, last = level + d, t
        area += level * (t1 - last)
        return area / (t1 - t0)


# -- the repository ----------------------------------------------------------------------------

def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True,
                         env={**os.environ, "GIT_AUTHOR_NAME": "cisuite",
                              "GIT_AUTHOR_EMAIL": "cisuite@localhost",
                              "GIT_COMMITTER_NAME": "cisuite",
                              "GIT_COMMITTER_EMAIL": "cisuite@localhost"})
    return out.stdout


def make_repo(where: Path, change: corpus.Change | None, reverse: bool) -> Path:
    """The template as a git repository with one commit on ``main``: the original code, or the
    changed code when ``reverse``. The working tree is left as committed."""
    repo = where / "repo"
    shutil.copytree(corpus.TEMPLATE, repo,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))
    if reverse and change is not None:
        change.apply(repo)
    (repo / ".gitignore").write_text("__pycache__/\n*.pyc\n.pytest_cache/\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "main" + (f" ({change.name} applied)" if reverse and change
                                              else ""))
    return repo


def to_head(repo: Path, change: corpus.Change | None, reverse: bool) -> None:
    """Put the working tree at the head: main's code with ``change`` applied, or (``reverse``)
    main's changed code with the change taken back out. None: main as committed."""
    _git(repo, "checkout", "-q", "--", ".")
    if change is not None:
        change.apply(repo, reverse=reverse)


def session_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT), env.get("PYTHONPATH")]))
    # hypothesis's pytest plugin costs every session (A/B: every child) about a second
    env["PYTEST_ADDOPTS"] = " ".join(filter(None, [env.get("PYTEST_ADDOPTS"),
                                                   "-p no:hypothesispytest"]))
    env.pop("TRACEML_CI_OUT", None)
    return env


def run_pytest(repo: Path, args: list[str], log: Path, timeout_s: float) -> tuple[int | None,
                                                                                   float]:
    """One pytest session in ``repo``; its output in ``log``. Returns (exit code, wall s);
    the exit code is None when it ran past ``timeout_s`` (killed)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *args]
    t0 = time.monotonic()
    with log.open("wb") as f:
        f.write((" ".join(cmd) + "\n").encode())
        f.flush()
        proc = CHILDREN.popen(cmd, cwd=repo, env=session_env(), stdin=subprocess.DEVNULL,
                              stdout=f, stderr=subprocess.STDOUT)
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            CHILDREN.kill(proc)
            code = None
        except BaseException:
            CHILDREN.kill(proc)
            raise
        finally:
            CHILDREN.forget(proc)
    return code, time.monotonic() - t0


# -- reading a session's outputs ---------------------------------------------------------------

def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _nodeid(case: ET.Element) -> str:
    """A junit testcase's pytest node id: ``tests.test_smoke`` + ``test_x`` is
    ``tests/test_smoke.py::test_x`` (the template's tests are module-level functions)."""
    module = case.get("classname", "").replace(".", "/") + ".py"
    return f"{module}::{case.get('name', '')}"


def junit_outcomes(path: Path) -> dict[str, dict[str, str]]:
    """Node id -> {"outcome": passed|failed|error|skipped, "message": first line}."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return {}
    out = {}
    for case in root.iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (el.get("message") or el.text or "").strip().splitlines()[:1]
                message = message[0] if message else ""
                break
        out[_nodeid(case)] = {"outcome": outcome, "message": message}
    return out


@dataclass
class Terminal:
    """What the session printed: the traceml section's lines and the warnings summary."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    verdict_line: str = ""
    traceml_warnings: list[str] = field(default_factory=list)
    pytest_warnings: list[str] = field(default_factory=list)


def read_terminal(text: str) -> Terminal:
    term = Terminal()
    section = ""
    block: list[str] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        m = _SECTION.match(line)
        if m:
            if section == "warnings summary" and block:
                term.pytest_warnings += _traceml_warnings(block)
            section, block = m.group("title").strip().lower(), []
            continue
        if section == "warnings summary":
            if line.startswith("-- Docs:"):
                term.pytest_warnings += _traceml_warnings(block)
                section, block = "", []
            else:
                block.append(line)
            continue
        if section != "traceml":
            continue
        if line.startswith("traceml: "):
            said = line[len("traceml: "):]
            if said.startswith(("session verdict:", "A/B verdict:")):
                term.verdict_line = said
            elif said.startswith("warning:"):
                term.traceml_warnings.append(said)
            continue
        r = _RESULT_LINE.match(line)
        if r:
            term.results[r.group("nodeid")] = {
                "label": r.group("label").strip(), "key": r.group("key"),
                "runs": int(r.group("runs")) if r.group("runs") else 1,
                "detail": r.group("detail") or ""}
    if section == "warnings summary" and block:
        term.pytest_warnings += _traceml_warnings(block)
    return term


def _traceml_warnings(block: list[str]) -> list[str]:
    """The warnings-summary entries (a location line, then indented lines) that mention
    traceml; each joined into one line."""
    entries: list[list[str]] = []
    for line in block:
        if not line.strip():
            continue
        if not line.startswith(" ") or not entries:
            entries.append([line.strip()])
        else:
            entries[-1].append(line.strip())
    return [" | ".join(e) for e in entries if "traceml" in " ".join(e).lower()]


def _sanitized(nodeid: str) -> str:
    """The plugin's folder stem for a test (pytest_plugin/state.py: ``out_dir``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid.rsplit("::", 1)[-1])[:40] or "test"


def runs_from_folders(basetemp: Path, nodeid: str) -> int | None:
    """Traced runs of one test: the ``final_summary.json`` files (rank files and profiles
    aside) in its ``traceml-<test>N`` folders under ``--basetemp``; None when it has none."""
    stem = re.compile(re.escape(f"traceml-{_sanitized(nodeid)}") + r"\d+$")
    if not basetemp.is_dir():
        return None
    total, seen = 0, False
    for d in basetemp.iterdir():
        if d.is_symlink() or not d.is_dir() or not stem.match(d.name):
            continue
        seen = True
        total += sum(1 for p in d.rglob("final_summary.json")
                     if "profile" not in p.relative_to(d).parts)
    return total if seen else None


def ab_child_sessions(basetemp: Path, nodeid: str) -> int | None:
    """A/B child sessions of one test: its ``{base,head}-roundN.log`` files."""
    stem = re.compile(re.escape(f"traceml-{_sanitized(nodeid)}") + r"\d+$")
    if not basetemp.is_dir():
        return None
    logs = [p for d in basetemp.iterdir() if d.is_dir() and not d.is_symlink()
            and stem.match(d.name) for p in d.glob("*-round*.log")]
    return len(logs) if logs else None


def _rows(item: dict[str, Any], status: str) -> list[str]:
    return [str(r.get("name")) for r in item.get("rows") or []
            if isinstance(r, dict) and r.get("status") == status]


def read_session(mode: str, sdir: Path, log_text: str) -> dict[str, Any]:
    """Per test: verdict, failed, causes, reasons, runs, improved; and the session's warnings.
    Every source may be missing or of another shape: what cannot be read is left out."""
    junit = junit_outcomes(sdir / "junit.xml")
    term = read_terminal(log_text)
    comparison = _read_json(sdir / "comparison.json") if mode == "stored" else None
    ab = _read_json(sdir / "ab.json") if mode == "ab" else None
    save = _read_json(sdir / "save.json")
    saved = (save or {}).get("summaries") or {} if isinstance(save, dict) else {}
    items = (comparison or {}).get("items") or {} if isinstance(comparison, dict) else {}
    ab_tests = {t.get("nodeid"): t for t in (ab or {}).get("tests") or []
                if isinstance(t, dict)} if isinstance(ab, dict) else {}
    nodeids = sorted(set(junit) | set(term.results) | set(ab_tests)
                     | {k for k in items if "::" in k})
    tests: dict[str, dict[str, Any]] = {}
    for nodeid in nodeids:
        t: dict[str, Any] = {}
        j = junit.get(nodeid, {})
        t["outcome"] = j.get("outcome")
        t["failed"] = j.get("outcome") in ("failed", "error")
        if j.get("message"):
            t["message"] = j["message"][:300]
        line = term.results.get(nodeid, {})
        key = line.get("key") or nodeid
        t["label"] = line.get("label")
        t["detail"] = line.get("detail", "")
        if mode == "stored":
            item = items.get(key) or {}
            t["verdict"] = item.get("verdict") or (line.get("label") or "").lower() or None
            t["causes"] = [str(c) for c in item.get("causes") or []]
            t["reasons"] = [str(r) for r in item.get("reasons") or []]
            t["regressed"] = _rows(item, "regressed")
            t["warned"] = _rows(item, "warn")
            t["improved"] = _rows(item, "improved")
            t["runs"] = runs_from_folders(sdir / "bt", nodeid)
            repeats = (saved.get(key) or {}).get("repeats") if isinstance(saved, dict) else None
            t["combined_runs"] = (repeats or {}).get("count", 1) if key in saved else None
            t["line_runs"] = line.get("runs") if line else None
        else:
            entry = ab_tests.get(nodeid) or {}
            doc = entry.get("ab") or {}
            t["verdict"] = entry.get("verdict") or (line.get("label") or "").lower() or None
            t["detail"] = entry.get("detail") or t["detail"]
            t["causes"] = [str(c) for c in doc.get("causes") or []]
            t["reasons"] = [str(doc["reason"])] if doc.get("reason") else []
            rounds = doc.get("rounds")
            t["rounds"] = len(rounds) if isinstance(rounds, list) else None
            t["runs"] = 2 * t["rounds"] if t["rounds"] else ab_child_sessions(sdir / "bt", nodeid)
            t["child_logs"] = ab_child_sessions(sdir / "bt", nodeid)
            intervals = [iv for iv in doc.get("intervals") or [] if isinstance(iv, dict)]
            counters = [r for r in doc.get("counters") or [] if isinstance(r, dict)]
            t["regressed"] = ([iv.get("metric") for iv in intervals
                               if iv.get("status") == "regressed"]
                              + [r.get("name") for r in counters if r.get("status") == "regressed"])
            t["warned"] = [r.get("name") for r in counters if r.get("status") == "warn"]
            t["improved"] = ([iv.get("metric") for iv in intervals
                              if iv.get("status") == "improved"]
                             + [r.get("name") for r in counters if r.get("status") == "improved"])
            t["contended"] = doc.get("contended")
        t["confirmation"] = _confirmation(t.get("detail") or "")
        t["warn"] = _test_warned(t, line)
        tests[nodeid] = t
    warnings = [f"{n}: {t['label'] or t['verdict']}" for n, t in tests.items() if t["warn"]]
    verdict_line = term.verdict_line
    # a warn verdict no test line showed (an inconclusive A/B fails its test unless it says
    # "(does not fail the test)", which the test's own line carries)
    if re.search(r"verdict: warn\b", verdict_line) and not warnings:
        warnings.append(verdict_line)
    warnings += term.traceml_warnings + term.pytest_warnings
    session_verdict = None
    if isinstance(comparison, dict):
        session_verdict = comparison.get("verdict")
    elif isinstance(ab, dict):
        session_verdict = ab.get("verdict")
    return {"tests": tests, "warnings": warnings, "warning": bool(warnings),
            "session_verdict": session_verdict, "verdict_line": verdict_line}


_CONFIRMATION = ("confirmed:", "the first run looked like a regression",
                 "the first run came close; not", "the first run came close;")


def _confirmation(detail: str) -> str | None:
    """What confirmation did, as the plugin's terminal detail says it (pytest-plugin.md)."""
    for phrase in _CONFIRMATION:
        if phrase in detail:
            return {"confirmed:": "first regressed, confirmed",
                    "the first run looked like a regression": "first regressed, not confirmed",
                    "the first run came close; not": "came close, not confirmed",
                    "the first run came close;": "came close, confirmed"}[phrase]
    return None


def _test_warned(t: dict[str, Any], line: dict[str, Any]) -> bool:
    """A passing test the gate warned about: its verdict or terminal word is a warning, or an
    A/B verdict that did not fail its test (``(does not fail the test)``)."""
    if t.get("failed"):
        return False
    words = {str(t.get("verdict") or "").lower(), str(line.get("label") or "").lower()}
    if words & {"warn", "a/b warn", "inconclusive", "a/b inconclusive"}:
        return True
    return "does not fail the test" in (line.get("detail") or "")


# -- judging a session against what the corpus expects ----------------------------------------

def expectation(change: corpus.Change | None, reverse: bool) -> str:
    if change is None or change.harmless:
        return "pass"
    return "improved" if reverse else "fail"


def judge(record: dict[str, Any], change: corpus.Change | None, reverse: bool) -> None:
    """Add ``as_expected`` and ``cause_matched`` (None where no cause is expected)."""
    expected = expectation(change, reverse)
    tests = record.get("tests") or {}
    failed = record.get("exit_code") not in (0,)
    targets = [tests.get(n) or {} for n in (change.tests if change else ())]
    cause_matched: bool | None = None
    if expected == "fail":
        patterns = [p.lower() for p in change.expected_causes()] if change else []
        hits = []
        for t in targets:
            # an inconclusive A/B fails its test but decides nothing: no catch
            if not t.get("failed") or str(t.get("verdict")).lower() == "inconclusive":
                continue
            texts = [*(t.get("causes") or []), *(t.get("reasons") or []), t.get("detail") or "",
                     t.get("message") or ""]
            hits += [p for p in patterns if any(p in s.lower() for s in texts)]
        cause_matched = bool(hits)
        record["matched_causes"] = sorted(set(hits))
        as_expected = record.get("exit_code") == 1 and cause_matched
    elif expected == "improved":
        # a count, a setting or the verdict: a time or share that "improved" against a
        # baseline recorded under more load says nothing about the change
        improved = any(str(t.get("verdict")).lower() == "improved"
                       or any(str(n).startswith(("counters.", "settings."))
                              for n in t.get("improved") or [])
                       for t in targets)
        cause_matched = improved
        as_expected = not failed and improved
    else:
        as_expected = not failed
    record["expected"] = expected
    record["as_expected"] = bool(as_expected)
    record["cause_matched"] = cause_matched


# -- sessions ----------------------------------------------------------------------------------

@dataclass
class Plan:
    change: corpus.Change | None
    reverse: bool

    @property
    def name(self) -> str:
        return self.change.name if self.change else UNCHANGED

    @property
    def direction(self) -> str:
        return "reverse" if self.reverse else "forward"


class Driver:
    def __init__(self, args: argparse.Namespace, work: Path, hogs: Hogs) -> None:
        self.args, self.work, self.hogs = args, work, hogs
        self.out = Path(args.output)
        self.records: list[dict[str, Any]] = []

    def emit(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        with self.out.open("a") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")

    def modes(self) -> list[str]:
        return ["stored", "ab"] if self.args.mode == "both" else [self.args.mode]

    def run_plans(self, todo: list[Plan]) -> None:
        """The forward plans (and unchanged) share one repository and one baseline, recorded
        once on main as a CI would; each reversed change has its own (its base is changed)."""
        shared = [p for p in todo if not p.reverse]
        groups = ([("main", None, False, shared)] if shared else []) + [
            (f"{p.name}-reverse", p.change, True, [p]) for p in todo if p.reverse]
        for label, base_change, reverse, plans_ in groups:
            where = self.work / label
            where.mkdir(parents=True)
            repo = make_repo(where, base_change, reverse)
            baseline = where / "main.json"
            if "stored" in self.modes():
                self.record_baseline(repo, baseline, where, label)
            for plan in plans_:
                to_head(repo, plan.change, plan.reverse)
                for i in range(self.args.sessions):
                    for mode in self.modes():
                        self.session(repo, baseline, where, plan, mode, i)

    def record_baseline(self, repo: Path, baseline: Path, where: Path, label: str) -> None:
        sdir = where / "baseline"
        sdir.mkdir()
        t0 = time.monotonic()
        code, wall = run_pytest(repo, [f"--basetemp={sdir / 'bt'}",
                                       f"--traceml-baseline={baseline}",
                                       "--traceml-update-baseline"],
                                sdir / "pytest.log", self.args.session_timeout)
        hogs = self.hogs.mean_running(t0, time.monotonic())
        entries = ((_read_json(baseline) or {}).get("summaries") or {}) if code == 0 else {}
        waits = {k: ((s.get("run") or {}).get("contention") or {}).get("runqueue_wait_pct")
                 for k, s in entries.items() if isinstance(s, dict)}
        print(f"[{label}] baseline recorded: exit {code}, {wall:.0f} s, hogs {hogs:.1f}",
              flush=True)
        self.emit({"kind": "baseline", "base": label,
                   "exit_code": code, "wall_s": round(wall, 2), "hogs_mean": round(hogs, 2),
                   "runqueue_wait_pct": waits})
        if code != 0:
            tail = "\n".join((sdir / "pytest.log").read_text(errors="replace")
                             .splitlines()[-40:])
            raise SystemExit(f"recording the baseline failed (exit {code}):\n{tail}")

    def session(self, repo: Path, baseline: Path, where: Path, plan: Plan, mode: str,
                index: int) -> None:
        sdir = where / f"{plan.name}-{mode}-{index}"
        sdir.mkdir()
        args = [f"--basetemp={sdir / 'bt'}", f"--junitxml={sdir / 'junit.xml'}",
                f"--traceml-report={sdir / 'report.md'}", f"--traceml-save={sdir / 'save.json'}"]
        if mode == "stored":
            args += [f"--traceml-baseline={baseline}",
                     f"--traceml-comparison={sdir / 'comparison.json'}"]
        else:
            args += ["--traceml-ab=main", f"--traceml-ab-json={sdir / 'ab.json'}"]
        args += self.args.pytest_args
        t0 = time.monotonic()
        code, wall = run_pytest(repo, args, sdir / "pytest.log", self.args.session_timeout)
        hogs = self.hogs.mean_running(t0, time.monotonic())
        log_text = (sdir / "pytest.log").read_text(errors="replace")
        record: dict[str, Any] = {"kind": "session", "mode": mode, "change": plan.name,
                                  "direction": plan.direction, "session": index,
                                  "exit_code": code, "wall_s": round(wall, 2),
                                  "hogs_mean": round(hogs, 2), "seed": self.args.seed}
        record.update(read_session(mode, sdir, log_text))
        judge(record, plan.change, plan.reverse)
        if code not in (0, 1):
            record["log_tail"] = log_text.splitlines()[-25:]
        self.emit(record)
        print(one_line(record), flush=True)


def one_line(r: dict[str, Any]) -> str:
    bad = [f"{n.rsplit('::', 1)[-1]}: {_first_cause(t)}"
           for n, t in (r.get("tests") or {}).items() if t.get("failed")]
    runs = [t.get("runs") for t in (r.get("tests") or {}).values()]
    said = "; ".join(bad) if bad else "passed"
    warn = f" WARN[{'; '.join(r['warnings'])[:200]}]" if r.get("warning") else ""
    return (f"[{r['change']} {r['direction']} {r['mode']} #{r['session']}] exit "
            f"{r['exit_code']}, {r['wall_s']:.0f} s, hogs {r['hogs_mean']:.1f}, runs {runs}, "
            f"{'as expected' if r.get('as_expected') else 'NOT as expected'}: {said}{warn}")


def _first_cause(t: dict[str, Any]) -> str:
    # the causes, else the plugin's own first reason (its terminal detail), else the rest
    for source in (t.get("causes"), [t.get("detail")], t.get("reasons"), [t.get("message")]):
        for s in source or []:
            if s:
                return str(s)[:160]
    return "?"


# -- the table ---------------------------------------------------------------------------------

def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.fmean(vals) if vals else None


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (mode, change, direction); each session judged again by today's rules of
    this file (so older result files read the same way)."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in records:
        if r.get("kind") == "session":
            change = corpus.BY_NAME.get(r.get("change", ""))
            if change is not None or r.get("change") == UNCHANGED:
                judge(r, change, r.get("direction") == "reverse")
            r["warning"] = any(not str(w).startswith("A/B verdict: inconclusive")
                               for w in r.get("warnings") or [])
            groups.setdefault((r["mode"], r["change"], r["direction"]), []).append(r)
    order = {c.name: i for i, c in enumerate(corpus.CHANGES)}
    rows = []
    for (mode, change, direction), rs in sorted(
            groups.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], -1), kv[0][2])):
        runs = [t.get("runs") for r in rs for t in (r.get("tests") or {}).values()]
        rounds = [t.get("rounds") for r in rs for t in (r.get("tests") or {}).values()]
        matched = [r.get("cause_matched") for r in rs if r.get("cause_matched") is not None]
        change_ = corpus.BY_NAME.get(change)
        targets = [[(r.get("tests") or {}).get(n) or {} for n in change_.tests] if change_
                   else [] for r in rs]
        caught: dict[str, int] = {}
        for ts in targets:
            for t in ts:
                if t.get("failed"):
                    for name in t.get("regressed") or [f"({t.get('verdict')})"]:
                        caught[name] = caught.get(name, 0) + 1
        rows.append({
            "mode": mode, "change": change, "direction": direction, "sessions": len(rs),
            "failures": sum(r.get("exit_code") == 1 for r in rs),
            "errors": sum(r.get("exit_code") not in (0, 1) for r in rs),
            "warnings": sum(bool(r.get("warning")) for r in rs),
            "runs_per_test": _mean(runs), "rounds_per_test": _mean(rounds),
            "wall_s": _mean(r.get("wall_s") for r in rs),
            "hogs_mean": _mean(r.get("hogs_mean") for r in rs),
            "target_failed": (f"{sum(any(t.get('failed') for t in ts) for ts in targets)}"
                              f"/{len(rs)}" if change_ else "-"),
            "caught_by": ", ".join(sorted(caught, key=lambda k: -caught[k])) or "-",
            "expected": rs[0].get("expected"),
            "as_expected": sum(bool(r.get("as_expected")) for r in rs),
            "cause_matched": (f"{sum(bool(m) for m in matched)}/{len(matched)}"
                              if matched else "-"),
        })
    return rows


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def table(rows: list[dict[str, Any]]) -> str:
    head = ["mode", "change", "dir", "n", "fail", "err", "warn", "runs/test", "rounds/test",
            "wall s", "hogs", "expect", "as expected", "cause", "target failed",
            "target's regressed rows"]
    lines = [head]
    for r in rows:
        lines.append([r["mode"], r["change"], r["direction"][:3], str(r["sessions"]),
                      str(r["failures"]), str(r["errors"]), str(r["warnings"]),
                      _fmt(r["runs_per_test"]), _fmt(r["rounds_per_test"], 1),
                      _fmt(r["wall_s"], 0), _fmt(r["hogs_mean"], 1), str(r["expected"]),
                      f"{r['as_expected']}/{r['sessions']}", r["cause_matched"],
                      r["target_failed"], r["caught_by"]])
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
           for row in lines]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def wall_ratio(records: list[dict[str, Any]]) -> str:
    """A/B unchanged session wall over stored unchanged session wall (means)."""
    walls = {m: [r["wall_s"] for r in records if r.get("kind") == "session"
                 and r.get("change") == UNCHANGED and r.get("mode") == m
                 and r.get("exit_code") is not None] for m in ("stored", "ab")}
    if not walls["stored"] or not walls["ab"]:
        return "wall ratio: needs unchanged sessions of both modes"
    s, a = statistics.fmean(walls["stored"]), statistics.fmean(walls["ab"])
    return (f"A/B unchanged session wall {a:.0f} s (n={len(walls['ab'])}) / stored {s:.0f} s "
            f"(n={len(walls['stored'])}) = {a / s:.2f}x")


def read_records(paths: list[str]) -> list[dict[str, Any]]:
    records = []
    for p in paths:
        for line in Path(p).read_text().splitlines():
            line = line.strip()
            if line:
                with contextlib.suppress(ValueError):
                    records.append(json.loads(line))
    return records


# -- main --------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("stored", "ab", "both"), default="stored")
    p.add_argument("--change", action="append", default=[],
                   help="a change of the corpus, a comma list, or a group (all, issue31, "
                        "issue32); repeatable; 'unchanged' for none. Default: unchanged")
    p.add_argument("--reverse", action="store_true",
                   help="apply each change as the base (committed on main), the original as "
                        "the head: the fix applied")
    p.add_argument("--sessions", type=int, default=1, help="sessions per change and mode")
    p.add_argument("--hogs", type=int, default=0, help="CPU hogs switched on and off")
    p.add_argument("--hog-mean-s", type=float, default=10.0,
                   help="mean of the hogs' exponential on and off periods (s)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("-o", "--output", default="cisuite-results.jsonl",
                   help="JSON lines, appended (default: %(default)s)")
    p.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (logs, outputs)")
    p.add_argument("--session-timeout", type=float, default=DEFAULT_SESSION_TIMEOUT_S)
    p.add_argument("--compare-wall", action="store_true",
                   help="print the A/B unchanged session wall over the stored one")
    p.add_argument("--summarize", nargs="+", metavar="JSONL",
                   help="print the table of recorded sessions and exit")
    p.add_argument("--list", action="store_true", help="list the corpus and exit")
    p.add_argument("pytest_args", nargs="*", help="after --: extra pytest arguments")
    return p.parse_args(argv)


def plans(args: argparse.Namespace) -> list[Plan]:
    names = [n for arg in args.change or [UNCHANGED] for n in arg.split(",") if n]
    out: list[Plan] = []
    for n in names:
        if n == UNCHANGED:
            out.append(Plan(None, False))
            continue
        out += [Plan(c, args.reverse) for c in corpus.select([n])]
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for c in corpus.CHANGES:
            print(f"{c.name:28} {c.what}")
        return 0
    if args.summarize:
        records = read_records(args.summarize)
        print(table(summarize(records)))
        if args.compare_wall:
            print(wall_ratio(records))
        return 0
    try:
        todo = plans(args)
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGHUP, _on_sigterm)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="cisuite-"))
    work.mkdir(parents=True, exist_ok=True)
    driver = None
    print(f"cisuite: {len(todo)} change(s) x {args.sessions} session(s), mode {args.mode}, "
          f"{args.hogs} hog(s), work in {work}, results appended to {args.output}", flush=True)
    try:
        with Hogs(args.hogs, args.seed, args.hog_mean_s) as hogs:
            driver = Driver(args, work, hogs)
            driver.run_plans(todo)
    except KeyboardInterrupt:
        print("cisuite: interrupted; children killed", file=sys.stderr)
        return 130
    finally:
        CHILDREN.kill_all()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        if driver is not None and driver.records:
            print(table(summarize(driver.records)))
            if args.compare_wall:
                print(wall_ratio(driver.records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
