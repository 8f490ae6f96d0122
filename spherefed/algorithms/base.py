"""What every federated algorithm shares: summable payloads and the strategy interface.

Secure aggregation (``crypto/``) gives the coordinator **sums over participants** and
nothing per participant. So every algorithm here is written as

1. a *local step* — a pure function of the global model, the participant's data, what
   the server broadcast, and the participant's own persistent state (SCAFFOLD's
   ``c_k``) — returning a :data:`Payload`: named float64 arrays whose **sum** over the
   round's participants is all the server needs; and
2. a *server step* — a function of the global vector, the summed payload and the
   server's own state (FedOpt's moments, SCAFFOLD's ``c``).

:class:`ServerStrategy` bundles the two for one algorithm, keeps the server state, and
can be checkpointed (``state_dict`` / ``load_state_dict``) so a coordinator that
restarts mid-federation resumes with identical numbers.

A strategy *declares* its sums (:attr:`ServerStrategy.sums`, each a :class:`NamedSum`
that is either one value per model-vector entry or a scalar). The service lays them
out end to end in one vector (:class:`SumLayout`) — the single vector one
secure-aggregation job sums — and splits the aggregate back into named sums.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch
from torch import nn

from spherecal.spherefed.fl import LocalObjective, LocalTrainConfig, local_steps

#: Named float64 arrays (scalars as 0-d arrays). Every entry is summed elementwise
#: over the round's participants — exactly what secure aggregation carries.
Payload = dict[str, np.ndarray]


def as_payload(**entries: np.ndarray | float | int) -> Payload:
    """Build a payload, converting every entry to a float64 array."""
    return {k: np.asarray(v, dtype=np.float64) for k, v in entries.items()}


def add_payloads(total: Payload | None, payload: Payload) -> Payload:
    """``total + payload`` entrywise (``total=None`` starts a new sum; inputs untouched).

    The key sets and shapes must match: a participant that sent something else is a
    protocol error, never silently ignored.
    """
    if total is None:
        return {k: np.array(v, dtype=np.float64, copy=True) for k, v in payload.items()}
    if set(total) != set(payload):
        raise ValueError(f"payload keys {sorted(payload)} differ from {sorted(total)}")
    out: Payload = {}
    for k, v in total.items():
        if v.shape != np.shape(payload[k]):
            raise ValueError(f"payload entry {k!r} has shape {np.shape(payload[k])}, not {v.shape}")
        out[k] = v + payload[k]
    return out


def sum_payloads(payloads: list[Payload]) -> Payload:
    """The sum of several payloads (what the secure-aggregation server outputs)."""
    if not payloads:
        raise ValueError("no payloads to sum")
    total: Payload | None = None
    for p in payloads:
        total = add_payloads(total, p)
    assert total is not None
    return total


@dataclass(frozen=True)
class NamedSum:
    """One named sum a server step reads: ``per_entry`` sums have one value per entry
    of the model vector (``Σ n_k Δ_k``, control-variate sums), the others are scalars
    (``Σ n_k``, FedNova's ``Σ n_k‖a_k‖₁``)."""

    name: str
    per_entry: bool = False
    example_weighted: bool = False
    """Whether the site's entry is proportional to its example weight ``n_k``
    (``n_k Δ_k``, ``n_k``, FedNova's ``n_k‖a_k‖₁``; not SCAFFOLD's ``c_k⁺ − c_k``). A
    site that weights its update by a released count ``ñ_k`` instead of ``n_k``
    (``spherecal.participant.example_weight``) scales exactly these entries by
    ``ñ_k / n_k`` (:meth:`ServerStrategy.reweighed`); the sum named ``weight`` is the
    weight itself."""

    def size(self, model_length: int) -> int:
        return model_length if self.per_entry else 1


def power_of_two_scale(reach: float, bound: float) -> float:
    """The smallest power of two ``s >= 1`` with ``reach / s <= bound``: the divisor
    under which a sum that can reach ``reach`` fits a job's declared ``bound``. A
    power of two so that dividing and multiplying back are exact in float64."""
    if not (math.isfinite(reach) and math.isfinite(bound) and bound > 0):
        raise ValueError(f"reach and bound must be finite, bound > 0: {reach!r}, {bound!r}")
    if reach <= bound:
        return 1.0
    return math.ldexp(1.0, math.ceil(math.log2(reach / bound)))


@dataclass(frozen=True)
class SumLayout:
    """Named sums laid end to end in one float64 vector (declaration order).

    Why: secure aggregation sums exactly one vector per job, and a plaintext upload is
    one tensor; flattening every named sum into it keeps *one* aggregation path for
    any algorithm. Summation is entrywise, so the flattened sum of payloads is the
    flattening of the summed payloads.

    ``scales`` (issue #23): a named sum may travel divided by a public power of two,
    so that one job bound serves sums of very different reach — FedNova's
    ``Σ n_k‖a_k‖₁`` grows with the square of a site's examples while ``Σ n_k Δ_k``
    needs the job's finest fixed-point step. :meth:`flatten` divides, :meth:`unflatten`
    multiplies back; both exact (powers of two).
    """

    entries: tuple[tuple[str, int], ...]
    scales: tuple[tuple[str, float], ...] = ()

    def with_scales(self, scales: Mapping[str, float]) -> SumLayout:
        """This layout with ``scales`` (name → power of two ≥ 1; 1 is dropped);
        refuses an unknown name or a scale that is not such a power of two."""
        for name, scale in scales.items():
            if name not in self.names:
                raise ValueError(f"scale for {name!r}: no such sum in {list(self.names)}")
            mantissa, _ = math.frexp(float(scale))
            if not (math.isfinite(scale) and scale >= 1 and mantissa == 0.5):
                raise ValueError(f"scale of {name!r} must be a power of two >= 1, got {scale!r}")
        kept = tuple(sorted((k, float(v)) for k, v in scales.items() if float(v) != 1.0))
        return SumLayout(self.entries, kept)

    def scale_of(self, name: str) -> float:
        return dict(self.scales).get(name, 1.0)

    @classmethod
    def of(cls, sums: Sequence[NamedSum], model_length: int) -> SumLayout:
        names = [s.name for s in sums]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate sum names in {names}")
        return cls(tuple((s.name, s.size(model_length)) for s in sums))

    @property
    def length(self) -> int:
        return sum(size for _, size in self.entries)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.entries)

    def flatten(self, payload: Mapping[str, np.ndarray | float | int]) -> np.ndarray:
        """The payload as one vector; refuses missing, extra or mis-sized entries."""
        if set(payload) != set(self.names):
            raise ValueError(
                f"payload has {sorted(payload)}, the layout needs {sorted(self.names)}"
            )
        parts = []
        for name, size in self.entries:
            value = np.ravel(np.asarray(payload[name], dtype=np.float64))
            if value.shape[0] != size:
                raise ValueError(f"sum {name!r} has {value.shape[0]} entries, expected {size}")
            scale = self.scale_of(name)
            parts.append(value / scale if scale != 1.0 else value)
        return np.concatenate(parts) if parts else np.zeros(0)

    def unflatten(self, vector: np.ndarray) -> Payload:
        """Named sums from an aggregate; scalars come back as 0-d arrays (copies)."""
        flat = np.asarray(vector, dtype=np.float64)
        if flat.shape != (self.length,):
            raise ValueError(f"aggregate has shape {flat.shape}, the layout {self.length}")
        out: Payload = {}
        start = 0
        for name, size in self.entries:
            part = flat[start : start + size] * self.scale_of(name)
            out[name] = part if size != 1 else np.array(part[0], dtype=np.float64)
            start += size
        return out


