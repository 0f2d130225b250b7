"""gate/counted/counters.py through compare(): exact rows, absent counters make none, the
sentences."""

from __future__ import annotations

import copy

from tests.summary.builders import summary_doc
from traceml_ci.gate.compare import Status, Verdict, compare

PHASES = {"dataloader": 1.0, "forward": 4.0, "backward": 8.0, "optimizer": 1.0}
COUNTERS = {
    "sampled_step": 1,
    "syncs": {"per_step": 1, "sites": [{"at": "train.py:42", "op": "item", "count": 1}]},
    "params": {"tensors": 4, "elements": 676, "bytes": 2704},
    "optimizer": {
        "classes": ["SGD"],
        "param_groups": 1,
        "params": 4,
        "state_tensors_per_param": 0.0,
        "state_bytes": 0,
    },
    "leak": {"after_steps": 3, "retained_bytes_per_step": 0, "top": []},
    "flops": {
        "per_step": 1000,
        "top_modules": [
            {"module": "block1.0", "type": "Conv2d", "flops": 600},
            {"module": "fc", "type": "Linear", "flops": 400},
        ],
    },
}


def _doc(counters: dict | None = COUNTERS) -> dict:
    doc = summary_doc(PHASES)
    if counters is not None:
        doc["counters"] = copy.deepcopy(counters)
    return doc


def _counter_rows(base: dict, head: dict) -> dict:
    return {r.name: r for r in compare(base, head).rows if r.name.startswith("counters.")}


def test_a_counter_absent_on_either_side_makes_no_row() -> None:
    assert _counter_rows(_doc(None), _doc()) == {}
    assert _counter_rows(_doc(), _doc(None)) == {}
    head = _doc()
    del head["counters"]["leak"]
    assert "counters.retained_bytes_per_step" not in _counter_rows(_doc(), head)


def test_equal_counters_pass_quietly() -> None:
    rows = _counter_rows(_doc(), _doc())
    assert len(rows) == 5 and all(r.status is Status.OK and not r.note for r in rows.values())


def test_a_read_that_moved_lines_is_said_but_passes() -> None:
    head = _doc()
    head["counters"]["syncs"]["sites"][0]["at"] = "train.py:45"
    row = _counter_rows(_doc(), head)["counters.syncs_per_step"]
    assert row.status is Status.OK
    assert row.note == (
        "same count, moved: adds 1 scalar read per step at train.py:45 (item), "
        "removes 1 scalar read per step at train.py:42 (item)"
    )


def test_flops_beyond_one_percent_regress_naming_the_module_either_way() -> None:
    head = _doc()
    head["counters"]["flops"] = {
        "per_step": 2140,
        "top_modules": [
            {"module": "block1.0", "type": "Conv2d", "flops": 1740},
            {"module": "fc", "type": "Linear", "flops": 400},
        ],
    }
    c = compare(_doc(), head)
    row = c.row("counters.flops_per_step")
    assert row is not None and row.status is Status.REGRESSED
    assert row.note == "FLOPs per step +114 % (block1.0 Conv2d +1.14 kFLOP)"
    assert c.verdict is Verdict.REGRESSION
    assert any("FLOPs per step +114 % (block1.0 Conv2d +1.14 kFLOP)" in r for r in c.reasons)
    small = _doc()
    small["counters"]["flops"]["per_step"] = 1009  # +0.9 %: within the 1 %
    assert _counter_rows(_doc(), small)["counters.flops_per_step"].status is Status.OK
    fewer = _doc()
    fewer["counters"]["flops"]["per_step"] = 900
    assert _counter_rows(_doc(), fewer)["counters.flops_per_step"].status is Status.REGRESSED


def test_a_leak_regresses_and_less_retained_improves() -> None:
    head = _doc()
    head["counters"]["leak"] = {
        "after_steps": 3,
        "retained_bytes_per_step": 2_200_000,
        "top": [{"op": "addmm", "at": "train.py:30", "bytes": 2_200_000}],
    }
    row = _counter_rows(_doc(), head)["counters.retained_bytes_per_step"]
    assert row.status is Status.REGRESSED
    assert row.note.startswith("retains 2.2 MB more per step (addmm at train.py:30)")
    assert _counter_rows(head, _doc())["counters.retained_bytes_per_step"].status is (
        Status.IMPROVED
    )


def _checkpointed(per_layer: int, layers: int = 2) -> dict:
    """The counters' FLOPs block of COUNTERS' model with its layers recomputed in backward."""
    flops = copy.deepcopy(COUNTERS["flops"])
    flops["per_step"] += layers * per_layer
    flops["recomputed"] = {
        "per_step": layers * per_layer,
        "top_modules": [{"module": f"h.{i}", "type": "Block", "flops": per_layer}
                        for i in range(layers)],
    }
    return flops


