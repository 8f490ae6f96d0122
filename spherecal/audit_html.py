"""``spherecal audit --html FILE``: the audit as one self-contained page for a privacy
officer.

Why self-contained: the page is read on an auditor's machine, archived with the run
and perhaps opened years later or offline, so it fetches nothing — CSS is inline,
the two charts are SVG drawn here, and there is no script at all. Everything it says
comes from the audit report dictionary (:func:`spherecal.audit.run_audit`) through
the plain-language helpers of :mod:`spherecal.audit_report`, in the order a reader
needs it: the verdict — ``PASS as configured`` with a plain list of what was *not*
protected whenever something was left open (a bare PASS beside "no DP" read as
"private", issue #23) — which run it is (federation, name, dates, sites, coordinator),
what was and was not protected, one ε per subject with what it means, each check in
one sentence (N/A, not PASS, where it had nothing to check), the protocol's stages in
order and in words, then the charts (bytes each site sent per stage; ε spent over
time, drawn only when some was spent).
"""

from __future__ import annotations

import math
from html import escape
from typing import Any, cast

from spherecal.audit_report import (
    CHECK_EXPLANATIONS,
    STAGE_ORDER,
    STAGES,
    check_items,
    epsilon_meanings,
    human_bytes,
    not_applicable,
    unprotected,
    verdict_label,
    verdict_sentence,
)
from spherecal.html_style import PAGE_CSS
from spherecal.results_schema import AuditDocument

__all__ = ["PALETTE", "epsilon_chart", "payload_chart", "render_html", "site_colours"]

#: Colour-blind-friendly categorical colours (Okabe–Ito, then Tableau), one per series.
PALETTE = (
    "#0072b2",
    "#e69f00",
    "#009e73",
    "#cc79a7",
    "#56b4e9",
    "#d55e00",
    "#f0e442",
    "#000000",
    "#8c564b",
    "#7f7f7f",
)

CSS = PAGE_CSS + """
.verdict{border-radius:8px;padding:12px 16px;margin:16px 0 4px;border:2px solid}
.verdict.pass{background:#e8f5e9;border-color:#2e7d32}
.verdict.partial{background:#fff8e1;border-color:#ef6c00}
.verdict.fail{background:#fdecea;border-color:#c62828}
.verdict strong{font-size:20px;display:block}
.verdict.pass strong{color:#1b5e20}.verdict.fail strong{color:#b71c1c}
.verdict.partial strong{color:#bf360c}.verdict ul{margin:6px 0 0;padding-left:20px}
table{border-collapse:collapse;width:100%;font-size:14px}
th,td{text-align:left;vertical-align:top;padding:5px 8px;border-bottom:1px solid #eceef1}
th{color:#5f6368;font-weight:600}
.note{background:#fff8e1;border-left:4px solid #f9a825;padding:8px 12px;margin:10px 0}
.badge{display:inline-block;min-width:42px;text-align:center;font-weight:700;
border-radius:4px;padding:1px 6px;font-size:12px;color:#fff}
.ok{background:#2e7d32}.bad{background:#c62828}.na{background:#80868b}
.tech{color:#6b7075;font-size:12px}
.charts{display:grid;grid-template-columns:1fr 1fr;gap:18px}
figure{margin:0}figcaption{font-size:13px;color:#5f6368;margin-top:4px}
svg text{font:11px system-ui,sans-serif;fill:#3c4043}
footer{margin-top:20px;color:#6b7075;font-size:12px}
@media print{body{background:#fff}main{padding:0}}
"""


# ----------------------------------------------------------------- charts
def _nice_log_ticks(lo: float, hi: float) -> list[float]:
    return [
        10.0**e for e in range(int(math.floor(math.log10(lo))), int(math.ceil(math.log10(hi))) + 1)
    ]


FEDERATION_COLOUR = "#3c4043"


def site_colours(names: list[str]) -> dict[str, str]:
    """One colour per site, the same in both charts; the federation is dark grey."""
    sites = sorted(n for n in set(names) if n != "federation")
    colours = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(sites)}
    colours["federation"] = FEDERATION_COLOUR
    return colours


def _nice_step(span: float) -> float:
    raw = span / 4
    power = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * power >= raw:
            return m * power
    return 10 * power  # pragma: no cover


