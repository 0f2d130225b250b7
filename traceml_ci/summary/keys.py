"""The summary's constants, free of dataclasses and enums: cheap to import for the gate's CLI,
whose whole run (start-up included) has a 0.25 s budget."""

SCHEMA_VERSION = "1.0"
TOOL_NAME = "traceml-ci"

#: The five phases a step is split into, in display order. ``other`` is the rest of the step.
PHASES: tuple[str, ...] = ("dataloader", "forward", "backward", "optimizer", "other")

#: Where a run's files go unless told otherwise, and the summary's file name in that folder.
DEFAULT_OUT_DIR = "traceml-out"
SUMMARY_FILENAME = "final_summary.json"
#: Steps counted but left out of the statistics (compilation, allocator warm-up, first batches).
DEFAULT_WARMUP_STEPS = 5
#: The environment variable naming the output folder (users set it; launchers may too).
ENV_OUT = "TRACEML_CI_OUT"
