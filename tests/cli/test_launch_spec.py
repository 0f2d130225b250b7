"""The launch spec: what `traceml-ci run` and the plugin hand the child, as one JSON value."""

from __future__ import annotations

from pathlib import Path

from traceml_ci.tracer.bootstrap import _config
from traceml_ci.tracer.launch import LaunchSpec


def test_the_spec_crosses_as_json_and_comes_back_equal() -> None:
    spec = LaunchSpec("train.py", ("--lr", "0.1"), out_dir="o", run_name="r", warmup_steps=0)
    assert LaunchSpec.from_json(spec.to_json()) == spec


def test_only_what_the_launcher_was_given_is_locked() -> None:
    assert LaunchSpec("t.py").locked == frozenset()
    spec = LaunchSpec("t.py", out_dir="o", warmup_steps=0, max_steps=9)
    assert spec.locked == {"out_dir", "warmup_steps", "max_steps"}
    config = _config(spec)  # the child's tracer settings, read from the spec alone
    assert (config.out_dir, config.warmup_steps, config.max_steps) == (Path("o"), 0, 9)
    assert config.locked == spec.locked
    assert config.run_name == "t"


def test_names_and_paths() -> None:
    assert LaunchSpec("a/b/train.py").name == "train"
    assert LaunchSpec("pkg.sub.train", module=True).name == "train"
    assert LaunchSpec("t.py", run_name="x").name == "x"
    assert LaunchSpec("t.py").summary_path == Path("traceml-out/final_summary.json")
    assert LaunchSpec("t.py", default_out_dir="env").summary_path == Path("env/final_summary.json")
    assert LaunchSpec("t.py", out_dir="o", default_out_dir="env").out == Path("o")
