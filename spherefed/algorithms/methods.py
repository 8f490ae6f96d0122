"""Every method of the papers as a named recipe: algorithm × head × classifier × loss.

A :class:`MethodSpec` says how to train; calibration (none / CCVR / FFC) is applied
afterwards to *every* method by the runner, so "FedAvg + FFC" is the FedAvg run with
the FFC classifier swapped in (FFC applies to any features — SphereFed App. C.3).

Base algorithms (learnable bias-free classifier, cross-entropy — the "Baseline" rows
of SphereFed Tab. 2 and FedFN Tab. 2): FedAvg, FedProx, FedNova, FedOpt (server Adam
and Yogi), SCAFFOLD — see :mod:`spherecal.spherefed.algorithms.strategies`.

Rival fixes (all on FedAvg):

- **BABU** (Oh et al. 2022; FedFN §5.1 "+BABU"): the classifier is randomly
  initialised and frozen; CE. Here: the He-initialised ``random`` fixed classifier
  on raw features (the ``fixed`` head) — FedBABU keeps PyTorch's default init, which
  differs only in scale, irrelevant for a frozen layer on unnormalised features.
- **FedFN** (Kim et al. 2023, §4.1): features normalised, classifier learnable, CE;
  FN divides the classifier gradient by ``‖f(x)‖``, hence its larger learning rate.
- **FedUV** (Son et al. 2024, Eq. 1–4): CE + ``μ`` uniformity + ``λ`` variance hinge.
- **SphereFed-CE (τ)** (Kim et al. 2023, App. D.4/D.5): SphereFed's head with CE on
  ``τ``-scaled cosine logits.
- **SphereFed** (Dong et al. 2022): fixed orthonormal classifier, normalised features,
  MSE; its "+FFC" row is the paper's full method.

Ablation (SphereFed Tab. 3, FedAvg base): {CE, MSE} × {baseline, Fix (R), Fix (OU),
Norm, Fix (OU) + Norm}, plus the temperature sweep of FedFN Tab. 11 for
CE + Fix (OU) + Norm.

Learning rates: the MSE loss on unit-norm outputs is reported to need ~10× the CE
learning rate (FedFN App. D.5) and FN rescales the classifier gradient (FedFN §4.1),
so no single learning rate is fair to all methods. Every method therefore gets the
same wide log-spaced grid :data:`DEFAULT_LR_GRID` (0.01 … 1) and the experiment
harness picks *per method* on the validation split, reporting every grid point —
which makes the learning-rate shift visible (or shows its absence) instead of baking
a paper's CIFAR optimum into the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from spherecal.spherefed.algorithms.base import AlgorithmSettings, ServerStrategy
from spherecal.spherefed.algorithms.objectives import (
    FedUVConfig,
    feduv_objective,
    temperature_objective,
)
from spherecal.spherefed.algorithms.registry import configured_strategy
from spherecal.spherefed.fl import LocalObjective

if TYPE_CHECKING:
    from spherecal.spherefed.reference import ReferenceConfig

DEFAULT_LR_GRID: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0)
"""Every method's default local learning-rate grid (tuned on validation)."""


@dataclass(frozen=True)
class MethodSpec:
    """How one method trains. ``key`` names it; everything else defines the run.

    ``temperature_grid`` (if not empty) is tuned jointly with the learning rate;
    ``fedopt_lr`` is FedOpt's server learning rate ``η``.
    """

    key: str
    label: str
    algorithm: str = "fedavg"
    head: str = "learnable"
    classifier: str = "orthonormal"
    loss: str = "ce"
    temperature: float = 1.0
    temperature_grid: tuple[float, ...] = ()
    feduv: FedUVConfig | None = None
    lr_grid: tuple[float, ...] = DEFAULT_LR_GRID
    fedopt_lr: float = 0.01
    source: str = ""
    family: str = "rival"

    def temperatures(self) -> tuple[float, ...]:
        return self.temperature_grid or (self.temperature,)

    def reference_config(self, base: ReferenceConfig, *, lr: float) -> ReferenceConfig:
        """``base`` with this method's head, classifier, loss and the given lr."""
        return replace(
            base,
            head=self.head,
            classifier=self.classifier,
            loss=self.loss,
            lr=float(lr),
            algorithm="fedprox" if self.algorithm == "fedprox" else "fedavg",
        )

    def strategy(self, base: ReferenceConfig) -> ServerStrategy:
        """A fresh server strategy for one federation (SCAFFOLD's ``N`` = every
        participant, as in the paper; FedProx's ``μ`` from ``base``)."""
        return configured_strategy(
            self.algorithm,
            AlgorithmSettings(
                prox_mu=base.prox_mu,
                fedopt_lr=self.fedopt_lr,
                num_participants=base.participants,
            ),
        )

    def objective(self, temperature: float | None = None) -> LocalObjective | None:
        """The local loss, or ``None`` for plain ``config.loss`` (the reference path)."""
        temperature = self.temperature if temperature is None else temperature
        if self.feduv is not None:
            return feduv_objective(None, self.feduv)
        if temperature != 1.0:
            return temperature_objective(self.loss, temperature)
        return None

    def service_options(self) -> dict[str, Any] | None:
        """How to run this method through the service, or ``None`` where it needs more
        than the service carries.

        The service carries a model plan (extractor, head, classifier), a local loss,
        any algorithm of the registry (``spherecal.spherefed.algorithms.STRATEGIES``: the named
        sums it declares travel through secure aggregation, what it broadcasts is
        published with the model). Not: custom local objectives (FedUV's terms, a CE
        temperature τ ≠ 1). The keys are those of ``spherecal simulate`` options and
        of the coordinator's ``[model]`` / ``[training]`` tables.
        """
        if self.objective() is not None:
            return None
        if self.temperature_grid and set(self.temperature_grid) != {1.0}:
            return None
        options: dict[str, Any] = {
            "algorithm": self.algorithm,
            "head": self.head,
            "classifier": self.classifier,
            "loss": self.loss,
        }
        if self.algorithm in ("fedadam", "fedyogi"):
            options["fedopt_lr"] = self.fedopt_lr
        return options

    def describe(self, temperature: float | None = None) -> dict[str, Any]:
        """What identifies the training run beyond the reference config (for cell keys)."""
        tau = self.temperature if temperature is None else temperature
        out: dict[str, Any] = {"algorithm": self.algorithm, "temperature": float(tau)}
        if self.feduv is not None:
            out["feduv"] = {
                "mu": self.feduv.mu,
                "lam": self.feduv.lam,
                "unbiased": self.feduv.unbiased,
            }
        if self.algorithm in ("fedadam", "fedyogi"):
            out["fedopt_lr"] = self.fedopt_lr
        return out


