"""A/B mode (``--traceml-ab=REF``): each traced test run by child pytest processes in the
base's worktree and in the head's tree, interleaved round by round, and judged by the same
pipeline as ``traceml-ci ab`` (``traceml_ci.gate.ab.sequential``: rounds in ABBA order,
paired intervals, the sequential decision); docs/pytest-plugin.md, "A/B mode".

One round of one test is ``python -m pytest NODEID --traceml-ab-child=FILE`` once per side: the
child traces the test as a plain session would (marker or ``run_script``), without gating, and
writes what it traced to FILE; the parent reads the summary from it. The first round of every
A/B test of a session is run as one child per side with all their node ids (``AbSession.
batch_first_round``): on a host clock that round alone decides unless a timing passed its band,
so an unchanged session costs two child sessions, not two per test. A test the batch could not
answer for (a child that crashed, a node id the base lacks) runs its own first round.

Both sides run the same way, with the environment ``traceml_ci.gitwork.side_env`` gives
``traceml-ci ab``'s runs: its tree first on ``PYTHONPATH``, so the base imports its own code.
"""

from __future__ import annotations

import base64
import json
import pickle
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_plugin.options import AB_CHILD_OPTION, Options, SetupError
from traceml_ci.sides import SideFailed, Sides

if TYPE_CHECKING:  # pragma: no cover
    from traceml_ci.gate.ab.sequential import AbResult, AbSettings, Side, SideFigures

#: The document a child writes: this version, what it collected, how it ended, what it traced.
CHILD_DOC_VERSION = 1
#: Version of the session's A/B JSON (--traceml-ab-json).
AB_SESSION_JSON_VERSION = "1"
#: A test the base does not have: it is run here, as without A/B, and passes with this note.
NO_BASE = "no base"
#: The last lines of a failed child's output shown in the failure.
OUTPUT_TAIL_LINES = 30
#: pytest's exit codes when a node id matches nothing (usage error: "not found") or nothing
#: was collected: with no test collected, the base simply has no such test.
_NOT_FOUND_EXITS = (4, 5)


class NoBase(Exception):
    """The base has no such test, or its test traced nothing: there is nothing to pair."""


