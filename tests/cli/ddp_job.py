"""examples/train_ddp.py, its options and all, with the slow rank's extra time in forward,
backward or the optimizer spent *waiting* (a sleep) rather than spinning: the host thread of a
rank whose device is slower waits for it, and that wait does not stretch with CPU load.

The example's spin holds wall time. Beside two busy loops (and a second job of the suite) the
slow rank got a fraction of a CPU while it spun, so most of a 12 ms spin was waiting for a
CPU, and the straggler analysis rightly takes a rank's extra waits for a CPU off its extra own
work (summary/ranks.py: ``contended``): the compute-straggler tests failed under load, the tool
being right. Burning CPU time instead (``time.thread_time``) fared no better: the spin's wall
time then moves with the load from window to window, and that noise (``own_work_noise_ms``)
grew past a 40 ms spin's excess. A sleep of S ms is S ms more of the rank's own work in that
phase, quiet or loaded (measured beside two busy loops, 2 ranks x 2 jobs on 2 vCPUs: the
others waited 10.6-15.8 ms a step for a 12 ms-slow rank, its own work's noise 0.2-3.1 ms).

python ddp_job.py --slow-rank 1 --slow forward --slow-ms 12   # as train_ddp.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import train_ddp  # noqa: E402


def sleep_ms(ms: float) -> None:
    time.sleep(ms / 1000.0)


def slow_phases_wait() -> None:
    """The example's forward, backward and optimizer spins (``train_ddp.spin``, looked up when
    they run) sleep from now on."""
    train_ddp.spin = sleep_ms


if __name__ == "__main__":
    slow_phases_wait()
    train_ddp.main()
