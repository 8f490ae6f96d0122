"""Local work of a participant: train a round, compute statistics, evaluate.

Everything mirrors ``spherecal.spherefed.reference.run_reference`` operation for operation —
``load_state_vector`` then ``local_train`` with the round's seed; features in batches
of 512 in eval mode; statistics with ``spherecal.spherefed.stats``; evaluation batches of 512
with the classifier swapped in and restored — so a participant process computes the
same floats the reference runner computes for participant ``k`` (given the same
torch build and thread count). Local training is the plan's algorithm's own local
step (``spherecal.spherefed.algorithms.STRATEGIES``, the object the harness calls), and its
payload is flattened in the layout the coordinator unflattens
(``ServerStrategy.layout`` + ``LOSS_SUM``).
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from spherecal.participant.adversary import Adversary
from spherecal.participant.data import LocalData
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import model_spec_from_proto
from spherecal.spherefed.algorithms.base import (
    LOSS_SUM,
    AlgorithmSettings,
    ClientResult,
    ServerStrategy,
    SumLayout,
    as_payload,
)
from spherecal.spherefed.algorithms.registry import configured_strategy
from spherecal.spherefed.discriminant import CalibratedHead
from spherecal.spherefed.fl import (
    LocalTrainConfig,
    LocalUpdate,
    aggregated_keys,
    count_correct,
    load_state_vector,
    state_vector,
)
from spherecal.spherefed.network import (
    ModelSpec,
    Net,
    build_model,
    classifier_swapped,
    compute_features,
)
from spherecal.spherefed.privacy.sensitivity import exact_ccvr_statistics, exact_ffc_statistics
from spherecal.spherefed.stats import ccvr_statistics, ffc_statistics

__all__ = ["LocalTrainer", "model_spec_from_plan", "random_subset"]

FEATURE_BATCH = 512


def random_subset(n: int, m: int, rng: np.random.Generator | None = None) -> npt.NDArray[np.int64]:
    """Indices of a uniformly random subset of exactly ``m`` of ``n`` records, in
    increasing order; every index (``0 … n-1``) when ``n <= m``.

    Why: a DP job's plan bounds what one site sends by the job's public
    ``max_examples``, and every secure job's ``bound`` caps its counts (an
    evaluation's total, a unit-norm statistic's entries). A site holding more
    contributes a random subset of the size that fits instead of refusing, since a
    refusal would tell the coordinator — un-noised, past secure aggregation, and as
    often as it asks with other bounds — how many it holds. The draw is the site's
    own, fresh each call (keyed from :mod:`secrets` without ``rng``; ``rng`` is for
    tests): nobody outside the site knows or chooses which records a release used."""
    if n < 0 or m < 0:
        raise ValueError(f"need n >= 0 and m >= 0, got n={n}, m={m}")
    if n <= m:
        return np.arange(n, dtype=np.int64)
    gen = rng if rng is not None else np.random.default_rng(secrets.randbits(128))
    return np.sort(gen.choice(n, size=m, replace=False, shuffle=False)).astype(np.int64)


def _at_most(
    x: torch.Tensor, y: torch.Tensor, max_examples: int | None, rng: np.random.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)``, or the rows of a uniformly random ``max_examples`` of them when
    there are more (:func:`random_subset`); only those rows go through the network."""
    n = int(y.shape[0])
    if max_examples is None or n <= max_examples:
        return x, y
    keep = torch.from_numpy(random_subset(n, max_examples, rng))
    return x[keep], y[keep]