#: The service's own sum after a strategy's: ``Σ_k mean_loss_k`` (the round's training
#: loss, a metric; no server step reads it). Participant and coordinator both append it.
LOSS_SUM = NamedSum("loss")


@dataclass(frozen=True)
class AlgorithmSettings:
    """The knobs a deployment sets for any algorithm; each strategy reads what applies
    (:meth:`ServerStrategy.configured`): FedProx ``μ``, FedOpt's server ``η``, and
    SCAFFOLD's ``N`` (``None``: the number selected each round)."""

    prox_mu: float = 0.01
    fedopt_lr: float = 0.01
    num_participants: int | None = None


@dataclass(frozen=True)
class UpdateLimits:
    """What bounds one participant's round payload, entry by entry (issue #24).

    Secure aggregation encodes every entry in a fixed-point ring whose width and scale
    follow from one declared bound on ``|entry|``; the tighter that bound, the finer the
    step a 32-bit ring can carry. The bound follows from what the federation declares:

    * ``max_examples``: ``n_k`` of any site (``[federation] max_examples_per_site``);
    * ``max_change``: ``|θ_k − θ|`` on any entry after one round's local training
      (``[training] max_update_change``: the model's declared update limit);
    * ``max_steps``: local SGD steps of one round, ``epochs · ⌈max_examples / batch⌉``;
    * ``momentum``: the local optimiser's momentum ``ρ`` (FedNova's ``‖a_k‖₁ ≤ τ/(1−ρ)``).

    A site whose payload leaves the bound refuses to encode it
    (:class:`spherecal.crypto.EncodingOverflow`, never a wrap), so a limit declared
    too tight costs that site its round, not the sum's correctness.
    """

    max_examples: int
    max_change: float = 1.0
    max_steps: int = 1
    momentum: float = 0.0

    def __post_init__(self) -> None:
        if self.max_examples < 1:
            raise ValueError(f"max_examples must be >= 1, got {self.max_examples}")
        if not (np.isfinite(self.max_change) and self.max_change > 0):
            raise ValueError(f"max_change must be a positive number, got {self.max_change}")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")


