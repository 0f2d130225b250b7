"""One tracing session: owns the recorder, the patches, the probes, and builds the summary."""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from traceml_ci.summary.build import RunRecord, StepSeries, build_summary
from traceml_ci.summary.io import write_summary
from traceml_ci.summary.model import (
    BetweenSteps,
    DataLoaderSettings,
    GpuUtil,
    RunInfo,
    RunStatus,
    Summary,
)
from traceml_ci.tracer.clocks import ClockFactory, DeviceEventClock, HostClock, device_event_factory
from traceml_ci.tracer.config import TracerConfig, read_identity
from traceml_ci.tracer.contention import read_probe, start_probe
from traceml_ci.tracer.copies import CopyPatches
from traceml_ci.tracer.counters import CounterProbe, flops_block
from traceml_ci.tracer.distributed import RankGather, parallelism
from traceml_ci.tracer.flops import FlopCount, not_counted
from traceml_ci.tracer.gpu_util import summarize as summarize_gpu
from traceml_ci.tracer.identity import Identity
from traceml_ci.tracer.inputs import InputProbe
from traceml_ci.tracer.live import LiveWriter, Window
from traceml_ci.tracer.memory import RSS_INTERVAL_NS, CudaMemory, RssSampler, system_total_mb
from traceml_ci.tracer.modules import ModuleSampler
from traceml_ci.tracer.patches import (
    AutoPatches,
    RootForwardHooks,
    infer_batch_size,
    loader_settings,
)
from traceml_ci.tracer.recorder import (
    BWD,
    PHASE_INDEX,
    ForwardTimer,
    Recorder,
    StepGate,
    unwrap_forward,
)
from traceml_ci.tracer.steps import ALLOC_COL, PHASE_COLS, RESERVED_COL, STEP, StepStore
from traceml_ci.tracer.transparency import Transparency
from traceml_ci.tracer.waits import CollectivePatches, GradReadyProbe
from traceml_ci.tracer.warn import warn

#: Evaluation spans kept for the summary (the newest); a run evaluates far less often.
MAX_EVALS = 10_000
#: GPU utilisation samples (NVML, ~5 per second) averaged for a live snapshot: the last ~5 s.
GPU_RECENT_SAMPLES = 25


