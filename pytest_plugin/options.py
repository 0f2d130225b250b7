"""The plugin's settings: command-line options with ini / pyproject fallbacks, read once.

Standard library only: pytest imports this at start-up in every session.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceml_ci.fsutil import find_pyproject
from traceml_ci.summary.keys import (
    DEFAULT_BASELINE_RUNS,
    DEFAULT_CONFIRM_RERUNS,
    SMOKE_TEST_MODULE_SAMPLE_S,
)
from traceml_ci.summary.profile import DEFAULT_PROFILE_STEPS

#: (option, ini name, kind, help). ``kind``: "path", "flag", "int" or "seconds".
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
)


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
    #: The nearest pyproject.toml at or above the rootdir, for [tool.traceml-ci] rules.
    pyproject: Path | None = None

    @property
    def active(self) -> bool:
        """Whether anything was asked of the plugin beyond tracing marked tests."""
        return any(
            (self.baseline, self.update_baseline, self.save, self.report, self.comparison,
             self.tolerances, self.require_baseline, self.repeats != 1, self.report_only)
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
            meta = {"int": "N", "seconds": "S"}.get(kind, "PATH")
            group.addoption(flag, action="store", default=None, dest=ini, metavar=meta,
                            help=help_text)
            parser.addini(ini, help_text, type="string", default="")


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
    # At or above pytest's rootdir, as ``traceml-ci diff`` looks from its working directory.
    return Options(**values, pyproject=find_pyproject(config.rootpath))
