"""FFC+bias, LDA and QDA through the service: solved from the CCVR secure sums, their
ridge / shrinkage chosen on the participants' validation splits.

Why here and so: the closed forms (``spherecal.spherefed.discriminant``; ESL Eq. 4.10 / 4.12,
SphereFed Eq. 12 on ``[z; 1]``) need only ``N_c``, ``S_c``, ``M_c`` — the sums the
CCVR statistics job already delivers through secure aggregation — so no further
upload is asked for. Each has one knob; every grid point is a local solve, and
the *whole* grid is scored in ONE federated evaluation on the participants'
**validation** splits (``EvaluateTask.split = SPLIT_VALIDATION``; counts summed
through secure aggregation when ``[secure_aggregation] evaluation`` is on), never
on test. The best per calibrator (ties → the earlier, i.e. smaller, value — the
rule of ``spherecal.spherefed.calibration_suite.select_on_validation``) becomes its head;
the chosen value and the validation grid go into ``results.json``
(``calibration.<name>``), exactly the reference runner's keys, plus ``selection``:
``"validation"``, or ``"default, no validation"`` when the evaluation succeeded but
no participant holds a validation sample (every site set ``[data]
validation_fraction = 0``) — then each calibrator takes
:data:`~spherecal.spherefed.calibration_suite.DEFAULT_VALUE`, with a logged warning. A
*failed* validation evaluation is different: the calibrator is left out with an
error (a run that lost what was asked for is not reported as if it had it).
"""

from __future__ import annotations

import time
import warnings
from typing import Any, TypedDict

import numpy as np
import numpy.typing as npt

from spherecal.coordinator.driver.evaluation_stage import federated_evaluation
from spherecal.coordinator.driver.stages import StageContext
from spherecal.coordinator.summary_schema import FederatedEvaluation
from spherecal.spherefed.calibration_suite import (
    DEFAULT_VALUE,
    PARAMETER,
    closed_form_head,
    dp_grid,
    guard_noisy_statistics,
)
from spherecal.spherefed.discriminant import CalibratedHead
from spherecal.spherefed.stats import CCVRStatistics

__all__ = ["NO_VALIDATION", "candidate_name", "select_closed_forms"]

NO_VALIDATION = "default, no validation"
"""``calibration.<name>.selection`` when no participant had a validation sample."""


class EmptyEvaluation(TypedDict):
    """What stands for the validation evaluation when no grid point gave a head."""

    accuracy: dict[str, float | None]
    error: str
    samples: int


def candidate_name(name: str, value: float) -> str:
    """The evaluation head name of grid point ``value`` of calibrator ``name``."""
    return f"{name}@{value!r}"


def _candidates(
    names: tuple[str, ...], grids: dict[str, tuple[float, ...]], stats: CCVRStatistics
) -> tuple[dict[str, CalibratedHead], dict[str, list[dict[str, Any]]], dict[str, set[str]]]:
    heads: dict[str, CalibratedHead] = {}
    rows: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    notes: dict[str, set[str]] = {n: set() for n in names}
    for name in names:
        for value in grids[name]:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    heads[candidate_name(name, value)] = closed_form_head(name, stats, value)
                except (ValueError, np.linalg.LinAlgError) as exc:
                    rows[name].append({"value": value, "validation": None, "error": str(exc)})
                    continue
            notes[name].update(str(w.message)[:160] for w in caught)
            rows[name].append({"value": value, "validation": None})
    return heads, rows, notes


