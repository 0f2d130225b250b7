"""``traceml-ci run SCRIPT`` / ``traceml-ci run -m MODULE``: run training code with tracing and
write its summary. The launcher itself is ``traceml_ci.tracer.launch`` (torch-free)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from traceml_ci.errors import ExitCode, UsageError

#: torchrun options `traceml-ci run` takes itself (its own spelling), passed on unchanged.
TORCHRUN_OPTIONS: tuple[tuple[str, str], ...] = (
    ("--nproc-per-node", "N"),
    ("--nnodes", "N[:M]"),
    ("--node-rank", "R"),
    ("--rdzv-endpoint", "HOST:PORT"),
    ("--rdzv-backend", "NAME"),
    ("--rdzv-id", "ID"),
    ("--master-addr", "HOST"),
    ("--master-port", "PORT"),
)


def _dest(flag: str) -> str:
    return "torchrun_" + flag.lstrip("-").replace("-", "_")


def torchrun_args(args: argparse.Namespace) -> tuple[str, ...]:
    """The torchrun options given, in torchrun's own spelling; empty: not distributed."""
    out: list[str] = []
    for flag, _ in TORCHRUN_OPTIONS:
        value = getattr(args, _dest(flag), None)
        if value is not None:
            out += [flag, str(value)]
    out += list(getattr(args, "torchrun_arg", None) or [])
    if out and getattr(args, _dest("--nproc-per-node"), None) is None:
        raise UsageError("distributed options need --nproc-per-node N")
    return tuple(out)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run",
        help="run a training script with tracing",
        description="Run SCRIPT (or -m MODULE, like python -m) with tracing, whether or not it "
        "calls traceml_ci.init(), and write DIR/final_summary.json. Exits with the script's exit "
        f"code ({int(ExitCode.MISSING_DEPENDENCY)} when torch is not installed). A crash still "
        "writes a summary (run.status 'crashed'); SIGINT/SIGTERM give 'interrupted'. On a "
        "terminal the script runs on a pseudo-terminal with the live view under its output (a "
        "second Ctrl-C kills it); otherwise plain progress lines go to stderr.",
    )
    p.add_argument(
        "--out", metavar="DIR", help="output folder (default $TRACEML_CI_OUT or ./traceml-out)"
    )
    p.add_argument("--run-name", metavar="NAME", help="run name (default: the script's name)")
    p.add_argument(
        "--warmup-steps", metavar="N", type=int, help="steps left out of the statistics (default 5)"
    )
    p.add_argument(
        "--module-sample-s", metavar="S", type=float,
        help="seconds of training between two steps timed per submodule (default 0.5; 0: off; "
        "trace_step runs only, docs/pinpoint.md)",
    )
    p.add_argument(
        "--no-live", action="store_true",
        help="no live view on a terminal: the script keeps our terminal, and plain progress "
        "lines go to stderr as in a log",
    )
    p.add_argument(
        "--progress-interval", metavar="S", type=float,
        help="seconds between plain progress lines when not showing the live view (default "
        "$TRACEML_CI_PROGRESS_INTERVAL or 10; 0: none)",
    )
    dist = p.add_argument_group(
        "distributed", "launch every rank through torchrun (torch.distributed.run), each traced; "
        "rank 0 writes one summary with the per-rank table and the straggler (docs/distributed.md)")
    for flag, meta in TORCHRUN_OPTIONS:
        dist.add_argument(flag, metavar=meta, dest=_dest(flag),
                          help=f"torchrun's {flag}")
    dist.add_argument("--torchrun-arg", metavar="ARG", action="append", default=[],
                      help="any other torchrun option, passed through unchanged (repeatable: "
                      "--torchrun-arg=--max-restarts=1)")
    # Like python's -m: everything after MODULE is the module's, not ours.
    p.add_argument(
        "-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE [ARGS]",
        help="run library module MODULE as a script (like python -m)",
    )
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="SCRIPT [ARGS]",
                   help="the training script and its arguments (or, with -m, the module's)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from traceml_ci.cli.live_run import attachment, progress_interval
    from traceml_ci.tracer.launch import LaunchSpec, launch

    rest = list(args.args)
    if args.module is not None:
        if not args.module:
            raise UsageError("-m takes a MODULE name, then its arguments")
        # argparse takes a "--" among the module's arguments as its own: give it back.
        target, *margs = args.module
        rest = [*margs, "--", *rest] if rest else margs
        module = True
    elif rest:
        target, module = rest.pop(0), False
        if not Path(target).is_file():
            raise UsageError(f"{target}: no such script")
    else:
        raise UsageError("give a SCRIPT, or -m MODULE")
    if args.warmup_steps is not None and args.warmup_steps < 0:
        raise UsageError("--warmup-steps must be >= 0")
    if args.module_sample_s is not None and not args.module_sample_s >= 0:
        raise UsageError("--module-sample-s must be >= 0 (0: no module sampling)")
    if args.progress_interval is not None and not args.progress_interval >= 0:
        raise UsageError("--progress-interval must be >= 0")
    try:
        interval = progress_interval(args.progress_interval)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    spec = LaunchSpec(
        target=target,
        args=tuple(rest),
        module=module,
        out_dir=args.out,
        run_name=args.run_name,
        warmup_steps=args.warmup_steps,
        module_sample_s=args.module_sample_s,
        torchrun=torchrun_args(args),
    )
    company = attachment(live=not args.no_live, progress_interval_s=interval)
    done = launch(spec, forward_signals=True, attach=company)
    if done.fallback:
        print(
            f"traceml-ci: the script ended without a summary (exit {done.code}); "
            f"wrote {done.summary} with run.status set",
            file=sys.stderr,
        )
    elif spec.torchrun and done.summary.is_file():
        # One process says where the merged summary is: the ranks finish inside torchrun's
        # workers, where none of them announces (a single process says it itself).
        print(f"traceml-ci: summary written to {done.summary}", file=sys.stderr)
    return int(done.code or 0)
