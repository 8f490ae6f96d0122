"""Validation-gated calibration and training rounds (issue #22).

Why: the sites already sum validation counts through secure aggregation (the
calibrators' grid, ``discriminant_heads``); the same counts can decide whether a
calibrated head is worth shipping. A head that one dishonest site wrecked — CCVR
retrained on 10⁵ relabelled fake features, say — scores far *below* the
uncalibrated model on validation, which no honest calibration does beyond noise.

The rule (``[federation] validation_gate``, on by default): with ``p₀`` the
uncalibrated model's and ``p_h`` a head's federated validation accuracy over ``n``
samples, the head is not shipped when

    p_h < p₀ − z · √((p₀(1−p₀) + p_h(1−p_h)) / n) − z · √2 · σ / n,

``z = [federation] gate_sigmas`` (3), ``σ`` the DP noise of one count (0 when the
counts are exact). Both accuracies come from one secure evaluation of the same
model on the same samples. A rejected head is left out (the sites save no model for
it) and recorded as an error, so the run is ``degraded`` with the reason. A head
below ``p₀`` but within the uncertainty is shipped (chance may explain it) and still
recorded as a failed check: the run is ``degraded`` and the audit fails, so no run
reads ``completed`` with a calibrated head worse than none on validation — except
within the evaluation's own DP noise band (:func:`noise_band`, issue #19's noised
counts), where a tie reads as "below" half the time: that is a warning, not a
failed check. Every
decision is in ``results.json`` (``integrity.gate.heads``) and ``spherecal audit``.

The uncalibrated model itself must score above chance (``1/C`` plus the same
uncertainty, at most 0.05): a model one site's update blew up scores at chance, which honest
training does not end at; below it is a failed check (``degraded``).

With no validation sample anywhere the gate cannot decide: it says so (a warning)
and ships. With the validation evaluation failed, it ships nothing it could not
check.

Rounds (``[federation] round_gate``, ``off`` by default: one more evaluation job per
round): after each round the new model is scored on validation; a drop of more than
``round_max_drop`` *and* the same uncertainty from the previous model's accuracy is
flagged (``degraded``) and, with ``rollback``, the round's step is undone.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from spherecal.coordinator.driver.evaluation_stage import Heads, federated_evaluation
from spherecal.coordinator.driver.integrity import integrity_record, note
from spherecal.coordinator.driver.stages import StageContext

__all__ = ["RoundGate", "gate_heads", "margin", "noise_band"]


def margin(p0: float, ph: float, n: int, *, sigmas: float, noise_sigma: float = 0.0) -> float:
    """How far below ``p0`` an honest ``ph`` may fall on ``n`` samples (see module)."""
    if n <= 0:
        return math.inf
    se = math.sqrt(max(p0 * (1 - p0) + ph * (1 - ph), 0.0) / n)
    return sigmas * se + sigmas * math.sqrt(2.0) * noise_sigma / n


def _sum_sd(evaluation: Any) -> float:
    """The standard deviation of one noisy count sum of a federated evaluation
    (``noise.sum_sd``), 0 for exact counts or none."""
    if not isinstance(evaluation, dict):
        return 0.0
    noise = evaluation.get("noise")
    return float(noise.get("sum_sd", 0.0)) if isinstance(noise, dict) else 0.0


def noise_band(n: int, *, sigmas: float, noise_sigma: float) -> float:
    """How far the evaluation's DP noise alone can move a difference of two
    accuracies over ``n`` samples (``z · √2 · σ / n``, the noise term of
    :func:`margin`; 0 for exact counts). A head this close below ``p₀`` cannot be told
    from it: shipped with a warning, not a failed check (with noisy counts a tie would
    otherwise make every other run ``degraded``)."""
    if n <= 0 or noise_sigma <= 0:
        return 0.0
    return float(sigmas * math.sqrt(2.0) * noise_sigma / n)


def gate_heads(ctx: StageContext, global_vector: npt.NDArray[np.float64], heads: Heads) -> Heads:
    """The heads that may ship (see the module docstring); the others are recorded."""
    s = ctx.settings
    progress = ctx.progress
    record = integrity_record(progress, s)["gate"]["heads"]
    if not heads:
        return heads
    if not s.validation_gate:
        line = (
            "validation gate off ([federation] validation_gate = false): calibrated heads "
            "are shipped without comparing them with the uncalibrated model"
        )
        ctx.say(f"WARNING: {line}")
        ctx.store.event("warning", line)
        progress.warnings.append(line)
        return heads
    validation: dict[str, Any] = progress.results.setdefault("validation_accuracy", {})
    missing = {n: h for n, h in heads.items() if validation.get(n) is None}
    samples = int((progress.results.get("validation_evaluation") or {}).get("samples") or 0)
    error: str | None = None
    # the validation counts' DP noise (issue #19): of the grid's evaluation, or of ours
    noise_sigma = _sum_sd(progress.results.get("validation_evaluation"))
    if missing or validation.get("none") is None:
        fed = federated_evaluation(ctx, global_vector, missing, None, split="validation")
        error = fed.get("error")
        noise_sigma = _sum_sd(fed)
        samples = int(fed.get("samples") or 0)
        for name, acc in fed["accuracy"].items():
            if acc is not None:
                validation[name] = acc
        progress.results["gate_evaluation"] = {
            k: fed.get(k) for k in ("participants", "samples", "secure", "error")
        }
    p0 = validation.get("none")
    _check_chance(ctx, p0, samples, noise_sigma)
    shipped: Heads = {}
    for name, head in heads.items():
        ph = validation.get(name)
        entry: dict[str, Any] = {"validation": ph, "none": p0, "samples": samples}
        if error is not None or p0 is None or ph is None:
            if samples == 0 and error is None:
                entry.update(shipped=True, reason="no validation samples: not checked")
                shipped[name] = head
                line = f"validation gate: {name} not checked (no validation samples)"
                progress.warnings.append(line)
                ctx.store.event("warning", line)
            else:
                why = error or "no validation accuracy"
                entry.update(shipped=False, reason=f"could not be validated ({why})")
                _reject(ctx, name, f"could not be validated on federated validation ({why})")
            record[name] = entry
            continue
        m = margin(p0, ph, samples, sigmas=s.gate_sigmas, noise_sigma=noise_sigma)
        entry["margin"] = m
        if ph < p0 - m:
            reason = (
                f"validation accuracy {ph:.4f} is below the uncalibrated model's {p0:.4f} "
                f"by more than its uncertainty ({m:.4f}, {samples} samples)"
            )
            entry.update(shipped=False, reason=reason)
            _reject(ctx, name, reason)
        elif ph < p0 - noise_band(samples, sigmas=s.gate_sigmas, noise_sigma=noise_sigma):
            reason = (
                f"validation accuracy {ph:.4f} is below the uncalibrated model's {p0:.4f}, "
                f"within its uncertainty ({m:.4f}, {samples} samples): shipped, not vouched for"
            )
            entry.update(shipped=True, reason=reason)
            shipped[name] = head
            note(ctx, f"{name} no worse than uncalibrated", False, reason, m)
        elif ph < p0:
            reason = (
                f"validation accuracy {ph:.4f} is below the uncalibrated model's {p0:.4f} by "
                f"less than the evaluation's DP noise can move it: shipped (indistinguishable)"
            )
            entry.update(shipped=True, reason=reason)
            shipped[name] = head
            line = f"validation gate: {name}: {reason}"
            progress.warnings.append(line)
            ctx.store.event("warning", line)
        else:
            entry.update(shipped=True, reason="no worse than uncalibrated on validation")
            shipped[name] = head
        record[name] = entry
    return shipped


def _check_chance(ctx: StageContext, p0: float | None, n: int, noise_sigma: float) -> None:
    """The trained model itself: no better than guessing the most likely of ``C``
    classes (``1/C``) on federated validation is what an update one site blew up
    leaves behind (and never what an honest training run ends with). Recorded as a
    failed check, so the run is ``degraded``."""
    if p0 is None or n <= 0:
        return
    classes = ctx.settings.model.num_classes
    chance = 1.0 / classes
    # at most 5 points above chance: a barely trained honest model (one short round)
    # must not be mistaken for a wrecked one, even on a small validation split
    limit = chance + min(
        0.05, margin(chance, chance, n, sigmas=ctx.settings.gate_sigmas, noise_sigma=noise_sigma)
    )
    note(
        ctx,
        "trained model above chance",
        p0 > limit,
        f"the trained model scores {p0:.4f} on federated validation ({n} samples); chance "
        f"is {chance:.4f}, the check needs more than {limit:.4f}",
        limit - chance,
    )


def _reject(ctx: StageContext, name: str, reason: str) -> None:
    message = f"{name} rejected by the validation gate: {reason}"
    ctx.progress.errors.append(message)
    ctx.say(message)
    ctx.store.event("error", message)


class RoundGate:
    """``[federation] round_gate``: score each round's model on validation."""

    def __init__(self, ctx: StageContext) -> None:
        self.ctx = ctx
        self.previous: float | None = None
        self.noise_sigma = 0.0
        """The largest count noise of the two evaluations compared (issue #19)."""

    def _accuracy(self, vector: npt.NDArray[np.float64], index: int) -> tuple[float | None, int]:
        fed = federated_evaluation(self.ctx, vector, {}, index, split="validation")
        self.noise_sigma = max(self.noise_sigma, _sum_sd(fed))
        return fed["accuracy"].get("none"), int(fed.get("samples") or 0)

    def check(
        self, r: int, before: npt.NDArray[np.float64], after: npt.NDArray[np.float64]
    ) -> bool:
        """Record round ``r``'s validation accuracy; True when the round must be rolled
        back (flagged with ``rollback``)."""
        s = self.ctx.settings
        if s.round_gate == "off":
            return False
        if self.previous is None:
            self.previous, _ = self._accuracy(before, r - 1)
        acc, n = self._accuracy(after, r)
        prev = self.previous
        entry: dict[str, Any] = {"round": r + 1, "before": prev, "after": acc, "samples": n}
        flagged = False
        if acc is not None and prev is not None and n > 0:
            limit = max(
                s.round_max_drop,
                margin(prev, acc, n, sigmas=s.gate_sigmas, noise_sigma=self.noise_sigma),
            )
            entry["limit"] = limit
            flagged = prev - acc > limit
        rolled_back = flagged and s.round_gate == "rollback"
        entry.update(flagged=flagged, rolled_back=rolled_back)
        integrity_record(self.ctx.progress, s)["gate"]["rounds"].append(entry)
        if flagged:
            line = (
                f"round {r + 1}: federated validation accuracy dropped from {prev:.4f} to "
                f"{acc:.4f}" + ("; the round is rolled back" if rolled_back else "")
            )
            self.ctx.say(f"WARNING: {line}")
            self.ctx.store.event("warning", line)
        if not rolled_back and acc is not None:
            self.previous = acc
        return rolled_back