class Tracer:
    """Records one run. ``zero_change``: the script never calls trace_step (``traceml-ci run``
    on an unmodified script); steps are then delimited by optimizer steps. ``identity``: this
    process's place in its run (default: read from the environment now, once). ``clock``: makes
    the host clock its phases and steps are timed with (tests give a fake one)."""

    def __init__(self, config: TracerConfig, *, zero_change: bool = False,
                 identity: Identity | None = None, clock: ClockFactory = HostClock) -> None:
        self.config = config
        self.identity = identity if identity is not None else read_identity()
        self.started_at = datetime.now(timezone.utc)
        self._started_iso = self.started_at.isoformat(timespec="seconds").replace("+00:00", "Z")
        self._t0 = time.perf_counter()
        self.enabled = True
        self.status: RunStatus | None = None
        self.path: Path | None = None
        #: Where the summary was meant to go, when another process's summary was written there
        #: during this run (the summary then went to ``pid-<pid>/``).
        self.diverted_from: Path | None = None
        self.summary: Summary | None = None
        self.device: Any = None
        self.batch_size = config.batch_size
        #: Launched on an unmodified script (``traceml-ci run``): steps end at optimizer steps
        #: until the script calls trace_step.
        self.zero_change = zero_change
        #: The first DataLoader iterator's own settings (read once, off the hot path).
        self.dataloader: dict[str, Any] | None = None
        self._warned = False
        self._device_decided = False
        self._explicit_steps = False
        self._gpu_sampler: Any = None
        #: Read once, at the first record (they do not change while a run goes).
        self._system_total_mb: float | None = None
        self._device_total_mb: float | None = None
        self._last_scope: StepScope | None = None
        self._contention = start_probe()  # read once more at finish, never per step
        #: Evaluations a framework callback saw: (start, end) in perf_counter_ns, the newest
        #: ``MAX_EVALS`` of them (``note_eval``); never touched per step.
        self.evals: list[tuple[int, int]] = []
        #: A framework callback reports evaluations here: none noted means none ran.
        self.eval_hooks = False
        try:
            self.rss: RssSampler | None = RssSampler()
        except Exception:
            self.rss = None
        clock = clock()
        self.store = StepStore(clock, config.warmup_steps, self.rss, max_steps=config.max_steps)
        self.rec = Recorder(clock.mark, self.store, implicit=zero_change)
        self.patches = AutoPatches(self.rec, self.fail, self._on_first_fetch, self._on_optimizer)
        self.roots = RootForwardHooks(self.rec, self.note_eval) if zero_change else None
        #: Our hooks and forward shadows stay out of what the user pickles, copies or scripts.
        self.transparency = Transparency(self.fail)
        try:
            self.transparency.install()
        except Exception as exc:
            warn(f"module save/copy guard not installed ({exc!r})")
        if config.mode == "auto":
            self.patches.install()
            if self.roots is not None:
                self.roots.install_discovery()
        #: FLOPs of the first trace_step (a warmup step); none without warmup steps.
        # Any compiled frame in the process turns counting off (a count is cheap to miss, a
        # failed compiled step is not); module sampling looks at this run's frames only.
        self.flop_count = FlopCount(warn)
        #: Deterministic counters of one sampled warmup step (scalar reads, optimizer, leak).
        self.counters = CounterProbe(warn, root=config.root_dir)
        #: The input pipeline's work on one batch, in DataLoader workers too (auto mode).
        self.inputs = InputProbe(warn, root=config.root_dir)
        if config.mode == "auto":
            self.inputs.install()
        if zero_change and config.mode == "auto":  # steps close themselves: so do the counts
            self.counters.sampled_step += 1
            self.rec.on_close = self._implicit_boundary
        #: Per-module forward and backward time, one step now and then (trace_step runs).
        self.module_sampler = ModuleSampler(warn, config.module_sample_s)
        self.module_sampler.clock = clock  # modules are timed with the phases' clock
        #: The wait phase (tracer/waits.py): collectives timed once a process group is in
        #: use, and a DDP model's last-ready gradients hooked from its first step.
        self.collectives = CollectivePatches(self.rec, self.fail)
        self.grad_ready = GradReadyProbe(self.rec)
        #: The h2d phase (tracer/copies.py): host-to-device copies inside a step, timed once
        #: the run is known to be on an accelerator (a CPU run has nothing to copy to).
        self.copies = CopyPatches(self.rec, self.fail)
        #: Distributed runs: finish before the job destroys its process group, gather there.
        self.ranks = RankGather(self.finish, warn, self._group_in_use)
        try:
            self.ranks.install()
        except Exception as exc:
            warn(f"distributed hooks not installed ({exc!r})")
        #: The live snapshot's writer thread (None: off, or not this process's run).
        self.live: LiveWriter | None = None
        if config.live:
            self._start_live()
        #: A few steps under torch.profiler after the warmup (None: off, or done).
        self.profile: Any = None
        if config.profile_steps > 0:
            self._start_profile()

    # -- live snapshots ------------------------------------------------------------------------
    def _start_live(self) -> None:
        from traceml_ci.tracer import lifecycle

        if not lifecycle.owns_run():  # a DataLoader worker never writes (nor starts threads)
            return
        try:
            self.live = self.live_writer().start()
        except Exception as exc:
            self.live = None
            warn(f"the live snapshot could not start ({exc!r}); training goes on")

    def live_writer(self, interval_s: float | None = None) -> LiveWriter:
        """A snapshot writer for this run (not started): handed the one record builder."""
        return LiveWriter(self.run_record, self.identity, self.store, self.rss,
                          self.config.out_dir, self.config.thresholds, warn, interval_s)

    # -- profiling (tracer/profiling.py; never imported when off) ---------------------------
    def _start_profile(self) -> None:
        from traceml_ci.tracer import lifecycle

        if not lifecycle.owns_run() or self.identity.rank != 0:  # one rank's profile: rank 0's
            return
        try:
            from traceml_ci.tracer.profiling import StepProfiler

            cfg = self.config
            self.profile = StepProfiler(cfg.profile_steps, cfg.warmup_steps, cfg.out_dir, warn)
            if self.zero_change:  # steps end at optimizer steps until trace_step is called
                self.profile.follow_optimizer(
                    lambda: self.store.steps_total,
                    lambda: self.device,
                    lambda: self._explicit_steps,
                )
        except Exception as exc:
            self.profile = None
            warn(f"profiling off ({exc!r}); training goes on")

    def stop_live(self) -> None:
        """Stop the snapshot thread without a last snapshot (a tracer forgotten unfinished)."""
        if self.live is not None:
            self.live.stop()

    def _close_live(self) -> None:
        live = self.live
        if live is None:
            return
        status = (self.status or RunStatus.COMPLETED).value
        # Absolute: `traceml-ci watch` may read it from another folder.
        live.close(status, str(self.path.absolute()) if self.path is not None else None)

    # -- configuration ---------------------------------------------------------------------
    def reconfigure(self, **changes: Any) -> None:
        """A later init(): apply what the launcher did not fix, while no step is recorded yet."""
        changes = {
            k: v for k, v in changes.items() if v is not None and k not in self.config.locked
        }
        if not changes:
            return
        if self.store.steps_total:
            warn("init() called after steps were recorded; its options are ignored")
            return
        old = self.config
        self.config = replace(self.config, **changes)
        self._reconfigure_live(old)
        self._last_scope = None  # a scope built for the old mode must not be reused
        self.store.warmup_steps = self.config.warmup_steps
        if self.profile is not None:
            self.profile.warmup = self.config.warmup_steps
        if "batch_size" in changes:
            self.batch_size = self.config.batch_size
        if "module_sample_s" in changes:
            self.module_sampler.set_every(self.config.module_sample_s)
            self.store.tick_ns = self.module_sampler.tick_ns(RSS_INTERVAL_NS)
        if self.config.mode == "manual":
            self.patches.uninstall()
            self.inputs.uninstall()
            if self.roots is not None:
                self.roots.uninstall()
        else:
            self.patches.install()
            self.inputs.install()

    def _reconfigure_live(self, old: TracerConfig) -> None:
        if not self.config.live:
            if self.live is not None:
                self.live.discard()  # live=False: nothing stays behind
                self.live = None
        elif self.live is None:
            self._start_live()
        else:
            self.live.thresholds = self.config.thresholds
            if self.config.out_dir != old.out_dir:
                self.live.retarget(self.config.out_dir)

    def fail(self, exc: BaseException) -> None:
        """Our own code failed: warn once, stop tracing, leave the training loop alone."""
        self.enabled = False
        self.rec.stop()
        if not self._warned:
            self._warned = True
            warn(f"tracing stopped after an internal error ({exc!r}); training goes on")
        self.patches.uninstall()
        self.inputs.uninstall()
        self.collectives.uninstall()
        self.copies.uninstall()
        self.grad_ready.close()
        self.counters.close()  # its modes, hooks and patches; the collector back on
        self.flop_count.end()
        if self.roots is not None:
            self.roots.uninstall()

    def _group_in_use(self, dist: Any) -> None:
        """A process group is in use (``RankGather``): collectives inside a step are waits."""
        if self.enabled and self.config.mode == "auto" and self.summary is None:
            self.collectives.install(dist)

    # -- device and clock --------------------------------------------------------------------
    def _decide_device(self, device: Any) -> None:
        """Once, at the first step: a model on an accelerator switches to device-event timing."""
        self._device_decided = True
        self.patches.want_optimizer = False
        try:
            self._use_device(device)
            if (self.device is not None and self.device.type != "cpu"
                    and self.config.mode == "auto"):
                self.copies.install()
        finally:
            self.rec.set_ready(self.store.host)  # the fast path may run from now on

    def _use_device(self, device: Any) -> None:
        if device is None:
            device = _current_accelerator()
        self.device = device
        factory = device_event_factory(device)
        if factory is None:
            return
        clock = DeviceEventClock(factory)
        cuda_mem = None
        if device.type == "cuda":
            import torch

            index = device.index if device.index is not None else torch.cuda.current_device()
            cuda_mem = CudaMemory(torch, index)
            self._start_gpu_sampler(torch, index)
        self.store.set_clock(clock, cuda_mem)
        self.rec.use_clock(clock.mark)
        self.module_sampler.clock = clock  # modules are timed with the phases' clock

    def _start_gpu_sampler(self, torch: Any, index: int) -> None:
        from traceml_ci.tracer.gpu_util import GpuUtilSampler

        uuid = None
        try:
            raw = str(torch.cuda.get_device_properties(index).uuid)
            uuid = raw if raw.startswith("GPU-") else f"GPU-{raw}"
        except Exception:
            pass
        self._gpu_sampler = GpuUtilSampler.start_for(index, uuid)

    def _on_first_batch(self, batch: Any) -> None:
        """``wrap_dataloader``'s first batch: the batch size, if not given."""
        if self.batch_size is None:
            self.batch_size = infer_batch_size(batch)

    def _on_first_fetch(self, iterator: Any, batch: Any) -> int:
        """A DataLoader iterator's first batch: its samples per batch (0: unknown), and, for
        the first iterator of the run, the loader's own settings."""
        settings = loader_settings(iterator)
        if self.dataloader is None:
            self.dataloader = settings
        size = settings.get("batch_size") or infer_batch_size(batch)
        if self.batch_size is None:
            self.batch_size = size
        return size or 0

    def _on_optimizer(self, optimizer: Any) -> None:
        self.patches.want_optimizer = False
        if self._device_decided:
            return
        if self.roots is not None:
            self.roots.settle()
        device = None
        for group in getattr(optimizer, "param_groups", ()):
            for p in group.get("params", ()):
                device = p.device
                break
            if device is not None:
                break
        self._decide_device(device)

    def _implicit_boundary(self, starting: bool) -> None:
        """Zero-change mode: a step just closed (``starting``: the next one begins now, at a
        fetch or a forward; else an evaluation follows). The FLOP count takes the second
        step and the counters the third, warmup steps both, as trace_step's scope does with
        its first two; the leak check follows the steps. Unhooked once nothing is left."""
        fc, probe, rec = self.flop_count, self.counters, self.rec
        try:
            if self._explicit_steps:  # trace_step's scope counts from now on
                rec.on_close = None
                return
            n = self.store.steps_total
            gr = self.grad_ready
            if gr.calibrating:
                gr.after_step()
            roots = self.roots
            if not gr.watched and self.ranks.in_use and roots is not None and roots.timed:
                gr.watch(tuple(roots.timed))
            if fc.counting:
                fc.end()
            if probe.armed:
                probe.end(n)
            if probe.pending:
                probe.after_step(n)
            models = tuple(roots.timed) if roots is not None else ()
            if starting and models:
                entering = roots.entering if roots is not None else None
                if not fc.done and n < self.store.warmup_steps and fc.begin(models, entering):
                    return
                if probe.pending and not probe.armed:
                    probe.begin(n, self.store.warmup_steps, models)
            if fc.done and not fc.counting and not probe.pending and not gr.calibrating and (
                gr.watched or not self.ranks.in_use
            ):
                rec.on_close = None
        except Exception as exc:  # never into the user's step: the counts are given up
            rec.on_close = None
            fc.end()
            probe.close()
            warn(f"FLOPs and counters left out ({exc!r}); training goes on")

    # -- steps -------------------------------------------------------------------------------
    def step_scope(self, models: tuple[Any, ...]) -> StepScope:
        last = self._last_scope
        if last is not None and last.key == models:  # identity for modules: a cheap check
            return last
        given = tuple(m for m in models if m is not None)
        usable = tuple(m for m in given if _is_module_like(m))
        if len(usable) != len(given):
            warn("trace_step() got something that is not a model; its forward is not timed")
        try:
            scope = StepScope(self, usable, key=models)
        except Exception as exc:  # never into the user's step: the step is timed all the same
            warn(f"trace_step(): the model's forward is not timed ({exc!r})")
            scope = StepScope(self, (), key=models)
        self._last_scope = scope
        return scope

    def _before_first_step(self, models: tuple[Any, ...]) -> None:
        self._explicit_steps = True
        if self.config.mode == "auto" and models:
            try:
                self.module_sampler.watch(models[0])
                self.store.tick = self._housekeeping
                self.store.tick_ns = self.module_sampler.tick_ns(self.store.tick_ns)
            except Exception as exc:
                warn(f"module sampling off ({exc!r})")
        if self.roots is not None:
            self.roots.uninstall()  # trace_step names the model: no discovery needed
            self.roots = None
        if self.config.mode == "auto" and models:
            self.grad_ready.watch(models)
        if not self._device_decided:
            self._decide_device(_model_device(models))

    def _housekeeping(self, now_ns: int) -> None:
        """Between steps, ~10 times a second (host clock): arm a module sample if one is due,
        once the warmup steps are over."""
        steps = self.store.steps_total
        if steps > self.store.warmup_steps:
            self.module_sampler.tick(now_ns, steps)

    # -- finish ------------------------------------------------------------------------------
    def finish(self, status: RunStatus | str | None = None) -> Path | None:
        """Stop tracing and write the summary atomically; returns its path (None if it failed)."""
        if self.path is not None or self.summary is not None:
            return self.path
        if status is not None:
            self.status = RunStatus(status)
        self.patches.uninstall()
        self.inputs.uninstall()
        self.collectives.uninstall()
        self.copies.uninstall()
        self.grad_ready.close()
        if self.ranks.world_size() <= 1:
            self.ranks.uninstall()
        if self.roots is not None:
            self.roots.uninstall()
        store = self.store
        if store.host:  # before our threads stop: their CPU is left out at both ends
            store.cpu.settle(max(0, store.steps_total - store.warmup_steps))
        self.stop_live()  # its thread reads nothing while the store drains
        self.flop_count.end()  # a step left open by an error: close the counter
        self.counters.close()
        self.module_sampler.stop()
        self.transparency.uninstall()  # after the last hook of ours is off the user's modules
        if self.profile is not None:  # fewer steps than asked: write what was profiled
            self.profile.close(self.store.steps_total)
            self.profile = None
        try:
            self._drain()
            record = self.run_record()
            if self.config.mode == "manual" and not record.steps_total:
                warn("manual mode recorded no steps: wrap the loop body in trace_step")
            if record.backward_without_steps:
                warn(
                    f"no steps: {record.backward_without_steps} backward passes but no "
                    "optimizer.step(), which ends a step when the script is traced without "
                    "changes; wrap the loop body in `with traceml_ci.trace_step(model):`"
                )
            self.summary = build_summary(record, self.config.thresholds)
            if self.ranks.world_size() > 1:
                self.path = self._write_distributed(self.summary)
            else:
                self.path = self._write_claimed(self._summary_path(), self.summary)
        except Exception as exc:
            warn(f"could not write the summary ({exc!r})")
            return None
        finally:
            self._close_live()  # the last snapshot: how the run ended, where its summary is
        return self.path

    def _write_claimed(self, target: Path, summary: Summary | dict[str, Any]) -> Path:
        """Write ``target`` under the folder's claim (``lifecycle.claim``): when another
        process finished a summary there during this run, this one goes to ``pid-<pid>/``
        instead (``diverted_from`` says so). The claim is held for the write alone -- never
        across the ranks' gather, where another rank of this job may be waiting for it."""
        from traceml_ci.tracer import lifecycle

        with contextlib.ExitStack() as held:
            try:
                where, diverted = held.enter_context(
                    lifecycle.claim(target, self.started_at.timestamp())
                )
            except OSError:  # no lock to be had (read-only folder...): the write says why
                where, diverted = target, False
            if diverted:
                self.diverted_from = target
                self.config = replace(self.config, out_dir=where.parent)
            return write_summary(where, summary)

    def _write_distributed(self, summary: Summary) -> Path:
        """Every rank writes its own ``final_summary.rank<N>.json``; the ranks' summaries are
        gathered once, and rank 0 writes the merged ``final_summary.json`` (summary/ranks.py).
        A failed gather leaves rank 0's own summary there, with the ranks that reported.
        The ranks of one job share the folder: only the merged file is claimed, after the
        gather."""
        from traceml_ci.summary.ranks import merge_ranks

        doc = summary.to_dict()
        doc["run"].update(self.identity.placement())
        last = self._last_scope
        kind = parallelism(last.models if last is not None else ())
        if kind is not None:
            doc["run"]["parallelism"] = kind
        rank = self.identity.rank
        own = write_summary(self.config.out_dir / self.identity.rank_summary_name, doc)
        docs = self.ranks.gather(doc)
        self.ranks.uninstall()
        if rank != 0:
            return own
        world = self.ranks.world_size()
        got = docs or [doc]
        merged = merge_ranks(got, world_size=world, nodes=self.ranks.nodes(got),
                             backend=self.ranks.backend)
        return self._write_claimed(self._summary_path(), merged)

    def _summary_path(self) -> Path:
        return self.config.out_dir / self.identity.summary_name

    def _drain(self) -> None:
        """At finish: every step recorded and resolved, and a last RSS sample."""
        if self.enabled:
            self.rec.flush()
            try:
                self.store.drain_all()
            except Exception as exc:
                self.fail(exc)
        if self.rss is not None:
            self.rss.sample(self.store.steps_total)

    def run_record(self, window: Window | None = None) -> RunRecord:
        """The run as the summary layer's ``RunRecord``: the one builder of it.

        ``window`` None: the whole run, at finish (after ``_drain``), with what only the finish
        reads -- the environment, contention, FLOPs, modules, counters, how the run ended.
        A window: the live snapshot thread's rows (tracer/live.py), with the fields that are
        cheap to read while training goes on. From that thread it only reads -- plain fields,
        list copies -- and never writes what the training thread does; the run's status and
        zero-change mode are left to the finish (a snapshot carries its own status)."""
        store = self.store
        final = window is None
        if window is None:
            window = Window([store.column(i) for i in range(len(store.columns.cols))],
                            store.columns.stride, store.steps_total)
        cols, steps, memory = window.cols, window.steps, window.memory
        on_device = store.cuda_memory is not None
        if on_device and self._device_total_mb is None:
            self._device_total_mb = store.cuda_memory.total_mb()
        if self._system_total_mb is None:
            self._system_total_mb = system_total_mb()
        rss = self.rss
        warmup = store.warmup_steps
        device = self.device
        record = RunRecord(
            run=RunInfo(
                name=self.identity.run_name(self.config.run_name),
                status=RunStatus.COMPLETED,  # a snapshot carries its own status
                started_at=self._started_iso,
                duration_s=time.perf_counter() - self._t0,
                mode=self.config.mode,
                rank=self.identity.rank,
                world_size=self.identity.world_size,
            ),
            env={},
            clock=store.clock.kind,
            steps_total=steps,
            warmup_steps=min(warmup, steps),
            series=StepSeries(
                step_ms=cols[STEP],
                phase_ms={p: cols[c] for p, c in PHASE_COLS.items()},
                stride=window.stride,
                allocated_mb=cols[ALLOC_COL] if on_device and memory else None,
                reserved_mb=cols[RESERVED_COL] if on_device and memory else None,
            ),
            batch_size=self.batch_size,
            samples_per_step=self._samples_per_step(),
            dataloader=self._dataloader_settings(),
            memory_device=str(device) if device is not None else "cpu",
            # Growth over the run so far (a list copy is atomic; the sampler rebinds, never
            # edits in place, when it thins).
            rss_samples=[(s, mb) for s, mb in list(rss.samples) if s > warmup]
            if rss and memory else (),
            peak_rss_mb=rss.peak_mb() if rss and memory else None,
            system_total_mb=self._system_total_mb,
            device_total_mb=self._device_total_mb,
            gpu=self._gpu(final),
            waits=self.ranks.in_use,
            copies=self.copies.seen,
            # A window's over about its steps: the live view's straggler rule takes what a
            # rank waited for a CPU off its extra own work, as the merged summary does.
            thread=self._thread_split(
                None if final else max(0, steps - warmup - len(cols[STEP]) * window.stride)),
        )
        return self._finished(record) if final else record

    def _finished(self, record: RunRecord) -> RunRecord:
        """The whole run's record: what only the finish reads, added."""
        from traceml_ci.tracer.env import fingerprint

        retries = ooms = None
        if self.store.cuda_memory is not None:
            retries, ooms = self.store.cuda_memory.counters()
        return replace(
            record,
            run=replace(record.run, status=self.status or RunStatus.COMPLETED,
                        mode=self._mode(), contention=read_probe(self._contention)),
            env=fingerprint(self.device),
            peak_job_rss_mb=self.rss.job_peak_mb() if self.rss else None,
            alloc_retries=retries,
            ooms=ooms,
            flops_per_step=self.flop_count.flops,
            modules=self.module_sampler.summary(),
            flops_dtype=self.flop_count.dtype,
            backward_without_steps=self._backward_without_steps(),
            between_steps=self._between_steps(),
            flops_not_counted=not_counted(
                self.flop_count,
                self._explicit_steps or self.rec.implicit,
                self.config.warmup_steps,
            ),
            counters=self._counters(),
            cpu_ms=self.store.cpu.ms_per_step() if self.store.host else None,
        )

    def _mode(self) -> str:
        """What was asked for: zero-change only for a launched script that never called
        trace_step (a script that asked for manual mode says so, steps or not). A live
        snapshot's window says what was configured."""
        asked = self.config.mode
        implicit = self.zero_change and not self._explicit_steps and asked == "auto"
        return "zero-change" if implicit else asked

    def _gpu(self, final: bool) -> GpuUtil:
        """GPU utilisation: the whole run's at finish (the sampler stops), else the last ~5 s."""
        sampler = self._gpu_sampler
        if sampler is None:
            return GpuUtil()
        if final:
            return sampler.stop()
        return summarize_gpu(list(sampler.util[-GPU_RECENT_SAMPLES:]),
                             list(sampler.mem_used_mb[-GPU_RECENT_SAMPLES:]),
                             list(sampler.temp_c[-GPU_RECENT_SAMPLES:]),
                             sampler.temp_slowdown_c)

    def _thread_split(self, since: int | None = None) -> dict[str, float] | None:
        """The training thread's wall time per analysed step, split (host clock only); from
        about ``since`` analysed steps on (``CpuWindow.thread_split``)."""
        split = self.store.cpu.thread_split(since) if self.store.host else None
        return None if split is None else split._asdict()

    def _counters(self) -> dict[str, Any] | None:
        """The sampled step's counters, with the FLOP count's per-module figures."""
        probe = self.counters
        try:
            probe.flops = flops_block(self.flop_count)
            block = probe.record()
        except Exception as exc:
            warn(f"counters left out ({exc!r})")
            return None
        inputs = self.inputs.record()  # never raises
        if block is not None and inputs is not None:
            block["input"] = inputs
        return block

    def note_eval(self, start_ns: int, end_ns: int) -> None:
        """An evaluation ran from ``start_ns`` to ``end_ns`` (``time.perf_counter_ns``)."""
        if self.summary is None and end_ns > start_ns:
            self.evals.append((start_ns, end_ns))
            if len(self.evals) > MAX_EVALS:
                del self.evals[0]

    def _between_steps(self) -> BetweenSteps | None:
        """Wall time after the warmup not in any step, between two of the store's housekeeping
        marks (host ns at a step's end); the evaluations noted inside that span."""
        store = self.store
        first, last = store.analysed_window()
        if first is None or last is None or last[0] <= first[0] or last[1] <= first[1]:
            return None
        steps_ms = store.column(STEP)
        lo, hi = first[0] - store.warmup_steps, last[0] - store.warmup_steps  # rows of the steps
        stride = store.columns.stride
        if stride == 1 and hi <= len(steps_ms):
            in_steps = sum(steps_ms[lo:hi]) / 1e3
        elif steps_ms:  # a uniform sample of the rows: its mean
            in_steps = sum(steps_ms) / len(steps_ms) * (last[0] - first[0]) / 1e3
        else:
            return None
        wall = (last[1] - first[1]) / 1e9
        between = max(0.0, wall - in_steps)
        t0, t1 = first[1], last[1]
        evals = [(max(a, t0), min(b, t1)) for a, b in self.evals if b > t0 and a < t1]
        seen = self.eval_hooks or evals
        eval_s = min(between, sum(b - a for a, b in evals) / 1e9) if seen else None
        return BetweenSteps(
            wall_s=wall,
            between_s=between,
            between_pct=100.0 * between / wall,
            eval_s=eval_s,
            eval_pct=None if eval_s is None else 100.0 * eval_s / wall,
            evals=None if eval_s is None else len(evals),
        )

    def _backward_without_steps(self) -> int:
        """Zero-change mode with no step at all: the backward passes its open step holds (no
        optimizer step ever closed one)."""
        rec = self.rec
        if not rec.implicit or self.store.steps_total or rec.saw_opt:
            return 0
        return rec.dropped_bwd + sum(1 for p, _, _ in rec.marks if p == BWD)

    def _samples_per_step(self) -> float | None:
        """``init(batch_size=...)`` when given (it means samples per step); else the DataLoader
        samples fetched per analysed step, on average (None when none was counted). A loader
        that fetches one batch ahead (accelerate's: the HF Trainer's) counts each batch a step
        early; a run that ends as it runs out gets that one batch back (``Recorder.ahead``)."""
        if self.config.batch_size is not None:
            return float(self.config.batch_size)
        store = self.store
        analysed = store.resolved - store.warmup_steps
        if analysed <= 0 or not store.samples_analyzed:
            return None
        # The run ended on a batch fetched ahead, counted to a warmup or earlier step.
        return (store.samples_analyzed + self.rec.ahead) / analysed

    def _dataloader_settings(self) -> DataLoaderSettings | None:
        if self.dataloader is None:
            return None
        device = self.device.type if self.device is not None else "cpu"
        return DataLoaderSettings(**self.dataloader, device=device)


