"""Run a composite action's steps the way a runner would, close enough to test its wiring.

Each ``run:`` step goes to ``bash --noprofile --norc -eo pipefail`` with its ``env:`` (where
``${{ }}`` is expanded), its ``working-directory``, and fresh GITHUB_OUTPUT and
GITHUB_STEP_SUMMARY files; ``if:`` conditions are evaluated (a small subset of GitHub's
expression language: contexts, string literals, ==, !=, !, &&, ||, parentheses and the status
functions); ``uses:`` steps are recorded with their expanded ``with:`` but not run.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

_TEMPLATE = re.compile(r"\$\{\{(.*?)\}\}", re.S)
_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<op>==|!=|&&|\|\||!|\(|\))|(?P<num>\d+)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_.-]*(?:\(\))?))"
)


@dataclass
class StepResult:
    name: str
    id: str | None
    ran: bool
    exit_code: int | None = None
    outputs: dict[str, str] = field(default_factory=dict)
    uses: str | None = None
    with_: dict[str, str] = field(default_factory=dict)
    stdout: str = ""
    stderr: str = ""


@dataclass
class JobResult:
    steps: list[StepResult]
    outputs: dict[str, str]
    step_summary: str

    @property
    def failed(self) -> bool:
        return any(s.exit_code not in (None, 0) for s in self.steps)

    def step(self, name_prefix: str) -> StepResult:
        return next(s for s in self.steps if s.name.startswith(name_prefix))


class Expr:
    """Evaluate a GitHub Actions expression against nested dict contexts."""

    def __init__(self, contexts: dict[str, Any], status: dict[str, bool]) -> None:
        self.contexts = contexts
        self.status = status

    def eval(self, text: str) -> Any:
        self.tokens = [m for m in _TOKEN.finditer(text) if m.group().strip()]
        if "".join(m.group().strip() for m in self.tokens) != re.sub(r"\s+", "", text):
            raise ValueError(f"unsupported expression: {text!r}")
        self.pos = 0
        value = self._or()
        if self.pos != len(self.tokens):
            raise ValueError(f"trailing tokens in {text!r}")
        return value

    def _peek(self) -> str | None:
        return self.tokens[self.pos].group().strip() if self.pos < len(self.tokens) else None

    def _take(self) -> re.Match[str]:
        self.pos += 1
        return self.tokens[self.pos - 1]

    def _or(self) -> Any:
        left = self._and()
        while self._peek() == "||":
            self._take()
            right = self._and()
            left = left or right
        return left

    def _and(self) -> Any:
        left = self._cmp()
        while self._peek() == "&&":
            self._take()
            right = self._cmp()
            left = left and right
        return left

    def _cmp(self) -> Any:
        left = self._unary()
        while self._peek() in ("==", "!="):
            op = self._take().group().strip()
            right = self._unary()
            left = (_norm(left) == _norm(right)) == (op == "==")
        return left

    def _unary(self) -> Any:
        if self._peek() == "!":
            self._take()
            return not self._unary()
        if self._peek() == "(":
            self._take()
            value = self._or()
            assert self._take().group().strip() == ")"
            return value
        tok = self._take()
        if tok.group("str") is not None:
            return tok.group("str")[1:-1].replace("''", "'")
        if tok.group("num") is not None:
            return int(tok.group("num"))
        name = tok.group("name")
        if name.endswith("()"):
            return self.status[name[:-2]]
        if name in ("true", "false"):
            return name == "true"
        node: Any = self.contexts
        for part in name.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return "" if node is None else node


def _norm(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def expand(text: str, expr: Expr) -> str:
    return _TEMPLATE.sub(lambda m: _norm(expr.eval(m.group(1))), text)


def run_composite(
    action_yml: Path,
    inputs: dict[str, str],
    *,
    env: dict[str, str],
    workspace: Path,
    github: dict[str, Any],
    scratch: Path,
    timeout_s: float = 120,
) -> JobResult:
    """Run ``action_yml``'s steps with ``inputs``; ``env`` is the job's environment."""
    spec = yaml.safe_load(action_yml.read_text(encoding="utf-8"))
    declared = spec.get("inputs") or {}
    unknown = set(inputs) - set(declared)
    assert not unknown, f"inputs not declared in action.yml: {sorted(unknown)}"
    contexts: dict[str, Any] = {"github": github, "steps": {}, "inputs": {}}
    status = {"success": True, "failure": False, "always": True, "cancelled": False}
    expr = Expr(contexts, status)
    for name, meta in declared.items():
        default = str((meta or {}).get("default", ""))
        contexts["inputs"][name] = inputs.get(name, expand(default, expr))

    results: list[StepResult] = []
    summaries: list[str] = []
    for index, step in enumerate(spec["runs"]["steps"]):
        name = step.get("name") or step.get("uses") or f"step {index}"
        cond = str(step.get("if", "success()")).strip()
        if cond.startswith("${{") and cond.endswith("}}"):
            cond = cond[3:-2]
        if not expr.eval(cond):
            results.append(StepResult(name, step.get("id"), ran=False))
            continue
        if "uses" in step:
            with_ = {k: expand(str(v), expr) for k, v in (step.get("with") or {}).items()}
            results.append(
                StepResult(name, step.get("id"), True, 0, uses=step["uses"], with_=with_)
            )
            continue
        out_file = scratch / f"output-{index}"
        summary_file = scratch / f"summary-{index}"
        out_file.write_text("")
        summary_file.write_text("")
        script = scratch / f"step-{index}.sh"
        script.write_text(step["run"])
        step_env = {
            **env,
            **{k: expand(str(v), expr) for k, v in (step.get("env") or {}).items()},
            "GITHUB_OUTPUT": str(out_file),
            "GITHUB_STEP_SUMMARY": str(summary_file),
        }
        cwd = workspace / expand(str(step.get("working-directory", ".")), expr)
        assert step.get("shell") == "bash", f"{name}: composite run steps need shell: bash"
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            cwd=cwd, env=step_env, capture_output=True, text=True, timeout=timeout_s,
        )  # fmt: skip
        outputs = parse_outputs(out_file.read_text(encoding="utf-8"))
        summaries.append(summary_file.read_text(encoding="utf-8"))
        result = StepResult(
            name, step.get("id"), True, proc.returncode, outputs, stdout=proc.stdout,
            stderr=proc.stderr,
        )  # fmt: skip
        results.append(result)
        if step.get("id"):
            contexts["steps"][step["id"]] = {"outputs": outputs}
        if proc.returncode != 0:
            status["success"], status["failure"] = False, True
    outputs = {
        name: expand(str(meta.get("value", "")), expr)
        for name, meta in (spec.get("outputs") or {}).items()
    }
    return JobResult(results, outputs, "".join(summaries))


def parse_outputs(text: str) -> dict[str, str]:
    """Read a GITHUB_OUTPUT file: ``name=value`` lines and ``name<<DELIM`` heredocs."""
    out: dict[str, str] = {}
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            end = lines.index(delim, i + 1)
            out[name] = "\n".join(lines[i + 1 : end])
            i = end + 1
            continue
        if "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
        i += 1
    return out


def clean_environ() -> dict[str, str]:
    """This process's environment less anything a runner or an outer pytest would not pass on."""
    drop = ("GITHUB_", "RUNNER_", "PYTEST_", "TRACEML_CI_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}
