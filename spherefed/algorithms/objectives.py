"""Local training objectives of the rival fixes: CE with a temperature, and FedUV.

- **SphereFed-CE with temperature τ** (Kim et al. 2023, appendix D.4, studied alongside
  the D.5 reproduction): with unit features and unit classifier rows every logit is a
  cosine in ``[−1, 1]``, so softmax + CE can never become confident — the logit margin
  is at most 2. Scaling the logits, ``z̃^τ = τ W f/‖f‖``, relaxes that; FedFN found
  ``τ ≈ 15`` best on CIFAR-100 and τ = 1 clearly worse. SphereFed (§5.3, Tab. 3) makes
  the same point: "CE + Fix (OU) + Norm ... is quite sensitive to the scaling
  hyper-parameter (i.e., temperature)". The temperature only rescales the logits, so
  it changes training, not the arg-max at test time.
- **FedUV** (Son et al. 2024): Eq. 1
  ``L = L_CE(f(X), Y) + μ L_U(g(X)) + λ L_V(f(X))`` with

  * Eq. 2, classifier variance: ``L_V = (1/D) Σ_j max(0, c − √Var(P̂_j))`` where
    ``P̂ = softmax(f(X))`` over the mini-batch and ``P̂_j`` its column for class ``j``
    (the spread of class-``j`` probabilities across the batch);
  * Eq. 3, ``c = (1/D) Σ_j √Var(A_j)`` for the ``D×D`` identity ``A`` — the column
    spread of a perfectly balanced, perfectly classified batch;
  * Eq. 4, hyperspherical uniformity: ``L_U = E_{x≠y}[exp(−‖x − y‖²/(2σ))]`` over the
    rows of the representation ``g(X)`` (the penultimate output), with ``σ`` = the
    median of the squared pairwise distances of the batch (§3.2, "to ensure
    hyperspherical uniformity is induced in any setting");
  * defaults (§4.1): ``μ = 0.5``, ``λ = D/4``.

  ``Var`` is the unbiased estimator (PyTorch's default, which the paper's PyTorch
  pseudocode uses); then ``c = 1/√D``. With the population estimator it would be
  ``√(D−1)/D`` (0.30 instead of 0.316 for D = 10); :class:`FedUVConfig` can select it.
  ``σ`` is treated as a constant (no gradient flows through the median); since
  ``σ`` scales with the squared distances, ``L_U`` is invariant to the scale of
  ``g(X)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from spherecal.spherefed.fl import LocalObjective
from spherecal.spherefed.losses import make_loss
from spherecal.spherefed.network import Net


def temperature_objective(loss: str = "ce", temperature: float = 1.0) -> LocalObjective:
    """``loss(τ · logits, y)`` — SphereFed-CE with temperature (FedFN App. D.4)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if loss != "ce" and temperature != 1.0:
        raise ValueError("a temperature only makes sense with the CE loss")
    loss_fn = make_loss(loss)
    tau = float(temperature)

    def objective(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return loss_fn(tau * model(x), y)

    return objective


@dataclass(frozen=True)
class FedUVConfig:
    """FedUV hyper-parameters (Son et al. 2024, §4.1 defaults).

    ``mu`` weights the uniformity term ``L_U``; ``lam`` the variance term ``L_V``
    (``None`` = ``D/4``, D the number of classes); ``unbiased`` picks the variance
    estimator of Eq. 2–3; ``eps`` keeps ``√Var`` differentiable at 0.
    """

    mu: float = 0.5
    lam: float | None = None
    unbiased: bool = True
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if not self.mu >= 0:
            raise ValueError(f"FedUV mu must be >= 0, got {self.mu}")
        if self.lam is not None and not self.lam >= 0:
            raise ValueError(f"FedUV lam must be >= 0, got {self.lam}")

    def weight_variance(self, num_classes: int) -> float:
        """``λ``: as configured, or ``D/4`` (§4.1)."""
        return num_classes / 4.0 if self.lam is None else float(self.lam)


def feduv_variance_constant(num_classes: int, *, unbiased: bool = True) -> float:
    """Eq. 3: ``c = (1/D) Σ_j √Var(A_j)``, computed from the ``D×D`` identity matrix."""
    if num_classes < 2:
        raise ValueError(f"FedUV needs at least 2 classes, got {num_classes}")
    eye = torch.eye(num_classes, dtype=torch.float64)
    return float(eye.var(dim=0, unbiased=unbiased).sqrt().mean())


def feduv_variance_loss(
    logits: torch.Tensor, c: float, *, unbiased: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Eq. 2: hinge on the per-class standard deviation of softmax probabilities."""
    if logits.shape[0] < 2:
        return logits.sum() * 0.0
    probs = F.softmax(logits, dim=1)
    std = torch.sqrt(probs.var(dim=0, unbiased=unbiased) + eps)
    return F.relu(c - std).mean()


def feduv_uniformity_loss(representations: torch.Tensor) -> torch.Tensor:
    """Eq. 4: mean Gaussian potential over distinct pairs, ``σ`` = median squared distance.

    Squared distances are formed as ``‖a‖² + ‖b‖² − 2a·b`` (clamped at 0) rather than
    through ``pdist``, whose square root has an infinite gradient at coincident points.
    """
    n = representations.shape[0]
    if n < 2:
        return representations.sum() * 0.0
    r = representations.reshape(n, -1)
    sq = (r * r).sum(dim=1)
    d2 = (sq[:, None] + sq[None, :] - 2.0 * (r @ r.t())).clamp_min(0.0)
    iu = torch.triu_indices(n, n, offset=1)
    pair = d2[iu[0], iu[1]]
    sigma = pair.detach().median().clamp_min(1e-12)
    return torch.exp(-pair / (2.0 * sigma)).mean()


def feduv_objective(
    num_classes: int | None = None, config: FedUVConfig | None = None
) -> LocalObjective:
    """FedUV's local loss (Eq. 1) for a :class:`~spherecal.spherefed.network.Net`.

    ``num_classes`` (``D``, which sets ``c`` and the default ``λ = D/4``) defaults to
    the width of the model's logits.
    """
    cfg = config or FedUVConfig()
    mu = cfg.mu
    constants: dict[int, tuple[float, float]] = {}

    def constants_for(d: int) -> tuple[float, float]:
        if d not in constants:
            constants[d] = (
                feduv_variance_constant(d, unbiased=cfg.unbiased),
                cfg.weight_variance(d),
            )
        return constants[d]

    if num_classes is not None:
        constants_for(num_classes)

    def objective(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not isinstance(model, Net):
            raise TypeError("FedUV needs a spherecal.spherefed.network.Net (extractor + head)")
        h = model.extractor(x)
        logits = model.head(h)
        d = int(logits.shape[1])
        if num_classes is not None and d != num_classes:
            raise ValueError(f"FedUV was set up for {num_classes} classes, the model has {d}")
        c, lam = constants_for(d)
        loss = F.cross_entropy(logits, y.long())
        if mu:
            loss = loss + mu * feduv_uniformity_loss(h)
        if lam:
            loss = loss + lam * feduv_variance_loss(logits, c, unbiased=cfg.unbiased, eps=cfg.eps)
        return loss

    return objective
