"""Front door: the ``traceml-ci`` command. Thin wiring over the tracer, summary and gate layers."""
