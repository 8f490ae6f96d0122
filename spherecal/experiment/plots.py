"""The PNG plots of ``spherecal experiment`` (matplotlib, Agg backend).

Colour says *which method*, line style says *which calibration*: every method gets
its own colour from qualitative colormaps (``tab10`` then ``Dark2``, never the
light/dark pairs of ``tab20`` that made neighbouring methods look alike), and the
calibrated end points are drawn in the method's colour with one line style per
calibration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from spherecal.experiment.markdown import CALIBRATION_LABELS, GAIN_ORDER
from spherecal.results_schema import ExperimentResults, JsonObject, calibration_stats

__all__ = ["CALIBRATION_STYLES", "gain_panels", "method_colors", "write_plots"]

CALIBRATION_STYLES: dict[str, str] = {"none": "-", "ccvr": "--", "ffc": ":", "oracle": "-."}
"""Line style per calibration (the same in every plot)."""

_QUALITATIVE = ("tab10", "Dark2", "Set1")


def method_colors(n: int) -> list[tuple[float, float, float, float]]:
    """``n`` distinct RGBA colours from qualitative colormaps (cycled only past 26)."""
    import matplotlib

    palette: list[tuple[float, float, float, float]] = []
    for name in _QUALITATIVE:
        cmap = matplotlib.colormaps[name]
        for k in range(cmap.N):
            rgba = tuple(float(v) for v in cmap(k))
            if rgba not in palette:
                palette.append(rgba)  # type: ignore[arg-type]
    return [palette[i % len(palette)] for i in range(n)]


def gain_panels(report: ExperimentResults) -> list[str]:
    """The calibrations ``calibration_gain.png`` has a panel for: CCVR and FFC, and the
    oracle wherever the report has oracle re-runs (the ``calibration`` table)."""
    gains = report["calibration"]
    cols = [c["key"] for c in report["settings"]["columns"]]
    return [
        c
        for c in ("ccvr", "ffc", "oracle")
        if any(f"{c}_gain" in gains[k][col] for k in gains for col in cols)
    ]


def write_plots(report: ExperimentResults, out_dir: Path) -> list[Path]:
    """``accuracy_per_round.png`` and ``calibration_gain.png`` (matplotlib, Agg)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except ImportError:  # pragma: no cover - matplotlib is in the dev extra
        return []
    cols = report["settings"]["columns"]
    labels = {m["key"]: m["label"] for m in report["methods"]}
    keys = [m["key"] for m in report["methods"]]
    colors = dict(zip(keys, method_colors(len(keys)), strict=True))
    gains = report["calibration"]
    written = []

    fig, axes = plt.subplots(1, len(cols), figsize=(max(6.5, 4.2 * len(cols)), 3.8), squeeze=False)
    cals_drawn: set[str] = set()
    for ax, col in zip(axes[0], cols, strict=True):
        for key in keys:
            curve = report["curves"].get(key, {}).get(col["key"])
            if not curve:
                continue
            mean = 100 * np.asarray(curve["mean"])
            rounds = np.arange(1, mean.size + 1)
            ax.plot(
                rounds, mean, label=labels[key], color=colors[key], lw=1.2, ls="-",
                marker="o" if mean.size == 1 else None, ms=3,
            )  # fmt: skip
            # the calibrated accuracies of the same model: a segment after the last round
            g = gains.get(key, {}).get(col["key"], {})
            span = (mean.size, mean.size + max(1.0, 0.15 * mean.size))
            for cal in ("ccvr", "ffc", "oracle"):
                stats = calibration_stats(g, cal)
                value = None if stats is None else stats["mean"]
                if value is None:
                    continue
                cals_drawn.add(cal)
                ax.plot(span, [100 * value] * 2, color=colors[key], ls=CALIBRATION_STYLES[cal])
        ax.set_title(col["label"])
        ax.set_xlabel("round (segments after the last: calibrated)")
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
    handles, names = axes[0][0].get_legend_handles_labels()
    style_handles = [
        Line2D([], [], color="black", ls=CALIBRATION_STYLES[c], label=c)
        for c in ("none", "ccvr", "ffc", "oracle")
        if c == "none" or c in cals_drawn
    ]
    fig.legend(
        handles=[*handles, *style_handles],
        loc="lower center",
        ncol=min(7, max(1, len(names) + len(style_handles))),
        fontsize=7,
    )
    fig.suptitle(
        "Accuracy per round (lr selected on validation, no calibration; mean over seeds)",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.14, 1, 0.95))
    path = out_dir / "accuracy_per_round.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    written.append(path)

    cals = gain_panels(report)
    fig, axes = plt.subplots(
        1, len(cals), figsize=(max(3.5 * len(cals), 0.55 * len(keys) * len(cals)), 3.8),
        squeeze=False,
    )  # fmt: skip
    width = 0.8 / max(len(cols), 1)
    x = np.arange(len(keys))
    column_colors = method_colors(len(cols) + len(keys))[len(keys) :]
    for ax, cal in zip(axes[0], cals, strict=True):
        for j, col in enumerate(cols):
            vals, errs = [], []
            for key in keys:
                st = calibration_stats(gains[key][col["key"]], f"{cal}_gain")
                st_mean = None if st is None else st["mean"]
                std = None if st is None else st["std"]
                vals.append(100 * st_mean if st_mean is not None else np.nan)
                errs.append(100 * std if std is not None else 0.0)
            ax.bar(
                x + (j - (len(cols) - 1) / 2) * width,
                vals,
                width,
                yerr=errs,
                label=col["label"],
                capsize=2,
                color=column_colors[j],
            )
        ax.axhline(0, color="black", lw=0.6)
        ax.set_xticks(x)
        ax.set_xticklabels([labels[k] for k in keys], rotation=60, ha="right", fontsize=7)
        for tick, key in zip(ax.get_xticklabels(), keys, strict=True):
            tick.set_color(colors[key])
        ax.set_ylabel("gain over no calibration (points)")
        title = "oracle (best on test)" if cal == "oracle" else f"+{cal.upper()}"
        ax.set_title(f"{title} gain per partition")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / "calibration_gain.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    written.append(path)
    if report["table"] == "calibration":
        written += _oracle_gap_plot(report, out_dir, plt)
    return written


