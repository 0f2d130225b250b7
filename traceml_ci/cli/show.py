"""``traceml-ci show FILE``: a summary, readably, in the terminal."""

from __future__ import annotations

import argparse
from typing import Any

BAR_WIDTH = 30
SEVERITY_STYLE = {"info": "green", "warn": "yellow", "crit": "bold red"}
PHASES = ("dataloader", "forward", "backward", "optimizer", "other")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "show",
        help="print a summary readably",
        description="Print a final_summary.json: the step-time split, memory and diagnoses.",
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument("--width", type=int, default=None, help="terminal width (default: detected)")
    p.set_defaults(func=run)


def _fmt(value: Any, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}{unit}"


def render(doc: dict[str, Any]) -> Any:
    """A rich renderable for a summary document (validated beforehand)."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    run, st, mem = doc["run"], doc["step_time"], doc["step_memory"]
    env = doc["env"]
    head = Text.assemble(
        (f"{run['name']}", "bold"),
        f" · {run['status']} · {st['steps_analyzed']} steps analysed "
        f"(+{st['warmup_steps']} warmup) · {env['device_type']}"
        f"{' ' + env['device_name'] if env.get('device_name') else ''} · clock {st['clock']}",
    )
    times = Table(title="Step time", title_justify="left", show_edge=False, expand=False)
    times.add_column("phase")
    times.add_column("share", justify="right")
    times.add_column("median ms", justify="right")
    times.add_column("noise ±pp", justify="right")
    times.add_column("")
    noise = (st.get("noise") or {}).get("pct", {})
    for phase in PHASES:
        pct = st.get(f"{phase}_pct")
        bar = "█" * round((pct or 0) / 100 * BAR_WIDTH)
        spread = noise.get(phase, {}).get("iqr")
        times.add_row(
            phase,
            _fmt(pct, "%"),
            _fmt(st["phase_ms"].get(phase), digits=2),
            _fmt(spread, digits=2) if spread is not None else "",
            Text(bar, style="cyan"),
        )
    step_ms, tput = st["step_ms"], st["throughput"]
    # A line of its own: as the table's caption it would wrap at the table's width.
    step_line = Text(
        f"step {_fmt(step_ms['median'], ' ms', 2)} median "
        f"(p10 {_fmt(step_ms['p10'], '', 2)}, p90 {_fmt(step_ms['p90'], '', 2)}) · "
        f"{_fmt(tput['steps_per_s'], ' steps/s')}"
        + (f" · {_fmt(tput['samples_per_s'], ' samples/s')}" if tput.get("samples_per_s") else ""),
        style="dim",
    )
    memory = Table(title="Memory", title_justify="left", show_edge=False, show_header=False)
    memory.add_column("what")
    memory.add_column("value", justify="right")
    memory.add_row("device", mem["device"])
    memory.add_row("peak allocated", _fmt(mem["peak_allocated_mb"], " MB"))
    memory.add_row("peak reserved", _fmt(mem["peak_reserved_mb"], " MB"))
    memory.add_row("peak RSS", _fmt(mem["peak_rss_mb"], " MB"))
    growth = mem.get("growth_mb_per_1k_steps")
    memory.add_row(f"growth ({mem.get('growth_basis') or 'n/a'})", _fmt(growth, " MB/1k steps", 2))
    verdicts = []
    for d in doc.get("diagnoses", []):
        style = SEVERITY_STYLE.get(d["severity"], "")
        verdicts.append(Text.assemble((f"{d['kind']}", style), f"  {d['message']}"))
        verdicts.append(Text(f"  → {d['next_step']}", style="dim"))
    title = f"traceml-ci · {st['diagnosis']} · memory {mem['diagnosis']}"
    body = Group(head, Text(""), times, step_line, Text(""), memory, Text(""), *verdicts)
    return Panel(body, title=title)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from traceml_ci.summary.io import load_summary

    doc = load_summary(args.file)
    Console(width=args.width).print(render(doc))
    return 0
