"""``spherecal report RUN_DIR``: a picture of one run, as a self-contained HTML page.

Why: a run used to be a wall of text — the coordinator's log and ``results.json``
(issue #23). An ML engineer wants to see at a glance whether training converged,
what calibration bought, and who contributed. The page draws, from the run's
``results.json`` (``spherecal simulate``) or ``summary.json`` (a coordinator's
``out_dir``) alone:

1. the training loss per round (the mean over the round's contributors, as summed
   through secure aggregation);
2. the accuracy per round: federated (sites' own test splits) and central (the
   coordinator's test split), each where it was evaluated;
3. calibration before and after, per method: the uncalibrated model's federated
   accuracy next to each calibrated head's;
4. each site's contribution: the rounds its update was in the sum and the bytes it
   uploaded. A site's example count is *not* drawn: secure aggregation gives the
   coordinator only the sum over sites, so no per-site size exists to draw.

Like the audit page (:mod:`spherecal.audit_html`), it fetches nothing and runs no
script: CSS inline, charts as SVG drawn here, text escaped. It is read offline and
archived with the run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from spherecal.audit_html import PALETTE
from spherecal.audit_report import human_bytes
from spherecal.coordinator.summary_schema import (
    Accuracy,
    HeadlineCoverage,
    HistoryRow,
    JsonObject,
    RoundMetrics,
    Traffic,
)
from spherecal.html_style import PAGE_CSS

__all__ = [
    "ReportError",
    "RunDocument",
    "bar_chart",
    "line_chart",
    "load_run",
    "render_run_report",
    "site_contributions",
    "write_run_report",
]


class ReportError(ValueError):
    """The directory holds no run document this page can draw."""


CSS = PAGE_CSS + """
.status{display:inline-block;border-radius:4px;padding:1px 8px;font-weight:700;color:#fff}
.status.completed{background:#2e7d32}.status.degraded{background:#ef6c00}
.status.failed{background:#c62828}.status.other{background:#5f6368}
table{border-collapse:collapse;font-size:14px}
th,td{text-align:left;padding:4px 10px;border-bottom:1px solid #eceef1}
th{color:#5f6368;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
.charts{display:grid;grid-template-columns:1fr 1fr;gap:18px}
figure{margin:0}figcaption{font-size:13px;color:#5f6368;margin-top:4px}
svg text{font:11px system-ui,sans-serif;fill:#3c4043}
.note{background:#fff8e1;border-left:4px solid #f9a825;padding:8px 12px;margin:10px 0}
footer{margin-top:20px;color:#6b7075;font-size:12px}
@media print{body{background:#fff}main{padding:0}}
"""

WIDTH, HEIGHT = 500, 260
LEFT, RIGHT, TOP, BOTTOM = 52, 14, 30, 40


class RunDocument(TypedDict):
    """What the page reads of a run document: ``results.json``
    (:class:`spherecal.results_schema.SimulationResults`) or ``summary.json``
    (:class:`spherecal.coordinator.summary_schema.CoordinatorSummary`), of this version
    or an older one. Only ``status`` is required (:func:`load_run` refuses a document
    without it); every other key may be missing from an older document (``history``
    came after ``per_round``), and the page reads each with a default. ``settings``
    differs between the two documents (a count of participants or the roster), so it
    is JSON read by key."""

    status: str | None
    schema: NotRequired[str]
    federation_id: NotRequired[str | None]
    status_reasons: NotRequired[list[str]]
    settings: NotRequired[JsonObject]
    accuracy: NotRequired[Accuracy | None]
    accuracy_covers: NotRequired[HeadlineCoverage | None]
    per_round: NotRequired[list[RoundMetrics]]
    history: NotRequired[list[HistoryRow]]
    bytes: NotRequired[Traffic]
    _source: NotRequired[str]  # where it was read from; not in the file


def load_run(path: Path) -> RunDocument:
    """The run document in ``path``: ``results.json`` (a simulate output directory),
    ``summary.json`` (a coordinator's out_dir), ``coordinator/out/summary.json``, or
    ``path`` itself when it is one of those files."""
    candidates = (
        [path]
        if path.is_file()
        else [path / "results.json", path / "summary.json", path / "coordinator/out/summary.json"]
    )
    for candidate in candidates:
        if candidate.is_file():
            try:
                document = json.loads(candidate.read_text())
            except (OSError, ValueError) as exc:
                raise ReportError(f"cannot read {candidate}: {exc}") from None
            if not isinstance(document, dict) or "status" not in document:
                raise ReportError(f"{candidate} is not a spherecal results or summary document")
            document.setdefault("_source", str(candidate))
            return cast(RunDocument, document)
    raise ReportError(
        f"no results.json or summary.json in {path} (give a `spherecal simulate --out` "
        "directory or a coordinator's out_dir)"
    )


def _history(run: RunDocument) -> list[HistoryRow]:
    """``history`` rows, or built from ``per_round`` for a run written before it."""
    rows = run.get("history")
    if isinstance(rows, list) and rows:
        return rows
    return [
        {  # an older document's round may lack any of these: None, as .get gives
            "round": m.get("round"),
            "train_loss": m.get("train_loss"),
            "federated_accuracy": m.get("federated_accuracy"),
            "test_accuracy": m.get("test_accuracy"),
            "contributors": len(m.get("contributors") or ()),
            "seconds": m.get("seconds"),
        }
        for m in run.get("per_round") or []
    ]


def _nice_step(span: float, ticks: int = 5) -> float:
    import math

    raw = span / max(ticks, 1)
    if raw <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * power:
            return float(factor * power)
    return float(10 * power)


def _frame(y_lo: float, y_hi: float, y_label: str, x_label: str) -> tuple[list[str], Any]:
    """Axes, horizontal grid and y ticks; returns (svg parts, y → pixel)."""
    plot_h = HEIGHT - TOP - BOTTOM

    def y(v: float) -> float:
        return TOP + plot_h * (1 - (v - y_lo) / (y_hi - y_lo))

    parts = []
    step = _nice_step(y_hi - y_lo)
    tick = y_lo
    while tick <= y_hi + 1e-9:
        py = y(tick)
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py:.1f}" y2="{py:.1f}" '
            'stroke="#eceef1"/>'
            f'<text x="{LEFT - 6}" y="{py + 4:.1f}" text-anchor="end">{tick:.3g}</text>'
        )
        tick += step
    parts.append(
        f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{HEIGHT - BOTTOM}" stroke="#9aa0a6"/>'
        f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{HEIGHT - BOTTOM}" '
        f'y2="{HEIGHT - BOTTOM}" stroke="#9aa0a6"/>'
        f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 6}" '
        f'text-anchor="middle">{escape(x_label)}</text>'
        f'<text transform="translate(12,{TOP + plot_h / 2}) rotate(-90)" '
        f'text-anchor="middle">{escape(y_label)}</text>'
    )
    return parts, y


def _svg(title: str, parts: Sequence[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>{''.join(parts)}</svg>"
    )


def _legend_item(k: int, name: str, colour: str) -> str:
    """The k-th legend entry, in a row above the plot (never over the data)."""
    x0 = LEFT + 150 * k
    return (
        f'<rect x="{x0}" y="6" width="12" height="10" fill="{colour}"/>'
        f'<text x="{x0 + 17}" y="15">{escape(name)}</text>'
    )


def line_chart(
    title: str,
    series: dict[str, list[tuple[float, float]]],
    *,
    y_label: str,
    x_label: str = "round",
    y_range: tuple[float, float] | None = None,
) -> str:
    """One SVG line chart: each series a polyline with a dot per point (a series of
    one point is a dot alone). Series without points are left out; with none at all
    the chart says so instead of drawing empty axes."""
    drawn = {name: points for name, points in series.items() if points}
    if not drawn:
        return _svg(
            title,
            [f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">not measured</text>'],
        )
    xs = [x for points in drawn.values() for x, _ in points]
    ys = [y for points in drawn.values() for _, y in points]
    if y_range is not None:
        y_lo, y_hi = y_range
    else:
        y_lo, y_hi = min(0.0, min(ys)), max(ys)
        y_hi = y_hi * 1.08 if y_hi > 0 else 1.0
    x_lo, x_hi = min(xs), max(xs)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    parts, y = _frame(y_lo, y_hi, y_label, x_label)
    plot_w = WIDTH - LEFT - RIGHT

    def x(v: float) -> float:
        return LEFT + plot_w * (v - x_lo) / (x_hi - x_lo)

    step = max(1, int(_nice_step(x_hi - x_lo)))
    tick = int(x_lo)
    while tick <= x_hi:
        if tick >= x_lo:
            parts.append(
                f'<text x="{x(tick):.1f}" y="{HEIGHT - BOTTOM + 14}" '
                f'text-anchor="middle">{tick}</text>'
            )
        tick += step
    for k, (name, points) in enumerate(drawn.items()):
        colour = PALETTE[k % len(PALETTE)]
        # later series dashed: two that coincide (federated = central when the sites'
        # test splits are the coordinator's) both stay visible
        dash = ' stroke-dasharray="6 4"' if k else ""
        coords = " ".join(f"{x(px):.1f},{y(py):.1f}" for px, py in points)
        parts.append(
            f'<polyline class="series" data-series="{escape(name)}" points="{coords}" '
            f'fill="none" stroke="{colour}" stroke-width="2"{dash}/>'
        )
        parts.extend(
            f'<circle cx="{x(px):.1f}" cy="{y(py):.1f}" r="3" fill="{colour}">'
            f"<title>{escape(name)} round {px:g}: {py:.4f}</title></circle>"
            for px, py in points
        )
        parts.append(_legend_item(k, name, colour))
    return _svg(title, parts)


def bar_chart(
    title: str,
    groups: list[tuple[str, dict[str, float]]],
    *,
    y_label: str,
    x_label: str,
    y_range: tuple[float, float] | None = None,
    value_format: str = "{:.3f}",
) -> str:
    """One SVG grouped bar chart: per group (x) one bar per key, in a stable colour
    per key; every bar is labelled with its value."""
    keys: list[str] = []
    for _, values in groups:
        keys.extend(k for k in values if k not in keys)
    values_all = [v for _, values in groups for v in values.values()]
    if not values_all:
        return _svg(
            title,
            [f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">not measured</text>'],
        )
    y_lo, y_hi = y_range if y_range is not None else (0.0, max(values_all) * 1.12 or 1.0)
    parts, y = _frame(y_lo, y_hi, y_label, x_label)
    plot_w = WIDTH - LEFT - RIGHT
    slot = plot_w / len(groups)
    bar = min(36.0, slot * 0.8 / max(len(keys), 1))
    for g, (label, values) in enumerate(groups):
        x0 = LEFT + slot * g + (slot - bar * len(values)) / 2
        for k, (key, value) in enumerate(values.items()):
            colour = PALETTE[keys.index(key) % len(PALETTE)]
            top = y(max(min(value, y_hi), y_lo))
            bx = x0 + bar * k
            parts.append(
                f'<rect class="bar" data-group="{escape(label)}" data-key="{escape(key)}" '
                f'x="{bx:.1f}" y="{top:.1f}" width="{bar - 2:.1f}" '
                f'height="{HEIGHT - BOTTOM - top:.1f}" fill="{colour}">'
                f"<title>{escape(label)} {escape(key)}: {value_format.format(value)}</title></rect>"
                f'<text x="{bx + (bar - 2) / 2:.1f}" y="{top - 3:.1f}" text-anchor="middle">'
                f"{escape(value_format.format(value))}</text>"
            )
        parts.append(
            f'<text x="{LEFT + slot * (g + 0.5):.1f}" y="{HEIGHT - BOTTOM + 14}" '
            f'text-anchor="middle">{escape(label)}</text>'
        )
    if len(keys) > 1:
        parts.extend(_legend_item(k, key, PALETTE[k % len(PALETTE)]) for k, key in enumerate(keys))
    return _svg(title, parts)


def site_contributions(run: RunDocument) -> list[dict[str, Any]]:
    """Per site: rounds whose sum held its update, and bytes it uploaded (as the
    coordinator counted them: ``received`` is participant → coordinator)."""
    declared = (run.get("settings") or {}).get("participants")
    # a coordinator's summary lists the roster; simulate's settings give a count
    roster = [str(p) for p in declared] if isinstance(declared, list) else []
    rounds: dict[str, int] = {}
    for m in run.get("per_round") or []:
        for pid in m.get("contributors") or []:
            rounds[pid] = rounds.get(pid, 0) + 1
    traffic = run.get("bytes") or {}
    sites = roster or sorted(set(rounds) | set(traffic))
    return [
        {
            "site": pid,
            "rounds": rounds.get(pid, 0),
            "uploaded_bytes": int(((traffic.get(pid) or {}).get("total") or {}).get("received", 0)),
        }
        for pid in sites
    ]


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: set[int]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{escape(c)}</td>' if i in numeric else f"<td>{escape(c)}</td>"
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(value: Any, spec: str = "{:.4f}") -> str:
    return "–" if value is None else spec.format(value)


def render_run_report(run: RunDocument) -> str:
    """The page (a string of HTML) for one run document."""
    history = _history(run)
    status = str(run.get("status") or "unknown")
    settings = run.get("settings") or {}
    accuracy = {k: v for k, v in (run.get("accuracy") or {}).items() if v is not None}
    covers = run.get("accuracy_covers")
    name = settings.get("name") or settings.get("dataset") or "federation"
    rounds_total = settings.get("rounds", len(history))

    loss = {
        "training loss": [
            (float(r["round"]), float(v))
            for r in history
            if (v := r.get("train_loss")) is not None
        ]
    }
    acc_series = {
        "federated accuracy": [
            (float(r["round"]), float(v))
            for r in history
            if (v := r.get("federated_accuracy")) is not None
        ],
        "central test accuracy": [
            (float(r["round"]), float(v))
            for r in history
            if (v := r.get("test_accuracy")) is not None
        ],
    }
    before = accuracy.get("none")
    groups = [
        (method, {"before (none)": float(before), "after": float(value)})
        for method, value in accuracy.items()
        if method != "none" and before is not None
    ]
    sites = site_contributions(run)
    contribution_chart = bar_chart(
        "rounds each site contributed to",
        [(s["site"], {"rounds": float(s["rounds"])}) for s in sites],
        y_label="rounds in the sum",
        x_label="site",
        value_format="{:.0f}",
    )
    upload_chart = bar_chart(
        "bytes each site uploaded",
        [(s["site"], {"MB": s["uploaded_bytes"] / 1e6}) for s in sites],
        y_label="uploaded (MB)",
        x_label="site",
        value_format="{:.1f}",
    )
    status_class = status if status in ("completed", "degraded", "failed") else "other"
    reasons = "".join(f"<li>{escape(str(r))}</li>" for r in run.get("status_reasons") or [])
    accuracy_rows = [
        (
            method,
            _fmt(value),
            "–" if method == "none" or before is None else f"{value - before:+.4f}",
        )
        for method, value in accuracy.items()
    ]
    round_rows = [
        (
            str(r.get("round")),
            _fmt(r.get("train_loss")),
            _fmt(r.get("federated_accuracy")),
            _fmt(r.get("test_accuracy")),
            str(r.get("contributors", "–")),
            _fmt(r.get("seconds"), "{:.1f}"),
        )
        for r in history
    ]
    covered = (
        f"{covers.get('participants')} of {covers.get('of')} sites, "
        f"{covers.get('test_samples')} test samples"
        if covers
        else "not recorded"
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>spherecal run report — {escape(str(name))}</title>
<style>{CSS}</style></head>
<body><main>
<h1>Run report: {escape(str(name))}</h1>
<p class="meta">status <span class="status {status_class}" id="status">{escape(status)}</span>
 · {len(history)} of {escape(str(rounds_total))} rounds · federation
 {escape(str(run.get("federation_id") or "–"))} · from {escape(str(run.get("_source", "")))}</p>
{f"<ul>{reasons}</ul>" if reasons else ""}
<h2>Training</h2>
<div class="charts">
<figure id="loss">{line_chart("training loss per round", loss, y_label="loss")}
<figcaption>Mean training loss of each round's contributors (summed through secure
aggregation: no site's own loss is known).</figcaption></figure>
<figure id="accuracy">{
        line_chart("accuracy per round", acc_series, y_label="accuracy", y_range=(0.0, 1.0))
    }
<figcaption>Federated accuracy (every site's own test split, counts summed securely),
where evaluated (<code>[evaluation] federated_every</code>); central accuracy on the
coordinator's test split, where it has one.</figcaption></figure>
</div>
<h2>Calibration</h2>
<div class="charts">
<figure id="calibration">{
        bar_chart(
            "accuracy before and after calibration",
            groups,
            y_label="federated accuracy",
            x_label="method",
            y_range=(0.0, 1.0),
        )
    }
<figcaption>Federated test accuracy of the uncalibrated model (before) and of each
calibrated head (after); covers {escape(covered)}.</figcaption></figure>
<div>{_table(("method", "accuracy", "vs none"), accuracy_rows, {1, 2})}</div>
</div>
<h2>Sites</h2>
<div class="charts">
<figure id="contributions">{contribution_chart}
<figcaption>Rounds whose secure sum held each site's update.</figcaption></figure>
<figure id="uploads">{upload_chart}
<figcaption>Bytes each site uploaded, as the coordinator counted them.</figcaption></figure>
</div>
<p class="note">A site's number of examples is not shown: secure aggregation gives the
coordinator only the total over sites, never one site's count.</p>
<h2>Rounds</h2>
{
        _table(
            ("round", "loss", "federated acc", "central acc", "contributors", "seconds"),
            round_rows,
            {1, 2, 3, 4, 5},
        )
    }
<footer>Written by <code>spherecal report</code>; self-contained (no script, nothing
fetched). Sites: {escape(", ".join(s["site"] for s in sites))} — uploads
{escape(", ".join(human_bytes(s["uploaded_bytes"]) for s in sites))}.</footer>
</main></body></html>
"""


def write_run_report(path: Path, out: Path | None = None) -> Path:
    """Write the page for the run in ``path`` (default ``path/report.html``, or next
    to the document when ``path`` is a file); returns where."""
    run = load_run(path)
    target = out or (path.parent if path.is_file() else path) / "report.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(render_run_report(run))
    tmp.replace(target)
    return target
