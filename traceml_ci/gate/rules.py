"""Tolerance rules: per-metric warn and fail tiers, matched by glob pattern, read from TOML.

A rules document (a ``--tolerances`` TOML file, or ``[tool.traceml-ci]`` in pyproject.toml)::

    noise_factor = 1.0
    noise_rule = "beyond"
    [tolerances]
    "step_time.*_pct" = {abs = 2.0}
    "step_time.step_ms.median" = {rel = 15, warn_rel = 8}
    "step_memory.peak_rss_mb" = {skip = true}

The defaults come first; then each pattern, in file order, overrides the fields it sets on
every metric it matches. docs/gate.md is the reference.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from traceml_ci.errors import InputError
from traceml_ci.fsutil import find_pyproject
from traceml_ci.gate.metrics import METRIC_NAMES

RULES_SCHEMA = "rules.schema.json"
#: A rules file is a few lines; refuse to parse anything this large.
MAX_RULES_BYTES = 1024 * 1024
#: The pyproject.toml table the gate reads; every key in it is a rules key (RULES_KEYS).
PYPROJECT_TABLE = "traceml-ci"
#: Keys of a rules document that belong to the gate.
RULES_KEYS = ("noise_factor", "noise_rule", "tolerances")
#: Default ``noise_factor``: a change must exceed this many combined IQRs to count.
DEFAULT_NOISE_FACTOR = 1.0
#: Default ``noise_rule`` (see Rules.noise_rule); calibrated in benchmarks/gate_calibrate.py.
DEFAULT_NOISE_RULE = "beyond"


class Direction(str, Enum):
    """Which changes count against a metric."""

    WORSE = "worse"  # only a change in the bad direction (slower, bigger, a worse label)
    ANY = "any"  # a change either way


@dataclass(frozen=True)
class Rule:
    """The tolerance of one metric. Thresholds are *exceeded* only when the change is beyond every
    one given in a tier (like ``math.isclose``: ``abs`` is a floor under ``rel``).

    ``abs``/``warn_abs`` are in the metric's unit (percentage points for ``*_pct``, ms for times,
    MB for memory); ``rel``/``warn_rel`` in percent of the base value. A rule with no threshold
    at all makes an informational row that never gates (labels are gated by ``direction``).
    """

    abs: float | None = None
    rel: float | None = None
    warn_abs: float | None = None
    warn_rel: float | None = None
    direction: Direction = Direction.WORSE
    fail: bool | None = None  # None: yes, except host-clock times (see compare.py)
    skip: bool = False

    @property
    def has_fail_tier(self) -> bool:
        return self.abs is not None or self.rel is not None

    @property
    def has_warn_tier(self) -> bool:
        return self.warn_abs is not None or self.warn_rel is not None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["direction"] = self.direction.value
        return {k: v for k, v in out.items() if v is not None}


_RULE_FIELDS = frozenset(f.name for f in fields(Rule))

#: The defaults, tuned for noisy shared CPU runners (docs/gate.md explains each one).
DEFAULT_TOLERANCES: tuple[tuple[str, Mapping[str, Any]], ...] = (
    ("step_time.diagnosis", {"direction": "worse"}),
    ("step_time.*_pct", {"abs": 5.0, "warn_abs": 3.0, "direction": "worse"}),
    ("step_time.step_ms.median", {"rel": 25.0, "warn_rel": 10.0, "direction": "worse"}),
    ("step_memory.diagnosis", {"direction": "worse"}),
    # On a host clock the warn tier is dropped (gate/judging.py): a job's peak RSS moved +5 %
    # and 8 MB between unchanged runs on a loaded runner (benchmarks/cisuite).
    (
        "step_memory.peak_*_mb",
        {"rel": 10.0, "abs": 16.0, "warn_rel": 5.0, "warn_abs": 8.0, "direction": "worse"},
    ),
    ("distributed.straggler.label", {"direction": "worse"}),
    ("distributed.straggler.score_pct", {"abs": 15.0, "warn_abs": 8.0, "direction": "worse"}),
)


@dataclass(frozen=True)
class Rules:
    """Tolerance patterns, in order (defaults first), and the noise factor.

    ``source`` says where they came from, for reports ("defaults", a file name).
    """

    tolerances: tuple[tuple[str, Mapping[str, Any]], ...] = DEFAULT_TOLERANCES
    noise_factor: float = DEFAULT_NOISE_FACTOR
    source: str = "defaults"
    #: "beyond": the change must pass the tolerance and, separately, exceed the noise (asv's
    #: effect size and significance); "margin": the change less the noise must pass the
    #: tolerance (stricter: fewer false alarms, less power).
    noise_rule: str = DEFAULT_NOISE_RULE
    #: Whether runs of different world sizes (distributed ranks) are compared at all; by
    #: default they are incomparable: every share and time means something else.
    allow_world_size_change: bool = False
    _cache: dict[str, Rule] = field(default_factory=dict, repr=False, compare=False)

    def rule_for(self, metric: str) -> Rule:
        """The merged rule of one metric name."""
        rule = self._cache.get(metric)
        if rule is None:
            rule = Rule()
            for pattern, overrides in self.tolerances:
                if fnmatchcase(metric, pattern):
                    rule = replace(rule, **_without_stale_warn(rule, _coerce(overrides)))
            self._cache[metric] = rule
        return rule

    def with_tolerances(
        self,
        tolerances: Mapping[str, Mapping[str, Any]],
        *,
        noise_factor: float | None = None,
        noise_rule: str | None = None,
        source: str | None = None,
    ) -> Rules:
        """These rules with more patterns on top (validated like a rules file)."""
        doc: dict[str, Any] = {"tolerances": {k: dict(v) for k, v in tolerances.items()}}
        if noise_factor is not None:
            doc["noise_factor"] = noise_factor
        if noise_rule is not None:
            doc["noise_rule"] = noise_rule
        problem = rules_problem(doc)
        if problem:
            raise InputError(source, f"invalid rules: {problem}")
        return Rules(
            tolerances=self.tolerances + tuple((k, dict(v)) for k, v in tolerances.items()),
            noise_factor=self.noise_factor if noise_factor is None else float(noise_factor),
            source=source or self.source,
            noise_rule=noise_rule or self.noise_rule,
            allow_world_size_change=self.allow_world_size_change,
        )


def _coerce(overrides: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(overrides)
    if "direction" in out:
        out["direction"] = Direction(out["direction"])
    for key in ("abs", "rel", "warn_abs", "warn_rel"):
        if key in out:
            out[key] = float(out[key])
    return out


DEFAULT_RULES = Rules()


def _without_stale_warn(rule: Rule, overrides: dict[str, Any]) -> dict[str, Any]:
    """A pattern that tightens a fail tier below the warn tier it inherits drops that warn tier
    (``"step_time.*_pct" = {abs = 2.0}`` under the default warn of 3 pp): a warn tier above the
    fail tier could never fire, and would blur what "improved" means."""
    out = dict(overrides)
    for fail_key, warn_key in (("abs", "warn_abs"), ("rel", "warn_rel")):
        inherited = getattr(rule, warn_key)
        new_fail = out.get(fail_key)
        stale = inherited is not None and new_fail is not None and inherited >= new_fail
        if warn_key not in out and stale:
            out[warn_key] = None
    return out


def rules_problem(doc: Any) -> str | None:
    """The first problem of a rules document, as 'JSON-PATH: reason'; None when valid."""
    from traceml_ci.summary.schema import document_problems

    if not isinstance(doc, Mapping):
        return f"$: expected a table, got {type(doc).__name__}"
    problems = document_problems(dict(doc), RULES_SCHEMA)
    if problems:
        path, message = problems[0].path, problems[0].message
        if message.startswith("unknown key") and path == "$":
            message += f" (allowed: {', '.join(RULES_KEYS)})"
        elif message.startswith("unknown key"):
            message += f" (allowed: {', '.join(sorted(_RULE_FIELDS))})"
        return f"{path}: {message}"
    nf = doc.get("noise_factor")
    if nf is not None and not math.isfinite(nf):
        return f"$.noise_factor: {nf} is not a finite number"
    for pattern, rule in (doc.get("tolerances") or {}).items():
        where = f"$.tolerances[{json.dumps(pattern)}]"
        for key in ("abs", "rel", "warn_abs", "warn_rel"):
            value = rule.get(key)
            if value is not None and not math.isfinite(value):
                return f"{where}.{key}: {value} is not a finite number"
        if not any(fnmatchcase(name, pattern) for name in METRIC_NAMES):
            return f"{where}: pattern matches no metric (metrics: {', '.join(METRIC_NAMES)})"
        for unit in ("abs", "rel"):
            warn, fail = rule.get(f"warn_{unit}"), rule.get(unit)
            if warn is not None and fail is not None and warn > fail:
                return (
                    f"{where}: warn_{unit} {warn:g} is above {unit} {fail:g}; "
                    "the warn tier must be the smaller"
                )
    return None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise InputError(
                str(path), "reading TOML on Python 3.10 needs the 'tomli' package"
            ) from None
    from traceml_ci.summary.io import read_text

    text = read_text(path, MAX_RULES_BYTES)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(str(path), f"not valid TOML: {' '.join(str(exc).split())}") from None


def _from_doc(doc: Mapping[str, Any], source: str, path: str) -> Rules:
    problem = rules_problem(doc)
    if problem:
        raise InputError(path, f"invalid rules: {problem}")
    tolerances = tuple((k, dict(v)) for k, v in (doc.get("tolerances") or {}).items())
    nf = doc.get("noise_factor")
    return Rules(
        tolerances=DEFAULT_TOLERANCES + tolerances,
        noise_factor=DEFAULT_NOISE_FACTOR if nf is None else float(nf),
        source=source,
        noise_rule=doc.get("noise_rule", DEFAULT_NOISE_RULE),
        allow_world_size_change=bool(doc.get("allow_world_size_change", False)),
    )


_TOOL_TABLE = re.compile(r"""tool\s*\.\s*["']?traceml-ci|^\s*\[\s*tool\s*\]""", re.M)


