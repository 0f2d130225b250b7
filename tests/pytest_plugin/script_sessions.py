"""One traced script's pytest sessions (``traceml.run_script``), which test_run_script.py,
test_confirm.py and test_profile.py assert different things on: each run of the script is a
fresh process that imports torch (and torch._dynamo), seconds apiece, so the sessions run once
per test session, whichever file (or xdist worker) asks first.

The sessions, in one project against one baseline:

- ``recorded``: ``--traceml-update-baseline``, three runs (the default);
- ``confirmed``: only the first run slow: re-run to confirm, and not confirmed;
- ``profiled``: only the first run slow, no confirmation, ``--traceml-profile-on-regression``:
  a regression, profiled in a re-run of the script.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.pytest_plugin.conftest import SLOW_DATA_MS, SmokeProject, shared_smoke
from tests.pytest_plugin.shared import once_per_session, result_data, result_from

#: Steps the test asks of the script (its first argument: what run_script passes reaches it).
STEPS = 40

#: No warmup (not the default 5, so the setting is seen to reach the child): the tracer counts
#: FLOPs on a warmup step, and torch's FLOP counter imports torch._dynamo, seconds in each of
#: the script's fresh processes; a median of 40 steps does not mind the first step's lazy
#: set-up. Its assertions hold in every run of the test, re-runs included.
SCRIPT_TEST = f'''
def test_script(traceml):
    summary = traceml.run_script("train_script.py", {STEPS}, env={{"SMOKE_PLAIN_SGD": "1"}},
                                 warmup_steps=0)
    assert traceml.summary is summary
    st = summary["step_time"]
    assert (st["steps_total"], st["warmup_steps"], st["steps_analyzed"]) == ({STEPS}, 0, {STEPS})
    assert summary["run"]["name"] == "test_smoke.py::test_script"
'''

#: The script leaves a file per run in SCRIPT_RUNS_DIR, and is slow (SMOKE_DATA_MS per batch)
#: on the runs whose number (0-based, counted by those files) SCRIPT_SLOW_RUNS lists.
SCRIPT = '''
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ["SMOKE_SLOW_CALLS"] = os.environ.get("SCRIPT_SLOW_RUNS", "") and (
    "1" if str(len(os.listdir(os.environ["SCRIPT_RUNS_DIR"]))) in
    os.environ["SCRIPT_SLOW_RUNS"].split(",") else "0")
open(os.path.join(os.environ["SCRIPT_RUNS_DIR"], str(os.getpid())), "w").close()
# Before the loop, as a script's imports are: torch imports torch._dynamo at a DataLoader's
# first batch, ~100 MB that a 40-step run's few RSS samples would show as growth in one fresh
# process and not in the next (step_memory.diagnosis BALANCED -> MEMORY_GROWTH failed clean
# runs against a baseline that missed it, beside busy loops).
import torch._dynamo  # noqa: F401
from smoke_train import train

train(int(sys.argv[1]))
'''

#: Each session's arguments and the runs SCRIPT_SLOW_RUNS makes slow ("999": none).
SESSIONS = {
    # (Three runs, the default: one fresh process's memory label can differ from the next's --
    # a lazy import in its first step -- and a baseline of one run then fails clean re-runs.)
    "recorded": ("999", ["--traceml-update-baseline"]),
    "confirmed": ("0", []),
    "profiled": ("0", ["--traceml-confirm=0", "--traceml-profile-on-regression",
                       "--traceml-profile-steps=3"]),
}

_DONE: dict[str, Any] = {}


def script_sessions(request: pytest.FixtureRequest,
                    tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """name -> {"result": the session's RunResult, "runs": the script's runs in it}, and
    "entries": the baseline's keys after recording; once per test session."""
    if "done" not in _DONE:  # (once_per_session shares between xdist workers; this, modules)

        def produce() -> dict[str, Any]:
            with shared_smoke(request, tmp_path_factory) as smoke:
                return _produce(smoke)

        _DONE["done"] = once_per_session(tmp_path_factory, "run-script-sessions", produce)
    done = _DONE["done"]
    return {"entries": done["entries"],
            **{name: {"result": result_from(d["result"]), "runs": d["runs"]}
               for name, d in done["sessions"].items()}}


def _produce(smoke: SmokeProject) -> dict[str, Any]:
    smoke.tests(SCRIPT_TEST)
    (smoke.path / "train_script.py").write_text(SCRIPT)
    runs = smoke.path / "runs"
    runs.mkdir()
    smoke.monkeypatch.setenv("SCRIPT_RUNS_DIR", str(runs))
    smoke.monkeypatch.setenv("SMOKE_DATA_MS", SLOW_DATA_MS)
    sessions: dict[str, Any] = {}
    entries: list[str] = []
    for name, (slow, args) in SESSIONS.items():
        for f in runs.iterdir():
            f.unlink()
        smoke.monkeypatch.setenv("SCRIPT_SLOW_RUNS", slow)
        # (a temporary folder of its own: pytester's default is shared by every session of the
        # test session, emptied as each starts, and the tests read the files this one leaves)
        result = smoke.run(*args, f"--basetemp={smoke.path / ('tmp-' + name)}")
        sessions[name] = {"result": result_data(result), "runs": len(os.listdir(runs))}
        if name == "recorded" and smoke.baseline.is_file():
            entries = list(smoke.baseline_summaries())
    return {"sessions": sessions, "entries": entries}