class StepScope(StepGate):
    """``with trace_step(model):`` -- one training step. Reused across steps for the same
    model(s). The short path is the recorder's (``StepGate``); here is the general way: the
    run's first step, several models, device clocks, a step that raised."""

    __slots__ = ("tracer", "models", "key", "timers")

    def __init__(self, tracer: Tracer, models: tuple[Any, ...], key: tuple[Any, ...]) -> None:
        auto = tracer.config.mode == "auto"  # manual mode: the model is never wrapped
        self.timers = tuple(ForwardTimer(m, tracer.rec, tracer.fail) for m in models if auto)
        super().__init__(tracer.rec, self.timers[0] if len(self.timers) == 1 else None)
        self.tracer = tracer
        self.models = models
        self.key = key

    def _enter(self) -> StepScope:
        tr = self.tracer
        if not tr.enabled:
            return self
        try:
            if not tr._explicit_steps:
                tr._before_first_step(self.models)
            rec = tr.rec
            if not rec.in_step and self.timers:
                timer = self.timer
                self.saved = timer.wrap() if timer else [t.wrap() for t in self.timers]
            counting = (
                not tr.flop_count.done
                and not rec.in_step
                and tr.store.steps_total < tr.store.warmup_steps  # never an analysed one
                and tr.flop_count.begin(self.models)
            )
            if tr.counters.pending and not rec.in_step and not counting:
                store = tr.store
                tr.counters.begin(store.steps_total, store.warmup_steps, self.models)
            if tr.profile is not None and not rec.in_step:
                tr.profile.boundary(tr.store.steps_total, tr.device)
            rec.step_begin()
            # Several models: always the general way; a counted step ends the general way too;
            # so does each step while a profile or the counters are due (boundaries here).
            self.primed = not counting and self._may_prime()
        except Exception as exc:
            tr.fail(exc)
        return self

    def _exit(self, exc_type: Any) -> bool:
        tr = self.tracer
        try:
            tr.rec.step_end(exc_type is None)  # a no-op outside a step (tracing stopped)
            if tr.flop_count.counting and not tr.rec.in_step:
                tr.flop_count.end()
                self.primed = self._may_prime()
            if tr.counters.pending and not tr.rec.in_step:
                tr.counters.end(tr.store.steps_total)
                tr.counters.after_step(tr.store.steps_total)
                self.primed = self._may_prime()
            profile = tr.profile
            if (
                profile is not None
                and not tr.rec.in_step
                and profile.boundary(tr.store.steps_total, tr.device)
            ):
                tr.profile = None  # written (or given up): the short path may run again
                self.primed = self._may_prime()
            if tr.grad_ready.calibrating and not tr.rec.in_step:
                tr.grad_ready.after_step()
                self.primed = self._may_prime()
            saved = self.saved
            if saved is not None and not tr.rec.in_step:
                self.saved = None
                for s in [saved] if type(saved) is tuple else saved:
                    unwrap_forward(s)
        except Exception as err:
            tr.fail(err)
        return False

    def _may_prime(self) -> bool:
        """Whether the short path may run from the next step: one model at most, and nothing
        due at a step boundary (the FLOP count, a profile, the counters)."""
        tr = self.tracer
        return (len(self.timers) <= 1 and not tr.flop_count.counting and tr.profile is None
                and not tr.counters.pending and not tr.grad_ready.calibrating)

    def _fail(self, exc: BaseException) -> None:
        self.tracer.fail(exc)


