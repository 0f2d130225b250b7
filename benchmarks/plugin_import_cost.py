"""What the installed pytest plugin adds to a pytest session that traces nothing.

Runs ``pytest`` on a throw-away project of trivial tests, alternating sessions with the plugin
(``-p traceml`` is the default once traceml-ci is installed) and without it (``-p no:traceml``),
and reports the median wall time of each and the difference. Also times importing the front
door module alone in a fresh interpreter that already has pytest.

    .venv/bin/python benchmarks/plugin_import_cost.py [--runs 15] [--tests 50]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Plugins of this environment that are not under test and only add noise (hypothesis alone
#: costs seconds of imports per session). Pass --keep-plugins to measure with them.
QUIET = ("-p", "no:hypothesispytest", "-p", "no:cacheprovider")

IMPORT_ONLY = (
    "import time, pytest; t = time.perf_counter(); import pytest_plugin.plugin; "
    "print(time.perf_counter() - t)"
)


def session_s(project: Path, extra: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", "-q", *extra], cwd=project, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="sessions per arm")
    parser.add_argument("--tests", type=int, default=50, help="trivial tests in the project")
    parser.add_argument("--keep-plugins", action="store_true")
    args = parser.parse_args()

    base = [] if args.keep_plugins else list(QUIET)
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        (project / "test_plain.py").write_text("".join(
            f"def test_{i}():\n    assert {i} == {i}\n\n" for i in range(args.tests)))
        session_s(project, base)  # warm the file cache and bytecode
        with_plugin, without = [], []
        for _ in range(args.runs):  # alternate, so drifts in machine load hit both arms
            with_plugin.append(session_s(project, base))
            without.append(session_s(project, [*base, "-p", "no:traceml"]))
    imports = []
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, "-c", IMPORT_ONLY], capture_output=True, text=True,
                             check=True)
        imports.append(float(out.stdout))

    med_with, med_without = statistics.median(with_plugin), statistics.median(without)
    print(f"pytest session, {args.tests} trivial tests, {args.runs} runs per arm "
          f"({'all plugins' if args.keep_plugins else ' '.join(base)})")
    print(f"  with the traceml plugin  : median {med_with:.3f} s  "
          f"(min {min(with_plugin):.3f} s)")
    print(f"  -p no:traceml            : median {med_without:.3f} s  "
          f"(min {min(without):.3f} s)")
    print(f"  added by the plugin      : {med_with - med_without:+.3f} s (median), "
          f"{min(with_plugin) - min(without):+.3f} s (min)")
    print(f"import pytest_plugin.plugin alone: median {statistics.median(imports) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
