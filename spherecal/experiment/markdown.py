"""``table.md`` of ``spherecal experiment``, rendered from the ``results.json`` document."""

from __future__ import annotations

from spherecal.experiment.grid import CALIBRATIONS
from spherecal.results_schema import (
    ExperimentColumn,
    ExperimentResults,
    ExperimentTimings,
    JsonObject,
    RowColumn,
    Stats,
    calibration_stats,
)

__all__ = ["CALIBRATION_LABELS", "GAIN_ORDER", "render_markdown"]

ENGINE_TEXT = {
    "inprocess": "Engine: **inprocess** — every cell trained in one process by the "
    "reference runner (`spherecal.spherefed.reference.run_federation`).",
    "service": "Engine: **service** — every cell trained as a real federation: a "
    "coordinator process and the participants over gRPC on loopback, secure "
    "aggregation of updates and statistics on (`spherecal simulate`). Test accuracy is "
    "the coordinator's central evaluation; validation accuracy (for selection) is "
    "computed by the harness from the saved models. No oracle column.",
}
"""The line of ``table.md`` that says which engine made the numbers."""

HOSTING_TEXT = {
    "threads": "as virtual participants, threads of the cell's process (own identity key "
    "and gRPC connection each; `spherecal simulate --engine threads`)",
    "processes": "one OS process per participant (`spherecal simulate --engine processes`)",
}


def engine_line(engine: str = "inprocess", hosting: dict[str, int] | None = None) -> str:
    """Which engine made the numbers, and (service) how the participants were hosted
    (``hosting``: cells per hosting, the document's ``hosting``)."""
    text = ENGINE_TEXT.get(engine, f"Engine: {engine}.")
    hosting = hosting or {}
    if engine == "service" and hosting:
        parts = [
            f"{n} cell{'s' if n != 1 else ''} {HOSTING_TEXT.get(h, h)}"
            for h, n in sorted(hosting.items())
        ]
        text += " Participants hosted: " + "; ".join(parts) + "."
    return text


SECURE_SUM_TEXT = (
    "Statistics: **through secure aggregation** (`--secure-sum`) — every calibrator is "
    "solved from CCVR sums computed by the real secure-aggregation protocol in process "
    "(identity keys, pairwise masks, Shamir shares, fixed-point ring at the service's "
    "scale; only the network is missing), i.e. the numbers the service delivers."
)

CALIBRATION_LABELS = {
    "none": "none",
    "ccvr": "+CCVR",
    "ffc": "+FFC",
    "ffc_bias": "+FFC+bias",
    "lda": "+LDA",
    "qda": "+QDA",
    "oracle": "oracle",
}
GAIN_ORDER: tuple[str, ...] = ("ffc", "ffc_bias", "ccvr", "lda", "qda")
"""Calibrations of the ``calibration`` table, in row order (those a cell has)."""


def _pct(stats: Stats, *, signed: bool = False) -> str:
    mean, std = stats["mean"], stats["std"]
    if mean is None:
        return "diverged"
    sign = "+" if signed and mean >= 0 else ""
    text = f"{sign}{100 * mean:.1f}"
    if stats["n"] > 1 and std is not None:
        text += f" ± {100 * std:.1f}"
    return text


def _bold_best(cells: list[tuple[str, float | None]]) -> list[str]:
    means = [m for _, m in cells if m is not None]
    best = max(means) if means else None
    out = []
    for text, m in cells:
        if best is not None and m is not None and round(m, 6) == round(best, 6):
            out.append(f"**{text}**")
        else:
            out.append(text)
    return out


def _lr_text(col: RowColumn) -> str:
    grid = col.get("lr_grid") or []
    parts = []
    for p in col["per_seed"]:
        lr = p.get("lr")
        if p.get("diverged") or lr is None:
            parts.append("×")
            continue
        t = f"{lr:g}"
        if grid and len(grid) > 1 and lr == max(grid):
            t += "↑"
        elif grid and len(grid) > 1 and lr == min(grid):
            t += "↓"
        if p.get("temperature", 1.0) != 1.0:
            t += f"/τ{p['temperature']:g}"
        parts.append(t)
    return ", ".join(parts)


def _header(report: ExperimentResults) -> list[str]:
    s = report["settings"]
    cfg = s["base_config"]
    seeds = len(s["seeds"])
    lines = [
        f"# spherecal experiment — {report['table']} ({s['dataset']})",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Test accuracy (%) of the global model, mean ± sample std over {seeds} seed(s). "
        f"{cfg['participants']} participants, {cfg['rounds']} rounds × {cfg['local_epochs']} "
        f"local epochs, batch {cfg['batch_size']}, SGD momentum {cfg['momentum']}, model "
        f"`{cfg['model']}`. Learning rate chosen per row, column and seed on the validation "
        "split (never on test); **bold** = best mean in the column. "
        "CCVR and FFC calibrate the trained model's classifier from summed statistics.",
        "",
        engine_line(report.get("engine", "inprocess"), report.get("hosting")),
        "",
    ]
    if s.get("secure_sum"):
        lines += [SECURE_SUM_TEXT, ""]
    skipped = report.get("skipped_methods") or []
    if skipped:
        lines += ["Not run by this engine (no row below):", ""]
        lines += [f"- {m['label']} (`{m['key']}`): {m['reason']}" for m in skipped]
        lines.append("")
    return lines


