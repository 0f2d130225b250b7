"""Launching a traced child: the one spec ``traceml-ci run`` and the pytest plugin hand it, and
the launcher that starts it, passes signals on and writes a summary if the child left none.

Torch-free: the launcher process never imports torch (the child does, when the script does).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from traceml_ci.childenv import child_env
from traceml_ci.errors import MissingDependencyError
from traceml_ci.summary.keys import DEFAULT_OUT_DIR, ENV_OUT, SUMMARY_FILENAME

#: The one environment variable carrying the spec to the child (JSON). The child reads it once,
#: in ``traceml_ci.tracer.bootstrap`` (through ``config.take_launch_spec``), and removes it.
ENV_LAUNCH = "TRACEML_CI_LAUNCH"

#: What a child killed by a signal exits with, in the shell's convention (128 + signal).
_SIGNAL_BASE = 128

TORCH_MISSING = (
    "tracing needs PyTorch, which is not installed in this environment "
    "(install the torch build you train with, e.g. pip install torch)"
)


@dataclass(frozen=True)
class LaunchSpec:
    """What to run and how to trace it. ``None`` settings are left to the script's ``init()``
    (or the defaults); settings given here win over the script's own ``init()`` keywords."""

    target: str
    args: tuple[str, ...] = ()
    #: ``target`` is a module name, run like ``python -m target``.
    module: bool = False
    out_dir: str | None = None
    run_name: str | None = None
    warmup_steps: int | None = None
    max_steps: int | None = None
    #: Samples per step (``init(batch_size=)``): for loops without a DataLoader to count from.
    batch_size: int | None = None
    #: Seconds between module samples (0: off); None leaves it to init() / the environment.
    module_sample_s: float | None = None
    #: Distributed: torchrun's own options (``--nproc-per-node 2``, ``--nnodes``, ...); the job
    #: then starts through ``torch.distributed.run``, every rank under the bootstrap.
    torchrun: tuple[str, ...] = ()
    #: The run's root, that the summary's ``file:line`` sites are relative to (the pytest
    #: plugin's rootdir); None: found from the child's working directory (tracer/sites.py).
    root_dir: str | None = None
    #: Resolved by the launcher: where the summary goes when ``out_dir`` is not given.
    default_out_dir: str = field(default=DEFAULT_OUT_DIR)

    @property
    def out(self) -> Path:
        return Path(self.out_dir or self.default_out_dir)

    @property
    def summary_path(self) -> Path:
        return self.out / SUMMARY_FILENAME

    @property
    def name(self) -> str:
        """The run's name unless the script or the spec says otherwise: the script's stem, or
        the module's last component."""
        if self.run_name:
            return self.run_name
        return self.target.rsplit(".", 1)[-1] if self.module else Path(self.target).stem

    @property
    def locked(self) -> frozenset[str]:
        """The tracer settings fixed here, which a later ``init()`` must leave alone."""
        given = {
            "out_dir": self.out_dir,
            "run_name": self.run_name,
            "warmup_steps": self.warmup_steps,
            "max_steps": self.max_steps,
            "batch_size": self.batch_size,
            "module_sample_s": self.module_sample_s,
        }
        return frozenset(k for k, v in given.items() if v is not None)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LaunchSpec:
        raw = json.loads(text)
        raw["args"] = tuple(raw.get("args", ()))
        raw["torchrun"] = tuple(raw.get("torchrun", ()))
        return cls(**raw)


@dataclass(frozen=True)
class Launched:
    """How a launch ended. ``code``: the script's exit code (``128 + N`` when killed by signal
    N; ``None`` when it timed out). ``fallback``: the launcher wrote the summary."""

    code: int | None
    summary: Path
    fallback: bool = False
    #: With ``fallback``: the steps of the live snapshot the summary was recovered from.
    recovered_steps: int | None = None
    output: str | None = None

    @property
    def timed_out(self) -> bool:
        return self.code is None


class Attachment:
    """What a front door does around a launched child (a live view, progress lines): wire its
    stdio, wait on it itself, and hear how the run ended. This base does nothing: the child
    shares our stdio and the launcher waits. The launcher never imports the front door; the
    front door hands one of these to ``launch()``."""

    def popen_kwargs(self, out_dir: Path) -> dict[str, Any]:
        """Extra ``subprocess.Popen`` keywords (stdin, stdout, stderr, start_new_session,
        preexec_fn). ``out_dir``: the run's output folder (its live snapshots)."""
        return {}

    def started(self, proc: subprocess.Popen) -> None:
        """The child runs."""

    def wait(self, proc: subprocess.Popen, timeout_s: float | None) -> int | None:
        """Wait for the child and return its Popen-style returncode, ``-signal.SIGINT`` for a
        child the user interrupted and that had to be killed; or None to let the launcher wait
        as usual. May raise ``subprocess.TimeoutExpired``."""
        return None

    def ended(self, done: Launched | None) -> None:
        """Called last, always; ``done`` is None when the launch is unwound by an error."""


