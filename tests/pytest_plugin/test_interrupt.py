"""A pytest session interrupted while a traced script's step hangs in a DataLoader worker ends as
pytest promises (KeyboardInterrupt, exit 2, its summary printed) within seconds, and so does a
traced script that runs past its time: the launcher leaves nothing of the child behind.

It did not: killed, the child left its worker holding the output pipe, and the launcher read
that pipe to its end, which never came (a SIGINT to the session alone did not stop it in 45 s).
Real sessions in real processes; each test kills its process group when it fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.cli.scripts import kill_group
from tests.conftest import sigint_default

#: Two steps, then a batch whose fetch in the worker never returns (a dead NFS mount, a lock).
HANGING_SCRIPT = '''
import pathlib
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import traceml_ci as traceml

torch.set_num_threads(1)


class Stuck(Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        if i >= 6:
            time.sleep(3600)
        return torch.randn(4)


model = torch.nn.Linear(4, 1)
for i, x in enumerate(DataLoader(Stuck(), batch_size=2, num_workers=1)):
    with traceml.trace_step(model):
        model(x).sum().backward()
    if i == 1:
        pathlib.Path(sys.argv[1]).write_text("looping")
'''

SESSION_TEST = '''
import runpy
import sys
from pathlib import Path

import pytest


# No warmup: a warmup step counts FLOPs, whose import of torch._dynamo costs a process seconds
# before it reaches the hang (the steps traced are analysed instead; the status is the point).
def test_hangs(traceml):
    here = Path(__file__).parent
    traceml.run_script(here / "hanging.py", str(here / "looping"), warmup_steps=0)


@pytest.mark.traceml(warmup_steps=0)
def test_hangs_here():
    here = Path(__file__).parent
    sys.argv = ["hanging.py", str(here / "looping")]
    runpy.run_path(str(here / "hanging.py"))
'''

#: Where the step hangs: in a script the test runs traced in a child (run_script), or in the
#: test's own body, traced in the session's process (a marked test).
WHERE = {"child": "test_hangs", "in process": "test_hangs_here"}

#: How long an interrupted session may take to end: the child's grace to write its summary and
#: the kill, with room for a loaded machine (8-10 s beside two busy loops; a loaded full suite
#: stretches a session's teardown further). It never ended before: a guard against a hang.
ENDS_WITHIN_S = 60.0

#: A traced script past its time: it starts a process of its own that inherits the output pipe
#: and never ends (as a DataLoader worker stuck in a fetch holds it), then hangs itself. No torch
#: and no DataLoader to start: the bootstrap reaches the hang in a fraction of a second, so the
#: launch's timeout need not cover a torch import on a loaded machine (a torch child beside two
#: busy loops and the suite once took > 15 s to reach its stuck fetch, and the test waited out a
#: 40 s timeout). The launcher ends the group the same way: the script's descendants are found
#: and killed, the pipe drained for at most DRAIN_S.
STUCK_SCRIPT = '''
import pathlib
import subprocess
import sys
import time

subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])  # holds our stdout
pathlib.Path(sys.argv[1]).write_text("looping")
time.sleep(3600)
'''

#: The launch's timeout in the timed-out test: many times what the stuck script takes to reach
#: its hang even on a loaded machine (about 0.15 s quiet).
LAUNCH_TIMEOUT_S = 8


def _group_is_gone(pgid: int, within: float = 10.0) -> bool:
    """Whether process group ``pgid`` holds no process within ``within`` seconds (a killed
    process takes a moment to be reaped)."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.1)


@pytest.mark.parametrize(("where", "whom"), [("child", "session"), ("child", "process group"),
                                            ("in process", "session")])
def test_sigint_while_a_traced_step_hangs_ends_the_session_as_pytest_does(tmp_path, where, whom):
    """``kill -INT`` of the session alone (a child never hears it), or of its whole process
    group as a terminal's Ctrl-C: KeyboardInterrupt, exit 2, pytest's summary line, the session
    gone within seconds, no worker left -- and the run's summary, written in its grace, saying
    interrupted (an in-process one said crashed)."""
    (tmp_path / "hanging.py").write_text(HANGING_SCRIPT)
    (tmp_path / "test_hang.py").write_text(textwrap.dedent(SESSION_TEST))
    basetemp = tmp_path / "bt"
    test = WHERE[where]
    proc = subprocess.Popen(
        # (without plugins it does not use: hypothesis's start-up costs a fresh session a
        # second, anyio's and xdist's a tenth)
        [sys.executable, "-m", "pytest", f"test_hang.py::{test}", "-p", "no:cacheprovider",
         "-p", "no:hypothesispytest", "-p", "no:anyio", "-p", "no:xdist",
         f"--basetemp={basetemp}"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, preexec_fn=sigint_default,
    )
    try:
        _wait_for(tmp_path / "looping", proc, 180)
        time.sleep(0.5)  # the worker is stuck in its fetch now
        sent = time.monotonic()
        if whom == "session":
            proc.send_signal(signal.SIGINT)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=ENDS_WITHIN_S)
        took = time.monotonic() - sent
        assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
        assert "KeyboardInterrupt" in out and " in " in out.splitlines()[-1], out
        assert took < ENDS_WITHIN_S
        assert _group_is_gone(proc.pid)  # nothing of the session's is left, no worker
        [summary] = basetemp.glob(f"traceml-{test}[0-9]*/**/final_summary.json")
        assert json.loads(summary.read_text())["run"]["status"] == "interrupted"
    finally:
        kill_group(proc)


def test_a_traced_script_past_its_time_with_a_stuck_worker_times_out(tmp_path):
    """``launch(timeout_s=...)`` (run_script's ``timeout_s``): the child and its worker are
    killed and the launch returns timed out -- it read the worker's pipe for ever."""
    (tmp_path / "stuck.py").write_text(STUCK_SCRIPT)
    code = textwrap.dedent(f'''
        import time
        from traceml_ci.tracer.launch import LaunchSpec, launch

        spec = LaunchSpec(target="stuck.py", args=({str(tmp_path / "looping")!r},),
                          out_dir="out")
        started = time.monotonic()
        done = launch(spec, timeout_s={LAUNCH_TIMEOUT_S}, capture=True)
        print(done.timed_out, round(time.monotonic() - started, 1))
    ''')
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S + 120)
        assert proc.returncode == 0, out
        timed_out, took = out.split()[-2:]
        # Returned once the timeout ran out and the child's group was ended (its grace and the
        # kill), not reading the worker's pipe for ever.
        assert timed_out == "True" and float(took) < LAUNCH_TIMEOUT_S + 45, out
        assert (tmp_path / "looping").exists()  # it did reach the stuck fetch
        assert _group_is_gone(proc.pid)
    finally:
        kill_group(proc)
