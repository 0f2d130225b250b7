"""The HTML report: one self-contained file of charts (inline SVG from matplotlib) and tables.

Why matplotlib's SVG, inlined: the page needs no script and no network at view time (its
Content-Security-Policy forbids both), and a chart costs tens of kilobytes, where plotly's
inlined JavaScript alone is about 4 MB per file. matplotlib (the ``report`` extra) is imported
only here, inside the functions that draw, so ``traceml-ci diff`` never loads it.

Everything taken from input goes through ``fmt.plain`` (controls, bidirectional overrides) and
then ``html.escape``; chart text is SVG text that matplotlib escapes, with mathtext off (a
``$`` in a run name stays a dollar sign).
"""

from __future__ import annotations

import html
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from traceml_ci._version import __version__
from traceml_ci.gate import causes, fmt
from traceml_ci.gate.compare import Comparison, SetComparison, Status, Verdict
from traceml_ci.gate.render.chart import phase_colour
from traceml_ci.gate.render.comparison import shown_causes
from traceml_ci.summary.keys import phase_union
from traceml_ci.summary.view import SummaryView

#: Memory peaks drawn when recorded, with their labels.
MEMORY_KEYS = {"peak_rss_mb": "peak RSS", "peak_allocated_mb": "peak allocated",
               "peak_reserved_mb": "peak reserved"}
#: Jobs of a set drawn in full; the others are listed by name only (a file stays small).
MAX_SECTIONS = 40
_SEVERITY_CLASS = {"info": "ok", "warn": "warn", "crit": "bad"}
_STATUS_CLASS = {Status.REGRESSED: "bad", Status.WARN: "warn", Status.MISSING: "warn",
                 Status.IMPROVED: "ok", Status.NEW: "", Status.OK: ""}
