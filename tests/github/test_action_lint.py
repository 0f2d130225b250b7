"""The Action and its example workflows pass actionlint, the action-metadata schema and zizmor.

The tools come from the `dev` extra (PyPI wheels that carry their binaries); a test skips, saying
which, only when its tool is not installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ACTION = ROOT / "github-action" / "action.yml"
EXAMPLES = sorted((ROOT / "github-action" / "examples").glob("*.yml"))
ACTIONLINT_CONFIG = ROOT / ".github" / "actionlint.yaml"


def tool(name: str) -> str:
    """The tool's path: beside this interpreter (the venv's bin/) or on PATH; else skip."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.is_file() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed (pip install -e '.[dev]')")
    return found


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_there_are_the_examples() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"gpu-pull-request.yml", "cpu-pull-request.yml", "fork-safe-tests.yml",
            "fork-safe-comment.yml", "refresh-baseline.yml"} <= names  # fmt: skip


def _steps(name: str) -> list[dict]:
    doc = yaml.safe_load((ROOT / "github-action" / "examples" / name).read_text())
    return [s for job in doc["jobs"].values() for s in job.get("steps", [])]


def test_the_refresh_example_records_the_baseline_the_documented_way() -> None:
    """Three runs per test combined, merged by the plugin (docs/pytest-plugin.md), never one
    head run copied over the baseline."""
    steps = _steps("refresh-baseline.yml")
    [gate] = [s for s in steps if s.get("uses") == "./github-action"]
    args = gate["with"]["pytest-args"].split()
    assert "--traceml-update-baseline" in args
    assert not any(a.startswith(("--traceml-baseline-runs=1", "--traceml-repeats")) for a in args)
    for step in steps:
        assert "summary-path" not in str(step.get("env", {})), step.get("name")
        assert not re.search(r"\b(cp|mv)\b[^\n]*baseline", step.get("run", "")), step.get("name")
    assert "--traceml-update-baseline" in (ROOT / "docs" / "pytest-plugin.md").read_text()


def test_the_cpu_example_installs_the_cpu_torch_wheel_before_the_action() -> None:
    steps = _steps("cpu-pull-request.yml")
    runs = [i for i, s in enumerate(steps) if "download.pytorch.org/whl/cpu" in s.get("run", "")]
    [gate] = [i for i, s in enumerate(steps) if s.get("uses") == "./github-action"]
    assert runs and runs[0] < gate
    assert (
        "pip install torch --index-url https://download.pytorch.org/whl/cpu"
        in (ROOT / "github-action" / "README.md").read_text()
    )


def test_examples_pass_actionlint() -> None:
    cmd = [tool("actionlint"), "-config-file", str(ACTIONLINT_CONFIG), "-no-color"]
    shellcheck = Path(sys.executable).parent / "shellcheck"
    cmd += ["-shellcheck", str(shellcheck) if shellcheck.is_file() else ""]
    proc = run(*cmd, *map(str, EXAMPLES))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_action_matches_the_action_metadata_schema() -> None:
    proc = run(tool("check-jsonschema"), "--builtin-schema", "vendor.github-actions", str(ACTION))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_examples_match_the_workflow_schema() -> None:
    proc = run(
        tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *map(str, EXAMPLES)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_zizmor_finds_nothing() -> None:
    # --offline: the audits that need GitHub's API cannot run here (nor in CI's sandbox).
    proc = run(tool("zizmor"), "--offline", "--min-severity", "medium", "--no-progress",
               str(ACTION), *map(str, EXAMPLES))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_zizmor_would_catch_template_injection(tmp_path: Path) -> None:
    """The check above is not vacuous: the same call flags ${{ }} inside a run: script."""
    bad = tmp_path / "action.yml"
    safe = '"$TRACEML_PYTHON" -m traceml_ci --version'
    text = ACTION.read_text().replace(safe, '"${{ inputs.python }}" -m traceml_ci --version')
    assert text != ACTION.read_text()
    bad.write_text(text)
    proc = run(tool("zizmor"), "--offline", "--min-severity", "medium", "--no-progress", str(bad))
    assert proc.returncode != 0 and "template-injection" in proc.stdout


def test_action_run_scripts_pass_shellcheck(tmp_path: Path) -> None:
    """actionlint does not read action.yml; its run: scripts get shellcheck directly."""
    shellcheck = tool("shellcheck")
    steps = yaml.safe_load(ACTION.read_text())["runs"]["steps"]
    scripts = [s["run"] for s in steps if "run" in s]
    assert scripts
    for i, script in enumerate(scripts):
        path = tmp_path / f"step{i}.sh"
        path.write_text("#!/bin/bash\n" + script)
        proc = subprocess.run([shellcheck, "--severity=style", str(path)], capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert proc.returncode == 0, proc.stdout


def test_no_expressions_inside_run_scripts() -> None:
    """Belt and braces for zizmor: values reach shells through env:, never by ${{ }}."""
    for path in [ACTION, *EXAMPLES]:
        doc = yaml.safe_load(path.read_text())
        steps = doc["runs"]["steps"] if "runs" in doc else [
            s for job in doc["jobs"].values() for s in job.get("steps", [])
        ]  # fmt: skip
        for step in steps:
            assert "${{" not in step.get("run", ""), f"{path.name}: {step.get('name')}"


def test_permissions_are_least_privilege() -> None:
    """Workflow-level permissions are empty or read-only; each job asks for what it uses."""
    allowed_writes = {"pull-requests", "contents"}
    for path in EXAMPLES:
        doc = yaml.safe_load(path.read_text())
        top = doc.get("permissions")
        assert top == {} or top == {"contents": "read"}, path.name
        for name, job in doc["jobs"].items():
            perms = job.get("permissions", top)
            assert isinstance(perms, dict), f"{path.name}:{name} uses a permissions shorthand"
            writes = {k for k, v in perms.items() if v == "write"}
            assert writes <= allowed_writes, f"{path.name}:{name}: {writes}"
        on = doc.get(True, doc.get("on"))  # YAML 1.1 reads the key `on` as True
        assert "pull_request_target" not in on, path.name


def test_third_party_actions_are_pinned_by_sha() -> None:
    uses = re.compile(r"^\s*-?\s*uses:\s*(\S+)", re.M)
    for path in [ACTION, *EXAMPLES]:
        for ref in uses.findall(path.read_text()):
            if ref.startswith("./"):
                continue
            assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), f"{path.name}: {ref}"
