"""``traceml-ci show FILE_OR_DIR``: a summary, readably, in the terminal.

Every string taken from the summary goes through ``fmt.plain`` (gate/fmt.py): a crafted run
name can neither start a CI workflow command nor move the cursor, nor crash the output.
"""

from __future__ import annotations

import argparse
from typing import Any

from traceml_ci.cli.options import MIN_WIDTH, width
from traceml_ci.summary.keys import SUMMARY_FILENAME

BAR_WIDTH = 30
SEVERITY_STYLE = {"info": "green", "warn": "yellow", "crit": "bold red"}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "show",
        help="print a summary readably",
        description="Print a final_summary.json (or the one in a run's output folder): the "
        "step-time split, memory and diagnoses.",
    )
    p.add_argument("file", metavar="FILE_OR_DIR",
                   help=f"a summary, or a folder holding {SUMMARY_FILENAME}")
    p.add_argument("--width", type=width(), default=None, metavar="N",
                   help=f"terminal width, at least {MIN_WIDTH} (default: detected)")
    p.set_defaults(func=run)


def _between_lines(step_time: Any) -> list[Any]:
    """Time between steps (evaluation's part where a callback saw it), if measured."""
    from rich.text import Text

    from traceml_ci.summary.view import finite

    b = step_time.get("between_steps") if isinstance(step_time, dict) else None
    if not isinstance(b, dict):
        return []
    wall, between, pct = (
        finite(b.get("wall_s")),
        finite(b.get("between_s")),
        finite(b.get("between_pct")),
    )
    if wall is None or between is None or pct is None:
        return []
    line = f"between steps: {between:.2f} s of {wall:.2f} s after warmup ({pct:.1f} %)"
    eval_s, eval_pct, evals = finite(b.get("eval_s")), finite(b.get("eval_pct")), b.get("evals")
    if eval_s is not None and eval_pct is not None:
        count = f", {evals} evaluation{'s' if evals != 1 else ''}" if isinstance(evals, int) else ""
        line += f", evaluation {eval_s:.2f} s ({eval_pct:.1f} %{count})"
    return [Text(line + "; not in steps/s or samples/s", style="dim")]


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

    from traceml_ci.gate.fmt import plain
    from traceml_ci.summary.view import SummaryView

    v = SummaryView(doc)
    env = v.env
    device = plain(env.get("device_type"))
    if env.get("device_name"):
        device += " " + plain(env["device_name"])
    head = Text.assemble(
        (plain(v.run_name), "bold"),
        f" · {plain(v.run_status)} · {v.steps_analyzed} steps analysed "
        + (f"(the last of {v.steps_total}, from the live snapshot: killed before it wrote "
           "its summary) " if v.recovered else "")
        + f"(+{v.warmup_steps} warmup) · {device} · clock {plain(v.clock)}",
    )
    times = Table(title="Step time", title_justify="left", show_edge=False, expand=False)
    times.add_column("phase")
    times.add_column("share", justify="right")
    # The share is a ratio of summed (trimmed) times, i.e. of means: its ms column is the mean.
    # The median is shown apart, labelled: with steps that alternate between waiting and not,
    # a phase can take 95 % of the time with a median of almost nothing.
    times.add_column("mean ms", justify="right")
    times.add_column("median ms", justify="right")
    times.add_column("noise ±pp", justify="right")
    times.add_column("")
    step_mean = v.step_ms("mean")
    for phase in v.phases:
        pct = v.share(phase)
        bar = "█" * round((pct or 0) / 100 * BAR_WIDTH)
        spread = v.share_noise(phase)
        mean_ms = pct / 100.0 * step_mean if pct is not None and step_mean is not None else None
        times.add_row(
            phase,
            _fmt(pct, "%"),
            _fmt(mean_ms, digits=2),
            _fmt(v.phase_ms(phase), digits=2),
            _fmt(spread, digits=2) if spread is not None else "",
            Text(bar, style="cyan"),
        )
    # A line of its own: as the table's caption it would wrap at the table's width.
    samples = v.samples_per_s
    step_line = Text(
        f"step {_fmt(v.step_ms('mean'), ' ms', 2)} mean, {_fmt(v.step_ms('median'), ' ms', 2)} "
        f"median (p10 {_fmt(v.step_ms('p10'), '', 2)}, p90 {_fmt(v.step_ms('p90'), '', 2)}) · "
        f"{_fmt(v.steps_per_s, ' steps/s')}"
        + (f" · {_fmt(samples, ' samples/s')}" if samples else "")
        + "\nshare = that phase's part of the summed step time (outliers left out); "
        "mean ms = share × mean step",
        style="dim",
    )
    # A distributed job: its ranks first, then the split of the rank that heads the summary.
    ranks = _ranks(doc.get("distributed"))
    parts: list[Any] = [head, *ranks, Text(""), times, step_line]
    parts += _between_lines(doc.get("step_time"))
    eff = v.efficiency
    if eff and isinstance(eff.get("not_counted"), str):
        parts.append(Text(f"compute: FLOPs not counted ({plain(eff['not_counted'])})", style="dim"))
    elif eff:
        from traceml_ci.gate.fmt import value

        mfu = eff.get("mfu_pct")
        parts.append(Text(
            f"compute: {value(eff.get('flops_per_step'), 'FLOP')} per step "
            f"({plain(eff.get('dtype') or '?')}) · achieved "
            f"{value(eff.get('achieved_tflops'), 'TFLOP/s')}"
            + (f" · MFU {mfu:.1f} %" if mfu is not None else ""),
            style="dim"))
    parts += _module_lines(doc.get("modules"))
    wait = v.runqueue_wait_pct
    if wait is not None:
        parts.append(
            Text(
                f"CPU contention: main thread waited for a CPU {wait:.1f} % of the time",
                style="dim",
            )
        )
    memory = Table(title="Memory", title_justify="left", show_edge=False, show_header=False)
    memory.add_column("what")
    memory.add_column("value", justify="right")
    memory.add_row("device", plain(v.memory_device))
    memory.add_row("peak allocated", _fmt(v.memory_mb("peak_allocated_mb"), " MB"))
    memory.add_row("peak reserved", _fmt(v.memory_mb("peak_reserved_mb"), " MB"))
    memory.add_row("peak RSS", _fmt(v.memory_mb("peak_rss_mb"), " MB"))
    basis = plain(v.growth_basis or "n/a")
    memory.add_row(f"growth ({basis})", _fmt(v.growth_mb_per_1k_steps, " MB/1k steps", 2))
    verdicts = []
    for d in v.diagnoses:
        style = SEVERITY_STYLE.get(d.get("severity", ""), "")
        verdicts.append(
            Text.assemble((plain(d.get("kind", "")), style), f"  {plain(d.get('message', ''))}")
        )
        verdicts.append(Text(f"  → {plain(d.get('next_step', ''))}", style="dim"))
    title = f"traceml-ci · {plain(v.label('step_time'))} · memory {plain(v.label('step_memory'))}"
    body = Group(*parts, Text(""), memory, Text(""), *verdicts)
    return Panel(body, title=title)