def select_closed_forms(
    ctx: StageContext,
    global_vector: npt.NDArray[np.float64],
    stats: CCVRStatistics,
    *,
    dp_ridge: float | None = None,
) -> dict[str, CalibratedHead]:
    """The chosen head of every configured closed form (a calibrator whose whole grid
    failed, or whose validation evaluation failed, is recorded as an error and left
    out — never replaced by an unvalidated guess).

    ``dp_ridge`` (set when the CCVR sums are a DP release: ``≈ 2√l·σ`` of the noise
    on ``V = Σ_c M_c``): the sums are first guarded
    (:func:`~spherecal.spherefed.calibration_suite.guard_noisy_statistics`: counts ≥ 1, each
    class scatter projected to PSD) and the grids widened
    (:func:`~spherecal.spherefed.calibration_suite.dp_grid`); both are reported under
    ``calibration.dp_guard``."""
    s = ctx.settings.calibration
    progress = ctx.progress
    names = s.closed_forms
    if not names:
        return {}
    t0 = time.monotonic()
    grids = {n: s.grid(n) for n in names}
    if dp_ridge is not None:
        stats, guard = guard_noisy_statistics(stats)
        grids = {n: dp_grid(n, g, dp_ridge) for n, g in grids.items()}
        progress.results.setdefault("calibration", {})["dp_guard"] = {
            **guard.to_json(),
            "dp_ridge": dp_ridge,
            "grids": {n: list(g) for n, g in grids.items()},
        }
        ctx.say(
            f"closed forms on DP-noised sums: counts clipped at 1 for classes "
            f"{guard.clipped_counts}, scatter made PSD for classes {guard.psd_projected}"
        )
    candidates, rows, notes = _candidates(names, grids, stats)
    ctx.say(f"closed forms: {len(candidates)} candidate heads scored on validation")
    fed: FederatedEvaluation | EmptyEvaluation = (
        federated_evaluation(ctx, global_vector, dict(candidates), None, split="validation")
        if candidates
        else {"accuracy": {}, "error": "every grid point failed", "samples": 0}
    )
    accuracy: dict[str, float | None] = fed["accuracy"]
    chosen: dict[str, CalibratedHead] = {}
    report: dict[str, Any] = progress.results.setdefault("calibration", {})
    validation: dict[str, Any] = progress.results.setdefault("validation_accuracy", {})
    if accuracy.get("none") is not None:
        validation["none"] = accuracy["none"]
    if fed.get("error") is None and candidates and int(fed.get("samples") or 0) == 0:
        chosen = _defaults(ctx, names, rows, notes, stats)
        progress.results["validation_evaluation"] = {
            k: fed.get(k)
            for k in ("participants", "samples", "secure", "error", "accuracy_sd", "noise")
        }
        progress.timings["closed_forms_s"] = time.monotonic() - t0
        return chosen
    for name in names:
        best: tuple[float, float] | None = None
        for row in rows[name]:
            if "error" in row:
                continue
            acc = accuracy.get(candidate_name(name, row["value"]))
            row["validation"] = acc
            if acc is not None and (best is None or acc > best[1]):
                best = (row["value"], acc)
        report[name] = {
            "parameter": PARAMETER[name],
            "chosen": None if best is None else best[0],
            "selection": "validation",
            "grid": rows[name],
            "warnings": sorted(notes[name]),
        }
        if best is None:
            why = fed.get("error") or "no validation counts"
            message = f"{name}: not calibrated ({why})"
            progress.errors.append(message)
            ctx.say(message)
            ctx.store.event("error", message)
            continue
        chosen[name] = candidates[candidate_name(name, best[0])]
        validation[name] = best[1]
        ctx.say(f"{name}: {PARAMETER[name]} {best[0]:g} chosen on validation ({best[1]:.4f})")
    progress.results["validation_evaluation"] = {
        k: fed.get(k)
        for k in ("participants", "samples", "secure", "error", "accuracy_sd", "noise")
    }
    progress.timings["closed_forms_s"] = time.monotonic() - t0
    return chosen


def _defaults(
    ctx: StageContext,
    names: tuple[str, ...],
    rows: dict[str, list[dict[str, Any]]],
    notes: dict[str, set[str]],
    stats: CCVRStatistics,
) -> dict[str, CalibratedHead]:
    """No participant holds a validation sample: every calibrator at its
    :data:`DEFAULT_VALUE`, warned about and reported as such — never chosen on test."""
    progress = ctx.progress
    report: dict[str, Any] = progress.results.setdefault("calibration", {})
    chosen: dict[str, CalibratedHead] = {}
    line = (
        "closed forms: no participant holds a validation split ([data] validation_fraction "
        "= 0 everywhere); using default hyper-parameters, not chosen on data"
    )
    ctx.say(line)
    ctx.store.event("warning", line)
    progress.warnings.append(line)
    for name in names:
        value = DEFAULT_VALUE[name]
        entry: dict[str, Any] = {
            "parameter": PARAMETER[name],
            "chosen": value,
            "selection": NO_VALIDATION,
            "grid": rows[name],
            "warnings": sorted(notes[name]),
        }
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                chosen[name] = closed_form_head(name, stats, value)
            except (ValueError, np.linalg.LinAlgError) as exc:
                entry["chosen"] = None
                message = f"{name}: not calibrated (default {PARAMETER[name]} {value:g}: {exc})"
                progress.errors.append(message)
                ctx.say(message)
                ctx.store.event("error", message)
        entry["warnings"] = sorted({*entry["warnings"], *(str(w.message)[:160] for w in caught)})
        report[name] = entry
        if name in chosen:
            ctx.say(f"{name}: {PARAMETER[name]} {value:g} ({NO_VALIDATION})")
    return chosen