def _may_have_tool_table(path: Path) -> bool:
    """A cheap look before parsing: most pyproject.toml files have no [tool.traceml-ci] table,
    and ``traceml-ci diff`` should not pay for a TOML parser to learn that."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True  # let _read_toml report the problem
    return bool(_TOOL_TABLE.search(text))


def _tool_table(doc: Mapping[str, Any]) -> Mapping[str, Any] | None:
    tool = doc.get("tool")
    if isinstance(tool, Mapping) and isinstance(tool.get(PYPROJECT_TABLE), Mapping):
        return tool[PYPROJECT_TABLE]
    return None


def load_rules(
    path: str | os.PathLike[str] | None = None,
    *,
    pyproject: str | os.PathLike[str] | None = None,
) -> Rules:
    """Rules from a TOML file (``--tolerances``), else from ``[tool.traceml-ci]`` of a
    pyproject.toml, else the defaults. Raises InputError naming the file for any problem.

    A rules file holds ``noise_factor`` and ``[tolerances]`` at its top level and nothing else;
    a file with a ``[tool.traceml-ci]`` table (a pyproject.toml) is read like ``pyproject``.
    Every key of ``[tool.traceml-ci]`` is the gate's: an unknown one (a typo such as
    ``noise_factr``, or a ``[tool.traceml-ci.tolerance]`` table) is an error, as in a rules
    file, never silently ignored.
    """
    if path is not None:
        p = Path(path)
        doc = _read_toml(p)
        table = _tool_table(doc)
        if table is not None:
            return _from_doc(table, f"{p} [tool.{PYPROJECT_TABLE}]", str(p))
        return _from_doc(doc, str(p), str(p))
    if pyproject is not None:
        p = Path(pyproject)
        if not _may_have_tool_table(p):
            return DEFAULT_RULES
        table = _tool_table(_read_toml(p))
        if not table:
            return DEFAULT_RULES
        return _from_doc(table, f"{p} [tool.{PYPROJECT_TABLE}]", str(p))
    return DEFAULT_RULES


def describe(rules: Rules, names: Iterable[str] = METRIC_NAMES) -> dict[str, dict[str, Any]]:
    """The merged rule of each metric name, as plain dicts (for docs and ``--json``)."""
    return {name: rules.rule_for(name).to_dict() for name in names}


def resolve_rules(path: str | os.PathLike[str] | None = None) -> Rules:
    """The rules a command line means: the ``--tolerances`` file if given, else the nearest
    pyproject.toml's ``[tool.traceml-ci]``, else the defaults."""
    if path is not None:
        return load_rules(path)
    pyproject = find_pyproject()
    return load_rules(pyproject=pyproject) if pyproject is not None else load_rules()
