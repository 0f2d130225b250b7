"""traceml-ci's pytest plugin: trace training smoke tests and gate them on a baseline.

Registered through the ``pytest11`` entry point (``pytest_plugin.plugin``), so installing
traceml-ci activates it; it does nothing until a test carries ``@pytest.mark.traceml`` or uses
the ``traceml`` fixture. See docs/pytest-plugin.md.
"""