@dataclass(frozen=True)
class AbOutcome:
    """One traced test's A/B: its verdict word (``pass``, ``regression``, ``inconclusive``, or
    ``no base``), the one-line detail, and the rounds (None for ``no base``)."""

    nodeid: str
    key: str
    verdict: str
    detail: str
    result: AbResult | None = None
    #: Whether a failing verdict fails the test (False under --traceml-report-only, and for
    #: an inconclusive one unless --traceml-ab-inconclusive=fail).
    enforced: bool = True

    @property
    def fails(self) -> bool:
        return self.enforced and self.verdict in ("regression", "inconclusive")

    def to_dict(self) -> dict[str, Any]:
        """Plain data for pytest-xdist's channel; the rounds travel pickled (the session's own
        processes), so the controller decides nothing again."""
        blob = pickle.dumps(self.result) if self.result is not None else None
        return {"nodeid": self.nodeid, "key": self.key, "verdict": self.verdict,
                "detail": self.detail, "enforced": self.enforced,
                "result": base64.b64encode(blob).decode("ascii") if blob else None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AbOutcome:
        blob = d.get("result")
        return cls(str(d["nodeid"]), str(d["key"]), str(d["verdict"]), str(d.get("detail", "")),
                   pickle.loads(base64.b64decode(blob)) if blob else None,
                   bool(d.get("enforced", True)))


def settings_of(options: Options, rules: Any = None) -> AbSettings:
    """The A/B settings: the options given, the session's tolerance rules (each round's pair
    is compared by them), gate/ab/sequential.py's defaults for the rest."""
    from traceml_ci.errors import UsageError
    from traceml_ci.gate.ab.sequential import AbSettings

    given = {"max_rounds": options.ab_rounds_max, "step_tol_pct": options.ab_step_tolerance,
             "share_tol_pp": options.ab_share_tolerance, "rules": rules}
    try:
        return AbSettings(**{k: v for k, v in given.items() if v is not None})
    except UsageError as exc:
        raise SetupError(f"traceml: --traceml-ab-rounds-max: {exc}") from None


class AbSession:
    """The session's base: REF resolved once at start-up (a bad REF stops the session), its
    worktree checked out at the first A/B test and removed at the session's end, whatever the
    end (a failure, Ctrl-C, SIGTERM)."""

    def __init__(self, options: Options, rootpath: Path, rules: Any = None) -> None:
        from traceml_ci.errors import TracemlError
        from traceml_ci.gitwork import resolve_base, toplevel

        assert options.ab is not None
        self.options = options
        self.ref = options.ab
        self.settings = settings_of(options, rules)
        try:
            self.repo = toplevel(rootpath)
            self.base = resolve_base(self.repo, options.ab, flag="--traceml-ab")
        except TracemlError as exc:
            raise SetupError(f"traceml: {exc}") from None
        try:
            # Node ids are relative to the rootdir: each side's child runs in its counterpart.
            self.rel = rootpath.resolve().relative_to(self.repo.resolve())
        except ValueError:
            raise SetupError(f"traceml: --traceml-ab: pytest's rootdir {rootpath} is not inside "
                             f"the git repository {self.repo}") from None
        self.sides = Sides(self.repo, self.base.commit, self.rel, setup=options.ab_setup,
                           setup_flag="--traceml-ab-setup")
        #: The batched first round, per side: the child's document, its file and its log
        #: (None: not tried yet; empty: tried, each test runs its own first round).
        self._batched: dict[str, tuple[dict[str, Any], Path, Path]] | None = None

    @property
    def commit(self) -> str:
        return self.base.commit

    def describe(self) -> str:
        """``main = 1a2b3c4d5e6f (merge-base with HEAD)`` -- for the header and reports."""
        how = " (merge-base with HEAD)" if self.base.how == "merge-base" else ""
        return f"{self.ref} = {self.commit[:12]}{how}"

    def root(self, side: str, work: Path) -> Path:
        """The tree a side runs in: the repository for the head, the worktree for the base
        (checked out, and ``--traceml-ab-setup`` run there, on first use)."""
        try:
            return self.sides.root(side, setup_log=work / "base-setup.log")
        except SideFailed as exc:  # every A/B test of the session fails with this line
            log = work / "base-setup.log"
            raise SideFailed(f"traceml: {exc}\n" + _tail(log)) from None

    def batch_first_round(self, nodeids: list[str], work: Path) -> None:
        """Run the first round of all ``nodeids`` in one child per side, base then head (once
        per session; fewer than two tests gain nothing). A side whose child did not answer
        for its tests (a crash, a node id not found, another plugin version) drops the batch:
        each test then runs its own first round, as without it."""
        if self._batched is not None:
            return
        self._batched = {}
        if len(nodeids) < 2:
            return
        from traceml_ci.errors import InputError
        from traceml_ci.summary.io import read_json

        got = {}
        for side in ("base", "head"):
            try:
                self.root(side, work)  # the base checked out (and set up) on first use
            except SideFailed:
                return
            stem = work / f"{side}-round1"
            out, log = stem.with_suffix(".json"), stem.with_suffix(".log")
            try:
                self.sides.call(side, child_command(nodeids, out, stem.with_suffix(".tmp"),
                                                    self.options), log)
            except OSError:  # too many node ids for one command line, say: each its own
                return
            try:
                doc = read_json(out) if out.is_file() else None
            except InputError:
                return
            if (not isinstance(doc, dict) or doc.get("version") != CHILD_DOC_VERSION
                    or doc.get("exitstatus") not in (0, 1)
                    or not isinstance(doc.get("nodes"), dict)):
                return
            got[side] = (doc, out, log)
        self._batched = got

    @property
    def batch_tried(self) -> bool:
        return self._batched is not None

    def batched(self, side: str, nodeid: str) -> tuple[dict[str, Any], Path, Path] | None:
        """The batched first round's answer for one test on one side, if it has one."""
        entry = (self._batched or {}).get(side)
        return entry if entry is not None and nodeid in entry[0]["nodes"] else None

    def close(self) -> None:
        """Remove the base's worktree (idempotent)."""
        self.sides.close()


class RoundRunner:
    """Measures one side of one round of one test: ``python -m pytest NODEID`` as a child in
    that side's tree; its output in ``work/<side>-roundN.log``."""

    def __init__(self, ab: AbSession, nodeid: str, work: Path, preferred_key: str) -> None:
        self.ab, self.nodeid, self.work = ab, nodeid, work
        self.preferred_key = preferred_key
        self.key: str | None = None
        self.other_keys: list[str] = []
        self.head_summary: dict[str, Any] | None = None

    def measure(self, side: Side, number: int) -> SideFigures:
        name = side.value
        said = f"traceml: A/B round {number}, {name} side ({self._where(name)})"
        batched = self.ab.batched(name, self.nodeid) if number == 1 else None
        if batched is not None and batched[0]["nodes"][self.nodeid].get("passed"):
            doc, out, log = batched
            node = doc["nodes"][self.nodeid]
            summaries = {k: doc["summaries"][k] for k in node.get("keys", ())
                         if k in (doc.get("summaries") or {})}
            return self._figures(name, number, said, summaries, out, log)
        # (a test that failed beside the others runs alone: it fails for itself, or passes
        # where another test's state had failed it)
        return self._run_child(name, number, said)

    def _run_child(self, name: str, number: int, said: str) -> SideFigures:
        """This test alone, one side of one round, in a child session."""
        from traceml_ci.errors import InputError
        from traceml_ci.summary.io import read_json

        self.ab.root(name, self.work)  # the base checked out (and set up) on first use
        stem = self.work / f"{name}-round{number}"
        out, log = stem.with_suffix(".json"), stem.with_suffix(".log")
        code = self.ab.sides.call(
            name, child_command([self.nodeid], out, stem.with_suffix(".tmp"), self.ab.options), log)
        try:
            doc = read_json(out) if out.is_file() else None
        except InputError as exc:
            raise SideFailed(f"{said}: {exc}") from None
        if doc is None or doc.get("version") != CHILD_DOC_VERSION:
            raise SideFailed(f"{said}: pytest exited {code} before the test ran; its output: "
                             f"{log}\n" + _tail(log))
        if not doc.get("collected") and doc.get("exitstatus") in _NOT_FOUND_EXITS:
            if name == "base" and number == 1:
                raise NoBase(f"{NO_BASE}: new test (not in {self.ab.commit[:12]})")
            raise SideFailed(f"{said}: pytest found no test {self.nodeid}; its output: {log}")
        if code != 0:
            raise SideFailed(f"{said}: the test failed (pytest exit {code}); its output: "
                             f"{log}\n" + _tail(log))
        return self._figures(name, number, said, doc.get("summaries") or {}, out, log)

    def _figures(self, name: str, number: int, said: str, summaries: dict[str, Any],
                 out: Path, log: Path) -> SideFigures:
        """The figures of the summary this test traced on one side (the same key each round)."""
        from traceml_ci.errors import InputError
        from traceml_ci.gate.ab.sequential import SideFigures

        if not summaries:
            if name == "base" and number == 1:
                raise NoBase(f"{NO_BASE}: the base's test traces nothing")
            raise SideFailed(f"{said}: the test passed but gated no valid traced summary; "
                             f"nothing to compare (its output: {log})")
        key = self.preferred_key if self.preferred_key in summaries else next(iter(summaries))
        if self.key is None:
            self.key = key
            self.other_keys = [k for k in summaries if k != key]
        elif key != self.key:
            raise SideFailed(f"{said}: traced {key!r}, the other side {self.key!r}; give the "
                             "summaries the same key on both sides")
        if name == "head":
            self.head_summary = summaries[key]
        try:
            return SideFigures.from_summary(summaries[key], str(out))
        except InputError as exc:
            raise SideFailed(f"{said}: {exc}") from None

    def _where(self, side: str) -> str:
        return "the working tree" if side == "head" else f"{self.ab.commit[:12]}"


def run_test(
    nodeid: str, ab: AbSession, work: Path, preferred_key: str, *, report_only: bool,
) -> tuple[AbOutcome, str, dict[str, Any] | None]:
    """Run one test's rounds until a verdict. Returns the outcome, the failure message when
    the test must fail (else ""), and the head's last summary (for --traceml-save). Raises
    NoBase (run the test here instead) or SideFailed."""
    from traceml_ci.gate.ab import report as ab_report
    from traceml_ci.gate.ab.sequential import run_rounds
    from traceml_ci.gate.results import Verdict

    rounds = RoundRunner(ab, nodeid, work, preferred_key)

    def progress(result: AbResult) -> None:  # the test's captured stderr: shown on failure
        last = result.rounds[-1]
        print(f"traceml A/B {nodeid} round {last.number}: head/base {last.step_ratio:.3f}",
              file=sys.stderr, flush=True)

    result = run_rounds(rounds.measure, ab.settings, on_round=progress)
    verdict = result.verdict or Verdict.INCONCLUSIVE
    detail = result.reason()
    if rounds.other_keys:
        detail += (f" ({rounds.key} compared; {len(rounds.other_keys)} other summar"
                   f"{'y' if len(rounds.other_keys) == 1 else 'ies'} of this test not)")
    lenient = verdict is Verdict.INCONCLUSIVE and ab.options.ab_inconclusive != "fail"
    outcome = AbOutcome(nodeid, rounds.key or preferred_key, verdict.value, detail, result,
                        enforced=not (report_only or lenient))
    message = ""
    if outcome.fails:
        table = ab_report.render_text(result, ab.describe()).rstrip()
        if verdict is Verdict.REGRESSION:
            head = f"traceml: A/B regression for {nodeid} against {ab.describe()}"
            hint = ("The head's runs were slower than the base's, paired round by round; if "
                    "that is intended, accept it in review.")
        else:
            head = f"traceml: A/B inconclusive for {nodeid} against {ab.describe()}"
            hint = (f"inconclusive: re-run, or allow more rounds (--traceml-ab-rounds-max, now "
                    f"{ab.settings.max_rounds}), or let it pass (--traceml-ab-inconclusive=pass, "
                    "the default). Neither a pass nor a regression.")
        message = f"{head}\n\n{table}\n\n{hint}\nRound logs: {work}"
    return outcome, message, rounds.head_summary


def child_command(nodeids: list[str], out: Path, basetemp: Path, options: Options) -> list[str]:
    """One side's child session: the tests, traced without gating, answering in ``out``."""
    return [sys.executable, "-m", "pytest", *nodeids, "-q", "-p", "no:cacheprovider",
            f"{AB_CHILD_OPTION}={out}", f"--basetemp={basetemp}",
            f"--traceml-module-sample-s={options.module_sample_s!r}"]


def _tail(log: Path) -> str:
    try:
        text = log.read_text(errors="backslashreplace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-OUTPUT_TAIL_LINES:])


# -- the session's A/B: verdict, JSON, markdown ----------------------------------------------

def session_verdict(outcomes: Iterable[AbOutcome]) -> str | None:
    """Regression if any test regressed, else inconclusive if any was, else pass; None when no
    test was compared (every one new, or none traced)."""
    verdicts = {o.verdict for o in outcomes if o.result is not None}
    for word in ("regression", "inconclusive", "pass"):
        if word in verdicts:
            return word
    return None


def session_line(outcomes: list[AbOutcome]) -> str | None:
    """``A/B verdict: regression (1 of 3 regressed: ...)`` for the terminal."""
    verdict = session_verdict(outcomes)
    if verdict is None:
        return None
    compared = [o for o in outcomes if o.result is not None]
    named = [o.nodeid for o in compared if o.verdict == verdict]
    said = "" if verdict == "pass" else f" ({len(named)} of {len(compared)} {verdict}: " + \
        ", ".join(named[:10]) + (f" (+{len(named) - 10} more)" if len(named) > 10 else "") + ")"
    return f"A/B verdict: {verdict}{said}"


def to_json(outcomes: list[AbOutcome], ab: AbSession) -> dict[str, Any]:
    """The session's A/B document: the verdict, and per test its ``traceml-ci ab`` JSON."""
    from traceml_ci.gate.ab import report as ab_report
    from traceml_ci.gate.fmt import json_safe

    tests = []
    for o in sorted(outcomes, key=lambda o: o.nodeid):
        entry: dict[str, Any] = {"nodeid": o.nodeid, "key": o.key, "verdict": o.verdict,
                                 "detail": o.detail, "enforced": o.enforced}
        if o.result is not None:
            entry["ab"] = ab_report.to_json(o.result, ab.ref, ab.commit)
        tests.append(entry)
    return json_safe({"ab_session_version": AB_SESSION_JSON_VERSION,
                      "verdict": session_verdict(outcomes),
                      "base": {"ref": ab.ref, "commit": ab.commit, "how": ab.base.how},
                      "tests": tests})


def render_markdown(outcomes: list[AbOutcome], ab: AbSession) -> str:
    """The report's A/B part: one line of totals, then each compared test's tables
    (``ab_report.render_markdown``) and the tests the base does not have."""
    from traceml_ci.gate.ab import report as ab_report
    from traceml_ci.gate.fmt import markdown as md

    verdict = session_verdict(outcomes)
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.verdict] = counts.get(o.verdict, 0) + 1
    totals = ", ".join(f"{n} {word}" for word, n in sorted(counts.items()))
    out = [f"## traceml-ci A/B against `{md(ab.describe())}`: "
           f"**{(verdict or 'nothing compared').upper()}**", "",
           f"Each traced test ran on the base and on the head in interleaved rounds on this "
           f"machine. {md(totals) or 'No traced test ran.'}", ""]
    for o in sorted(outcomes, key=lambda o: (o.result is None, o.nodeid)):
        if o.result is None:
            out += [f"- `{md(o.nodeid)}`: {md(o.detail)}"]
            continue
        out += [f"#### {md(o.nodeid)}", "",
                ab_report.render_markdown(o.result, ab.describe()).rstrip(), ""]
    return "\n".join(out).rstrip("\n") + "\n"


def write_child_doc(path: Path, collected: int, exitstatus: int,
                    summaries: dict[str, dict[str, Any]],
                    nodes: dict[str, dict[str, Any]] | None = None) -> None:
    """The child's answer to its parent (atomically: the parent never reads half of it).
    ``nodes``: per node id run, whether it passed and the keys it traced."""
    from traceml_ci.fsutil import atomic_write_text

    atomic_write_text(path, json.dumps({"version": CHILD_DOC_VERSION, "collected": collected,
                                        "exitstatus": exitstatus, "summaries": summaries,
                                        "nodes": nodes or {}}))

