"""The constants every layer shares, free of dataclasses and enums: cheap to import for the
gate's CLI, whose whole run (start-up included) has a 0.25 s budget, and for the pytest plugin's
start-up in every session."""

from collections.abc import Container, Iterable

SCHEMA_VERSION = "1.0"
TOOL_NAME = "traceml-ci"

#: The five phases a step is split into, in display order. ``other`` is the rest of the step.
PHASES: tuple[str, ...] = ("dataloader", "forward", "backward", "optimizer", "other")
#: Time a step spends waiting in collectives for the other ranks (DDP's gradient all-reduce at
#: the end of backward, a synchronous ``dist.all_reduce``...): a phase only of runs that used a
#: process group, whose summaries carry ``step_time.wait_pct`` (docs/distributed.md); a
#: single-process summary has no such key.
WAIT_PHASE = "wait"
#: Time a step spends copying tensors from host to device (``.to(device)``, ``.cuda()``,
#: ``copy_`` of a host tensor into a device one, inside the step: tracer/copies.py): a phase
#: only of runs that made such copies, whose summaries carry ``step_time.h2d_pct``; a run
#: without copies (a CPU run) has no such key.
H2D_PHASE = "h2d"
#: Every phase a summary may have, in display order (a summary has the five of ``PHASES``, and
#: ``h2d`` / ``wait`` where the run made copies / used a process group: ``phases_of``).
ALL_PHASES: tuple[str, ...] = ("dataloader", H2D_PHASE, "forward", "backward", WAIT_PHASE,
                               "optimizer", "other")
#: PHASES with the wait phase, in display order: the phases of a run that used a process group.
PHASES_WITH_WAIT: tuple[str, ...] = tuple(p for p in ALL_PHASES if p != H2D_PHASE)
#: The phases the tracer measures, in the order of its per-phase slots and columns
#: (tracer/recorder.py: PHASE_INDEX); ``other`` is derived as the rest of the step. The wait
#: and h2d slots are last, so the four phases every run has keep their slots.
MEASURED_PHASES: tuple[str, ...] = (*PHASES[:-1], WAIT_PHASE, H2D_PHASE)


def phases_of(waits: bool, copies: bool = False) -> tuple[str, ...]:
    """The phases a summary has, in display order: with the wait phase when the run used a
    process group, with the h2d phase when it copied tensors from host to device."""
    if copies:
        return ALL_PHASES if waits else tuple(p for p in ALL_PHASES if p != WAIT_PHASE)
    return PHASES_WITH_WAIT if waits else PHASES


def phases_in(shares: Container[str]) -> tuple[str, ...]:
    """The phases of a summary whose ``step_time`` block (or anything keyed like it: ``pct``
    of a per-rank row, by phase) is ``shares``: ``<phase>_pct`` or bare phase keys."""
    return phases_of(
        f"{WAIT_PHASE}_pct" in shares or WAIT_PHASE in shares,
        f"{H2D_PHASE}_pct" in shares or H2D_PHASE in shares,
    )


def phase_union(*groups: Iterable[str]) -> tuple[str, ...]:
    """The phases any of ``groups`` has (each a summary's phases, in display order), in
    display order: what a chart or table of several summaries shows. Merged by each group's
    own order, so a phase only some summaries have lands where they put it, with no list of
    every phase kept here."""
    out: list[str] = []
    for group in groups:
        placed: str | None = None  # the last of this group's phases already in ``out``
        for phase in group:
            if phase not in out:
                out.insert(out.index(placed) + 1 if placed is not None else 0, phase)
            placed = phase
    return tuple(out)

#: Where a run's files go unless told otherwise, and the summary's file name in that folder.
DEFAULT_OUT_DIR = "traceml-out"
SUMMARY_FILENAME = "final_summary.json"
#: Steps counted but left out of the statistics (compilation, allocator warm-up, first batches).
DEFAULT_WARMUP_STEPS = 5
#: The environment variable naming the output folder (users set it; launchers may too).
ENV_OUT = "TRACEML_CI_OUT"

#: Re-runs of a job whose first run regressed or came close, before its verdict is final
#: (traceml_ci.gate.confirm; the pytest plugin's --traceml-confirm).
DEFAULT_CONFIRM_RERUNS = 2
#: What an A/B result too noisy to decide may do (``--traceml-ab-inconclusive``, the Action's
#: ``ab-inconclusive``, ``traceml-ci ab --inconclusive``); the first is the default: an
#: inconclusive result is no evidence of a regression (docs/gate.md, "The rule").
AB_INCONCLUSIVE_POLICIES = ("pass", "warn", "fail")
#: Runs of a job combined into a baseline entry when one is recorded (the pytest plugin's
#: --traceml-baseline-runs). A baseline is recorded once and judged against on every PR, so its
#: own run-to-run spread would shift every later verdict the same way: on the development VM
#: single runs of one job spread over 5 pp of dataloader share.
DEFAULT_BASELINE_RUNS = 3

#: A run whose main thread waited for a CPU this much of its wall time (percent; its
#: ``run.contention.runqueue_wait_pct``, or its training thread's CPU waits in % of its step)
#: ran on a contended CPU: the gate's contention guard excuses what that wait can explain; the
#: straggler analysis, what a rank's wait beyond the other ranks' median can.
CONTENDED_RUNQUEUE_WAIT_PCT = 10.0

#: ``step_time.thread``: the training thread's step time split, ms per step (schedstats only).
THREAD_SPLIT_KEYS: tuple[str, ...] = ("on_cpu_ms", "cpu_wait_ms", "blocked_ms")
#: ``step_time`` keys older summaries have and nothing reads any more: A/B's CPU reference and
#: its uncontended windows, which only steered host-clock estimates that counts now decide. The
#: schema still takes them (a baseline recorded before), ``combine`` drops them.
LEGACY_STEP_TIME_KEYS: tuple[str, ...] = ("cpu_reference_ms", "uncontended")

#: Sampled modules listed per direction in a summary's ``modules`` block (the slowest): a
#: shorter list means every timed module is there (tracer/modules.py, gate/timing/modules.py). Eight
#: keep a GPT-2 smoke job's summary under 8 KB; the FLOPs by module (counted) name the rest.
TOP_MODULES = 8

#: Seconds of training between two steps timed per submodule (tracer/modules.py): a sample
#: costs ~0.1-1 ms, so once per 0.5 s is a fixed ~0.1 % of a training run's wall time.
DEFAULT_MODULE_SAMPLE_S = 0.5
#: The same in tests the pytest plugin traces: a smoke test lasts a few hundred ms, and its
#: noise estimate needs several samples (at most one step in four is sampled, tracer/modules.py).
SMOKE_TEST_MODULE_SAMPLE_S = 0.02
#: The environment variable for it (``traceml-ci run --module-sample-s``; ``0``: off).
ENV_MODULE_SAMPLE = "TRACEML_CI_MODULE_SAMPLE_S"
