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


# -- what the docs tell a user to type -------------------------------------------------------
DOCS = [README, REPO / "github-action" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
CODE = [*sorted((REPO / "traceml_ci").rglob("*.py")), *sorted((REPO / "benchmarks").glob("*.py"))]
#: ``pip install traceml-ci``, ``'traceml-ci[x]'``, ``traceml-ci==0.1.0``: a name pip looks up on
#: PyPI, where traceml-ci is not published. A requirement with ``@ git+...`` is fine.
FROM_PYPI = re.compile(
    r"pip install [\"']?traceml-ci(\[[a-z,]+\])?[\"']?(?!\[|\s*@)|traceml-ci(\[[a-z,]+\])?==\d"
)


def test_no_install_hint_asks_pypi_for_traceml_ci() -> None:
    found = [f"{p.relative_to(REPO)}:{n}: {line.strip()}"
             for p in [*DOCS, *CODE]
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if FROM_PYPI.search(line)]  # fmt: skip
    assert not found, "\n".join(found)


def test_the_install_hint_is_a_requirement_pip_accepts() -> None:
    from packaging.requirements import Requirement

    from traceml_ci.errors import SOURCE_URL, install_hint

    hint = install_hint("report")
    assert "pip install -e '.[report]'" in hint
    (git,) = re.findall(r"pip install '([^']+ @ [^']+)'", hint)
    req = Requirement(git)
    assert (req.name, req.extras, req.url) == ("traceml-ci", {"report"}, SOURCE_URL)


def test_the_missing_torch_exit_code_in_readme_and_run_help_is_exit_6() -> None:
    from traceml_ci.errors import ExitCode

    code = int(ExitCode.MISSING_DEPENDENCY)
    text = " ".join(README.read_text().split())
    (said,) = re.findall(r"`traceml-ci run` says so in one line and exits (\d+)", text)
    assert int(said) == code
    proc = subprocess.run([sys.executable, "-c", "from traceml_ci.cli.main import entry; entry()",
                           "run", "--help"], capture_output=True, text=True, timeout=60,
                          cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"({code} when torch is not installed)" in " ".join(proc.stdout.split())


def test_docs_name_the_folder_and_options_that_exist() -> None:
    from traceml_ci.summary.keys import DEFAULT_OUT_DIR

    assert DEFAULT_OUT_DIR == "traceml-out"
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        assert ".traceml/" not in text, f"{doc.name}: the output folder is {DEFAULT_OUT_DIR}/"
        # `run`'s option is --run-name; --name belongs to history and report only.
        assert "init()`/`--name`" not in text, doc.name