def test_checkpointing_turned_on_is_said_as_recomputation_not_as_modules() -> None:
    """Issue 31: with activation checkpointing the FLOPs of the forwards run again in backward
    are the recomputed blocks', said as such -- no module's own figure moved."""
    head = _doc()
    head["counters"]["flops"] = _checkpointed(150)
    row = _counter_rows(_doc(), head)["counters.flops_per_step"]
    assert row.status is Status.REGRESSED
    assert row.note == row.cause == (
        "FLOPs per step +30 % (recomputed forward under activation checkpointing +300 FLOP: "
        "h.0 Block +150 FLOP, h.1 Block +150 FLOP)"
    )
    back = _counter_rows(head, _doc())["counters.flops_per_step"]
    assert back.note == (
        "FLOPs per step -23 % (recomputed forward under activation checkpointing −300 FLOP: "
        "h.0 Block −150 FLOP, h.1 Block −150 FLOP)"
    )


def test_recomputation_and_a_module_that_moved_are_both_named_the_larger_first() -> None:
    head = _doc()
    head["counters"]["flops"] = _checkpointed(100, layers=1)
    head["counters"]["flops"]["top_modules"][0]["flops"] = 1200  # block1.0: +600
    head["counters"]["flops"]["per_step"] += 600
    row = _counter_rows(_doc(), head)["counters.flops_per_step"]
    assert row.note == (
        "FLOPs per step +70 % (block1.0 Conv2d +600 FLOP; "
        "recomputed forward under activation checkpointing +100 FLOP: h.0 Block +100 FLOP)"
    )
    # a recomputation under a tenth of the module's move is not news
    head["counters"]["flops"] = _checkpointed(50, layers=1)
    head["counters"]["flops"]["top_modules"][0]["flops"] = 1200
    head["counters"]["flops"]["per_step"] += 600
    row = _counter_rows(_doc(), head)["counters.flops_per_step"]
    assert row.note == "FLOPs per step +65 % (block1.0 Conv2d +600 FLOP)"


def test_the_model_itself_is_named_by_its_class() -> None:
    """The traced model's own ops (named "" as ``named_modules`` names it) are its class's."""
    head = _doc()
    head["counters"]["flops"]["top_modules"].append({"module": "", "type": "Net", "flops": 500})
    head["counters"]["flops"]["per_step"] += 500
    assert _counter_rows(_doc(), head)["counters.flops_per_step"].note == (
        "FLOPs per step +50 % (Net +500 FLOP)"
    )


def test_the_ops_row_is_not_judged_across_torch_minor_versions():
    """torch's decompositions change between minor versions: the same code runs other ops."""
    from tests.gate.summaries import make

    def ran(ops: int, torch_version: str) -> dict:
        doc = make()
        doc["env"]["torch"] = torch_version
        doc["counters"] = {"sampled_step": 1, "ops": {
            "per_step": ops, "kinds": {"addmm": [ops, 0]}, "sites": ["train.py:9"], "other": 0}}
        return doc

    same = compare(ran(10, "2.13.0+cpu"), ran(14, "2.13.1")).row("counters.ops_per_step")
    assert same.status is Status.REGRESSED and "+4 addmm per step at train.py:9" in same.note
    bumped = compare(ran(10, "2.13.0"), ran(14, "2.14.0")).row("counters.ops_per_step")
    assert bumped.status is Status.OK and bumped.note == "not judged: torch 2.13 → 2.14"


def _with(block: str, value: dict) -> dict:
    doc = _doc()
    doc["counters"][block] = value
    return doc


def test_autograd_history_kept_regresses_naming_the_line_that_holds_it() -> None:
    clean = {"after_steps": 3, "nodes_kept_per_step": 0, "top": []}
    kept = {"after_steps": 3, "nodes_kept_per_step": 24,
            "top": [{"at": "train.py:68", "nodes": 20}, {"at": "train.py:70", "nodes": 4}],
            "newest": {"op": "add", "at": "train.py:70"}}
    row = _counter_rows(_with("graph", clean), _with("graph", kept))[
        "counters.graph_nodes_kept_per_step"]
    assert row.status is Status.REGRESSED and (row.base, row.head) == (0, 24)
    assert row.cause == ("keeps 24 autograd graph nodes more of each step alive 3 steps later "
                         "(most made at train.py:68; the newest made at train.py:70 (add))")
    assert "accumulate `loss.item()` or `loss.detach()`" in row.note
    assert compare(_with("graph", clean), _with("graph", kept)).verdict is Verdict.REGRESSION
    back = _counter_rows(_with("graph", kept), _with("graph", clean))[
        "counters.graph_nodes_kept_per_step"]
    assert back.status is Status.IMPROVED
    assert back.note == "keeps 24 autograd graph nodes fewer of each step alive"