_VERDICT_CLASS = {Verdict.PASS: "ok", Verdict.WARN: "warn", Verdict.REGRESSION: "bad",
                  Verdict.INCOMPARABLE: "warn"}

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;
max-width:1100px;padding:0 16px;color:#1b1f24}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #d0d7de;padding-bottom:4px;
margin-top:32px}h3{font-size:15px;margin:16px 0 6px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #d0d7de;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#f6f8fa}
.meta{color:#57606a}.side{display:flex;gap:16px;flex-wrap:wrap}.side>div{flex:1;min-width:320px}
.chart svg{max-width:100%;height:auto}
.bad{color:#cf222e;font-weight:600}.warn{color:#9a6700}.ok{color:#1a7f37}
"""
#: Jobs of a set are drawn worst first.
_ORDER = {Verdict.REGRESSION: 0, Verdict.INCOMPARABLE: 1, Verdict.WARN: 2, Verdict.PASS: 3}
#: No script, no network: only inline styles and inline SVG.
_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


@dataclass(frozen=True)
class Run:
    """One summary to draw: a label (run name or job key), where it came from, the document."""

    label: str
    source: str
    doc: Mapping[str, Any]

    @property
    def view(self) -> SummaryView:
        return SummaryView(self.doc)


# --- charts (matplotlib, imported here only) -----------------------------------------------


class _Charts:
    """Draws figures to SVG text; each figure gets its own id salt, so the clip-path ids of
    several SVGs inlined in one page never collide."""

    def __init__(self) -> None:
        import matplotlib

        matplotlib.use("Agg", force=True)
        self.count = 0

    def _svg(self, fig: Any) -> str:
        import matplotlib.pyplot as plt

        self.count += 1
        buf = io.StringIO()
        with _rc(hashsalt=f"traceml-ci-{self.count}"):
            fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
        plt.close(fig)
        text = buf.getvalue()
        return text[text.index("<svg"):]  # drop the XML prolog and doctype: inline in HTML

    def splits(self, bars: Sequence[tuple[str, Mapping[str, float | None]]]) -> str | None:
        """Stacked horizontal bars of the phase shares, one per (label, shares): each of the
        phases its summary has (a phase another bar has is 0 there)."""
        rows = [(name, s) for name, s in bars if s and all(v is not None for v in s.values())]
        if not rows:
            return None
        phases = phase_union(*(s for _, s in rows))
        with _rc():
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(8, 0.55 * len(rows) + 1.1))
            ys = range(len(rows))  # positions, not category names: equal names stay apart
            left = [0.0] * len(rows)
            for phase in phases:
                widths = [float(s.get(phase) or 0.0) for _, s in rows]
                ax.barh(ys, widths, left=left, color=phase_colour(phase), label=phase)
                left = [a + b for a, b in zip(left, widths, strict=True)]
            ax.set_yticks(ys, [_short(name) for name, _ in rows])
            ax.set_xlim(0, max(100.0, *left))
            ax.invert_yaxis()
            ax.set_xlabel("% of step time")
            ax.legend(ncol=len(phases), loc="lower center", bbox_to_anchor=(0.5, 1.0),
                      frameon=False)
            return self._svg(fig)

    def steps(self, runs: Sequence[tuple[str, SummaryView]]) -> str | None:
        """Step time distribution: p10 to p90 as a bar, the median and the mean as marks."""
        rows = [(name, v) for name, v in runs if v.step_ms("median") is not None]
        if not rows:
            return None
        with _rc():
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(8, 0.55 * len(rows) + 1.1))
            for i, (_, v) in enumerate(rows):
                lo, hi = v.step_ms("p10"), v.step_ms("p90")
                if lo is not None and hi is not None:
                    ax.barh(i, hi - lo, left=lo, height=0.5, color="#c8d7e6",
                            label="p10–p90" if i == 0 else None)
                ax.plot(v.step_ms("median"), i, "|", color="#1f77b4", markersize=18,
                        markeredgewidth=3, label="median" if i == 0 else None)
                if v.step_ms("mean") is not None:
                    ax.plot(v.step_ms("mean"), i, "o", color="#d62728", markersize=5,
                            label="mean" if i == 0 else None)
            ax.set_yticks(range(len(rows)), [_short(name) for name, _ in rows])
            ax.invert_yaxis()
            ax.set_xlabel("step time (ms)")
            ax.set_xlim(left=0)
            ax.legend(ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
            return self._svg(fig)

    def memory(self, runs: Sequence[tuple[str, SummaryView]]) -> str | None:
        """The memory peaks recorded (RSS, allocated, reserved), grouped per run."""
        keys = [k for k in MEMORY_KEYS if any(v.memory_mb(k) is not None for _, v in runs)]
        if not keys:
            return None
        with _rc():
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(8, 0.45 * len(runs) * len(keys) + 1.1))
            height = 0.8 / len(keys)
            colours = ("#6e7781", "#1f77b4", "#ff7f0e")
            for j, key in enumerate(keys):
                ys = [i + j * height for i in range(len(runs))]
                xs = [v.memory_mb(key) or 0.0 for _, v in runs]
                ax.barh(ys, xs, height=height, color=colours[j], label=MEMORY_KEYS[key])
            ax.set_yticks([i + height * (len(keys) - 1) / 2 for i in range(len(runs))],
                          [_short(name) for name, _ in runs])
            ax.invert_yaxis()
            ax.set_xlabel("MB")
            ax.legend(ncol=len(keys), loc="lower center", bbox_to_anchor=(0.5, 1.0),
                      frameon=False)
            return self._svg(fig)

    def trend(self, runs: Sequence[Run]) -> str | None:
        """Over many runs, in order: each phase's share, and the step time (median, p10–p90)."""
        with _rc():
            import matplotlib.pyplot as plt

            fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
            xs = list(range(len(runs)))
            phases = phase_union(*(r.view.phases for r in runs))
            for phase in phases:
                ys = [r.view.share(phase) for r in runs]
                top.plot(xs, [y if y is not None else float("nan") for y in ys], marker="o",
                         markersize=3, color=phase_colour(phase), label=phase)
            top.set_ylabel("% of step time")
            top.set_ylim(0, 100)
            top.legend(ncol=len(phases), loc="lower center", bbox_to_anchor=(0.5, 1.0),
                       frameon=False)

            def series(stat: str) -> list[float]:
                return [_nan(r.view.step_ms(stat)) for r in runs]

            bottom.fill_between(xs, series("p10"), series("p90"), color="#c8d7e6",
                                label="p10–p90")
            bottom.plot(xs, series("median"), marker="o", markersize=3, color="#1f77b4",
                        label="median")
            bottom.set_ylabel("step time (ms)")
            bottom.set_ylim(bottom=0)
            bottom.legend(loc="upper left", frameon=False)
            step = max(1, len(runs) // 20)  # at most ~20 tick labels
            bottom.set_xticks(xs[::step], [_short(r.label, 18) for r in runs][::step],
                              rotation=30, ha="right")
            return self._svg(fig)


def _rc(**svg: str) -> Any:
    import matplotlib

    params: dict[str, Any] = {"svg.fonttype": "none",  # text stays text: smaller, selectable
                              "text.parse_math": False, "font.size": 10,
                              "axes.spines.top": False, "axes.spines.right": False}
    params.update({f"svg.{k}": v for k, v in svg.items()})
    return matplotlib.rc_context(params)


def _nan(x: float | None) -> float:
    return float("nan") if x is None else x


def _short(text: str, limit: int = 40) -> str:
    """A chart label: one line, no control or bidirectional characters (``fmt.plain``), cut."""
    text = fmt.plain(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- HTML ----------------------------------------------------------------------------------


def _e(x: Any) -> str:
    """Input as HTML text: controls and bidirectional overrides shown as escapes (they could
    reorder what is read), then HTML-escaped."""
    return html.escape(fmt.plain(x), quote=True)


def _figure(svg: str | None, what: str) -> str:
    if svg is None:
        return f'<p class="meta">No {_e(what)} recorded.</p>'
    return f'<div class="chart" role="img" aria-label="{_e(what)}">{svg}</div>'


def _meta(run: Run) -> str:
    v = run.view
    env = v.env
    device = " ".join(str(x) for x in (env.get("device_type"), env.get("device_name")) if x)
    bits = [f"<b>{_e(v.run_name or run.label)}</b>", _e(v.run_status or "?"),
            f"{_e(v.steps_analyzed if v.steps_analyzed is not None else '?')} steps analysed",
            _e(device or "device ?"), f"clock {_e(v.clock or '?')}",
            f"from {_e(run.source)}"]
    growth = v.growth_mb_per_1k_steps
    if growth is not None:
        bits.append(f"memory growth {growth:,.2f} MB per 1k steps "
                    f"({_e(v.growth_basis or '?')})")
    return '<p class="meta">' + " · ".join(bits) + "</p>"


def _diagnoses(run: Run) -> str:
    rows = []
    for d in run.view.diagnoses:
        cls = _SEVERITY_CLASS.get(str(d.get("severity")), "")
        rows.append(f'<tr><td class="{cls}">{_e(d.get("severity", ""))}</td>'
                    f"<td>{_e(d.get('area', ''))}</td><td>{_e(d.get('kind', ''))}</td>"
                    f"<td>{_e(d.get('message', ''))}<br><span class=\"meta\">"
                    f"{_e(d.get('next_step', ''))}</span></td></tr>")
    if not rows:
        return '<p class="meta">No diagnoses.</p>'
    return ("<table><tr><th>severity</th><th>area</th><th>diagnosis</th><th>what it means"
            "</th></tr>" + "".join(rows) + "</table>")


def _run_section(charts: _Charts, runs: Sequence[Run], heading: str) -> str:
    """One run, or base and head side by side: charts drawn together, text in columns."""
    pairs = [(r.label, r.view) for r in runs]
    parts = [f"<h2>{_e(heading)}</h2>"]
    parts += ['<div class="side">'] + [f"<div>{_meta(r)}</div>" for r in runs] + ["</div>"]
    parts += ["<h3>Where the step time goes</h3>",
              _figure(charts.splits([(r.label, r.view.shares()) for r in runs]), "phase split"),
              "<h3>Step time distribution</h3>", _figure(charts.steps(pairs), "step time"),
              "<h3>Memory</h3>", _figure(charts.memory(pairs), "memory peak"),
              "<h3>Diagnoses</h3>", '<div class="side">']
    parts += [f"<div>{'<b>' + _e(r.label) + '</b>' if len(runs) > 1 else ''}"
              f"{_diagnoses(r)}</div>" for r in runs]
    parts.append("</div>")
    return "\n".join(parts)


def _rows_table(c: Comparison) -> str:
    body = []
    for r in c.rows:
        if isinstance(r.base, str) or isinstance(r.head, str):
            delta = "changed" if r.base != r.head and None not in (r.base, r.head) else ""
        else:
            delta = fmt.delta(r.delta, r.delta_unit)
        note = f" — {_e(r.note)}" if r.note else ""
        body.append(f"<tr><td>{_e(r.name)}</td><td>{_e(fmt.value(r.base, r.unit))}</td>"
                    f"<td>{_e(fmt.value(r.head, r.unit))}</td><td>{_e(delta)}</td>"
                    f'<td class="{_STATUS_CLASS[r.status]}">{_e(r.status.value)}{note}</td>'
                    "</tr>")
    return ("<table><tr><th>metric</th><th>base</th><th>head</th><th>Δ</th><th>status</th>"
            "</tr>" + "".join(body) + "</table>")


def _causes(c: Comparison) -> str:
    """The comparison's causes (gate/causes.py), above its rows; empty when it names none."""
    shown = shown_causes(c)
    if not shown:
        return ""
    label = causes.label(len(shown), passed=c.verdict is Verdict.PASS).capitalize()
    items = "".join(f"<li>{_e(x)}</li>" for x in shown)
    return f"<p>{label}:</p><ul>{items}</ul>"


def _verdict(c: Comparison | SetComparison) -> str:
    return (f'<p>Verdict: <span class="{_VERDICT_CLASS[c.verdict]}">{_e(c.verdict.value)}'
            f"</span> · rules: {_e(c.rules_source)}</p>")


def build_html(runs: Sequence[Run], *, base: Sequence[Run] = (),
               comparison: Comparison | SetComparison | None = None,
               title: str = "traceml-ci report") -> str:
    """The report page. With ``comparison`` (and ``base``: for a set, matched to ``runs`` by
    job key): base and head side by side per run or job, and the comparison's rows.
    Otherwise each run on its own, with the trend of each share and of step time first when
    there are 3 or more.
    """
    charts = _Charts()
    body: list[str] = [f"<h1>{_e(title)}</h1>"]
    if comparison is not None:
        body.append(_verdict(comparison))
        if isinstance(comparison, Comparison):
            heading = f"{base[0].label} → {runs[0].label}" if base else runs[0].label
            pairs = [(base[0] if base else None, runs[0], comparison, heading)]
        else:
            by_label = {r.label: r for r in base}
            pairs = [(by_label.get(h.label), h, comparison.items.get(h.label), h.label)
                     for h in runs]
            pairs.sort(key=lambda p: _ORDER[p[2].verdict] if p[2] else len(_ORDER))
        for i, (b, h, item, heading) in enumerate(pairs):
            if i == MAX_SECTIONS:
                body.append(f"<p class=\"meta\">{len(pairs) - i} more not drawn.</p>")
                break
            sides = ([Run("base", b.source, b.doc)] if b else []) + [
                Run("head", h.source, h.doc)]
            body.append(_run_section(charts, sides, heading))
            if item is not None:
                body += ["<h3>Compared</h3>", _causes(item), _rows_table(item)]
    else:
        if len(runs) >= 3:
            body += ["<h2>Trend</h2>",
                     f'<p class="meta">{len(runs)} runs, in the order given.</p>',
                     _figure(charts.trend(runs), "trend")]
        for i, run in enumerate(runs):
            if i == MAX_SECTIONS:
                body.append(f"<p class=\"meta\">{len(runs) - i} more not drawn.</p>")
                break
            body.append(_run_section(charts, [run], run.label))
    body.append(f'<p class="meta">Made by traceml-ci {_e(__version__)}; '
                f"{charts.count} charts, no script.</p>")
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
            f"<title>{_e(title)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")
