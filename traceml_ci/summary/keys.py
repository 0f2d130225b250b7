"""The summary's constants, free of dataclasses and enums: cheap to import for the gate's CLI,
whose whole run (start-up included) has a 0.25 s budget."""

SCHEMA_VERSION = "1.0"
TOOL_NAME = "traceml-ci"

#: The five phases a step is split into, in display order. ``other`` is the rest of the step.
PHASES: tuple[str, ...] = ("dataloader", "forward", "backward", "optimizer", "other")