def test_a_validation_forward_with_grad_regresses_at_its_line() -> None:
    none = {"per_step": 0, "sites": []}
    one = {"per_step": 1, "sites": [{"at": "train.py:37", "count": 1}]}
    row = _counter_rows(_with("eval_grad", none), _with("eval_grad", one))[
        "counters.eval_forwards_with_grad_per_step"]
    assert row.status is Status.REGRESSED
    assert row.cause == "adds 1 eval-mode forward with autograd on per step at train.py:37"
    assert "torch.no_grad()" in row.note and "Tuning Guide" in row.note
    back = _counter_rows(_with("eval_grad", one), _with("eval_grad", none))[
        "counters.eval_forwards_with_grad_per_step"]
    assert back.status is Status.IMPROVED


def test_an_all_reduce_per_micro_batch_regresses_by_its_bytes() -> None:
    """DDP under no_sync(): one all-reduce, and two small broadcasts of its one-time bucket
    rebuild; without no_sync(), four all-reduces."""
    synced = {"per_step": 3, "bytes_per_step": 668, "sites": [
        {"op": "broadcast_", "at": "ddp.py:42", "count": 2, "bytes": 24},
        {"op": "allreduce_", "at": "ddp.py:43", "count": 1, "bytes": 644}]}
    every = {"per_step": 4, "bytes_per_step": 2576, "sites": [
        {"op": "allreduce_", "at": "ddp.py:43", "count": 4, "bytes": 2576}]}
    row = _counter_rows(_with("collectives", synced), _with("collectives", every))[
        "counters.collectives_per_step"]
    assert row.status is Status.REGRESSED
    assert row.cause == ("collectives: +3 allreduce_ per step at ddp.py:43; -2 broadcast_ per "
                         "step (+1.91 kB per step)")
    assert "model.no_sync()" in row.note
    back = _counter_rows(_with("collectives", every), _with("collectives", synced))[
        "counters.collectives_per_step"]
    assert back.status is Status.IMPROVED  # fewer bytes, though the broadcasts are new
    assert back.note == ("collectives: +2 broadcast_ per step at ddp.py:42; -3 allreduce_ per "
                         "step (-1.91 kB per step)")
    user = copy.deepcopy(synced)  # the user's own all_reduce of the loss each step
    user["sites"].append({"op": "allreduce_", "at": "train.py:9", "count": 1, "bytes": 4})
    user["per_step"], user["bytes_per_step"] = 4, 672
    added = _counter_rows(_with("collectives", synced), _with("collectives", user))[
        "counters.collectives_per_step"]
    assert added.status is Status.REGRESSED
    assert added.cause == "collectives: +1 allreduce_ per step at train.py:9 (+4 B per step)"
    same = _counter_rows(_with("collectives", synced), _with("collectives", synced))[
        "counters.collectives_per_step"]
    assert same.status is Status.OK and not same.note


def test_more_python_calls_per_step_regress_past_the_floor_naming_the_users_functions() -> None:
    from traceml_ci.gate.counted.guide import PY_LIBRARY_FLOOR, PY_USER_FLOOR

    base = {"per_step": 242, "user": 0, "library": 242, "top_user": []}
    head = {"per_step": 542, "user": 300, "library": 242, "top_user": [
        {"at": "train.py:3", "function": "log_line", "calls": 150},
        {"at": "train.py:7", "function": "fields", "calls": 150}]}
    row = _counter_rows(_with("python", base), _with("python", head))[
        "counters.python_calls_per_step"]
    assert row.status is Status.REGRESSED
    assert row.cause == ("+300 Python calls per step (+150 fields() at train.py:7; +150 "
                         "log_line() at train.py:3)")
    assert _counter_rows(_with("python", head), _with("python", base))[
        "counters.python_calls_per_step"].status is Status.IMPROVED
    # a few calls more of the user's own code: past its floor
    few = dict(base, per_step=242 + PY_USER_FLOOR + 1, user=PY_USER_FLOOR + 1)
    assert _counter_rows(_with("python", base), _with("python", few))[
        "counters.python_calls_per_step"].status is Status.REGRESSED
    # the libraries' calls follow what the code asks of them (a foreach clip groups its
    # tensors in Python): within their floor, said, never a cause
    lib = dict(base, per_step=242 + PY_LIBRARY_FLOOR, library=242 + PY_LIBRARY_FLOOR)
    row = _counter_rows(_with("python", base), _with("python", lib))[
        "counters.python_calls_per_step"]
    assert row.status is Status.OK and row.cause == ""
    assert row.note == (f"within the floor: +{PY_LIBRARY_FLOOR} Python calls per step "
                        f"(libraries +{PY_LIBRARY_FLOOR})")
    anomaly = dict(base, per_step=24000, library=24000)  # detect_anomaly's hooks
    assert _counter_rows(_with("python", base), _with("python", anomaly))[
        "counters.python_calls_per_step"].status is Status.REGRESSED


