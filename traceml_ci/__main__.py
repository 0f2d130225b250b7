"""``python -m traceml_ci``: the ``traceml-ci`` command, for when its script is not on PATH."""

from traceml_ci.cli.main import entry

entry()
