"""Module shares never mislead: a child never exceeds its parent, siblings never add up to more
than their parent (nor the top level to more than the model), whatever the marks -- the
aggregation is checked with hypothesis, and a real traced model whose readers share an input
(their backward intervals overlap) against stopwatches of the same steps -- on the real clock:
on a fake clock the three readers' backward begin at one instant (the sum's backward), and one
reader's time goes to another by the tie (tried: the slow reader 3.5 ms of its 3.0, one fast
reader none), which says nothing of real overlaps, whose starts are apart by the engine's
own work."""

from __future__ import annotations

import time

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tests.conftest import spin_cpu
from tests.tracer.conftest import finish_and_load
from tests.tracer.loops import BusyBackward, train_at_least
from traceml_ci.tracer.clocks import HostClock
from traceml_ci.tracer.modules import (
    MAX_LEAK_SCALE,
    ModuleSampler,
    _Forward,
    _Sample,
    attribute,
)

#: A small module tree: parent -> children (names as select_modules writes them).
TREE = ["a", "b", "a.x", "a.y", "a.z", "b.x", "a.x.p", "a.x.q"]
ANCESTORS = {n: tuple(a for a in TREE if n.startswith(a + ".")) for n in TREE}
EPS = 1e-9


def _parent(name: str) -> str | None:
    return name.rsplit(".", 1)[0] if "." in name else None


def _check_tree(root: float, times: dict[str, float], eps: float) -> None:
    """The promise of docs/pinpoint.md, on one set of times (ms or shares)."""
    assert all(v >= -eps for v in times.values()), times
    for name, v in times.items():
        parent = _parent(name)
        assert v <= (times.get(parent, 0.0) if parent else root) + eps, (name, times)
    for parent in [None, *TREE]:
        kids = [v for n, v in times.items() if _parent(n) == parent]
        cap = root if parent is None else times.get(parent, 0.0)
        assert sum(kids) <= cap + eps * max(len(kids), 1), (parent, times)


span = st.tuples(st.floats(-5, 105, allow_nan=False), st.floats(-5, 105, allow_nan=False))
calls = st.lists(st.tuples(st.sampled_from(TREE), span), max_size=24)
gaps = st.lists(span, max_size=6)


@settings(max_examples=300, deadline=None)
@given(root=st.floats(0, 100, allow_nan=False), calls=calls, gaps=gaps)
def test_attribute_never_gives_a_child_or_siblings_more_than_their_parent(root, calls, gaps):
    """Any marks at all -- overlapping, reversed, outside the model's own time, with gaps."""
    own, times = attribute(root, [(n, s, e) for n, (s, e) in calls], ANCESTORS, gaps)
    assert -EPS <= own <= root + EPS
    _check_tree(own, times, EPS)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_properly_nested_calls_keep_their_lengths(data) -> None:
    """Forward calls nest like a stack: each module gets exactly the sum of its calls."""
    expect: dict[str, float] = {}
    out: list[tuple[str, float, float]] = []
    t = 0.0

    def call(name: str, depth: int) -> None:
        nonlocal t
        start = t
        t += data.draw(st.floats(0.0, 2.0))
        for child in [c for c in TREE if _parent(c) == name]:
            if depth < 3 and data.draw(st.booleans()):
                call(child, depth + 1)
                t += data.draw(st.floats(0.0, 1.0))
        out.append((name, start, t))
        expect[name] = expect.get(name, 0.0) + (t - start)

    for top in ("a", "b", "a"):  # "a" twice: its calls add up
        call(top, 1)
        t += 0.5
    own, times = attribute(t, out, ANCESTORS)
    assert own == t
    assert {n: round(v, 6) for n, v in times.items() if v} == {
        n: round(v, 6) for n, v in expect.items() if v
    }


@settings(max_examples=200, deadline=None)
@given(
    root=st.floats(0, 100, allow_nan=False),
    calls=calls,
    gaps=gaps,
    leak=st.tuples(*[st.floats(0, 3, allow_nan=False)] * 4),
)
def test_the_model_s_time_less_the_hooks_cost_is_attribute_s(root, calls, gaps, leak) -> None:
    """``leak_scale`` bisects on ``_Forward.root_less``, the model's time alone: it is what
    attributing the sample would give, whatever the marks and the cost."""
    hooks = tuple((s, e, s - 0.1, e + 0.1) for _, (s, e) in calls)
    raw = _Forward(root, tuple((n, s, e) for n, (s, e) in calls), tuple(gaps), hooks)
    assert abs(raw.root_less(leak) - raw.attribute(ANCESTORS, leak)[0]) < 1e-6


