"""``traceml-ci run SCRIPT`` / ``traceml-ci run -m MODULE``: run training code with tracing and
write its summary. The launcher itself is ``traceml_ci.tracer.launch`` (torch-free)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from traceml_ci.cli.options import seconds, whole
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


#: torchrun's own words for --nproc-per-node (one process per device of that kind).
NPROC_WORDS = ("auto", "cpu", "gpu", "cuda", "xpu")


def _nproc(text: str) -> str:
    if text not in NPROC_WORDS and not (text.isdigit() and int(text) >= 1):
        raise UsageError(f"--nproc-per-node {text!r}: must be a whole number of at least 1, "
                         f"or one of {', '.join(NPROC_WORDS)}")
    return text


def _nnodes(text: str) -> str:
    """N, or MIN:MAX for elastic runs: whole numbers, MIN <= MAX."""
    low, _, high = text.partition(":")
    least = whole("--nnodes", least=1)
    if least(low) > (least(high) if high else least(low)):
        raise UsageError(f"--nnodes {text!r}: MIN:MAX needs MIN <= MAX")
    return text


def _port(text: str) -> int:
    port = whole("--master-port", least=1)(text)
    if port > 65535:
        raise UsageError(f"--master-port {text!r}: a TCP port is at most 65535")
    return port


#: The torchrun options checked here (the rest torchrun checks itself).
_TORCHRUN_CHECKS = {
    "--nproc-per-node": _nproc,
    "--nnodes": _nnodes,
    "--node-rank": whole("--node-rank"),
    "--master-port": _port,
}


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
        "--warmup-steps", metavar="N", type=whole("--warmup-steps"),
        help="steps left out of the statistics (default 5)",
    )
    p.add_argument(
        "--batch-size", metavar="N", type=whole("--batch-size", least=1),
        help="samples per step, for a loop without a DataLoader to count them from (nanoGPT's "
        "get_batch): gives samples/s; like init(batch_size=N)",
    )
    p.add_argument(
        "--module-sample-s", metavar="S",
        type=seconds("--module-sample-s", zero="no module sampling"),
        help="seconds of training between two steps timed per submodule (default 0.5; 0: off; "
        "trace_step runs only, docs/pinpoint.md)",
    )
    p.add_argument(
        "--no-live",
        action="store_true",
        help="no live view on a terminal: the script keeps our terminal, and plain progress "
        "lines go to stderr as in a log",
    )
    p.add_argument(
        "--progress-interval", metavar="S", type=seconds("--progress-interval", zero="none"),
        help="seconds between plain progress lines when not showing the live view (default "
        "$TRACEML_CI_PROGRESS_INTERVAL or 10; 0: none)",
    )
    dist = p.add_argument_group(
        "distributed",
        "launch every rank through torchrun (torch.distributed.run), each traced; "
        "rank 0 writes one summary with the per-rank table and the straggler (docs/distributed.md)",
    )
    for flag, meta in TORCHRUN_OPTIONS:
        dist.add_argument(flag, metavar=meta, dest=_dest(flag), type=_TORCHRUN_CHECKS.get(flag),
                          help=f"torchrun's {flag}")
    dist.add_argument("--torchrun-arg", metavar="ARG", action="append", default=[],
                      help="any other torchrun option, passed through unchanged (repeatable: "
                      "--torchrun-arg=--max-restarts=1)")
    # Like python's -m: everything after MODULE is the module's, not ours.
    p.add_argument(
        "-m",
        dest="module",
        nargs=argparse.REMAINDER,
        metavar="MODULE [ARGS]",
        help="run library module MODULE as a script (like python -m)",
    )
    p.add_argument(
        "args",
        nargs=argparse.REMAINDER,
        metavar="SCRIPT [ARGS]",
        help="the training script and its arguments (or, with -m, the module's)",
    )
    p.set_defaults(func=run)


def module_problem(name: str) -> str | None:
    """Why ``python -m NAME`` could not start, as a script's "no such script" is said before
    anything runs; None when it can (or when it cannot be told without importing a package:
    finding a submodule only reads folders). Searched as the child will: the working folder
    first, as ``python -m`` does."""
    import importlib.machinery
    import importlib.util
    import os

    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        return "not a module name"
    saved = sys.path[:]
    sys.path[:1] = [os.getcwd()]
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return None  # a finder that cannot say: let python -m say it
    finally:
        sys.path[:] = saved
    for depth, part in enumerate(parts[1:], start=1):
        if spec is None:
            break
        where = spec.submodule_search_locations
        if where is None:
            return f"{'.'.join(parts[:depth])} is not a package"
        spec = importlib.machinery.PathFinder.find_spec(part, list(where))
    if spec is None:
        return f"no module named {name!r}"
    return None


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
        problem = module_problem(target)
        if problem:
            raise UsageError(f"-m {target}: {problem}")
    elif rest:
        target, module = rest.pop(0), False
        if not Path(target).is_file():
            raise UsageError(f"{target}: no such script")
    else:
        raise UsageError("give a SCRIPT, or -m MODULE")
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
        batch_size=args.batch_size,
        module_sample_s=args.module_sample_s,
        torchrun=torchrun_args(args),
    )
    company = attachment(live=not args.no_live, progress_interval_s=interval)
    done = launch(spec, forward_signals=True, attach=company)
    if done.fallback:
        source = ("from its last live snapshot "
                  f"({done.recovered_steps} steps)" if done.recovered_steps else "with no steps")
        print(
            f"traceml-ci: the script ended without a summary (exit {done.code}); "
            f"wrote {done.summary} {source}, with run.status set",
            file=sys.stderr,
        )
    elif spec.torchrun and done.summary.is_file():
        # One process says where the merged summary is: the ranks finish inside torchrun's
        # workers, where none of them announces (a single process says it itself).
        print(f"traceml-ci: summary written to {done.summary}", file=sys.stderr)
    return int(done.code or 0)