def test_python_calls_are_not_judged_across_python_minor_versions() -> None:
    base, head = _with("python", {"per_step": 10, "user": 0, "library": 10}), _with(
        "python", {"per_step": 30, "user": 0, "library": 30})
    base["env"]["python"], head["env"]["python"] = "3.11.7", "3.12.1"
    row = compare(base, head).row("counters.python_calls_per_step")
    assert row.status is Status.OK and row.note == "not judged: Python 3.11 → 3.12"


def test_more_allocations_regress_by_count_naming_the_phase() -> None:
    base = {"per_step": 76, "bytes_per_step": 8792,
            "by_phase": {"forward": [12, 2112], "backward": [32, 4704], "other": [32, 1976]}}
    head = {"per_step": 84, "bytes_per_step": 10000,
            "by_phase": {"forward": [12, 2112], "backward": [32, 4704], "other": [40, 3184]}}
    row = _counter_rows(_with("allocs", base), _with("allocs", head))[
        "counters.allocs_per_step"]
    assert row.status is Status.REGRESSED
    assert row.cause == "+8 allocations per step, +1.21 kB in other +8"
    bigger = dict(base, bytes_per_step=20000)  # same count, larger tensors: said, not judged
    row = _counter_rows(_with("allocs", base), _with("allocs", bigger))[
        "counters.allocs_per_step"]
    assert row.status is Status.OK


def test_the_ops_row_names_the_phase_that_ran_more() -> None:
    def ops(n: int, optimizer: int) -> dict:
        return {"per_step": n, "kinds": {"zero_": [optimizer, 0], "addmm": [n - optimizer, 1]},
                "sites": ["train.py:20", "train.py:22"], "other": 0,
                "by_phase": {"forward": n - optimizer, "optimizer": optimizer}}

    row = _counter_rows(_with("ops", ops(10, 0)), _with("ops", ops(18, 8)))[
        "counters.ops_per_step"]
    assert row.cause == "+8 ATen ops per step in optimizer +8 (+8 zero_ per step at train.py:20)"


def test_a_kind_one_side_does_not_list_moves_by_a_range_named_only_where_it_is_sure() -> None:
    """A block lists its most run kinds: one not listed ran at most as often as the least run
    listed one (here 4), so 28 zero_ in head against none listed in base is +24 to +28; a kind
    that may not have moved at all is not named."""
    def ops(kinds: dict) -> dict:  # 8 ops of kinds listed on neither side
        return {"per_step": sum(n for n, _ in kinds.values()) + 8, "kinds": kinds,
                "sites": ["train.py:20", "train.py:22"], "other": 8}

    base = ops({"addmm": [40, 1], "view": [4, 1], "relu": [4, 1]})
    head = ops({"addmm": [40, 1], "view": [4, 1], "zero_": [28, 0]})
    row = _counter_rows(_with("ops", base), _with("ops", head))["counters.ops_per_step"]
    assert row.status is Status.REGRESSED
    assert "+24 to +28 zero_ per step at train.py:20" in row.cause
    assert "set_to_none=True" in row.note
    assert "relu" not in row.cause  # listed in base only, but it may be among head's rest (≤ 4)


def test_host_to_device_copies_regress_when_more_or_unpinned_and_a_cpu_run_has_no_device() -> None:
    cpu = {"device": "cpu", "per_step": 0, "bytes_per_step": 0, "unpinned_per_step": 0,
           "sites": []}
    row = _counter_rows(_with("h2d", cpu), _with("h2d", cpu))["counters.h2d_copies_per_step"]
    assert row.status is Status.OK and row.note == "no device: nothing to copy to"
    pinned = {"device": "cuda", "per_step": 2, "bytes_per_step": 4096, "unpinned_per_step": 0,
              "sites": [{"at": "train.py:30", "count": 2, "bytes": 4096}]}
    lost = dict(pinned, unpinned_per_step=2)  # pin_memory turned off
    row = _counter_rows(_with("h2d", pinned), _with("h2d", lost))["counters.h2d_copies_per_step"]
    assert row.status is Status.REGRESSED
    assert row.cause == ("2 host-to-device copies per step, +2 of them from unpinned memory at "
                         "train.py:30")
    assert "pin_memory=True" in row.note
    assert _counter_rows(_with("h2d", lost), _with("h2d", pinned))[
        "counters.h2d_copies_per_step"].status is Status.IMPROVED
    more = dict(pinned, per_step=3, bytes_per_step=6144)
    assert _counter_rows(_with("h2d", pinned), _with("h2d", more))[
        "counters.h2d_copies_per_step"].status is Status.REGRESSED


