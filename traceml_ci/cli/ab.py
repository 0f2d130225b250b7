"""``traceml-ci ab --base REF -- python SCRIPT [ARGS]``: base and head run interleaved on this
machine, round after round, until a paired verdict (docs/gate.md, "A/B mode").

The head is the working tree as it is; the base is REF checked out into a temporary git
worktree (``gitwork.py``). Each run goes through the launcher, as ``traceml-ci run`` does, with
its side's worktree as the working folder and on ``PYTHONPATH``; the statistics and the
decision are ``gate/ab/sequential.py``, the report ``gate/ab/report.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from traceml_ci.cli.options import amount, seconds, whole
from traceml_ci.errors import (
    ExitCode,
    MissingDependencyError,
    UsageError,
    one_line,
)
from traceml_ci.gate.ab.sequential import (
    DEFAULT_MAX_ROUNDS,
    DEFAULT_MIN_ROUNDS,
    DEFAULT_SHARE_TOL_PP,
    DEFAULT_STEP_TOL_PCT,
)
from traceml_ci.gate.results import Verdict
from traceml_ci.sides import SideFailed, Sides, stopped
from traceml_ci.summary.keys import AB_INCONCLUSIVE_POLICIES

#: Where the runs' summaries and the report go unless --out says.
DEFAULT_AB_OUT = os.path.join("traceml-out", "ab")

#: What ``--inconclusive`` accepts (no warning here: a command has only its exit code); the
#: first is the default.
INCONCLUSIVE_CHOICES = tuple(p for p in AB_INCONCLUSIVE_POLICIES if p != "warn")



#: What may stand before the script: the interpreter (the runs use traceml-ci's own, as
#: ``traceml-ci run`` does).
_PYTHON = re.compile(r"(?:.*[/\\])?python[0-9.]*(?:\.exe)?")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "ab",
        help="A/B: base and head run interleaved on this machine, a paired verdict",
        description="Run the command on the base (REF checked out in a temporary git worktree) "
        "and on the head (this working tree) in interleaved rounds -- base, head; head, base; "
        "... -- each traced, and after each round judge the paired differences: the median "
        "step time's ratio and every phase share's change. Stops as soon as the evidence is "
        "clear. On a host clock (a CPU run) the first round's counts and settings decide and "
        "the timings inform. "
        f"Exit {int(ExitCode.OK)} pass (and inconclusive, unless --inconclusive fail), "
        f"{int(ExitCode.REGRESSION)} regression, "
        f"{int(ExitCode.INCONCLUSIVE)} inconclusive under --inconclusive fail, "
        f"{int(ExitCode.BAD_INPUT)} usage, {int(ExitCode.INCOMPARABLE)} a side's run failed.",
    )
    p.add_argument(
        "--base",
        metavar="REF",
        required=True,
        help="the base: a commit, tag or HEAD~N as it is; a branch: its merge-base with HEAD",
    )
    # The numbers a verdict is decided by (AbSettings): flag, metavar, type, default, meaning.
    settings = (
        ("--rounds-max", "N", whole("--rounds-max", least=2), DEFAULT_MAX_ROUNDS,
         "rounds at most before 'inconclusive'"),
        ("--rounds-min", "N", whole("--rounds-min", least=2), DEFAULT_MIN_ROUNDS,
         "rounds before any verdict"),
        ("--step-tolerance", "PCT", amount("--step-tolerance"), DEFAULT_STEP_TOL_PCT,
         "%% slower median step time tolerated"),
        ("--share-tolerance", "PP", amount("--share-tolerance"), DEFAULT_SHARE_TOL_PP,
         "percentage points a phase share may grow"),
    )
    for flag, metavar, kind, default, meaning in settings:
        p.add_argument(flag, metavar=metavar, type=kind, default=default,
                       help=f"{meaning} (default {default:g})")
    p.add_argument(
        "--inconclusive",
        choices=INCONCLUSIVE_CHOICES,
        default=INCONCLUSIVE_CHOICES[0],
        help="what a result too noisy to decide exits with: pass (default: 0, the report "
        f"says inconclusive) or fail ({int(ExitCode.INCONCLUSIVE)})",
    )
    p.add_argument(
        "--tolerances",
        metavar="FILE",
        help="TOML rules each round's pair is compared by, as `traceml-ci diff` compares two "
        "summaries (default: [tool.traceml-ci] in the nearest pyproject.toml, else the "
        "defaults)",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        default=DEFAULT_AB_OUT,
        help=f"where base/roundN.json, head/roundN.json, their logs, ab.json and "
        f"report.md go (default {DEFAULT_AB_OUT})",
    )
    p.add_argument(
        "--base-setup",
        metavar="CMD",
        help="a shell command run once in the base worktree before the first round "
        "(build compiled extensions there: 'python setup.py build_ext --inplace')",
    )
    p.add_argument(
        "--timeout",
        metavar="S",
        type=seconds("--timeout"),
        help="seconds one run may take (default: no limit)",
    )
    p.add_argument(
        "--format",
        choices=("text", "markdown", "json"),
        default="text",
        help="what to print on stdout (default text)",
    )
    p.add_argument(
        "training_command",  # not "command": main.py's subcommand name lives there
        nargs=argparse.REMAINDER,
        metavar="-- python SCRIPT [ARGS]",
        help="the training command, after --: python SCRIPT [ARGS] or python -m MODULE [ARGS]",
    )
    p.set_defaults(func=run)


@dataclass(frozen=True)
class Target:
    """The script (or module) and its arguments, from the command after ``--``."""

    target: str
    args: tuple[str, ...]
    module: bool


def parse_command(words: list[str]) -> Target:
    """``-- python SCRIPT [ARGS]`` / ``-- python -m MODULE [ARGS]`` / ``-- SCRIPT.py [ARGS]``."""
    if not words:
        raise UsageError("give the command after --: traceml-ci ab --base REF -- python SCRIPT")
    if words[0] != "--":
        raise UsageError(
            f"put -- before the command ({one_line(' '.join(words[:3]))} ...): "
            "traceml-ci ab --base REF -- python SCRIPT"
        )
    words = words[1:]
    if words and _PYTHON.fullmatch(words[0]):
        words = words[1:]
    if not words:
        raise UsageError(
            "the command after -- names no script: python SCRIPT [ARGS] or python -m MODULE [ARGS]"
        )
    if words[0] == "-m":
        if len(words) < 2:
            raise UsageError("-m takes a MODULE name, then its arguments")
        return Target(words[1], tuple(words[2:]), module=True)
    if words[0].startswith("-"):
        raise UsageError(
            f"{one_line(words[0])}: interpreter options are not passed on; give "
            "python SCRIPT [ARGS] or python -m MODULE [ARGS]"
        )
    return Target(words[0], tuple(words[1:]), module=False)


def _measure(sides: Sides, target: Target, out: Path, timeout_s: float | None,
             side_name: str, number: int):
    """One side of one round: a traced launch in that side's tree, its output in
    ``<out>/<side>/roundN.log``, its summary moved to ``<out>/<side>/roundN.json``."""
    from traceml_ci.gate.ab.sequential import SideFigures
    from traceml_ci.summary.io import load_summary
    from traceml_ci.tracer.launch import LaunchSpec, launch

    where = out / side_name
    run_dir = where / f"round{number}"
    shutil.rmtree(run_dir, ignore_errors=True)
    spec = LaunchSpec(target=target.target, args=target.args, module=target.module,
                      out_dir=str(run_dir))
    done = launch(spec, env=sides.env(side_name), cwd=sides.cwd(side_name), timeout_s=timeout_s,
                  capture=True)
    log = where / f"round{number}.log"
    log.write_text(done.output or "", errors="backslashreplace")
    if stopped(done.code):
        raise KeyboardInterrupt
    said = f"{side_name} round {number}"
    if done.timed_out:
        raise SideFailed(f"{said}: the command ran past --timeout (its output: {log})")
    if done.code != 0:
        raise SideFailed(f"{said}: the command exited {done.code} (its output: {log})")
    path = where / f"round{number}.json"
    try:
        os.replace(done.summary, path)
    except FileNotFoundError:
        raise SideFailed(f"{said}: the command wrote no summary (its output: {log})") from None
    shutil.rmtree(run_dir, ignore_errors=True)
    return SideFigures.from_summary(load_summary(path), str(path))


def _progress(result) -> None:
    last = result.rounds[-1]
    judged = "".join(
        f"; {iv.label} {iv.estimate:+.1f}% ({iv.low:+.1f}% .. {iv.high:+.1f}%)"
        for iv in (result.step, result.cpu)
        if iv is not None
    )
    first, second = ("base", "head") if last.first.value == "base" else ("head", "base")
    print(
        f"traceml-ci ab: round {last.number} ({first}, {second}): head/base "
        f"{last.step_ratio:.3f}{judged}",
        file=sys.stderr,
        flush=True,
    )


def run(args: argparse.Namespace) -> int:
    from traceml_ci.fsutil import write_output
    from traceml_ci.gate.ab import report as ab_report
    from traceml_ci.gate.ab.sequential import AbSettings, Side, run_rounds
    from traceml_ci.gate.rules import resolve_rules
    from traceml_ci.gitwork import resolve_base, toplevel
    from traceml_ci.tracer.launch import TORCH_MISSING, torch_available

    target = parse_command(list(args.training_command))
    settings = AbSettings(
        min_rounds=args.rounds_min,
        max_rounds=args.rounds_max,
        step_tol_pct=args.step_tolerance,
        share_tol_pp=args.share_tolerance,
        rules=resolve_rules(args.tolerances),
    )
    cwd = Path.cwd()
    if not target.module and not (cwd / target.target).is_file():
        raise UsageError(f"{one_line(target.target)}: no such script")
    repo = toplevel(cwd)
    base = resolve_base(repo, args.base)
    if not torch_available():
        raise MissingDependencyError(TORCH_MISSING)
    rel = cwd.resolve().relative_to(repo.resolve())
    out = Path(args.out).resolve()
    for side in Side:
        (out / side.value).mkdir(parents=True, exist_ok=True)
    print(
        f"traceml-ci ab: base {one_line(args.base)} = {base.commit[:12]}"
        f"{' (merge-base with HEAD)' if base.how == 'merge-base' else ''}; head: the working "
        f"tree of {one_line(repo)}",
        file=sys.stderr,
        flush=True,
    )
    with Sides(repo, base.commit, rel, setup=args.base_setup) as sides:
        base_root = sides.root("base", setup_log=out / "base" / "setup.log")
        if not target.module and not (base_root / rel / target.target).is_file():
            raise SideFailed(f"{one_line(target.target)}: not in the base {base.commit[:12]}")
        result = run_rounds(
            lambda side, n: _measure(sides, target, out, args.timeout, side.value, n), settings,
            on_round=_progress,
        )
    doc = ab_report.to_json(result, args.base, base.commit)
    write_output(str(out / "ab.json"), json.dumps(doc, indent=1) + "\n")
    write_output(str(out / "report.md"), ab_report.render_markdown(result, args.base))
    if args.format == "json":
        print(json.dumps(doc, indent=1))
    elif args.format == "markdown":
        print(ab_report.render_markdown(result, args.base), end="")
    else:
        print(ab_report.render_text(result, args.base), end="")
    from traceml_ci.cli.diff import exit_code

    return exit_code(result.verdict or Verdict.INCONCLUSIVE, args.inconclusive)