def _base(key: str, label: str, source: str) -> MethodSpec:
    return MethodSpec(key=key, label=label, algorithm=key, source=source, family="base")


BASES: tuple[MethodSpec, ...] = (
    _base("fedavg", "FedAvg", "McMahan et al. 2017"),
    _base("fedprox", "FedProx", "Li et al. 2020 (μ = 0.01)"),
    _base("fednova", "FedNova", "Wang et al. 2020 (normalised averaging)"),
    _base("fedadam", "FedAdam", "Reddi et al. 2021, Alg. 2 (server Adam)"),
    _base("fedyogi", "FedYogi", "Reddi et al. 2021, Alg. 2 (server Yogi)"),
    _base("scaffold", "SCAFFOLD", "Karimireddy et al. 2020, Alg. 1 (option II)"),
)

RIVALS: tuple[MethodSpec, ...] = (
    MethodSpec(
        key="babu",
        label="BABU",
        head="fixed",
        classifier="random",
        source="Oh et al. 2022; Kim et al. 2023 §5.1",
    ),
    MethodSpec(key="fedfn", label="FedFN", head="fn", source="Kim et al. 2023 §4.1"),
    MethodSpec(key="feduv", label="FedUV", feduv=FedUVConfig(), source="Son et al. 2024 Eq. 1–4"),
    MethodSpec(
        key="spherefed_ce",
        label="SphereFed-CE (τ=15)",
        head="sphere",
        temperature=15.0,
        source="Kim et al. 2023 App. D.4–D.5",
    ),
    MethodSpec(
        key="spherefed",
        label="SphereFed",
        head="sphere",
        loss="mse",
        source="Dong et al. 2022 §4 (MSE, Fix (OU) + Norm)",
    ),
)

_ABLATION_VARIANTS: tuple[tuple[str, str, str, str], ...] = (
    # key suffix, label suffix, head, classifier
    ("base", "", "learnable", "orthonormal"),
    ("fix_r", " + Fix (R)", "fixed", "random"),
    ("fix_ou", " + Fix (OU)", "fixed", "orthonormal"),
    ("norm", " + Norm", "fn", "orthonormal"),
    ("fix_ou_norm", " + Fix (OU) + Norm", "sphere", "orthonormal"),
)


def _ablation() -> tuple[MethodSpec, ...]:
    out = []
    for loss in ("ce", "mse"):
        for suffix, label, head, classifier in _ABLATION_VARIANTS:
            out.append(
                MethodSpec(
                    key=f"{loss}_{suffix}",
                    label=f"{loss.upper()}{label}",
                    head=head,
                    classifier=classifier,
                    loss=loss,
                    source="Dong et al. 2022 Tab. 3",
                    family="ablation",
                )
            )
    for tau in (10.0, 15.0, 30.0):
        out.append(
            MethodSpec(
                key=f"ce_fix_ou_norm_tau{tau:g}",
                label=f"CE + Fix (OU) + Norm, τ={tau:g}",
                head="sphere",
                temperature=tau,
                source="Kim et al. 2023 App. D.4, Tab. 11",
                family="ablation",
            )
        )
    return tuple(out)


ABLATION: tuple[MethodSpec, ...] = _ablation()

METHODS: dict[str, MethodSpec] = {m.key: m for m in (*BASES, *RIVALS, *ABLATION)}
"""Every method by key."""


def get_method(key: str) -> MethodSpec:
    try:
        return METHODS[key]
    except KeyError:
        raise ValueError(f"unknown method {key!r}; expected one of {sorted(METHODS)}") from None


def sphere_variant(base: MethodSpec) -> MethodSpec:
    """``base``'s algorithm with SphereFed's head and loss ("+ Ours" rows of SphereFed Tab. 2)."""
    return replace(
        base,
        key=f"{base.key}_spherefed",
        label=f"{base.label} + SphereFed",
        head="sphere",
        loss="mse",
        family="sphere",
        source=f"{base.source}; Dong et al. 2022 Tab. 2",
    )