def test_a_new_graph_break_regresses_naming_its_reason() -> None:
    clean = {"graphs": 1, "frames": 1, "graph_breaks": 0, "top_breaks": []}
    broken = {"graphs": 2, "frames": 3, "graph_breaks": 1, "top_breaks": [
        {"reason": "Failed to trace builtin operator: print", "count": 1}]}
    row = _counter_rows(_with("compile", clean), _with("compile", broken))[
        "counters.compile_graph_breaks"]
    assert row.status is Status.REGRESSED
    assert row.cause == ("torch.compile: +1 graph breaks, +2 frames compiled (recompiles) "
                         "(Failed to trace builtin operator: print)")
    assert "graph break" in row.note
    assert _counter_rows(_with("compile", broken), _with("compile", clean))[
        "counters.compile_graph_breaks"].status is Status.IMPROVED


def test_an_improved_row_never_hides_the_one_that_regressed() -> None:
    """A log line added each step (Python calls, an echo row) while a .item() went away."""
    base, head = _doc(), _doc()
    base["counters"]["python"] = {"per_step": 100, "user": 0, "library": 100}
    head["counters"]["python"] = {"per_step": 500, "user": 400, "library": 100}
    head["counters"]["syncs"] = {"per_step": 0, "sites": []}
    c = compare(base, head)
    assert c.verdict is Verdict.REGRESSION
    assert c.causes[0].startswith("+400 Python calls per step")


def test_python_calls_within_the_floor_are_said_never_a_cause() -> None:
    base, head = _doc(), _doc()
    base["counters"]["python"] = {"per_step": 100, "user": 0, "library": 100}
    head["counters"]["python"] = {"per_step": 104, "user": 3, "library": 101}
    c = compare(base, head)
    row = c.row("counters.python_calls_per_step")
    assert row.status is Status.OK and row.cause == "" and row.note.startswith("within the floor")
    assert c.causes == []


def test_a_component_that_rose_regresses_though_another_fell() -> None:
    fewer_breaks = {"graphs": 1, "frames": 7, "graph_breaks": 0}
    more_frames = _counter_rows(
        _with("compile", {"graphs": 2, "frames": 1, "graph_breaks": 1}),
        _with("compile", fewer_breaks))["counters.compile_graph_breaks"]
    assert more_frames.status is Status.REGRESSED  # recompiles rose
    pinned = {"device": "cuda", "per_step": 3, "bytes_per_step": 3, "unpinned_per_step": 0}
    unpinned = {"device": "cuda", "per_step": 2, "bytes_per_step": 2, "unpinned_per_step": 2}
    row = _counter_rows(_with("h2d", pinned), _with("h2d", unpinned))[
        "counters.h2d_copies_per_step"]
    assert row.status is Status.REGRESSED  # fewer copies, but from unpinned memory


def test_a_fix_that_costs_a_few_ops_is_not_failed_for_them() -> None:
    """``total + loss.detach()``: the graph kept goes 32 -> 0, four ``detach`` more run."""
    kept = {"after_steps": 3, "nodes_kept_per_step": 32}
    none = {"after_steps": 3, "nodes_kept_per_step": 0}

    def ops(n: int) -> dict:
        return {"per_step": n, "kinds": {"detach": [n - 100, 0], "addmm": [100, 0]},
                "sites": ["train.py:70"], "other": 0}

    base, head = _with("graph", kept), _with("graph", none)
    base["counters"]["ops"], head["counters"]["ops"] = ops(110), ops(114)
    c = compare(base, head)
    assert c.verdict is Verdict.PASS
    row = c.row("counters.ops_per_step")
    assert row.status is Status.OK and row.note.endswith(
        "; follows graph_nodes_kept_per_step, which improved")
    assert c.row("counters.graph_nodes_kept_per_step").status is Status.IMPROVED
    # ... but more ops with nothing surer improved still fail
    still = _with("graph", none)
    still["counters"]["ops"] = ops(110)
    assert compare(still, head).verdict is Verdict.REGRESSION