_S = TypeVar("_S", bound="ServerStrategy")


@dataclass(frozen=True)
class ClientResult:
    """One participant's output of a local step.

    ``payload`` goes to secure aggregation; ``client_state`` never leaves the
    participant (SCAFFOLD's ``c_k``; ``None`` for stateless algorithms); the rest is
    diagnostics (number of local SGD steps ``τ_k``, mean training loss).
    """

    payload: Payload
    num_samples: int
    num_steps: int
    mean_loss: float
    client_state: dict[str, np.ndarray] | None = field(default=None)


def parameter_mask(model: nn.Module, keys: list[str]) -> np.ndarray:
    """1.0 on entries of the :func:`~spherecal.spherefed.fl.state_vector` layout that are
    trainable parameters, 0.0 on buffers (e.g. BatchNorm running statistics).

    Control variates (SCAFFOLD) are estimates of *gradients*; a buffer has none.
    """
    state = model.state_dict()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    parts = [
        np.full(state[k].numel(), 1.0 if k in trainable else 0.0, dtype=np.float64) for k in keys
    ]
    return np.concatenate(parts) if parts else np.zeros(0)


class ServerStrategy(ABC):
    """One federated algorithm: its local step, its server step on sums, its state.

    Subclasses declare ``name`` and ``sums`` (the payload entries the server step
    reads — the complete list of what secure aggregation must carry); ``sum_keys`` is
    derived from ``sums``. Register a new algorithm in
    ``spherecal.spherefed.algorithms.registry.STRATEGIES`` (see docs/extending.md).
    """

    name: ClassVar[str]
    sums: ClassVar[tuple[NamedSum, ...]]
    sum_keys: ClassVar[tuple[str, ...]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "sums" in cls.__dict__:
            cls.sum_keys = tuple(s.name for s in cls.sums)

    @classmethod
    def configured(cls: type[_S], settings: AlgorithmSettings) -> _S:
        """This strategy with the deployment's settings (default: no arguments)."""
        return cls()

    def layout(self, model_length: int, *extra: NamedSum) -> SumLayout:
        """Where each declared sum (then ``extra``, e.g. the service's loss) lies in the
        one aggregated vector."""
        return SumLayout.of((*self.sums, *extra), model_length)

    def scalar_reach(self, max_examples: int, config: LocalTrainConfig) -> dict[str, float]:
        """How large each scalar sum's entry can be for one site holding at most
        ``max_examples`` examples and training with ``config`` — the bound that follows
        the data (issue #23), from which the service picks each sum's scale. The
        default: ``weight`` (``n_k``) reaches ``max_examples``."""
        names = {s.name for s in self.sums if not s.per_entry}
        return {"weight": float(max_examples)} if "weight" in names else {}

    def broadcast(self, global_vector: np.ndarray) -> dict[str, np.ndarray]:
        """What the server sends besides the global model (nothing, by default)."""
        return {}

    def reweighed(
        self,
        result: ClientResult,
        weight: int,
        config: LocalTrainConfig,
        *,
        trainable: np.ndarray | None = None,
    ) -> ClientResult:
        """``result`` weighted by ``weight`` instead of the site's own example count
        ``n_k`` (a count the site released, ``spherecal.participant.example_weight``):
        every sum declared :attr:`NamedSum.example_weighted` times ``weight / n_k``, the
        ``weight`` sum set to ``weight`` itself, and the diagnostics a plaintext upload
        carries (``num_samples``, ``num_steps``) those of a site of ``weight`` examples
        (:func:`~spherecal.spherefed.fl.local_steps`: the true step count gives the count
        to within the batch size). A strategy whose sums carry the count in another way
        overrides this (FedNova's ``τ``, SCAFFOLD's control variate, which needs
        ``trainable``: :func:`parameter_mask` of the model)."""
        n = int(result.num_samples)
        factor = weight / n if n > 0 else 0.0
        payload = dict(result.payload)
        for s in self.sums:
            if not s.example_weighted or s.name not in payload:
                continue
            if s.name == "weight":
                payload[s.name] = np.asarray(float(weight), dtype=np.float64)
            else:
                payload[s.name] = np.asarray(payload[s.name], dtype=np.float64) * factor
        return replace(
            result,
            payload=payload,
            num_samples=int(weight),
            num_steps=local_steps(int(weight), config),
        )

    def entry_bound(self, limits: UpdateLimits) -> float | None:
        """The largest ``|entry|`` of this strategy's payload (every declared sum) that
        ``limits`` allow, or ``None`` when the algorithm cannot state one (the service
        then uses its configured fallback). Secure aggregation sizes the round's ring
        from it (:class:`UpdateLimits`)."""
        return None

    @abstractmethod
    def local_step(
        self,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        config: LocalTrainConfig,
        *,
        seed: int,
        broadcast: Mapping[str, np.ndarray],
        client_state: Mapping[str, np.ndarray] | None = None,
        objective: LocalObjective | None = None,
    ) -> ClientResult:
        """Run the participant's half. Uses no server state beyond ``broadcast``."""

    @abstractmethod
    def server_step(
        self, global_vector: np.ndarray, sums: Payload, *, num_selected: int
    ) -> np.ndarray:
        """New global vector from the summed payloads (may update server state)."""

    def state_dict(self) -> dict[str, Any]:
        """Server state to checkpoint (numpy arrays and numbers)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output."""
        if state:
            raise ValueError(f"{self.name} has no server state, got keys {sorted(state)}")

    def hyperparameters(self) -> dict[str, Any]:
        """Constructor settings, for result files."""
        return {}

    def _check_sums(self, global_vector: np.ndarray, sums: Payload) -> None:
        missing = [k for k in self.sum_keys if k not in sums]
        if missing:
            raise ValueError(f"{self.name} needs the sums {list(self.sum_keys)}; missing {missing}")
        if float(sums["weight"]) <= 0:
            raise ValueError("no samples in this round's updates (weight sum is 0)")
        for k in self.sum_keys:
            v = sums[k]
            if v.ndim == 1 and v.shape != global_vector.shape:
                raise ValueError(
                    f"sum {k!r} has {v.shape} entries but the model has {global_vector.shape}"
                )