def payload_chart(
    rows: list[dict[str, Any]],
    *,
    colours: dict[str, str] | None = None,
    width: int = 500,
    height: int = 300,
) -> str:
    """Grouped bars, log scale: for each protocol stage, the bytes each site sent.

    A log axis because the stages differ by four orders of magnitude (a join is a few
    hundred bytes, a masked upload megabytes) while what the reader looks for is a
    site whose bar stands out from the others in the same stage."""
    totals: dict[tuple[str, str], int] = {}
    for r in rows:
        if r.get("status") == "accepted" and int(r.get("bytes", 0)) > 0:
            key = (str(r["stage"]), str(r["sender"]))
            totals[key] = totals.get(key, 0) + int(r["bytes"])
    if not totals:
        return '<p class="tech">No payloads were recorded.</p>'
    stages = sorted(
        {s for s, _ in totals},
        key=lambda s: (STAGE_ORDER.index(s) if s in STAGE_ORDER else len(STAGE_ORDER), s),
    )
    senders = sorted({p for _, p in totals})
    colour = colours or site_colours(senders)
    left, right, top, bottom = 52, 8, 10, 58
    plot_w, plot_h = width - left - right, height - top - bottom
    lo = 10.0 ** math.floor(math.log10(min(totals.values())))
    hi = max(10.0 * lo, 10.0 ** math.ceil(math.log10(max(totals.values()))))
    span = math.log10(hi) - math.log10(lo)

    def y(v: float) -> float:
        return top + plot_h - (math.log10(v) - math.log10(lo)) / span * plot_h

    parts = [
        f'<svg class="chart" id="payload-chart" role="img" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'aria-label="Bytes sent per site and protocol stage">'
    ]
    for tick in _nice_log_ticks(lo, hi):
        ty = y(tick)
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{ty:.1f}" y2="{ty:.1f}" '
            'stroke="#e3e5e8"/>'
            f'<text x="{left - 4}" y="{ty + 4:.1f}" text-anchor="end">'
            f"{escape(human_bytes(tick))}</text>"
        )
    group_w = plot_w / len(stages)
    bar_w = max(1.0, (group_w * 0.8) / len(senders))
    for gi, stage in enumerate(stages):
        gx = left + gi * group_w + group_w * 0.1
        for si, sender in enumerate(senders):
            v = totals.get((stage, sender))
            if not v:
                continue
            by = min(y(v), top + plot_h - 2)  # the smallest value still shows
            parts.append(
                f'<rect class="bar" x="{gx + si * bar_w:.1f}" y="{by:.1f}" '
                f'width="{bar_w * 0.92:.1f}" height="{top + plot_h - by:.1f}" '
                f'fill="{colour[sender]}"><title>{escape(sender)}, {escape(stage)}: '
                f"{escape(human_bytes(v))}</title></rect>"
            )
        parts.append(
            f'<text x="{gx + group_w * 0.4:.1f}" y="{top + plot_h + 14}" '
            f'text-anchor="middle">{escape(stage)}</text>'
        )
    parts.append(
        f'<line x1="{left}" x2="{width - right}" y1="{top + plot_h}" y2="{top + plot_h}" '
        'stroke="#5f6368"/>'
    )
    parts.append(_legend(senders, colour, left, height - 22, width - right))
    parts.append("</svg>")
    return "".join(parts)


def _legend(names: list[str], colour: dict[str, str], x0: float, y0: float, x_max: float) -> str:
    out, x, y = [], x0, y0
    for name in names:
        w = 18 + 7 * len(name)
        if x + w > x_max:
            x, y = x0, y + 14
        out.append(
            f'<rect x="{x:.0f}" y="{y - 9:.0f}" width="10" height="10" fill="{colour[name]}"/>'
            f'<text x="{x + 13:.0f}" y="{y:.0f}">{escape(name)}</text>'
        )
        x += w
    return "".join(out)


