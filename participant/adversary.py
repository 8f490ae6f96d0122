"""TEST ONLY: a dishonest participant's local computation (issue #22).

Why it exists: the coordinator's defences against one dishonest site — cross-checks
between independent sums, the per-site bound, the validation gate
(``spherecal.coordinator.driver.integrity`` and ``validation_gate``) — can only be
shown to work against a real participant that lies, through the real service. This
module is that lie: a participant built with an :class:`Adversary` replaces its
honest update or statistics by the attack's, and everything else (keys, masks,
shares, the participant's own range check of its input) stays the real protocol. A
dishonest site that ran modified code could do exactly this; it gains nothing the
protocol does not already allow it.

It is enabled only by ``ParticipantSettings.adversary`` (hidden in the TOML schema)
*and* the environment ``SPHERECAL_TEST_FAULTS=1`` — the participant refuses to start
otherwise — which ``spherecal simulate --adversary`` sets for that process alone.

Attacks (the table of issue #22; ``ATTACK[:COUNT][@ROUND]``):

``directions[:m]``  statistics: ``m`` fake examples per class placed at the public
                    classifier direction ``w_c`` and labelled ``π(c) = c + 1 mod C``
                    (default 10⁵), added to the honest statistics;
``relabel[:m]``     the same, plus the site's own features with labels ``π(y)``,
                    scaled to ``m`` examples per class;
``replace[:m]``     statistics of ``m`` examples per class at the relabelled
                    directions *instead of* its own, with the honest total count
                    (no count disagreement to catch: the validation gate must);
``blast[:w][@R]``  training: an update of ``0.9 × bound`` per entry along a random
                    sign direction, claiming weight ``w`` (default 10⁵); with ``@R``
                    honest before round ``R`` (1-based).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from spherecal.spherefed.stats import CCVRStatistics, FFCStatistics, ccvr_statistics

__all__ = ["ATTACKS", "Adversary", "parse_adversary"]

ATTACKS = ("directions", "relabel", "replace", "blast")
DEFAULT_AMOUNT = 1e5


@dataclass(frozen=True)
class Adversary:
    """One attack; ``amount`` is examples per class (statistics) or the claimed
    weight (``blast``)."""

    attack: str
    amount: float = DEFAULT_AMOUNT
    from_round: int = 1
    """``blast@R``: honest updates before round ``R`` (1-based), the attack from it on."""

    def __post_init__(self) -> None:
        if self.attack not in ATTACKS:
            raise ValueError(f"unknown attack {self.attack!r}; use one of {ATTACKS}")
        if not (np.isfinite(self.amount) and self.amount > 0):
            raise ValueError(f"attack amount must be > 0, got {self.amount}")
        if self.from_round < 1:
            raise ValueError(f"attack round must be >= 1, got {self.from_round}")

    def __str__(self) -> str:
        return f"{self.attack}:{self.amount:g}" + (
            f"@{self.from_round}" if self.from_round > 1 else ""
        )

    @property
    def attacks_statistics(self) -> bool:
        return self.attack != "blast"

    @property
    def attacks_update(self) -> bool:
        return self.attack == "blast"

    def update(
        self,
        payload: npt.NDArray[np.float64],
        entries: tuple[tuple[str, int], ...],
        *,
        bound: float,
        seed: int,
        round_index: int = 0,
    ) -> npt.NDArray[np.float64]:
        """The ``blast`` update: ``n_k Δ_k`` replaced by ``±0.9·bound`` per entry and
        ``n_k`` by the claimed weight (within the bound, so the site's own range check
        passes); ``entries`` is the round's ``SumLayout.entries``."""
        out = np.array(payload, dtype=np.float64)
        if not self.attacks_update or round_index + 1 < self.from_round:
            return out
        offset = 0
        for name, size in entries:
            if name == "delta":
                signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=size)
                out[offset : offset + size] = 0.9 * bound * signs
            elif name == "weight":
                out[offset] = min(self.amount, 0.9 * bound)
            offset += size
        return out

    def statistics(
        self,
        kind: str,
        honest: npt.NDArray[np.float64],
        *,
        features: npt.NDArray[np.float64],
        labels: npt.NDArray[np.int64],
        classifier: npt.NDArray[np.float64],
    ) -> npt.NDArray[np.float64]:
        """The attack's statistics vector (same layout as ``honest``)."""
        if not self.attacks_statistics:
            return honest
        classes, dim = classifier.shape
        target = (np.arange(classes) + 1) % classes
        w = classifier / np.linalg.norm(classifier, axis=1, keepdims=True)
        if self.attack == "replace":  # the honest total, split into integer class counts
            per_class = np.full(classes, len(labels) // classes, dtype=np.float64)
            per_class[: len(labels) % classes] += 1
        else:
            per_class = np.full(classes, float(self.amount))
        fake = CCVRStatistics(
            counts=np.zeros(classes),
            sums=np.zeros((classes, dim)),
            second_moments=np.zeros((classes, dim, dim)),
        )
        fake.counts[target] += per_class
        fake.sums[target] += per_class[:, None] * w
        fake.second_moments[target] += per_class[:, None, None] * np.einsum("ci,cj->cij", w, w)
        if self.attack == "relabel" and len(labels):
            own = ccvr_statistics(features, target[labels], classes)
            scale = float(max(1, round(self.amount * classes / len(labels))))
            fake = CCVRStatistics(
                counts=fake.counts + scale * own.counts,
                sums=fake.sums + scale * own.sums,
                second_moments=fake.second_moments + scale * own.second_moments,
            )
        # ``replace`` sends the fake alone, so no count cross-check can see it
        base = _zero_like(kind, dim, classes) if self.attack == "replace" else honest
        extra = fake.pack() if kind == "ccvr" else fake.to_ffc().pack()
        return np.asarray(base + extra, dtype=np.float64)


def _zero_like(kind: str, dim: int, classes: int) -> npt.NDArray[np.float64]:
    if kind == "ccvr":
        return CCVRStatistics(
            counts=np.zeros(classes),
            sums=np.zeros((classes, dim)),
            second_moments=np.zeros((classes, dim, dim)),
        ).pack()
    return FFCStatistics(V=np.zeros((dim, dim)), U=np.zeros((dim, classes)), count=0.0).pack()


def parse_adversary(text: str) -> Adversary:
    """``ATTACK[:AMOUNT][@ROUND]`` → :class:`Adversary` (ValueError on a bad spec)."""
    head, _, when = text.strip().partition("@")
    attack, _, amount = head.partition(":")
    try:
        value = float(amount) if amount else DEFAULT_AMOUNT
        start = int(when) if when else 1
    except ValueError:
        raise ValueError(f"attack {text!r}: amount and round must be numbers") from None
    if when and attack != "blast":
        raise ValueError(f"attack {text!r}: only blast takes @ROUND")
    return Adversary(attack, value, start)