class PhaseScope:
    """``with phase("forward"):`` -- mark a phase by hand (manual mode, or to add one in auto)."""

    __slots__ = ("tracer", "index")

    def __init__(self, tracer: Tracer, name: str) -> None:
        if name not in PHASE_INDEX:
            raise ValueError(f"phase must be one of {sorted(PHASE_INDEX)}, not {name!r}")
        self.tracer = tracer
        self.index = PHASE_INDEX[name]

    def __enter__(self) -> PhaseScope:
        if self.tracer.enabled:
            try:
                self.tracer.rec.phase_begin(self.index)
            except Exception as exc:
                self.tracer.fail(exc)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if self.tracer.enabled:
            try:
                self.tracer.rec.phase_end(self.index)
            except Exception as err:
                self.tracer.fail(err)
        return False


def _is_module_like(obj: Any) -> bool:
    return hasattr(obj, "__dict__") and callable(getattr(obj, "forward", None))


def _model_device(models: tuple[Any, ...]) -> Any:
    for m in models:
        params = getattr(m, "parameters", None)
        if params is None:
            continue
        try:
            for p in params():
                return p.device
        except Exception:
            continue
    return None


def _current_accelerator() -> Any:
    """The CUDA device, if this process already uses CUDA (checking does not initialise it)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return None