def _ranks(block: Any) -> list[Any]:
    """The per-rank table and the straggler line of a distributed summary; empty otherwise."""
    from collections.abc import Mapping

    from rich import box
    from rich.table import Table
    from rich.text import Text

    from traceml_ci.gate.fmt import plain
    from traceml_ci.gate.render.ranks import headline_line, rank_headers, rank_rows, straggler_line

    if not isinstance(block, Mapping):
        return []
    where = ", ".join(
        plain(x)
        for x in (
            f"{block.get('world_size', '?')} ranks",
            f"{block.get('nodes') or '?'} node(s)",
            block.get("backend") or "backend ?",
        )
    )
    headers = rank_headers(block, short=True)
    # Thirteen columns (fourteen with wait): no boxes, one space between them, to fit 100.
    table = Table(
        title=f"Ranks ({where})",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
    )
    for i, name in enumerate(headers[:-1]):  # rank, node and figures to the right
        table.add_column(
            name,
            justify="right" if i in (0, 1) or 4 <= i < len(headers) - 1 else "left",
            no_wrap=i != 2,
            min_width=8 if i == 2 else None,
        )
    for row in rank_rows(block):
        marked = bool(row.pop())  # the straggler: an arrow by its rank, in colour
        row[0] = f"▶ {row[0]}" if marked else row[0]
        table.add_row(*(plain(x) for x in row), style="bold yellow" if marked else None)
    out: list[Any] = [Text(""), table]
    if block.get("ranks_not_listed"):
        out.append(
            Text(
                f"…and {plain(block['ranks_not_listed'])} more ranks (quantiles in the summary)",
                style="dim",
            )
        )
    # The straggler's next step is among the diagnoses below.
    style = "bold yellow" if (block.get("straggler") or {}).get("rank") is not None else "green"
    out.append(Text(plain(straggler_line(block)), style=style))
    if headline_line(block):
        out.append(Text(plain(headline_line(block)), style="dim"))
    return out


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from traceml_ci.cli.output import stdout_console
    from traceml_ci.fsutil import is_dir
    from traceml_ci.summary.io import load_summary

    path = Path(args.file)
    if is_dir(path):
        path = path / SUMMARY_FILENAME
    doc = load_summary(path)
    stdout_console(width=args.width).print(render(doc))
    return 0


def _module_lines(mods: Any) -> list[Any]:
    """The five slowest sampled modules of forward and of backward, or why none were sampled."""
    from rich.text import Text

    from traceml_ci.gate.fmt import plain
    from traceml_ci.summary.view import module_label

    if not isinstance(mods, dict):
        return []
    if isinstance(mods.get("off"), str):
        return [Text(f"modules: not sampled ({plain(mods['off'])})", style="dim")]
    lines = []
    for phase, steps in (("forward", "sampled_steps"), ("backward", "backward_steps")):
        rows = mods.get(phase)
        if not isinstance(rows, list) or not rows:
            continue
        top = ", ".join(
            f"{plain(module_label(m))} {_fmt(m.get('share_pct'), '%')}"
            for m in rows[:5]
            if isinstance(m, dict)
        )
        lines.append(
            Text(
                f"{phase} by module ({mods.get(steps)} sampled steps, inclusive): {top}",
                style="dim",
            )
        )
    return lines
