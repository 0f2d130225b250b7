"""The README's test command is CI's, line for line, and it installs what the suite uses.

A developer who runs the README's command must skip no more tests than CI does: `.ci/run` runs
that very line, and `.ci/setup` (which the line starts with) installs every extra in
pyproject.toml that a test imports.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
CI_RUN = REPO / ".ci" / "run"
CI_SETUP = REPO / ".ci" / "setup"

#: Extras no test needs beyond [dev]: a torch range (CI installs the CPU wheel itself) and NVML.
NOT_FOR_TESTS = {"torch", "gpu"}


def readme_test_command() -> str:
    """The one line of the bash block that follows "Run the tests" in the README."""
    text = README.read_text()
    at = text.index("Run the tests")
    block = re.search(r"```bash\n(.*?)```", text[at:], re.S)
    assert block, "no bash block after 'Run the tests'"
    lines = [ln for ln in block.group(1).splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    return lines[0].strip()


def test_ci_runs_the_readme_test_command_exactly() -> None:
    command = readme_test_command()
    ci_lines = [ln.strip() for ln in CI_RUN.read_text().splitlines()]
    assert command in ci_lines, f".ci/run does not run the README's line: {command}"
    assert command.startswith(".ci/setup ")
    assert command.endswith("python -m pytest -n 2")


def test_setup_installs_every_extra_the_tests_use() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    installed: set[str] = set()
    for match in re.finditer(r"pip install [^\n]*-e \"\.\[([a-z,]+)\]\"", CI_SETUP.read_text()):
        installed |= set(match.group(1).split(","))
    assert set(extras) - NOT_FOR_TESTS <= installed, sorted(set(extras) - installed)


@pytest.mark.parametrize("script", [CI_RUN, CI_SETUP], ids=lambda p: p.name)
def test_ci_scripts_pass_shellcheck(script: Path) -> None:
    here = Path(sys.executable).parent / "shellcheck"
    shellcheck = str(here) if here.is_file() else shutil.which("shellcheck")
    if not shellcheck:
        pytest.skip("shellcheck is not installed (the [dev] extra brings it)")
    proc = subprocess.run([shellcheck, "--severity=style", str(script)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stdout
    assert script.stat().st_mode & 0o111, f"{script.name} is not executable"
