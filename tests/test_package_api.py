"""``import traceml_ci as traceml``: the tracing API loads on first use and is then a plain
global of the package, since ``traceml.trace_step`` is looked up on every step."""

from __future__ import annotations

import pytest

import traceml_ci
from traceml_ci.tracer import api


@pytest.mark.parametrize("name", ["init", "trace_step", "phase", "wrap_dataloader", "finish"])
def test_the_api_is_the_tracers_and_a_global_once_used(name: str) -> None:
    assert getattr(traceml_ci, name) is getattr(api, name)
    assert vars(traceml_ci)[name] is getattr(api, name)  # no module __getattr__ after this


def test_other_names_are_attribute_errors() -> None:
    with pytest.raises(AttributeError, match="no attribute 'tracer_step'"):
        traceml_ci.tracer_step  # noqa: B018