def epsilon_chart(
    timelines: dict[str, list[dict[str, Any]]],
    budgets: dict[str, float | None],
    *,
    colours: dict[str, str] | None = None,
    width: int = 500,
    height: int = 300,
) -> str:
    """ε spent over time, one step line per subject (it jumps at each release), and
    each distinct budget as a dashed line — so "how close did anyone get" is seen at
    a glance."""
    series = {s: sorted(t, key=lambda e: float(e["ts"])) for s, t in timelines.items() if t}
    if not series:
        return (
            '<p class="tech" id="epsilon-chart-empty">No differentially private release '
            "was made, so no ε was spent and there is nothing to plot.</p>"
        )
    names = sorted(series, key=lambda s: (s != "federation", s))
    colour = colours or site_colours(names)
    t0 = min(float(e["ts"]) for t in series.values() for e in t)
    t1 = max(float(e["ts"]) for t in series.values() for e in t)
    duration = max(t1 - t0, 1.0)
    t_end = t0 + duration * 1.08
    caps = [float(b) for b in budgets.values() if b is not None]
    e_max = max([float(e["epsilon_total"]) for t in series.values() for e in t] + caps)
    step = _nice_step(e_max * 1.08 if e_max > 0 else 1.0)
    ticks = int(math.ceil(e_max * 1.08 / step)) if e_max > 0 else 4
    e_max = step * ticks
    left, right, top, bottom = 44, 10, 10, 58
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(ts: float) -> float:
        return left + (ts - t0) / (t_end - t0) * plot_w

    def y(eps: float) -> float:
        return top + plot_h - eps / e_max * plot_h

    unit, scale = ("min", 60.0) if duration > 180 else ("s", 1.0)
    digits = 1 if (t_end - t0) / scale < 10 else 0
    parts = [
        f'<svg class="chart" id="epsilon-chart" role="img" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'aria-label="Privacy loss epsilon spent over time">'
    ]
    for i in range(ticks + 1):
        ev = step * i
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y(ev):.1f}" y2="{y(ev):.1f}" '
            f'stroke="#e3e5e8"/><text x="{left - 4}" y="{y(ev) + 4:.1f}" '
            f'text-anchor="end">{ev:g}</text>'
        )
    for i in range(5):
        tv = t0 + (t_end - t0) * i / 4
        parts.append(
            f'<text x="{x(tv):.1f}" y="{top + plot_h + 14}" '
            f'text-anchor="{"end" if i == 4 else "middle"}">'
            f"{(tv - t0) / scale:.{digits}f} {unit}</text>"
        )
    for cap in sorted(set(caps)):
        who = ", ".join(sorted(s for s, b in budgets.items() if b is not None and b == cap))
        parts.append(
            f'<line class="budget" x1="{left}" x2="{width - right}" y1="{y(cap):.1f}" '
            f'y2="{y(cap):.1f}" stroke="#c62828" stroke-dasharray="5 4"/>'
            f'<text x="{width - right - 2}" y="{y(cap) - 4:.1f}" text-anchor="end" '
            f'style="fill:#c62828">budget {cap:g} ({escape(who)})</text>'
        )
    for rank, name in enumerate(names):
        # Later series are drawn thinner, so identical curves still show every colour.
        stroke = max(1.6, 6.0 - 1.4 * rank)
        points = [(x(t0), y(0.0))]
        for e in series[name]:
            px, py = x(float(e["ts"])), y(float(e["epsilon_total"]))
            points += [(px, points[-1][1]), (px, py)]
        points.append((x(t_end), points[-1][1]))
        path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
        parts.append(
            f'<polyline class="series" points="{path}" fill="none" stroke="{colour[name]}" '
            f'stroke-width="{stroke:.1f}"><title>{escape(name)}</title></polyline>'
        )
        for e in series[name]:
            parts.append(
                f'<circle cx="{x(float(e["ts"])):.1f}" cy="{y(float(e["epsilon_total"])):.1f}" '
                f'r="3.2" fill="{colour[name]}"><title>{escape(name)}: ε = '
                f"{float(e['epsilon_total']):.3g} after {escape(str(e.get('kind', '')))}"
                "</title></circle>"
            )
    parts.append(
        f'<line x1="{left}" x2="{width - right}" y1="{top + plot_h}" y2="{top + plot_h}" '
        'stroke="#5f6368"/>'
    )
    parts.append(_legend(names, colour, left, height - 22, width - right))
    parts.append("</svg>")
    return "".join(parts)


# ----------------------------------------------------------------- the page
def _protection_html(report: AuditDocument) -> str:
    protection = report.get("protection") or {}
    if not protection:
        return ""
    rows = []
    for label, item in (
        ("Model updates (training)", protection["model_updates"]),
        ("Calibration statistics", protection["calibration_statistics"]),
    ):
        rows.append(
            f"<tr><th>{label}</th><td>{escape(item['transport'])}</td>"
            f"<td>{escape(item['dp'])}</td></tr>"
        )
    note = ""
    if protection.get("updates_without_dp"):
        covered = (
            "so the ε figures below cover the calibration statistics only."
            if protection["calibration_statistics"].get("dp_releases")
            else "and neither are the calibration statistics: the coordinator learned "
            "exact sums over sites, and no ε bounds what those sums reveal."
        )
        note = (
            '<p class="note" id="updates-no-dp"><strong>Model updates carry no '
            "differential privacy.</strong> Secure aggregation hides each site's update "
            f"from the coordinator, but the summed model itself is not noised, {covered}</p>"
        )
    return (
        '<section id="protection"><h2>What was protected in this run</h2>'
        "<table><tr><th>What left each site</th><th>How it travelled</th>"
        "<th>Differential privacy</th></tr>" + "".join(rows) + "</table>" + note + "</section>"
    )