def torch_available() -> bool:
    """Whether ``import torch`` can work here, without importing it (that costs seconds)."""
    from importlib.util import find_spec

    try:
        return find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def launch(
    spec: LaunchSpec,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout_s: float | None = None,
    capture: bool = False,
    forward_signals: bool = False,
    attach: Attachment | None = None,
) -> Launched:
    """Run ``spec`` in a child interpreter (this one's ``sys.executable``) and wait for it.

    env: the child's environment (default: ours). capture: collect stdout and stderr together
    into ``Launched.output`` instead of sharing ours. forward_signals (main thread only): pass
    SIGTERM, and SIGINT unless the terminal already delivered it, on to the child. attach:
    the front door's company for the child (not with capture); see ``Attachment``.
    Raises MissingDependencyError when torch is not installed.
    """
    if not torch_available():
        raise MissingDependencyError(TORCH_MISSING)
    full_env = child_env(env)
    spec_out = spec.default_out_dir
    if spec.out_dir is None and full_env.get(ENV_OUT):
        spec_out = full_env[ENV_OUT]
    if spec_out != spec.default_out_dir:
        spec = LaunchSpec(**{**asdict(spec), "default_out_dir": spec_out})
    summary = spec.summary_path
    if cwd is not None and not summary.is_absolute():
        summary = Path(cwd) / summary
    full_env[ENV_LAUNCH] = spec.to_json()
    # The script and its arguments follow on the command line (the bootstrap reads the spec
    # alone): `ps`, `pkill -f train.py` and process monitors still find the user's job.
    shown = ["--", *(["-m"] if spec.module else []), spec.target, *spec.args]
    cmd = [sys.executable, "-m", "traceml_ci.tracer.bootstrap", *shown]
    if spec.torchrun:  # every rank runs the bootstrap; torchrun passes our environment on
        cmd = [sys.executable, "-m", "torch.distributed.run", *spec.torchrun, "-m",
               "traceml_ci.tracer.bootstrap", *shown]
    attach = Attachment() if attach is None or capture else attach
    done: Launched | None = None
    try:
        done = _run(spec, cmd, full_env, cwd, summary, timeout_s, capture, forward_signals, attach)
        if spec.torchrun:
            from traceml_ci.tracer.ranks_on_node import complete_merged_summary

            complete_merged_summary(summary.parent, spec.torchrun, full_env)
        return done
    finally:
        attach.ended(done)


def _run(
    spec: LaunchSpec,
    cmd: list[str],
    full_env: dict[str, str],
    cwd: str | os.PathLike[str] | None,
    summary: Path,
    timeout_s: float | None,
    capture: bool,
    forward_signals: bool,
    attach: Attachment,
) -> Launched:
    started = time.time()
    pipe = subprocess.PIPE if capture else None
    popen_kwargs: dict[str, Any] = {
        "stdout": pipe,
        "stderr": subprocess.STDOUT if capture else None,
        "text": capture,
        **attach.popen_kwargs(summary.parent),
    }
    proc = subprocess.Popen(cmd, env=full_env, cwd=cwd, **popen_kwargs)
    output: str | None = None
    try:
        attach.started(proc)
        code = attach.wait(proc, timeout_s)
        if code is None and forward_signals:
            code = _wait_forwarding_signals(proc, timeout_s)
        elif code is None:
            output, _ = proc.communicate(timeout=timeout_s)
            code = proc.returncode
    except subprocess.TimeoutExpired:
        code = None
    except KeyboardInterrupt:
        # We are interrupted (pytest's session, ``traceml-ci ab``): the child is given its
        # grace to write an interrupted summary, then it and what it started are ended; if it
        # wrote none, ours is written, as for a child killed by a signal.
        if proc.poll() is None:
            _interrupt(proc)
        if not _written_since(summary, started):
            _fallback(spec, summary, proc, started, interrupted=True)
        raise
    finally:
        if proc.poll() is None:  # timed out, or we are being unwound: leave nothing running
            tail = _end(proc)
            output = (output or "") + (tail or "") if capture else None
    killed = code is not None and code < 0
    if killed:
        code = _SIGNAL_BASE - code
    if not killed or _written_since(summary, started):
        return Launched(code, summary, output=output)
    # Killed by a signal before it could write (SIGKILL, segfault, OOM killer): a child that
    # exits otherwise has written its summary, maybe where the script's init(out_dir=) said.
    interrupted = code in (_SIGNAL_BASE + signal.SIGINT, _SIGNAL_BASE + signal.SIGTERM)
    snap = _fallback(spec, summary, proc, started, interrupted=interrupted)
    return Launched(code, summary, fallback=True, output=output,
                    recovered_steps=int(snap["steps_done"]) if snap is not None else None)


def _fallback(spec: LaunchSpec, summary: Path, proc: subprocess.Popen, started: float, *,
              interrupted: bool) -> dict[str, Any] | None:
    """Write the summary of a child that left none (from its newest live snapshot, if any);
    returns that snapshot."""
    from traceml_ci.summary.model import RunStatus
    from traceml_ci.tracer.fallback import last_snapshot, write_fallback_summary

    status = RunStatus.INTERRUPTED if interrupted else RunStatus.CRASHED
    snap = None if spec.torchrun else last_snapshot(summary.parent, proc.pid, started)
    write_fallback_summary(summary, spec.name, started, status, snapshot=snap)
    return snap


