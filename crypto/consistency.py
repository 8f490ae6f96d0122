"""Checking a consistency-signed survivor view before unmasking (round 3 → 4).

Bonawitz et al. 2017, round 3 "ConsistencyCheck": every survivor signs the survivor
set ``U3``; before revealing anything, a holder checks that the set in the unmask
request is the one it signed and that at least ``t`` survivors signed that very set.
With ``2t >`` share holders (checked by the spec and by :mod:`crypto.policy`) no
second set can gather ``t`` signatures among the same holders, so the coordinator
cannot show one holder group "X survived" and another "X dropped".

SecAgg+ (Bell et al. 2020): the count is per owner — among the holders of each
owner whose share is about to be revealed, ``t`` must have signed this set.
"""

from __future__ import annotations

from collections.abc import Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ._exceptions import InconsistentSurvivors, TooFewSurvivors
from .graph import Graph
from .keys import survivors_payload, verify
from .messages import UnmaskRequest
from .spec import JobSpec

__all__ = ["verify_signed_view"]


def verify_signed_view(
    spec: JobSpec,
    graph: Graph,
    directory: Mapping[str, Ed25519PublicKey],
    request: UnmaskRequest,
    *,
    signed: tuple[str, ...] | None,
    owners: frozenset[str],
    members1: frozenset[str],
) -> None:
    """Raise unless ``request`` carries the survivor set this holder ``signed`` with
    ``t`` valid signatures overall and ``t`` among the holders of every owner in
    ``owners`` (whose shares the request would reveal); ``members1`` is ``U1``."""
    if request.survivors != signed:
        raise InconsistentSurvivors("survivor set differs from the one this participant signed")
    survivors = frozenset(request.survivors)
    payload = survivors_payload(
        spec_digest=spec.digest, job_id=spec.job_id, survivors=request.survivors
    )
    signers = set()
    for entry in request.signatures:
        if entry.signer not in survivors:
            raise InconsistentSurvivors(f"signature from {entry.signer!r}, who is not a survivor")
        verify(
            directory[entry.signer],
            entry.signature,
            payload,
            what=f"survivor-set signature of {entry.signer!r}",
        )
        signers.add(entry.signer)
    if len(signers) < spec.threshold:
        raise TooFewSurvivors(
            needed=spec.threshold,
            remaining=len(signers),
            stage="unmask",
            what="consistency signatures",
        )
    for owner in sorted(owners):
        holders = graph.holders(owner, members1)
        count = sum(1 for h in holders if h in signers)
        if count < spec.threshold:
            raise TooFewSurvivors(
                needed=spec.threshold,
                remaining=count,
                stage="unmask",
                what=f"consistency signatures among the share holders of {owner!r}",
            )
