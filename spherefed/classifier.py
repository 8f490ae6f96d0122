"""Fixed classifier matrices for SphereFed.

SphereFed (§4.1, Eq. 4) replaces the learnable classifier by a matrix ``W ∈ R^{C×l}``
whose rows are unit-norm and pairwise orthogonal, built once from a shared seed and
frozen for the whole federation. Every participant must build *the same bytes* from
the same seed, otherwise their local feature extractors chase different targets; so
every construction here is pure numpy in float64 from ``np.random.default_rng(seed)``
(PCG64 is bit-reproducible across processes and platforms) and finishes with an
explicit sign convention so that QR's sign ambiguity cannot leak in.

Three kinds:

- ``orthonormal`` — QR of a seeded Gaussian matrix (appendix D, "QR" row of Tab. 10).
  Requires ``C ≤ l``; there is no orthonormal set of ``C > l`` vectors in ``R^l``.
- ``random`` — He-initialised Gaussian rows, the paper's "Fix (R)" ablation (Tab. 3):
  fixed but neither unit-norm nor orthogonal.
- ``tammes`` — appendix D's Tammes method (Mettes et al. 2019): unit vectors spread by
  gradient descent on the largest pairwise cosine; works for ``C > l``.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

ClassifierKind = Literal["orthonormal", "random", "tammes"]
CLASSIFIER_KINDS: tuple[str, ...] = ("orthonormal", "random", "tammes")


def _check_dims(num_classes: int, dim: int) -> None:
    if not isinstance(num_classes, int | np.integer) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    if not isinstance(dim, int | np.integer) or dim < 1:
        raise ValueError(f"dim (the feature dimension l) must be a positive integer, got {dim!r}")


def orthonormal_classifier(num_classes: int, dim: int, *, seed: int = 0) -> np.ndarray:
    """Rows unit-norm and pairwise orthogonal: ``W Wᵀ = I_C`` (SphereFed Eq. 4).

    QR of a seeded ``l×C`` Gaussian matrix gives ``Q`` with orthonormal columns;
    ``W = Qᵀ``. Signs are fixed so that ``diag(R) > 0``, which makes the
    factorisation unique and the result independent of the LAPACK's sign choice.
    """
    _check_dims(num_classes, dim)
    if num_classes > dim:
        raise ValueError(
            f"an orthonormal classifier needs num_classes <= feature dim, got "
            f"C={num_classes} > l={dim}: there are at most l orthonormal vectors in R^l. "
            "Use kind='tammes' (uniformly spread unit vectors, works for C > l) or a "
            "model with a wider feature layer."
        )
    rng = np.random.default_rng(seed)
    gaussian = rng.standard_normal((dim, num_classes))
    q, r = np.linalg.qr(gaussian, mode="reduced")
    signs = np.sign(np.diag(r))
    signs[signs == 0] = 1.0
    weight = (q * signs).T
    return np.ascontiguousarray(weight, dtype=np.float64)


def random_classifier(num_classes: int, dim: int, *, seed: int = 0) -> np.ndarray:
    """He-initialised fixed classifier, the "Fix (R)" ablation of SphereFed Tab. 3.

    Entries ``~ N(0, 2/l)`` (He et al. 2015, fan-in ``l``). Deliberately *not*
    normalised: the ablation shows what fixing alone (without the hypersphere) buys.
    """
    _check_dims(num_classes, dim)
    rng = np.random.default_rng(seed)
    return rng.standard_normal((num_classes, dim)) * np.sqrt(2.0 / dim)


def tammes_classifier(
    num_classes: int,
    dim: int,
    *,
    seed: int = 0,
    steps: int = 1000,
    lr: float = 0.1,
    momentum: float = 0.9,
) -> np.ndarray:
    """Unit vectors spread over the sphere (appendix D, Tammes method).

    Following Mettes et al. (2019) as the appendix does: minimise
    ``(1/C) Σ_i max_{j≠i} cos(w_i, w_j)`` by SGD with momentum (lr 0.1, momentum 0.9,
    1000 steps), re-projecting onto the sphere after each step. Plain numpy in
    float64 so that the result is bit-identical in every process; the subgradient of
    the max only touches the arg-max pair of each row, so a step is ``O(C² l)``.
    """
    _check_dims(num_classes, dim)
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((num_classes, dim))
    weight /= np.linalg.norm(weight, axis=1, keepdims=True)
    if num_classes == 1:
        return weight
    velocity = np.zeros_like(weight)
    rows = np.arange(num_classes)
    for _ in range(steps):
        cosine = weight @ weight.T
        cosine[rows, rows] = -np.inf
        nearest = np.argmax(cosine, axis=1)
        # d/dW of (1/C) Σ_i w_i·w_{nearest(i)}: row i gets w_{n(i)}, row n(i) gets w_i.
        grad = weight[nearest].copy()
        np.add.at(grad, nearest, weight)
        grad /= num_classes
        velocity = momentum * velocity + grad
        weight = weight - lr * velocity
        weight /= np.linalg.norm(weight, axis=1, keepdims=True)
    return np.ascontiguousarray(weight)


def fixed_classifier(
    num_classes: int, dim: int, *, kind: str = "orthonormal", seed: int = 0
) -> np.ndarray:
    """Build the shared fixed classifier ``W`` (C×l, float64) of the given kind.

    Same ``(num_classes, dim, kind, seed)`` ⇒ identical bytes in any process.
    """
    if kind == "orthonormal":
        return orthonormal_classifier(num_classes, dim, seed=seed)
    if kind == "random":
        return random_classifier(num_classes, dim, seed=seed)
    if kind == "tammes":
        return tammes_classifier(num_classes, dim, seed=seed)
    raise ValueError(f"unknown classifier kind {kind!r}; expected one of {CLASSIFIER_KINDS}")