def _epsilon_html(report: AuditDocument) -> str:
    privacy = report.get("privacy") or {}
    meanings = epsilon_meanings(report)
    intro = (
        "<p>ε (epsilon) measures how much the released results can reveal about any one "
        "record: 0 would be nothing; below about 1 is strong protection, up to about 8 "
        "is common in practice. Each subject has one number: the federation as a whole, "
        "and each site by its own accounting.</p>"
    )
    if not privacy.get("enabled") and not any(m["epsilon"] > 0 for m in meanings):
        return (
            '<section id="epsilon"><h2>Privacy loss (ε)</h2><p>Differential privacy was '
            "<strong>not enabled</strong>: ε is not bounded. The coordinator learned only "
            "sums over sites, but those sums are exact.</p></section>"
        )
    rows = []
    for m in meanings:
        budget = "none set" if m["budget"] is None else f"{float(m['budget']):g}"
        if m["budget"] is None:
            status = ""
        elif m["within_budget"]:
            status = '<span class="badge ok">within</span>'
        else:
            status = '<span class="badge bad">OVER</span>'
        rows.append(
            f"<tr><th>{escape(m['subject'])}</th><td><strong>{m['epsilon']:.3g}</strong></td>"
            f"<td>{budget} {status}</td><td>{escape(m['meaning'])}</td></tr>"
        )
    other = []
    if privacy.get("epsilon") is not None:
        other.append(f"the target per release in the configuration (ε = {privacy['epsilon']:g})")
    if "epsilon_claimed" in report:
        other.append(
            "the empirical test below, which measured a lower bound of "
            f"{report['epsilon_empirical_lower']:.3g} against a claimed "
            f"{report['epsilon_claimed']:.3g} on a small test federation"
        )
    extra = (
        f'<p class="tech">Other ε figures you may meet: {"; ".join(other)}.</p>' if other else ""
    )
    return (
        '<section id="epsilon"><h2>Privacy loss (ε), one per subject</h2>'
        + intro
        + "<table><tr><th>Subject</th><th>ε spent</th><th>Budget</th><th>What it means</th>"
        "</tr>" + "".join(rows) + "</table>" + extra + "</section>"
    )


def _checks_html(report: AuditDocument) -> str:
    items = []
    skipped = not_applicable(report)
    for name, check in check_items(report["checks"]).items():
        title, explanation = CHECK_EXPLANATIONS.get(name, (name, ""))
        if name in skipped:
            items.append(
                f'<tr class="check" data-check="{escape(name)}" data-na="1"><td>'
                '<span class="badge na">N/A</span></td>'
                f"<td><strong>{escape(title)}</strong><br>Did not apply: "
                f"{escape(skipped[name])}.</td></tr>"
            )
            continue
        if name == "dp_releases" and not check.get("enabled") and not check.get("releases"):
            explanation = (
                "Differential privacy was not switched on, so there was no noisy release to check."
            )
        if name == "budgets" and not check.get("subjects"):
            explanation = "No privacy budget was in use: no site or federation spent any ε."
        badge = (
            '<span class="badge ok">PASS</span>'
            if check["ok"]
            else ('<span class="badge bad">FAIL</span>')
        )
        items.append(
            f'<tr class="check" data-check="{escape(name)}"><td>{badge}</td>'
            f"<td><strong>{escape(title)}</strong><br>{escape(explanation)}"
            f'<br><span class="tech">{escape(name)}: {escape(str(check["summary"]))}</span>'
            "</td></tr>"
        )
    empirical = report.get("empirical")
    if empirical is not None:
        if empirical.get("skipped"):
            text, ok = f"Nothing to audit: {empirical['reason']}.", True
        else:
            ok = not empirical.get("exceeds_claim", False)
            text = (
                "A simulated attacker tried to tell whether one planted record was in the "
                "data; its success bounds the real ε from below at "
                f"{report['epsilon_empirical_lower']:.3g}, which must not exceed the "
                f"claimed {report['epsilon_claimed']:.3g}."
            )
        badge = (
            '<span class="badge ok">PASS</span>' if ok else ('<span class="badge bad">FAIL</span>')
        )
        items.append(
            f'<tr class="check" data-check="empirical"><td>{badge}</td><td><strong>Empirical '
            f"test of the noise</strong><br>{escape(text)}</td></tr>"
        )
    return '<section id="checks"><h2>Checks</h2><table>' + "".join(items) + "</table></section>"