def render_markdown(report: ExperimentResults) -> str:
    """``table.md`` for any of the three tables."""
    cols = report["settings"]["columns"]
    lines = _header(report)
    table = report["table"]
    labels = {m["key"]: m["label"] for m in report["methods"]}
    if table == "methods":
        lines += _methods_table(report, cols)
    elif table == "ablation":
        lines += _ablation_table(report, cols, labels)
    else:
        lines += _calibration_table(report, cols, labels)
    lines += ["", "## Selected learning rates", ""]
    lines += [
        "Per seed; ↑/↓ = the largest/smallest value of that method's grid (the optimum "
        "may lie outside it), × = every learning rate diverged, /τ = temperature.",
        "",
        "| Method | Calibration | " + " | ".join(c["label"] for c in cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    shown = {"methods": CALIBRATIONS, "ablation": ("none", "ffc"), "calibration": ("none",)}
    for row in report["rows"]:
        if row["calibration"] not in shown[table]:
            continue
        lines.append(
            f"| {row['label']} | {CALIBRATION_LABELS[row['calibration']]} | "
            + " | ".join(_lr_text(row["columns"][c["key"]]) for c in cols)
            + " |"
        )
    lines += ["", "## Learning-rate grids", ""]
    for key, grid in report["settings"]["lr_grids"].items():
        taus = report["settings"]["temperature_grids"][key]
        t = f", τ ∈ {{{', '.join(f'{x:g}' for x in taus)}}}" if taus != [1.0] else ""
        lines.append(f"- {labels[key]}: {{{', '.join(f'{x:g}' for x in grid)}}}{t}")
    tm: ExperimentTimings = report.get("timings") or {}
    if tm:
        lines += [
            "",
            f"This invocation: {tm.get('wall_s', 0) / 60:.1f} min wall "
            f"({tm.get('cells_run', 0)} runs, {tm.get('cells_cached', 0)} reused from the "
            f"cells directory), {report['environment']['workers']} worker(s) × "
            f"{report['environment']['threads']} thread(s). The table's "
            f"{tm.get('cells_run', 0) + tm.get('cells_cached', 0)} runs took "
            f"{tm.get('cells_compute_s', 0) / 60:.1f} min of (single-thread) run time in total.",
        ]
    return "\n".join(lines) + "\n"


def _methods_table(report: ExperimentResults, cols: list[ExperimentColumn]) -> list[str]:
    lines = [
        "| Method | Calibration | " + " | ".join(c["label"] for c in cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    cells_by_col: dict[str, list[tuple[str, float | None]]] = {c["key"]: [] for c in cols}
    for row in report["rows"]:
        for c in cols:
            st = row["columns"][c["key"]]
            text = _pct(st)
            if st["diverged_seeds"] and st["mean"] is not None:
                text += f" (†{st['diverged_seeds']})"
            cells_by_col[c["key"]].append((text, st["mean"]))
    bolded = {k: _bold_best(v) for k, v in cells_by_col.items()}
    for i, row in enumerate(report["rows"]):
        lines.append(
            f"| {row['label']} | {CALIBRATION_LABELS[row['calibration']]} | "
            + " | ".join(bolded[c["key"]][i] for c in cols)
            + " |"
        )
    if any(r["columns"][c["key"]]["diverged_seeds"] for r in report["rows"] for c in cols):
        lines += ["", "† = seeds on which every learning rate diverged (left out of the mean)."]
    return lines


def _ablation_table(
    report: ExperimentResults, cols: list[ExperimentColumn], labels: dict[str, str]
) -> list[str]:
    heads = []
    for c in cols:
        heads += [c["label"], f"{c['label']} +FFC"]
    lines = ["| Variant | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    by = {(r["method"], r["calibration"]): r for r in report["rows"]}
    keys = [m["key"] for m in report["methods"]]
    grid: dict[str, list[tuple[str, float | None]]] = {}
    for c in cols:
        for cal in ("none", "ffc"):
            grid[f"{c['key']}/{cal}"] = [
                (_pct(by[(k, cal)]["columns"][c["key"]]), by[(k, cal)]["columns"][c["key"]]["mean"])
                for k in keys
            ]
    bolded = {k: _bold_best(v) for k, v in grid.items()}
    for i, k in enumerate(keys):
        cells = []
        for c in cols:
            cells += [bolded[f"{c['key']}/none"][i], bolded[f"{c['key']}/ffc"][i]]
        lines.append(f"| {labels[k]} | " + " | ".join(cells) + " |")
    return lines


def _calibration_table(
    report: ExperimentResults, cols: list[ExperimentColumn], labels: dict[str, str]
) -> list[str]:
    lines = [
        "The same trained model in every row of a column (its lr chosen on validation "
        "*without* calibration); each row calibrates that model's classifier from the "
        "summed statistics. Cells: test accuracy, mean ± std over seeds, and in brackets "
        "the difference to the oracle in points (row − oracle, mean over seeds; negative "
        "= below the oracle). FFC+bias' ridge "
        "and LDA/QDA's shrinkage are chosen per seed on the validation split. The oracle "
        "fine-tunes the classifier on all pooled real features and picks the best of "
        "CE/MSE × 3 lrs **on test** — an optimistic upper bound (SphereFed §5.4).",
        "",
    ]
    for key, per_col in report["calibration"].items():
        lines += [
            f"### {labels[key]}",
            "",
            "| Calibration | " + " | ".join(c["label"] for c in cols) + " |",
            "|---|" + "---|" * len(cols),
        ]
        present = [
            cal
            for cal in ("none", *GAIN_ORDER, "oracle")
            if any(cal in per_col[c["key"]] for c in cols)
        ]
        for cal in present:
            cells = []
            for c in cols:
                g: JsonObject = per_col[c["key"]]
                stats = calibration_stats(g, cal)
                if stats is None:
                    cells.append("—")
                    continue
                text = _pct(stats)
                gap = calibration_stats(g, f"{cal}_gap")
                if gap is not None and gap["mean"] is not None:
                    text += f" ({-100 * gap['mean']:+.1f})"
                cells.append(text)
            lines.append(f"| {CALIBRATION_LABELS[cal]} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines
