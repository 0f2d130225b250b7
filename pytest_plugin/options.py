"""The plugin's settings: command-line options with ini / pyproject fallbacks, read once.

Standard library only: pytest imports this at start-up in every session.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceml_ci.fsutil import find_pyproject
from traceml_ci.summary.keys import (
    AB_INCONCLUSIVE_POLICIES,
    DEFAULT_BASELINE_RUNS,
    DEFAULT_CONFIRM_RERUNS,
    SMOKE_TEST_MODULE_SAMPLE_S,
)
from traceml_ci.summary.profile import DEFAULT_PROFILE_STEPS

#: (option, ini name, kind, help). ``kind``: "path", "flag", "int", "seconds", "number" (a
#: finite number >= 0) or "text".
OPTIONS: tuple[tuple[str, str, str, str], ...] = (
    (
        "--traceml-baseline",
        "traceml_baseline",
        "path",
        "baseline set (JSON) to gate @pytest.mark.traceml tests on; never modified unless "
        "--traceml-update-baseline is given",
    ),
    (
        "--traceml-update-baseline",
        "traceml_update_baseline",
        "flag",
        "write or merge this run's summaries into the --traceml-baseline file (accepts changes)",
    ),
    ("--traceml-save", "traceml_save", "path", "write this run's summaries as a baseline set"),
    (
        "--traceml-report",
        "traceml_report",
        "path",
        "write this session's comparison as markdown (as `traceml-ci diff --format markdown`)",
    ),
    (
        "--traceml-comparison",
        "traceml_comparison",
        "path",
        "write this session's comparison as JSON (as `traceml-ci diff --format json`)",
    ),
    (
        "--traceml-tolerances",
        "traceml_tolerances",
        "path",
        "tolerance rules (TOML); default: [tool.traceml-ci] in pyproject.toml, else built-in",
    ),
    (
        "--traceml-require-baseline",
        "traceml_require_baseline",
        "flag",
        "fail a traced test that has no baseline entry instead of passing with a note",
    ),
    (
        "--traceml-repeats",
        "traceml_repeats",
        "int",
        "run each traced test N times and gate on the runs combined (noisy runners); default 1",
    ),
    (
        "--traceml-confirm",
        "traceml_confirm",
        "int",
        "when a traced test regresses or comes close (a phase share past its warn tier), run "
        "it up to K more times and fail only if all its runs combined still regress; "
        f"0 disables; default {DEFAULT_CONFIRM_RERUNS}",
    ),
    (
        "--traceml-baseline-runs",
        "traceml_baseline_runs",
        "int",
        "with --traceml-update-baseline, run each traced test N times and store the runs "
        f"combined (their spread becomes the entry's noise); default {DEFAULT_BASELINE_RUNS}",
    ),
    (
        "--traceml-report-only",
        "traceml_report_only",
        "flag",
        "compare and report, but a regression does not fail the test "
        "(the GitHub Action's fail-on-regression: false)",
    ),
    (
        "--traceml-module-sample-s",
        "traceml_module_sample_s",
        "seconds",
        "seconds of training between two steps timed per submodule in traced tests (the "
        "modules a regressed forward or backward names); 0 turns it off; default "
        f"{SMOKE_TEST_MODULE_SAMPLE_S}",
    ),
    (
        "--traceml-profile-on-regression",
        "traceml_profile_on_regression",
        "flag",
        "when a traced test regresses (after confirmation), run it once more under "
        "torch.profiler: a chrome trace, and its top ops by self time in the failure and the "
        "report; never changes a verdict",
    ),
    (
        "--traceml-profile",
        "traceml_profile",
        "flag",
        "with --traceml-update-baseline, run each traced test once more under torch.profiler "
        "and store its top ops in its baseline entry (a later regression then shows op "
        "deltas base -> head)",
    ),
    (
        "--traceml-profile-steps",
        "traceml_profile_steps",
        "int",
        f"steps profiled after the warmup; default {DEFAULT_PROFILE_STEPS}",
    ),
    (
        "--traceml-profile-dir",
        "traceml_profile_dir",
        "path",
        "where the profiles go (one folder per baseline key); default: the test's temporary "
        "folder",
    ),
    (
        "--traceml-ab",
        "traceml_ab",
        "text",
        "A/B: judge every traced test against its own version at REF (a commit or tag; a "
        "branch: its merge-base with HEAD), checked out in a temporary git worktree: base and "
        "head run as child pytest processes in interleaved rounds until a paired verdict, as "
        "`traceml-ci ab` judges (instead of --traceml-baseline)",
    ),
    (
        "--traceml-ab-rounds-max",
        "traceml_ab_rounds_max",
        "int",
        "with --traceml-ab: rounds at most before a test is inconclusive; default: that of "
        "`traceml-ci ab --rounds-max`",
    ),
    (
        "--traceml-ab-step-tolerance",
        "traceml_ab_step_tolerance",
        "number",
        "with --traceml-ab: how many percent slower the median step time may get; default: that of "
        "`traceml-ci ab --step-tolerance`",
    ),
    (
        "--traceml-ab-share-tolerance",
        "traceml_ab_share_tolerance",
        "number",
        "with --traceml-ab: percentage points a phase share may grow; default: that of "
        "`traceml-ci ab --share-tolerance`",
    ),
    (
        "--traceml-ab-setup",
        "traceml_ab_setup",
        "text",
        "with --traceml-ab: a shell command run once in the base worktree before its first run "
        "(build compiled extensions there: 'python setup.py build_ext --inplace')",
    ),
    (
        "--traceml-ab-inconclusive",
        "traceml_ab_inconclusive",
        "text",
        "with --traceml-ab: what a test whose A/B stays too noisy to decide (a device clock's "
        "timings; a host clock's only inform) does: 'pass' (default: it passes, the report "
        "saying inconclusive with the estimates), 'warn' (it passes with a pytest warning) or "
        "'fail' (the test fails, saying inconclusive)",
    ),
    (
        "--traceml-ab-json",
        "traceml_ab_json",
        "path",
        "with --traceml-ab: write the session's A/B results as JSON (the GitHub Action reads "
        "its verdict)",
    ),
)

#: Metavars shown in --help, by option (else by kind).
_METAVARS = {
    "--traceml-ab": "REF",
    "--traceml-ab-setup": "CMD",
    "--traceml-ab-inconclusive": "pass|warn|fail",
    "--traceml-ab-step-tolerance": "PCT",
    "--traceml-ab-share-tolerance": "PP",
}
#: The hidden option an A/B child session runs under: where it writes what it traced. Set by
#: the parent session only (pytest_plugin/ab.py); it turns A/B and gating off in the child.
AB_CHILD_OPTION = "--traceml-ab-child"
#: What --traceml-ab-inconclusive accepts; the first is the default.
AB_INCONCLUSIVE = AB_INCONCLUSIVE_POLICIES


class SetupError(Exception):
    """A setting, or a file a setting names, is unusable. The front door turns it into
    pytest.UsageError (exit code 4)."""


@dataclass(frozen=True)
class Options:
    baseline: Path | None = None
    update_baseline: bool = False
    save: Path | None = None
    report: Path | None = None
    tolerances: Path | None = None
    require_baseline: bool = False
    repeats: int = 1
    confirm: int = DEFAULT_CONFIRM_RERUNS
    baseline_runs: int = DEFAULT_BASELINE_RUNS
    comparison: Path | None = None
    report_only: bool = False
    profile_on_regression: bool = False
    profile: bool = False
    profile_steps: int = DEFAULT_PROFILE_STEPS
    profile_dir: Path | None = None
    module_sample_s: float = SMOKE_TEST_MODULE_SAMPLE_S
    #: --traceml-ab: the base REF as given; the A/B settings left None take gate/ab/sequential.py's
    #: defaults (AbSettings), which this start-up module does not import.
    ab: str | None = None
    ab_rounds_max: int | None = None
    ab_step_tolerance: float | None = None
    ab_share_tolerance: float | None = None
    ab_setup: str | None = None
    ab_inconclusive: str = AB_INCONCLUSIVE[0]
    ab_json: Path | None = None
    #: This session is an A/B child: where it writes the summaries it traced.
    ab_child: Path | None = None
    #: The nearest pyproject.toml at or above the rootdir, for [tool.traceml-ci] rules.
    pyproject: Path | None = None

    @property
    def active(self) -> bool:
        """Whether anything was asked of the plugin beyond tracing marked tests."""
        return any(
            (self.baseline, self.update_baseline, self.save, self.report, self.comparison,
             self.tolerances, self.require_baseline, self.repeats != 1, self.report_only,
             self.ab)
        )

    @property
    def runs_per_test(self) -> int:
        """Runs of each traced test before it is gated: ``--traceml-repeats``, and when a
        baseline is being recorded at least ``--traceml-baseline-runs``."""
        if self.update_baseline:
            return max(self.repeats, self.baseline_runs)
        return self.repeats

    @property
    def gating(self) -> bool:
        return self.baseline is not None


def add_options(parser: Any) -> None:
    """Register every option and its ini twin (pytest's ``pytest_addoption``)."""
    group = parser.getgroup("traceml", "traceml-ci: gate traced training tests on a baseline")
    for flag, ini, kind, help_text in OPTIONS:
        if kind == "flag":
            group.addoption(flag, action="store_true", default=None, dest=ini, help=help_text)
            parser.addini(ini, help_text, type="bool", default=False)
        else:
            meta = _METAVARS.get(flag) or {"int": "N", "seconds": "S", "number": "X"}.get(
                kind, "PATH")
            group.addoption(flag, action="store", default=None, dest=ini, metavar=meta,
                            help=help_text)
            parser.addini(ini, help_text, type="string", default="")
    import argparse

    group.addoption(AB_CHILD_OPTION, action="store", default=None, dest="traceml_ab_child",
                    help=argparse.SUPPRESS)


def read_options(config: Any) -> Options:
    """Command line first, then ini. Relative paths: from the invocation folder on the command
    line, from the ini file's folder in ini. Raises SetupError."""
    invocation = Path(config.invocation_params.dir)
    ini_dir = Path(config.inipath).parent if config.inipath else Path(config.rootpath)
    values: dict[str, Any] = {}
    for flag, ini, kind, _ in OPTIONS:
        given = config.getoption(ini)
        base = invocation
        if given is None:
            given = config.getini(ini)
            base = ini_dir
            if given == "":
                given = None
        name = ini.removeprefix("traceml_")
        if given is None:
            continue
        if kind == "flag":
            values[name] = bool(given)
        elif kind == "int":
            try:
                values[name] = int(given)
            except (TypeError, ValueError):
                raise SetupError(f"{flag} must be an integer, not {given!r}") from None
        elif kind == "number":
            try:
                number = float(given)
            except (TypeError, ValueError):
                number = -1.0
            if not number >= 0 or number == float("inf"):
                raise SetupError(f"{flag} must be a number >= 0, not {given!r}")
            values[name] = number
        elif kind == "text":
            values[name] = str(given)
        elif kind == "seconds":
            try:
                seconds = float(given)
            except (TypeError, ValueError):
                seconds = -1.0
            if not seconds >= 0 or seconds == float("inf"):
                raise SetupError(f"{flag} must be a number of seconds >= 0, not {given!r}")
            values[name] = seconds
        else:
            values[name] = base / Path(str(given)).expanduser()
    repeats = values.get("repeats", 1)
    if repeats < 1:
        raise SetupError(f"--traceml-repeats must be at least 1, not {repeats}")
    confirm = values.get("confirm", DEFAULT_CONFIRM_RERUNS)
    if confirm < 0:
        raise SetupError(f"--traceml-confirm must be 0 or more, not {confirm}")
    baseline_runs = values.get("baseline_runs", DEFAULT_BASELINE_RUNS)
    if baseline_runs < 1:
        raise SetupError(f"--traceml-baseline-runs must be at least 1, not {baseline_runs}")
    if values.get("update_baseline") and values.get("baseline") is None:
        raise SetupError("--traceml-update-baseline needs --traceml-baseline=PATH")
    if values.get("profile_steps", DEFAULT_PROFILE_STEPS) < 1:
        raise SetupError("--traceml-profile-steps must be at least 1, not "
                         f"{values['profile_steps']}")
    if values.get("profile") and not values.get("update_baseline"):
        raise SetupError("--traceml-profile needs --traceml-update-baseline (it records the "
                         "baseline's top ops)")
    if values.get("require_baseline") and values.get("baseline") is None:
        raise SetupError("--traceml-require-baseline needs --traceml-baseline=PATH")
    pyproject = find_pyproject(config.rootpath)
    child = config.getoption("traceml_ab_child")
    if child:
        # An A/B child traces its one test and reports it to the parent: no gating, no files,
        # no A/B of its own (the user's ini may say --traceml-ab too).
        return Options(ab_child=Path(child), pyproject=pyproject,
                       module_sample_s=values.get("module_sample_s", SMOKE_TEST_MODULE_SAMPLE_S))
    _check_ab(values)
    # At or above pytest's rootdir, as ``traceml-ci diff`` looks from its working directory.
    return Options(**values, pyproject=pyproject)


def _check_ab(values: dict[str, Any]) -> None:
    """The --traceml-ab options make sense together. Raises SetupError."""
    if values.get("ab") is None:
        given = [f"--traceml-{name.replace('_', '-')}" for name in values
                 if name.startswith("ab_")]
        if given:
            raise SetupError(f"{given[0]} needs --traceml-ab=REF")
        return
    if not values["ab"]:
        raise SetupError("--traceml-ab needs a git ref (a commit, tag or branch)")
    for other in ("baseline", "update_baseline", "require_baseline"):
        if values.get(other):
            raise SetupError(f"--traceml-ab and --traceml-{other.replace('_', '-')}: give one "
                             "(A/B judges each test against its base run beside it, not against "
                             "a stored baseline)")
    inconclusive = values.get("ab_inconclusive", AB_INCONCLUSIVE[0])
    if inconclusive not in AB_INCONCLUSIVE:
        raise SetupError(f"--traceml-ab-inconclusive must be one of "
                         f"{', '.join(AB_INCONCLUSIVE)}, not {inconclusive!r}")