def _forward_sample(length_ns: int) -> _Sample:
    """A forward of ``length_ns``: "a" over most of it, "a.x" inside "a", each call's hooks'
    marked work 10 µs on either side of it (host ns marks)."""
    s = _Sample()
    s.root = [0, length_ns, None, None]
    for name, c0, c1 in (("a", length_ns // 10, length_ns * 9 // 10),
                         ("a.x", length_ns // 5, length_ns * 3 // 5)):
        s.calls.append([name, c0, c1, None, None, True, c0 - 10_000, c1 + 10_000])
        s.gaps += [[c0 - 10_000, c0], [c1, c1 + 10_000]]
    return s


def test_the_hooks_cost_is_scaled_until_sampled_forwards_take_what_unhooked_ones_do() -> None:
    """``leak_scale``: the calibrated cost, scaled so that the sampled forwards take as long as
    the unhooked ones timed in the same run; every sample attributed again with it (a child
    still within its parent), and one that scaled cost leaves nothing of is left out rather
    than divided by (it used to raise at finish, and lose the summary)."""
    sampler = ModuleSampler(lambda _: None)
    sampler.clock = HostClock()
    sampler.types = dict.fromkeys(TREE, "M")
    sampler.ancestors = ANCESTORS
    sampler.leak = (2000.0, 3000.0, 2000.0, 3000.0)  # ns per call: 10 µs in all
    for _ in range(8):
        sampler._add(_forward_sample(1_000_000))
    calibrated = sampler.summary()
    assert calibrated is not None
    target = calibrated["forward_ms"] - 0.01  # what the unhooked forwards took, in ms
    sampler.plain = [(target, 0.0, None)] * 4
    assert 1.0 < sampler.leak_scale(sampler.samples["forward"]) < MAX_LEAK_SCALE
    scaled = sampler.summary()
    assert scaled is not None
    assert abs(scaled["forward_ms"] - target) < 0.001, (scaled["forward_ms"], target)
    shares = {m["name"]: m["share_pct"] for m in scaled["forward"]}
    assert shares["a.x"] <= shares["a"] <= 100.0
    assert shares["a"] > {m["name"]: m["share_pct"] for m in calibrated["forward"]}["a"] - 5
    # A forward that the scaled cost leaves nothing of is left out, not divided by.
    sampler._add(_forward_sample(20_000))  # 0.02 ms: its marks and scaled cost fill it
    sampler.plain = []
    nine = sampler.summary()
    assert nine is not None and nine["sampled_steps"] == 9
    sampler.plain = [(nine["forward_ms"] - 0.01, 0.0, None)] * 4
    with_tiny = sampler.summary()
    assert with_tiny is not None and with_tiny["forward_ms"] > nine["forward_ms"] - 0.01
    # Unhooked forwards no faster than the sampled: the calibrated cost stands.
    sampler.plain = [(calibrated["forward_ms"] + 1.0, 0.0, None)] * 4
    assert sampler.leak_scale(sampler.samples["forward"]) == 1.0


waits = st.lists(st.tuples(st.floats(-5, 105, allow_nan=False), st.integers(0, 10**6)),
                 max_size=8)


@settings(max_examples=100, deadline=None)
@given(
    samples=st.lists(st.tuples(st.integers(1, 10_000), calls, calls, waits), min_size=1,
                     max_size=6),
    leak=st.one_of(st.none(), st.tuples(*[st.floats(0, 5000, allow_nan=False)] * 4)),
    plain=st.lists(st.floats(0.55, 1.05, allow_nan=False), min_size=4, max_size=6),
)
def test_the_sampler_s_shares_keep_the_promise(samples, leak, plain) -> None:
    """Through ModuleSampler, from marks to the summary's rounded shares: forward and
    backward, over several samples, with the hooks' calibrated cost and the thread's waits
    for a CPU left out (any amounts, anywhere), and that cost scaled to what unhooked
    forwards say it is (``leak_scale``; ``plain``: their lengths as fractions of the sampled
    forwards' mean, so that the cost is scaled in many examples)."""
    sampler = ModuleSampler(lambda _: None)
    sampler.clock = HostClock()
    sampler.types = dict.fromkeys(TREE, "M")
    sampler.ancestors = ANCESTORS
    sampler.leak = leak
    for length, fwd, bwd, wait in samples:
        s = _Sample()
        s.root = [0, length * 1000, 10**7, 10**7 + length * 2000]
        s.backward_done = True
        for (name, (f0, f1)), (_, (b0, b1)) in zip(fwd, bwd, strict=False):
            c0, c1 = int(f0 * length * 10), int(f1 * length * 10)
            s.calls.append(
                [
                    name,
                    c0,
                    c1,
                    10**7 + int(b0 * length * 20),
                    10**7 + int(b1 * length * 20),
                    False,
                    c0 - 500,
                    c1 + 500,
                ]
            )
        total = 0
        for at, ns in sorted(wait):
            total += ns
            t = int(at * length * 10)
            s.waits["forward"].append((t, total, t, False))
            s.waits["backward"].append((10**7 + 2 * t, total, 10**7 + 2 * t + 300, at > 50))
        sampler._add(s)
    roots = [r[0] for r in sampler.samples["forward"]]
    mean = sum(roots) / len(roots) if roots else 0.0
    sampler.plain = [(f * mean, 0.0, None) for f in plain]
    out = sampler.summary()
    if out is None:
        return
    for direction in ("forward", "backward"):
        shares = {m["name"]: m["share_pct"] for m in out.get(direction, [])}
        _check_tree(100.0, shares, 0.01)  # the JSON's rounding to 0.01


# -- a real traced model --------------------------------------------------------------------


class Reader(nn.Module):
    """A head that reads the shared features; its backward spins ``ms``."""

    def __init__(self, ms: float) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.ms = ms
        self.log: list[float] = []
        self.calls: list[bool] = []  # per call: sampled (the sampler's hooks are on it)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(bool(self._forward_hooks))
        return BusyBackward.apply(self.lin(x), self.ms, self._spin_logged)

    def _spin_logged(self, ms: float) -> None:
        """Its backward's cost: spins ``ms`` and logs how long that took."""
        t0 = time.thread_time_ns()
        spin_cpu(ms)
        self.log.append((time.thread_time_ns() - t0) / 1e6)


class Heads(nn.Module):
    """Three readers of one input -- as q, k and v read a block's input. Their backward
    intervals overlap: the input's gradient is ready only after all three."""

    def __init__(self, costs: list[float]) -> None:
        super().__init__()
        self.reader = nn.ModuleList(Reader(ms) for ms in costs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(r(x) for r in self.reader)


class Wrapped(nn.Module):
    """A parent whose one child takes its input and gives its output: the child's tensor
    hooks sit on the parent's own tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Reader(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.heads = Heads([2.0, 2.0, 12.0])
        self.wrapped = Wrapped()
        self.out = nn.Linear(16, 1)
        self.backward_log: list[tuple[float, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.wrapped(self.heads(torch.relu(self.embed(x)))))


def test_readers_of_one_input_share_their_parent_and_the_slow_one_is_timed_right(
    fresh_tracer,
) -> None:
    tracer = fresh_tracer(warmup_steps=2, module_sample_s=0.03)
    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    train_at_least(model, opt, x, y, steps=60, seconds=1.5)
    mods = finish_and_load(tracer)["modules"]
    assert mods["backward_steps"] >= 3
    for direction in ("forward", "backward"):
        shares = {m["name"]: m["share_pct"] for m in mods[direction]}
        assert shares
        top = [v for n, v in shares.items() if "." not in n]
        assert sum(top) <= 100.0 + 0.01 * len(top), shares
        readers = [
            v for n, v in shares.items() if n.startswith("heads.reader.") and n.count(".") == 2
        ]
        assert sum(readers) <= shares["heads"] + 0.01 * len(readers), shares
        if "wrapped.inner" in shares:
            assert shares["wrapped.inner"] <= shares["wrapped"], shares
    # The slow reader, against its own stopwatch in the same sampled steps: its share of
    # what the three readers' backward took (loose: a loaded 2-core machine).
    bwd = {m["name"]: m["ms"] for m in mods["backward"]}
    slow = model.heads.reader[2]
    sampled = [i for i, s in enumerate(slow.calls) if s]
    assert len(sampled) >= mods["backward_steps"]
    truth_ms = [slow.log[i] for i in sampled]
    readers_ms = [sum(r.log[i] for r in model.heads.reader) for i in sampled]
    truth = 100.0 * sum(truth_ms) / sum(readers_ms)
    got = 100.0 * bwd["heads.reader.2"] / sum(bwd[f"heads.reader.{i}"] for i in range(3))
    # Readers of 2, 2 and 12 ms: a scheduler slice missed by the schedstat readings (a few
    # ms) moves a sample's shares a little, not half of them as it did readers of 0.5, 0.5 and
    # 3 ms (52 against 74.7 once beside two busy loops). Measured: 73.9-74.1 vs 74.9 quiet,
    # 73.0-73.2 beside two busy loops. A wrong attribution gives 0 or 100.
    assert abs(got - truth) < 15.0, (got, truth, bwd)
