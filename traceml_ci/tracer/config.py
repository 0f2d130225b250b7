"""Tracer settings, from init() keywords, the environment and `traceml-ci run` flags.

The tracer's one reader of the environment: its settings (``TracerConfig``'s defaults), the
gather's timeout, the process's place in its run (``read_identity``) and the launch spec a
launcher handed a traced child (``take_launch_spec``). Every variable the project reads is
listed in docs/architecture.md#environment-variables.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from traceml_ci.summary.keys import (  # noqa: F401  (re-exported for the tracer's modules)
    DEFAULT_OUT_DIR,
    DEFAULT_WARMUP_STEPS,
    ENV_MODULE_SAMPLE,
    ENV_OUT,
    SUMMARY_FILENAME,
)
from traceml_ci.summary.profile import ENV_PROFILE_STEPS
from traceml_ci.summary.thresholds import DEFAULT_THRESHOLDS, Thresholds
from traceml_ci.tracer.identity import Identity
from traceml_ci.tracer.launch import ENV_LAUNCH
from traceml_ci.tracer.modules import SAMPLE_EVERY_S

MODES = ("auto", "manual")

#: ``0`` (or false/no/off) turns the live snapshot writer off, like ``init(live=False)``.
ENV_LIVE = "TRACEML_CI_LIVE"
#: Seconds the finish-time gather of a distributed run waits for the other ranks.
ENV_GATHER_TIMEOUT = "TRACEML_CI_GATHER_TIMEOUT_S"
GATHER_TIMEOUT_S = 30.0


class RunOptions(TypedDict, total=False):
    """The keywords a framework callback (HF, Lightning) takes and hands on to ``init()``;
    None, like a keyword left out, means "not given"."""

    out_dir: str | os.PathLike[str] | None
    run_name: str | None
    warmup_steps: int | None
    batch_size: int | None
    thresholds: Thresholds | None


class InitOptions(RunOptions, total=False):
    """``init()``'s keywords besides ``mode``: a callback's, and two switches of its own."""

    live: bool | None
    module_sample_s: float | None


def given_options(options: Mapping[str, Any], kind: type, caller: str) -> dict[str, Any]:
    """The keywords of ``options`` that were given (not None). A name that is not one of the
    TypedDict ``kind``'s keys is a TypeError naming it, as Python says of a signature's."""
    names = kind.__required_keys__ | kind.__optional_keys__  # type: ignore[attr-defined]
    for name in options:
        if name not in names:
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}")
    return {k: v for k, v in options.items() if v is not None}


def read_identity() -> Identity:
    """This process's place in its run, as its launcher (torchrun, or none) set it: read once,
    when a tracer starts."""
    return Identity.parse(os.environ, sys.argv, socket.gethostname(), os.getpid())


def take_launch_spec() -> str | None:
    """``$TRACEML_CI_LAUNCH``, the spec (JSON) a launcher handed this child; None without one.
    Removed as it is read: read once, and the script's own children never see it."""
    return os.environ.pop(ENV_LAUNCH, None)


def gather_timeout_s() -> float:
    """``$TRACEML_CI_GATHER_TIMEOUT_S``: at least 1 s; unreadable is the default."""
    try:
        return max(1.0, float(os.environ.get(ENV_GATHER_TIMEOUT, GATHER_TIMEOUT_S)))
    except ValueError:
        return GATHER_TIMEOUT_S


def live_from_env(value: str | None) -> bool:
    """Whether ``$TRACEML_CI_LIVE`` leaves the snapshot writer on (unset or empty: on)."""
    return (value or "").strip().lower() not in ("0", "false", "no", "off")


def profile_steps_from_env(value: str | None) -> int:
    """``$TRACEML_CI_PROFILE_STEPS`` as a step count; unset, empty or not a positive integer: 0."""
    try:
        return max(0, int((value or "0").strip()))
    except ValueError:
        return 0


def module_sample_from_env(value: str | None) -> float:
    """``$TRACEML_CI_MODULE_SAMPLE_S``: unset or empty is the default, ``0``/off turns sampling
    off; anything unreadable is the default too (a tracer setting must not stop training)."""
    text = (value or "").strip().lower()
    if text in ("0", "off", "false", "no"):
        return 0.0
    try:
        seconds = float(text)
    except ValueError:
        return SAMPLE_EVERY_S
    return seconds if seconds >= 0 and seconds == seconds else SAMPLE_EVERY_S


@dataclass
class TracerConfig:
    mode: str = "auto"
    out_dir: Path = field(default_factory=lambda: Path(os.environ.get(ENV_OUT) or DEFAULT_OUT_DIR))
    run_name: str | None = None
    warmup_steps: int = DEFAULT_WARMUP_STEPS
    batch_size: int | None = None
    #: Record at most this many steps (warmup included); later steps run untraced.
    max_steps: int | None = None
    thresholds: Thresholds = DEFAULT_THRESHOLDS
    #: Keep ``<out>/live/rank<N>.json`` up to date while the run goes (the live view reads it).
    live: bool = field(default_factory=lambda: live_from_env(os.environ.get(ENV_LIVE)))
    #: Seconds of training between two module samples (tracer/modules.py); 0 turns them off.
    module_sample_s: float = field(default_factory=lambda: module_sample_from_env(
        os.environ.get(ENV_MODULE_SAMPLE)))
    #: Profile this many steps after the warmup under torch.profiler (0: off; the pytest
    #: plugin's escalation on a regression). ``<out>/profile/``: trace.json, top_ops.json.
    profile_steps: int = field(
        default_factory=lambda: profile_steps_from_env(os.environ.get(ENV_PROFILE_STEPS)))
    #: Fields a launcher fixed (e.g. `traceml-ci run --out`); a later init() leaves them alone.
    locked: frozenset[str] = frozenset()
    #: The run's root, that the counters' ``file:line`` sites are relative to (the pytest
    #: rootdir under the plugin); None: the git top level or pyproject.toml folder above the
    #: working directory, else that directory (tracer/sites.py).
    root_dir: Path | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {self.mode!r}")
        if int(self.warmup_steps) < 0:
            raise ValueError("warmup_steps must be >= 0")
        if self.max_steps is not None and int(self.max_steps) < 1:
            raise ValueError("max_steps must be >= 1")
        if not float(self.module_sample_s) >= 0:
            raise ValueError("module_sample_s must be >= 0 (0: no module sampling)")
        self.module_sample_s = float(self.module_sample_s)
        if int(self.profile_steps) < 0:
            raise ValueError("profile_steps must be >= 0")
        self.out_dir = Path(self.out_dir)
        if self.root_dir is not None:
            self.root_dir = Path(self.root_dir)
        self.profile_steps = int(self.profile_steps)
        self.warmup_steps = int(self.warmup_steps)