def _oracle_gap_plot(report: ExperimentResults, out_dir: Path, plt: Any) -> list[Path]:
    """``calibration_accuracy.png``: every calibration's accuracy per column (one panel
    per method), the oracle as a bar too, error bars = std over seeds."""
    cols = report["settings"]["columns"]
    labels = {m["key"]: m["label"] for m in report["methods"]}
    keys = list(report["calibration"])
    fig, axes = plt.subplots(
        1, len(keys), figsize=(max(6.5, 1.6 * len(cols)) * len(keys), 3.8), squeeze=False
    )
    for ax, key in zip(axes[0], keys, strict=True):
        per_col = report["calibration"][key]
        cals = [
            c for c in ("none", *GAIN_ORDER, "oracle") if any(c in per_col[k["key"]] for k in cols)
        ]
        width = 0.8 / max(len(cals), 1)
        x = np.arange(len(cols))
        for j, cal in enumerate(cals):
            stats = [_stats(per_col[c["key"]], cal) for c in cols]
            vals = [100 * m if (m := st[0]) is not None else np.nan for st in stats]
            errs = [100 * sd if (sd := st[1]) is not None else 0.0 for st in stats]
            ax.bar(
                x + (j - (len(cals) - 1) / 2) * width,
                vals,
                width,
                yerr=errs,
                capsize=2,
                label=CALIBRATION_LABELS[cal],
            )
        ax.set_xticks(x)
        ax.set_xticklabels([c["label"] for c in cols])
        ax.set_ylabel("test accuracy (%)")
        finite = [
            100 * mean
            for c in cols
            for cal in cals
            if (mean := _stats(per_col[c["key"]], cal)[0]) is not None
        ]
        if finite:
            ax.set_ylim(max(0.0, min(finite) - 5), min(100.0, max(finite) + 3))
        ax.set_title(f"{labels[key]}: calibration vs oracle")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = out_dir / "calibration_accuracy.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return [path]


def _stats(cell: JsonObject, name: str) -> tuple[float | None, float | None]:
    """(mean, std) of one calibration in a ``calibration.<method>.<column>`` cell."""
    st = calibration_stats(cell, name)
    return (None, None) if st is None else (st["mean"], st["std"])
