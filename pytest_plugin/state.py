"""One pytest session's traceml state: settings, baseline, rules, and every gated result.

The session's one comparison (``session_comparison``) is assembled from the comparisons made
as each test finished; the terminal's verdict line, --traceml-report and --traceml-comparison
are all rendered from it, so they cannot disagree and no pair is compared twice.

Under pytest-xdist each worker gates its own tests and sends its results to the controller
(``payload`` / ``merge_payload``); only the controller (or a plain session) writes files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_plugin.baseline import Summaries, load_baseline, merge_into, save_set
from pytest_plugin.options import Options, SetupError
from pytest_plugin.results import GateResult

if TYPE_CHECKING:  # pragma: no cover
    from pytest_plugin.ab import AbOutcome, AbSession
    from traceml_ci.gate import SetComparison

#: The key of this plugin's entry in xdist's ``workeroutput``.
WORKER_OUTPUT_KEY = "traceml_results"
#: Rules the plugin puts on top of the user's: see ``load``.
PLUGIN_TOLERANCES = {"step_memory.peak_rss_mb": {"skip": True}}
#: Notes list at most this many keys, then "(+N more)".
MAX_KEYS_LISTED = 10
#: The report shows the top ops of at most this many profiled tests (a PR comment is bounded).
MAX_PROFILES_SHOWN = 5


class TracemlState:
    def __init__(self, options: Options, *, is_worker: bool = False) -> None:
        self.options = options
        self.is_worker = is_worker
        self.baseline: Summaries = {}
        self.rules: Any = None
        self.results: dict[str, GateResult] = {}
        #: Lines for the terminal summary about files written, and problems writing them.
        self.notes: list[str] = []
        self.errors: list[str] = []
        self._tmp_factory: Any = None
        self._loaded = False
        self._comparison: SetComparison | None = None
        #: --traceml-ab: the session's base (``start_ab``), each test's A/B by node id, and the
        #: head summary of its last round (what --traceml-save keeps in A/B mode).
        self.ab: AbSession | None = None
        self.ab_outcomes: dict[str, AbOutcome] = {}
        self.ab_heads: Summaries = {}

    # -- setup -------------------------------------------------------------------------------
    def load(self) -> None:
        """Read the baseline and the tolerance rules once. Raises SetupError naming the file."""
        opts = self.options
        if self._loaded or not (opts.gating or opts.report or opts.comparison or opts.tolerances):
            return
        if opts.baseline is not None:
            self.baseline = load_baseline(opts.baseline)
        self.rules = self._read_rules()
        self._loaded = True

    def _read_rules(self) -> Any:
        """The session's tolerance rules: the file's (or pyproject's), the plugin's on top."""
        from traceml_ci.errors import InputError
        from traceml_ci.gate import load_rules

        opts = self.options
        try:
            rules = load_rules(opts.tolerances, pyproject=opts.pyproject)
        except InputError as exc:
            raise SetupError(f"traceml: unusable tolerance rules: {exc}") from None
        # Tests share one process: its lifetime peak RSS says what the heaviest test before
        # this one used. Each test's own memory (peak_job_rss_mb) is gated instead.
        return rules.with_tolerances(PLUGIN_TOLERANCES)

    def start_ab(self, rootpath: Path) -> None:
        """--traceml-ab: resolve the base REF now (a bad one is a SetupError before any test);
        its worktree is made at the first A/B test."""
        if self.options.ab is not None and self.ab is None:
            from pytest_plugin.ab import AbSession

            # each round's pair is compared by the session's rules, as a stored baseline is
            self.ab = AbSession(self.options, rootpath, self.rules or self._read_rules())

    def close_ab(self) -> None:
        """Remove the base's worktree, if one was made."""
        if self.ab is not None:
            self.ab.close()

    def record_ab(self, outcome: AbOutcome, head: dict[str, Any] | None = None) -> None:
        self.ab_outcomes[outcome.nodeid] = outcome
        if head is not None:
            self.ab_heads[outcome.key] = head

    def use_tmp_factory(self, get_factory: Callable[[], Any]) -> None:
        """``get_factory()``: pytest's TempPathFactory (set up after plugins configure)."""
        self._tmp_factory = get_factory

    def header(self) -> str | None:
        """The line under pytest's session header, when a baseline, rules or A/B are in play."""
        opts = self.options
        parts = []
        if self.ab is not None:
            s = self.ab.settings
            parts.append(f"A/B against {self.ab.describe()}, {s.min_rounds}-{s.max_rounds} "
                         "rounds per traced test")
        if not self._loaded:
            return "traceml: " + ", ".join(parts) if parts else None
        if opts.baseline is not None:
            state = f"{len(self.baseline)} entries" if opts.baseline.exists() else "no file yet"
            update = ", updating" if opts.update_baseline else ""
            parts.append(f"baseline {opts.baseline} ({state}{update})")
        parts.append(f"rules: {getattr(self.rules, 'source', 'defaults')}")
        if opts.runs_per_test > 1:
            parts.append(f"{opts.runs_per_test} runs combined")
        return "traceml: " + ", ".join(parts)

    def out_dir(self, nodeid: str) -> Path:
        """A fresh folder for one test's summaries (under pytest's basetemp when available)."""
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid.rsplit("::", 1)[-1])[:40] or "test"
        factory = self._tmp_factory() if self._tmp_factory is not None else None
        if factory is not None:
            return Path(factory.mktemp(f"traceml-{name}", numbered=True))
        import tempfile

        return Path(tempfile.mkdtemp(prefix=f"traceml-{name}-"))

    # -- results -----------------------------------------------------------------------------
    def key_clash(self, key: str, nodeid: str) -> str | None:
        """Why ``key`` cannot be used by test ``nodeid`` (another test's summary has it), or
        None. The same test may reuse its key: a rerun replaces its earlier result."""
        prior = self.results.get(key)
        if prior is not None and prior.nodeid != nodeid:
            return (
                f"traceml: baseline key {key!r} is already used by {prior.nodeid}; give this "
                "summary its own key (@pytest.mark.traceml(key=...) or run_script(key=...))"
            )
        return None

    def record(self, result: GateResult) -> None:
        self.results[result.key] = result
        self._comparison = None

    def payload(self) -> str:
        return json.dumps({"results": [r.to_dict() for r in self.results.values()],
                           "ab": [o.to_dict() for o in self.ab_outcomes.values()],
                           "ab_heads": self.ab_heads}, allow_nan=False)

    def merge_payload(self, payload: str) -> None:
        doc = json.loads(payload)
        if doc.get("ab"):
            from pytest_plugin.ab import AbOutcome

            for d in doc["ab"]:
                self.ab_outcomes[str(d["nodeid"])] = AbOutcome.from_dict(d)
        self.ab_heads.update(doc.get("ab_heads") or {})
        for d in doc.get("results", []):
            result = GateResult.from_dict(d)
            prior = self.results.get(result.key)
            if prior is not None and prior.nodeid != result.nodeid:
                self.errors.append(
                    f"baseline key {result.key!r} used by both {prior.nodeid} and "
                    f"{result.nodeid}; the second one is kept"
                )
            self.record(result)

    @property
    def heads(self) -> Summaries:
        """This session's valid summaries by key (in A/B mode, each test's last head round)."""
        heads = dict(self.ab_heads)
        heads.update({k: r.summary for k, r in self.results.items() if r.summary is not None})
        return heads

    # -- end of session (controller only) -----------------------------------------------------
    def write_files(self) -> None:
        """--traceml-update-baseline, --traceml-save, --traceml-report, --traceml-comparison.
        Problems are collected in ``errors`` (the session then exits with a usage error)."""
        opts, heads = self.options, self.heads
        if opts.update_baseline and opts.baseline is not None and heads:
            self._write(opts.baseline, lambda p: self._merge(p, heads))
        if opts.save is not None:
            self._write(opts.save, lambda p: self._save(p, heads))
        if opts.report is not None:
            self._write(opts.report, self._report)
        if opts.comparison is not None:
            if self.ab is None:
                self._write(opts.comparison, self._comparison_json)
            else:  # a stored-baseline comparison: A/B made none (see --traceml-ab-json)
                self.notes.append(f"comparison not written: {opts.comparison} (--traceml-ab "
                                  "compares no baseline; its results: --traceml-ab-json)")
        if opts.ab_json is not None and self.ab is not None:
            self._write(opts.ab_json, self._ab_json)

    def _ab_json(self, path: Path) -> None:
        from pytest_plugin.ab import to_json
        from traceml_ci.fsutil import atomic_write_text

        assert self.ab is not None
        doc = to_json(list(self.ab_outcomes.values()), self.ab)
        atomic_write_text(path, json.dumps(doc, indent=1) + "\n")
        self.notes.append(f"A/B results written: {path}")

    def _write(self, path: Path, write: Any) -> None:
        from traceml_ci.errors import TracemlError

        try:
            write(path)
        except (OSError, TracemlError, SetupError) as exc:
            self.errors.append(f"could not write {path}: {exc}")

    def _merge(self, path: Path, heads: Summaries) -> None:
        total = merge_into(path, heads)
        self.notes.append(f"baseline updated: {path} ({len(heads)} written, {total} in all)")

    def _save(self, path: Path, heads: Summaries) -> None:
        save_set(path, heads)
        self.notes.append(f"summaries saved: {path} ({len(heads)})")

    def _report(self, path: Path) -> None:
        from traceml_ci.fsutil import atomic_write_text
        from traceml_ci.gate import render_markdown

        if self.ab is not None:
            text = self._ab_markdown()
        else:
            text = render_markdown(self.session_comparison())
        section = self._profiles_markdown()
        if section:
            text = text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
        atomic_write_text(path, text)
        self.notes.append(f"report written: {path}")

    def _ab_markdown(self) -> str:
        """The report in A/B mode: the gate's marker line (the Action's comment replaces it),
        then the A/B results; a stored-baseline comparison is not made in this mode."""
        from pytest_plugin.ab import render_markdown
        from traceml_ci.gate.render.comparison import MARKER

        assert self.ab is not None
        return f"{MARKER}\n" + render_markdown(list(self.ab_outcomes.values()), self.ab)

    def _profiles_markdown(self) -> str:
        """The report's section on regressed tests profiled (--traceml-profile-on-regression)."""
        from traceml_ci.gate.render import ops

        runs = [r.profile for r in sorted(self.results.values(), key=lambda r: r.key)
                if r.profile is not None and r.comparison is not None
                and not self.options.update_baseline]
        section = ops.markdown_section(runs[:MAX_PROFILES_SHOWN])
        if len(runs) > MAX_PROFILES_SHOWN:
            more = len(runs) - MAX_PROFILES_SHOWN
            section += f"\n*…and {more} more profiled (their traces are named in the log)*\n"
        return section

    def profile_notes(self) -> list[str]:
        """Terminal lines: where each profile went, and each profile that could not be taken."""
        from traceml_ci.gate.fmt import plain
        from traceml_ci.gate.render.ops import describe

        lines = []
        for r in sorted(self.results.values(), key=lambda r: r.key):
            p = r.profile
            if p is not None and p.trace:
                lines.append(f"profile of {plain(r.key)}: {plain(p.trace)} ({describe(p)})")
            if r.profile_error:
                lines.append(f"warning: could not profile {plain(r.key)}: "
                             f"{plain(r.profile_error)}")
        return lines

    def _comparison_json(self, path: Path) -> None:
        from traceml_ci.fsutil import atomic_write_text
        from traceml_ci.gate import render_json

        atomic_write_text(path, render_json(self.session_comparison()))
        self.notes.append(f"comparison written: {path}")

    def session_comparison(self) -> SetComparison:
        """This session's one comparison, from the per-test comparisons already made.

        Compared: every test whose summary had a baseline entry. Added: summaries with no entry.
        A baseline entry this session did not gate -- its test deselected (``-k``, a path),
        skipped, or failing before its summary was gated -- is *not run*: listed in a note and
        no part of the verdict (it is not "removed": the session simply did not look at it)."""
        if self._comparison is not None:
            return self._comparison
        from traceml_ci.gate import DEFAULT_RULES, set_comparison

        results = sorted(self.results.values(), key=lambda r: r.key)
        items = {r.key: r.comparison for r in results if r.comparison is not None}
        added = [r.key for r in results if r.summary is not None and r.key not in self.baseline]
        notes = []
        invalid = [r.key for r in results if r.summary is None]
        if invalid:
            notes.append(f"{len(invalid)} without a valid summary: " + _keys(invalid))
        not_run = [k for k in self.baseline if k not in self.results]
        if not_run:
            notes.append(f"{len(not_run)} in the baseline not run in this session (not "
                         "compared): " + _keys(not_run))
        rules = self.rules or DEFAULT_RULES
        self._comparison = set_comparison(items, added, [], rules.source, notes)
        return self._comparison

    def verdict_line(self) -> str | None:
        """The session's verdict for the terminal, when anything was compared."""
        if self.ab is not None:
            from pytest_plugin.ab import session_line

            return session_line(list(self.ab_outcomes.values()))
        if not any(r.comparison is not None for r in self.results.values()):
            return None
        c = self.session_comparison()
        return f"session verdict: {c.verdict.value}" + (
            " (" + "; ".join(c.reasons) + ")" if c.reasons else "")


def _keys(keys: list[str]) -> str:
    more = len(keys) - MAX_KEYS_LISTED
    return ", ".join(keys[:MAX_KEYS_LISTED]) + (f" (+{more} more)" if more > 0 else "")