def _identity_html(report: AuditDocument) -> str:
    """Which run: federation, name, when, sites, coordinator (what an auditor files
    the page under)."""
    run = report.get("run") or {}
    sites = run.get("sites") or []
    joined = run.get("joined") or []
    when = run.get("started") or "not recorded"
    if run.get("ended") and run.get("ended") != run.get("started"):
        when += f" to {run['ended']}"
    rows = [
        ("Federation", str(run.get("federation_id") or report.get("federation_id") or "?")),
        ("Name", str(run.get("name") or "not recorded")),
        ("When", when),
        (
            "Sites",
            (", ".join(sites) + f" ({len(joined)} of {len(sites)} joined)")
            if sites
            else "none recorded",
        ),
        ("Coordinator", str(run.get("coordinator") or "address not recorded")),
        ("Final status", str(run.get("status") or "not recorded")),
    ]
    return (
        '<section id="run"><h2>Which run</h2><table>'
        + "".join(f"<tr><th>{k}</th><td>{escape(v)}</td></tr>" for k, v in rows)
        + "</table></section>"
    )


def _stages_html(report: AuditDocument) -> str:
    """The stages this run's payloads went through, in protocol order, each in words."""
    seen = {str(r["stage"]) for r in report["payloads"]["rows"]}
    explained = dict(STAGES)
    ordered = [s for s in STAGE_ORDER if s in seen] + sorted(seen - set(STAGE_ORDER))
    if not ordered:
        return ""
    rows = "".join(
        f'<tr class="stage" data-stage="{escape(s)}"><th>{escape(s)}</th>'
        f"<td>{escape(explained.get(s, 'Other messages.'))}</td></tr>"
        for s in ordered
    )
    return (
        '<section id="stages"><h2>Protocol stages, in order</h2><p>What each site sent '
        "the coordinator, stage by stage (the chart below counts the bytes).</p>"
        f"<table>{rows}</table></section>"
    )


def render_html(report: AuditDocument) -> str:
    """The whole page as one string (UTF-8, no external references)."""
    ok = bool(report["ok"])
    budgets = report["checks"]["budgets"]
    subjects = budgets.get("subjects", {})
    timelines = {
        s: cast("list[dict[str, Any]]", e.get("timeline", [])) for s, e in subjects.items()
    }
    caps = {s: cast("float | None", e.get("budget_epsilon")) for s, e in subjects.items()}
    colours = site_colours([str(r["sender"]) for r in report["payloads"]["rows"]] + list(subjects))
    title = f"Privacy audit of federation {report.get('federation_id') or '(unnamed)'}"
    label = verdict_label(report)
    left_open = unprotected(report) if ok else []
    kind = "fail" if not ok else ("partial" if left_open else "pass")
    verdict = (
        f'<section class="verdict {kind}" id="verdict">'
        f"<strong>{escape(label)}</strong>"
        f"<span>{escape(verdict_sentence(report))}</span>"
        + (
            '<p><b>Not protected in this run:</b></p><ul id="not-protected">'
            + "".join(f"<li>{escape(x)}</li>" for x in left_open)
            + "</ul>"
            if left_open
            else ""
        )
        + "</section>"
    )
    payload_svg = payload_chart(report["payloads"]["rows"], colours=colours)
    epsilon_svg = epsilon_chart(timelines, caps, colours=colours)
    charts = (
        '<section id="charts"><h2>Charts</h2><div class="charts">'
        f"<figure>{payload_svg}<figcaption>Bytes each site "
        "sent, per protocol stage (log scale). In one stage the bars should be alike; a "
        "site that stands out sent something unusual.</figcaption></figure>"
        + (
            f"<figure>{epsilon_svg}<figcaption>Privacy loss ε spent over "
            "time, per subject; dashed: budgets.</figcaption></figure>"
            if any(timelines.values())
            else f"<div>{epsilon_svg}</div>"  # nothing drawn: no caption for it
        )
        + "</div></section>"
    )
    footer = (
        f"<footer>Evidence: <code>{escape(str(report.get('path', 'audit.json')))}</code> "
        f"(every payload with its SHA-256, every check's numbers). Database: "
        f"<code>{escape(str(report['database']))}</code>. Generated by "
        "<code>spherecal audit --html</code>.</footer>"
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body><main>"
        f"<h1>{escape(title)}</h1>"
        f'<p class="meta">{report["payloads"]["count"]} payloads received by the '
        "coordinator were examined (their sizes and hashes, never their contents).</p>"
        + verdict
        + _identity_html(report)
        + _protection_html(report)
        + _epsilon_html(report)
        + _checks_html(report)
        + _stages_html(report)
        + charts
        + footer
        + "</main></body></html>\n"
    )
