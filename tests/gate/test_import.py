"""The gate imports neither torch nor pandas (nor jsonschema, tabulate or rich until needed)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.gate.summaries import DATA

HEAVY = ("torch", "pandas", "jsonschema", "tabulate", "rich", "numpy")


def _loaded_after(code: str) -> dict[str, bool]:
    probe = code + (
        f"\nimport json, sys; print(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_gate_loads_nothing_heavy():
    loaded = _loaded_after("import traceml_ci.gate")
    assert not any(loaded.values()), loaded


def test_diffing_two_valid_summaries_as_json_skips_jsonschema_torch_and_pandas():
    a, b = DATA / "input_bound_a.json", DATA / "input_bound_b.json"
    loaded = _loaded_after(
        "import io, contextlib\nfrom traceml_ci.cli.main import main\n"
        f"with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert main(['diff', '--format', 'json', {str(a)!r}, {str(b)!r}]) == 0"
    )
    assert not loaded["jsonschema"] and not loaded["torch"] and not loaded["pandas"], loaded
