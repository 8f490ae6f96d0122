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
from .graph import COMPLETE, Graph
from .keys import survivors_payload, verify
from .messages import UnmaskRequest
from .spec import JobSpec

__all__ = ["signers_counted", "verify_signed_view"]


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


def signers_counted(
    graph: Graph,
    holder: str,
    *,
    revealed: frozenset[str],
    members1: frozenset[str],
    signed: Mapping[str, bytes],
    threshold: int,
) -> list[str]:
    """The signers (sorted) whose consistency signatures ``holder``'s check in
    :func:`verify_signed_view` counts — what the coordinator sends it.

    The check needs, for every owner whose share the holder would reveal
    (``revealed``: survivors and dropouts), ``t`` signatures among that owner's
    share holders. On the complete graph that is everyone's. On a Harary graph the
    owners are the holder's closed neighbourhood and their holders its 2-hop
    neighbourhood: O(k²) signatures, not all n — sending all n made every holder
    verify n signatures, n² Ed25519 verifications per job (at 1,000 participants
    a million, minutes of CPU). Fewer signatures can only make the holder's check
    fail, never pass: it still verifies every one it gets. Topped up to ``t`` in
    all, for its overall count."""
    if graph.kind == COMPLETE:
        return sorted(signed)
    wanted: set[str] = set()
    for owner in graph.closed(holder) & revealed:
        wanted.update(graph.holders(owner, members1))
    chosen = sorted(s for s in wanted if s in signed)
    if len(chosen) < threshold:
        others = sorted(set(signed) - set(chosen))
        chosen = sorted(chosen + others[: threshold - len(chosen)])
    return chosen
