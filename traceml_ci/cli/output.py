"""The rich console every command prints to stdout through (``show``, ``watch``).

rich's own answer to a closed pipe (``traceml-ci show x.json | head -1``) is ``SystemExit(1)``,
which would read as a regression (main() reports it as an internal error rather); here it is
the BrokenPipeError main() turns into 141, like any other write to a closed stdout."""

from __future__ import annotations

from typing import Any


def stdout_console(**options: Any) -> Any:
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True  # nothing more is written
            raise BrokenPipeError("stdout was closed")

    return _Console(**options)