def _canonical(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` with each value in one form per number it computes as: ``-0.0`` as
    ``+0.0`` (IEEE ``-0.0 + 0.0 = +0.0``; every other value is unchanged by the sum) and
    every NaN as the one NaN torch writes (``LocalTrainer.executed_digest``)."""
    if not tensor.is_floating_point():
        return tensor
    return torch.where(torch.isnan(tensor), torch.full_like(tensor, float("nan")), tensor + 0.0)


def model_spec_from_plan(spec: pb.ModelSpec) -> ModelSpec:
    return ModelSpec(**model_spec_from_proto(spec))


def local_config_from_plan(training: pb.LocalTraining) -> LocalTrainConfig:
    return LocalTrainConfig(
        epochs=int(training.epochs),
        batch_size=int(training.batch_size),
        lr=float(training.lr),
        momentum=float(training.momentum),
        weight_decay=float(training.weight_decay),
        loss=training.loss,
        prox_mu=float(training.prox_mu),
    )


def strategy_from_plan(training: pb.LocalTraining) -> ServerStrategy:
    """The plan's algorithm (``""`` = FedAvg) from the one registry; ValueError when
    this participant does not know it."""
    return configured_strategy(
        training.algorithm or "fedavg", AlgorithmSettings(prox_mu=float(training.prox_mu))
    )


class LocalTrainer:
    def __init__(self, plan: pb.Plan, data: LocalData) -> None:
        self.spec = model_spec_from_plan(plan.model)
        self.config = local_config_from_plan(plan.training)
        self.strategy = strategy_from_plan(plan.training)
        self.data = data
        self.model: Net = build_model(self.spec)
        self.keys = aggregated_keys(self.model)
        self.length = int(state_vector(self.model, self.keys).shape[0])
        #: The vector this participant sends each round: the strategy's sums, then Σ loss,
        #: each scalar sum at the scale the plan names (powers of two; checked here).
        self.layout: SumLayout = self.strategy.layout(self.length, LOSS_SUM).with_scales(
            dict(plan.sum_scales)
        )

    @property
    def feature_dim(self) -> int:
        return self.model.feature_dim

    @property
    def num_classes(self) -> int:
        return self.model.num_classes

    def load(self, vector: npt.NDArray[np.float64]) -> None:
        # A private writable copy: downloaded tensors are read-only, and torch warns
        # about (and must not alias) read-only numpy memory.
        load_state_vector(self.model, np.array(vector, dtype=np.float64), self.keys)

    def executed_digest(self, vector: npt.NDArray[np.float64]) -> bytes:
        """SHA-256 of the model the network actually computes with: the architecture,
        then every aggregated tensor *after* the cast to its dtype (float32), as
        :meth:`load` writes it. Two vectors that differ only below float32 precision
        (a 1-ulp float64 change) run the same network and give the same digest, so
        the release ledger treats them as one model (issue #19).

        Each value is written in one form per number the network computes with: a zero
        as ``+0.0`` and every NaN as one NaN (:func:`_canonical`). A weight of ``-0.0``
        runs as ``+0.0`` does — its products and sums, the loss, the gradients and the
        update ``after − start`` are bit for bit the same — but its bytes differ, and
        until 2026-11-27 a coordinator that gave one zero weight the other sign got a
        new executed model for free: two rounds over rosters one site apart gave
        identical updates that the site's audit did not pair, and exact statistics left
        again where the executed model was their only key
        (``tests/security/test_differencing.py``)."""
        vec = np.asarray(vector, dtype=np.float64)
        state = self.model.state_dict()
        h = hashlib.sha256(b"spherecal/executed-model/v1\0")
        h.update(repr(self.spec).encode())
        offset = 0
        for key in self.keys:
            t = state[key]
            n = t.numel()
            cast = _canonical(torch.from_numpy(np.array(vec[offset : offset + n])).to(t.dtype))
            h.update(f"\0{key}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
            h.update(cast.contiguous().numpy().tobytes())
            offset += n
        return h.digest()

    def update_digest(
        self,
        vector: npt.NDArray[np.float64],
        seed: int,
        broadcast: Mapping[str, npt.NDArray[np.float64]] | None = None,
    ) -> bytes:
        """SHA-256 of what determines an exact update (:meth:`train`) bit for bit, as
        far as the coordinator sets it: the executed model (:meth:`executed_digest`),
        the round's seed, each broadcast tensor as executed (cast per tensor as the
        model is: SCAFFOLD's ``c`` corrects float32 gradients) and the plan's local
        training — its algorithm, epochs, batch size, lr, momentum, weight decay,
        loss, proximal term.

        Not in it: the site's data and its client state (SCAFFOLD's ``c_k``), which
        the update also depends on. The release ledger refuses a second update of
        one digest in a federation (:meth:`ReleaseLedger.admit_update`), and a
        refusal keyed on the data would tell the coordinator whether it changed;
        an update asked again over changed data or state is refused too (the safe
        side). The training weight, the job's bound and the sums' scales are not
        in it either: they scale or clip an update whose trained delta is the same,
        and the sums carry the weight, so the coordinator undoes them."""
        h = hashlib.sha256(b"spherecal/update/v1\0")
        h.update(self.executed_digest(vector))
        h.update(int(seed).to_bytes(8, "big", signed=True))
        for name in sorted(broadcast or {}):
            h.update(f"\0broadcast\0{name}\0".encode())
            h.update(self.executed_digest(np.asarray((broadcast or {})[name], np.float64)))
        h.update(f"\0{self.strategy.name}\0{self.config!r}".encode())
        return h.digest()

    def train(
        self,
        vector: npt.NDArray[np.float64],
        seed: int,
        *,
        broadcast: dict[str, npt.NDArray[np.float64]] | None = None,
        client_state: dict[str, npt.NDArray[np.float64]] | None = None,
    ) -> ClientResult:
        """The strategy's local step from ``vector`` (what the harness runs for this
        participant): payload, diagnostics and the new client state."""
        self.load(vector)
        return self.strategy.local_step(
            self.model,
            self.data.train_x,
            self.data.train_y,
            self.config,
            seed=int(seed),
            broadcast=broadcast or {},
            client_state=client_state,
        )

    def flatten(
        self, result: ClientResult, *, loss_bound: float | None = None
    ) -> npt.NDArray[np.float64]:
        """The payload plus ``loss = mean_loss``, as the one vector to send.

        ``loss_bound``: a secure job's entry bound, which the loss is clipped to. The
        loss is a metric no server step reads, so clipping costs only the round's
        reported loss, whereas a refusal by it would tell the coordinator — past
        secure aggregation, at a bound it chose — whether this site's mean loss is
        above it (not covered by DP-SGD, which noises the update but not the loss).
        A non-finite loss is left as it is: the job's encoder refuses it."""
        loss = result.mean_loss
        if loss_bound is not None and np.isfinite(loss):
            loss = float(np.clip(loss, -loss_bound, loss_bound))
        return self.layout.flatten({**result.payload, LOSS_SUM.name: loss})

    def require_dpsgd_compatible(self) -> None:
        """Refuse DP-SGD with an algorithm whose sums are not FedAvg's (FedNova's
        ``τ``, SCAFFOLD's control variates: their sensitivity is not bounded by
        DP-SGD's clipping). Checked before any privacy budget is charged."""
        if self.strategy.sum_keys != ("delta", "weight"):
            raise ValueError(
                f"DP-SGD updates fit FedAvg-style sums only, not {self.strategy.name}'s "
                f"{list(self.strategy.sum_keys)}"
            )

    def dpsgd_result(self, update: LocalUpdate) -> ClientResult:
        """A DP-SGD update as this strategy's payload; only strategies whose sums are
        FedAvg's (``Σ n_k Δ_k``, ``Σ n_k``) can take it."""
        self.require_dpsgd_compatible()
        return ClientResult(
            as_payload(delta=update.weighted_delta, weight=update.num_samples),
            update.num_samples,
            update.num_steps,
            update.mean_loss,
        )

    def dpsgd_config(self, noise_multiplier: float, max_grad_norm: float, delta: float) -> Any:
        """The plan's local training as DP-SGD (momentum, lr, epochs, batch size, loss;
        weight decay and FedProx's term are not applied under DP-SGD)."""
        from spherecal.spherefed.privacy.dpsgd import DPSGDConfig

        return DPSGDConfig(
            epochs=self.config.epochs,
            batch_size=self.config.batch_size,
            lr=self.config.lr,
            momentum=self.config.momentum,
            max_grad_norm=max_grad_norm,
            noise_multiplier=noise_multiplier,
            delta=delta,
            loss=self.config.loss,
        )

    def dpsgd_steps(self) -> tuple[float, int]:
        """(sample rate, steps) DP-SGD will take: Opacus samples with rate
        ``1/⌈n/b⌉`` for ``⌈n/b⌉`` steps per epoch. Known before training, so the charge
        can be checked against the budget before any data is touched."""
        n = self.data.train_size
        batches = max(1, math.ceil(n / max(1, min(self.config.batch_size, n or 1))))
        return 1.0 / batches, batches * self.config.epochs

    def train_dpsgd(self, vector: npt.NDArray[np.float64], config: Any) -> tuple[LocalUpdate, Any]:
        """One round of DP-SGD from ``vector``; (update, DPSGDResult)."""
        from spherecal.spherefed.privacy.dpsgd import dp_local_train

        self.load(vector)
        start = state_vector(self.model, self.keys)
        n = self.data.train_size
        result = dp_local_train(self.model, self.data.train_x, self.data.train_y, config)
        after = state_vector(self.model, self.keys)
        update = LocalUpdate(
            weighted_delta=float(n) * (after - start),
            num_samples=n,
            num_steps=result.steps,
            mean_loss=result.mean_loss,
        )
        return update, result

    def features(self, x: torch.Tensor) -> npt.NDArray[np.float64]:
        return compute_features(self.model, x, batch_size=FEATURE_BATCH)

    def statistics(
        self,
        vector: npt.NDArray[np.float64],
        kind: str,
        *,
        max_examples: int | None = None,
        rng: np.random.Generator | None = None,
    ) -> npt.NDArray[np.float64]:
        """FFC or CCVR statistics of the local training split, packed (flat float64).

        ``max_examples``: a training split larger than it contributes a uniformly
        random ``max_examples`` of its examples (:func:`random_subset`, drawn afresh;
        ``rng`` fixes the draw for tests). A secure job's bound caps every entry, and
        with a unit-norm head the largest entry is the count: the caller passes the
        count that fits the job's bound, so the site sends whatever its count instead
        of refusing by it (``spherecal.participant.statistics_task``)."""
        x, labels = _at_most(self.data.train_x, self.data.train_y, max_examples, rng)
        self.load(vector)
        z = self.features(x)
        y = labels.numpy()
        if kind == "ffc":
            return ffc_statistics(z, y, self.num_classes).pack()
        if kind == "ccvr":
            return ccvr_statistics(z, y, self.num_classes).pack()
        raise ValueError(f"unknown statistics kind {kind!r}")

    def attacked_statistics(
        self, adversary: Adversary, kind: str, honest: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """TEST ONLY: ``honest`` (packed, at the loaded model) replaced by
        ``adversary``'s statistics (``spherecal.participant.adversary``)."""
        if not adversary.attacks_statistics:
            return honest
        return adversary.statistics(
            kind,
            honest,
            features=self.features(self.data.train_x),
            labels=self.data.train_y.numpy().astype(np.int64),
            classifier=self.model.head.weight.detach().double().numpy(),
        )

    def private_statistics(
        self,
        vector: npt.NDArray[np.float64],
        kind: str,
        *,
        quant_bits: int,
        max_examples: int | None = None,
        rng: np.random.Generator | None = None,
    ) -> npt.NDArray[np.float64]:
        """Statistics for a DP release: exact sums of quantised unit features, packed
        with the isometric triangle layout. Only statistics computed this way are
        covered by the release's sensitivity bound (``spherecal.spherefed.privacy.sensitivity``);
        plain float statistics are not.

        ``max_examples`` is the release's public bound on one site's examples, which
        the plan's ring headroom and rounding term assume: a training split larger
        than it contributes a uniformly random ``max_examples`` of its examples
        (:func:`random_subset`, drawn afresh each call; ``rng`` fixes the draw for
        tests), so the statistics never count more than the plan allows. Only the
        selected rows go through the network."""
        x, y_all = _at_most(self.data.train_x, self.data.train_y, max_examples, rng)
        self.load(vector)
        z = self.features(x)
        y = y_all.numpy()
        if kind == "ffc":
            return exact_ffc_statistics(z, y, self.num_classes, quant_bits=quant_bits).pack(
                isometric=True
            )
        if kind == "ccvr":
            return exact_ccvr_statistics(z, y, self.num_classes, quant_bits=quant_bits).pack(
                isometric=True
            )
        raise ValueError(f"unknown statistics kind {kind!r}")

    def evaluate(
        self,
        vector: npt.NDArray[np.float64],
        heads: Mapping[str, npt.NDArray[np.float64] | CalibratedHead],
        *,
        split: str = "test",
        max_examples: int | None = None,
        rng: np.random.Generator | None = None,
    ) -> tuple[int, dict[str, int]]:
        """(samples, correct predictions per head) on the local ``test`` or
        ``validation`` split; head ``none`` is the model's own. A weight matrix is
        swapped into the network's classifier (FFC, CCVR); a
        :class:`~spherecal.spherefed.discriminant.CalibratedHead` (bias, QDA's quadratic term)
        scores the network's features, as the reference runner does.

        ``max_examples``: a split larger than it is evaluated on a uniformly random
        ``max_examples`` of its examples (:func:`random_subset`, drawn afresh; ``rng``
        for tests), so that the total and every count stay within a secure job's
        bound: a site whose counts did not fit would refuse, and that refusal — its
        own, past secure aggregation and the counts' noise — would tell the
        coordinator exactly whether the split holds more than the bound it chose
        (``spherecal.participant.evaluation_task``)."""
        if split == "validation":
            x, y = self.data.val_x, self.data.val_y
            if x is None or y is None:
                # ``[data] validation_fraction = 0``: nothing to score, and zero counts
                # (not a withdrawal) keep the secure evaluation job whole for the others;
                # with no validation sample anywhere the coordinator falls back to defaults.
                return 0, {name: 0 for name in ("none", *heads)}
        else:
            x, y = self.data.test_x, self.data.test_y
        x, y = _at_most(x, y, max_examples, rng)
        self.load(vector)
        counts = {"none": count_correct(self.model, x, y, FEATURE_BATCH)}
        features: npt.NDArray[np.float64] | None = None
        labels = y.numpy()
        for name, head in heads.items():
            if isinstance(head, CalibratedHead):
                if features is None:
                    features = self.features(x)
                counts[name] = int(np.sum(head.predict(features) == labels))
                continue
            with classifier_swapped(self.model, np.array(head, dtype=np.float64)):
                counts[name] = count_correct(self.model, x, y, FEATURE_BATCH)
        return int(y.shape[0]), counts