#: An interrupted launcher's patience with its child, in seconds: first for the child to end on
#: its own (a Ctrl-C at a terminal reached it too: a second SIGINT would land in its summary's
#: write), then after a SIGINT of ours to it and its DataLoader workers; past both it is killed.
INTERRUPT_GRACE_S = (1.0, 5.0)
#: Seconds the output of a killed child is read for at most: a process it started that we could
#: not find may hold the pipe open for ever.
DRAIN_S = 2.0


def _descendants(proc: subprocess.Popen) -> list[Any]:
    """The processes the child started, and theirs (psutil), found while it still runs: once it
    is gone they belong to init, and only their pids are left to find them by."""
    import psutil

    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        return []


def _signal_all(processes: list[Any], signum: int) -> None:
    import psutil

    for process in processes:
        try:
            process.send_signal(signum)
        except psutil.Error:
            pass


def _interrupt(proc: subprocess.Popen) -> None:
    """End a child as a Ctrl-C would, with time to write its summary: wait for it a moment, then
    SIGINT it and its descendants (a DataLoader worker stuck in a fetch holds the output pipe,
    and the child's own shutdown waits on it), then wait again. Leaves it running only when it
    ignores all that; :func:`_end` then kills what is left."""
    first, second = INTERRUPT_GRACE_S
    try:
        proc.wait(timeout=first)
        return
    except subprocess.TimeoutExpired:
        pass
    _signal_all([*_descendants(proc), proc], signal.SIGINT)
    try:
        proc.wait(timeout=second)
    except subprocess.TimeoutExpired:
        pass


def _end(proc: subprocess.Popen) -> str | None:
    """Kill the child and every process it started, and return what is left of its captured
    output (read for at most ``DRAIN_S``: a process that escaped the kill could hold the pipe
    open for ever; it was read to its end before, which never came)."""
    import psutil

    started = _descendants(proc)
    proc.kill()
    for process in started:
        try:
            process.kill()
        except psutil.Error:
            pass
    try:
        tail, _ = proc.communicate(timeout=DRAIN_S)
    except subprocess.TimeoutExpired:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()
        return None
    return tail


#: Linux's si_code for a signal the kernel sent itself -- a terminal's Ctrl-C goes to the
#: whole foreground process group that way; kill() from a process gives SI_USER (0).
_SI_KERNEL = 0x80
#: How often the Linux wait loop looks at the child between signals (seconds).
_POLL_S = 0.05


def _terminal_signalled_us() -> bool:
    """Whether we run in our terminal's foreground process group: a Ctrl-C there reaches every
    process of the group, the child and its DataLoader workers included, so passing it on
    would make a second KeyboardInterrupt land in the child's cleanup. (The guess where the
    signal's origin cannot be read: a kill -INT of this process alone is then not passed on.)"""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def _wait_forwarding_signals(proc: subprocess.Popen, timeout_s: float | None) -> int:
    """Wait for the child, passing SIGTERM and SIGINT on so it can write an 'interrupted'
    summary -- but not a SIGINT the terminal sent: the child has it already. A SIGINT
    inherited as ignored (a background job) stays ignored, as it is in the child: neither
    waits on a signal the other will not act on."""
    wanted = {signal.SIGTERM}
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        wanted.add(signal.SIGINT)
    if hasattr(signal, "sigtimedwait"):
        return _wait_reading_siginfo(proc, timeout_s, wanted)

    def forward(signum: int, frame: object) -> None:
        if proc.poll() is not None:
            return
        if signum == signal.SIGINT and _terminal_signalled_us():
            return
        proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in wanted}
    try:
        while True:
            try:
                return proc.wait(timeout=timeout_s)  # negative: killed by that signal
            except KeyboardInterrupt:  # pragma: no cover - a SIGINT before the handler was set
                continue
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _wait_reading_siginfo(proc: subprocess.Popen, timeout_s: float | None, wanted: set[int]) -> int:
    """Linux: the signals stay blocked and are read with their origin, so a terminal's Ctrl-C
    (sent by the kernel to the group) is told from a ``kill -INT`` of the launcher alone."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    # The child was started before this: it does not inherit the mask.
    signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
    try:
        while True:
            code = proc.poll()
            if code is not None:
                return code
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(proc.args, timeout_s or 0.0)
            info = signal.sigtimedwait(wanted, _POLL_S)
            if info is None or proc.poll() is not None:
                continue
            if info.si_signo == signal.SIGINT and info.si_code == _SI_KERNEL:
                continue
            proc.send_signal(info.si_signo)
    finally:
        # Anything left pending is ours: take it before unblocking, or it would act now.
        while signal.sigtimedwait(wanted, 0) is not None:
            pass
        signal.pthread_sigmask(signal.SIG_UNBLOCK, wanted)


def _written_since(path: Path, started: float) -> bool:
    try:
        return path.stat().st_mtime >= started - 1.0
    except FileNotFoundError:
        return False
