"""Shared by the gate benchmarks: run a job under ``traceml-ci run`` and load the summaries;
judge recorded runs (summaries, or A/B rounds) the way the gate would."""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXE = str(Path(sys.executable).with_name("traceml-ci"))


def run_job(script: Path, out: Path, args: Sequence[str] = ()) -> dict[str, Any]:
    """Run ``script`` traced into ``out`` (reused if a summary is already there)."""
    summary = out / "final_summary.json"
    if not summary.exists():
        subprocess.run([EXE, "run", "--out", str(out), str(script), *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads(summary.read_text())


#: A CPU hog: a busy loop, in its own interpreter.
HOG = "while True: pass"


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    """``count`` busy-loop processes running beside the block; always stopped after it."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            procs.append(subprocess.Popen([sys.executable, "-c", HOG]))
        time.sleep(0.2 if count else 0.0)  # let them reach the scheduler first
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=10)


def run_many(script: Path, root: Path, n: int, args: Sequence[str] = (),
             label: str = "", hogs: int = 0) -> list[dict[str, Any]]:
    """``n`` traced runs of ``script``; ``hogs`` CPU hogs beside each (not beside reused ones)."""
    docs = []
    t0 = time.perf_counter()
    for i in range(n):
        out = root / f"run-{i:02d}"
        with cpu_hogs(0 if (out / "final_summary.json").exists() else hogs):
            docs.append(run_job(script, out, args))
        print(f"  {label or script.stem}: {i + 1}/{n} runs ({time.perf_counter() - t0:.0f} s)",
              file=sys.stderr, flush=True)
    return docs


def runqueue_waits(docs: Sequence[dict[str, Any]]) -> str:
    """The runs' measured runqueue waits (run.contention), as 'median (min–max) %'."""
    import statistics

    from traceml_ci.summary.view import SummaryView

    waits = [w for w in (SummaryView(d).runqueue_wait_pct for d in docs) if w is not None]
    if not waits:
        return "not measured"
    return f"{statistics.median(waits):.1f} % ({min(waits):.1f}–{max(waits):.1f})"


def judge_pairs(bases: Sequence[dict[str, Any]], heads: Sequence[dict[str, Any]] | None = None,
                rules: Any = None) -> dict[str, Any]:
    """Compare every (base, head) pair: ordered pairs of distinct runs when ``heads`` is None.
    Returns verdict counts and which metrics drove regressions and warnings."""
    if heads is None:
        pairs = list(itertools.permutations(bases, 2))
    else:
        pairs = list(itertools.product(bases, heads))
    return _judge_list(pairs, rules)


def _judge_list(pairs: Sequence[tuple[dict[str, Any], dict[str, Any]]],
                rules: Any = None) -> dict[str, Any]:
    from traceml_ci.gate import DEFAULT_RULES, Status, compare

    rules = rules or DEFAULT_RULES
    verdicts: Counter[str] = Counter()
    regressed: Counter[str] = Counter()
    warned: Counter[str] = Counter()
    for b, h in pairs:
        c = compare(b, h, rules)
        verdicts[c.verdict.value] += 1
        for r in c.rows:
            if r.status is Status.REGRESSED:
                regressed[r.name] += 1
            elif r.status is Status.WARN:
                warned[r.name] += 1
    return {"pairs": len(pairs), "verdicts": dict(verdicts), "regressed": dict(regressed),
            "warned": dict(warned)}


def combined_groups(docs: Sequence[dict[str, Any]], repeats: int, limit: int = 60,
                    seed: int = 0) -> list[list[int]]:
    """Up to ``limit`` distinct ``repeats``-subsets of run indices, drawn at random (fixed seed):
    the repeated runs one CI job would combine (``traceml-ci combine``)."""
    import random

    combos = list(itertools.combinations(range(len(docs)), repeats))
    random.Random(seed).shuffle(combos)
    return [list(c) for c in combos[:limit]]


def judge_combined(bases: Sequence[dict[str, Any]], heads: Sequence[dict[str, Any]] | None,
                   repeats: int, limit: int = 60) -> dict[str, Any]:
    """``judge_pairs`` on combined summaries of ``repeats`` runs per side. With ``heads`` None
    (no change), base and head groups are disjoint subsets of ``bases``."""
    from traceml_ci.summary.repeats import combine_repeats

    def combine(docs: Sequence[dict[str, Any]], idx: list[int]) -> dict[str, Any]:
        return combine_repeats([docs[i] for i in idx])

    if heads is None:
        groups = combined_groups(bases, 2 * repeats, limit)
        b = [combine(bases, g[:repeats]) for g in groups]
        h = [combine(bases, g[repeats:]) for g in groups]
        return _judge_list(list(zip(b, h, strict=True)))
    bs = [combine(bases, g) for g in combined_groups(bases, repeats, limit)]
    hs = [combine(heads, g) for g in combined_groups(heads, repeats, limit, seed=1)]
    return _judge_list(list(itertools.product(bs, hs)))


def judge_sequential(bases: Sequence[dict[str, Any]], heads: Sequence[dict[str, Any]] | None,
                     baseline_runs: int = 3, max_reruns: int = 2, limit: int = 40,
                     rules: Any = None) -> dict[str, Any]:
    """The pytest plugin's policy, run on recorded summaries: a baseline of ``baseline_runs``
    runs combined (``--traceml-baseline-runs``); the head's first run judged, re-run while it
    regresses or comes close (``traceml_ci.gate.confirm``, the same function the plugin
    calls),
    up to ``max_reruns`` times. Up to ``limit`` baseline groups × ``limit`` orders of head runs
    (with ``heads`` None: head runs drawn from the base runs outside the baseline group).
    Returns verdict counts (``pairs``: head jobs judged) and the mean runs per head job."""
    import random

    from traceml_ci.gate import DEFAULT_RULES, Verdict, compare
    from traceml_ci.gate.confirm import confirm, worth_confirming
    from traceml_ci.summary.repeats import combine_repeats

    rules = rules or DEFAULT_RULES
    verdicts: Counter[str] = Counter()
    runs = jobs = 0
    rng = random.Random(2)
    for group in combined_groups(bases, baseline_runs, limit):
        base = combine_repeats([bases[i] for i in group])
        pool = ([d for i, d in enumerate(bases) if i not in group] if heads is None
                else list(heads))
        depth = min(1 + max_reruns, len(pool))
        orders = list(itertools.permutations(range(len(pool)), depth))
        rng.shuffle(orders)
        for order in orders[:limit]:
            seq = [pool[i] for i in order]
            made = [seq[0]]

            def rerun(seq: list[dict[str, Any]] = seq, made: list[dict[str, Any]] = made
                      ) -> dict[str, Any]:
                made.append(seq[len(made)])
                return made[-1]

            def judge(docs: Sequence[dict[str, Any]], base: dict[str, Any] = base
                      ) -> tuple[Any, dict[str, Any]]:
                head = combine_repeats(docs) if len(docs) > 1 else dict(docs[0])
                return compare(base, head, rules), head

            done = confirm(made[:1], judge,
                           regressed=lambda j: j[0].verdict is Verdict.REGRESSION,
                           suspect=lambda j, base=base: worth_confirming(j[0], base, j[1]),
                           rerun=rerun, max_reruns=depth - 1)
            verdicts[done.result[0].verdict.value] += 1
            runs += len(done.docs)
            jobs += 1
    return {"pairs": jobs, "verdicts": dict(verdicts), "regressed": {},
            "runs_per_job": runs / jobs if jobs else 0.0}


def ab_gate_runs(pairs: Sequence[Any], settings: Any,
                 every_start: bool = False) -> list[tuple[Any, int]]:
    """A/B gate runs replayed over recorded rounds (``gate.ab.RoundPair``s), as ``traceml-ci ab``
    takes them: each run takes rounds until ``decide`` gives a verdict, the next starts at the
    round after; a run is only started where ``settings.max_rounds`` rounds are left (fewer
    recorded than the cap: one run over them all, whose verdict may be None, undecided).
    ``every_start``: a run starts at every such round instead (overlapping runs: not
    independent, but every stretch of the recording is judged). Each run's ``AbResult`` and
    the rounds it took."""
    from traceml_ci.gate.ab.sequential import RoundPair, decide

    runs: list[tuple[Any, int]] = []
    i = 0
    while i < len(pairs) and i + min(settings.max_rounds, len(pairs)) <= len(pairs):
        taken: list[Any] = []
        for p in pairs[i:]:
            taken.append(RoundPair(len(taken) + 1, p.base, p.head))
            result = decide(taken, settings)
            if result.verdict is not None:
                break
        runs.append((result, len(taken)))
        i += 1 if every_start else len(taken)
    return runs


def pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "n/a"
