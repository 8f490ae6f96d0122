"""Checking a consistency-signed survivor view before unmasking (round 3 → 4).

Bonawitz et al. 2017, round 3 "ConsistencyCheck": every survivor signs the survivor
set ``U3``; before revealing anything, a holder checks that the set in the unmask
request is the one it signed and that at least ``t`` survivors signed that very set.
With ``2t >`` share holders (checked by the spec and by :mod:`spherecal.crypto.policy`) no
second set can gather ``t`` signatures among the same holders, so the coordinator
cannot show one holder group "X survived" and another "X dropped".

SecAgg+ (Bell et al. 2020): the count is per owner — among the holders of each
owner whose share is about to be revealed, ``t`` must have signed this set.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping, Sequence

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from spherecal.crypto._exceptions import BadSignature, InconsistentSurvivors, TooFewSurvivors
from spherecal.crypto.graph import COMPLETE, Graph
from spherecal.crypto.keys import pinned_key, survivors_payload, verify
from spherecal.crypto.messages import UnmaskRequest
from spherecal.crypto.spec import JobSpec

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
    me: str | None = None,
    own_signature: bytes | None = None,
    payload: bytes | None = None,
    holders_cache: Callable[[str], tuple[str, ...]] | None = None,
) -> None:
    """Raise unless ``request`` carries the survivor set this holder ``signed`` with
    ``t`` valid signatures overall and ``t`` among the holders of every owner in
    ``owners`` (whose shares the request would reveal); ``members1`` is ``U1``.

    Only signatures of those holders are verified and counted — they are the only
    ones either count can use, and their keys are the ones a participant holds
    (:func:`spherecal.crypto.spec.keys_needed`: its closed 2-hop neighbourhood). Any other
    survivor's signature is *ignored*: not verified, never counted toward ``t``, so
    it can neither help nor fail the check (a coordinator sending all ``n``
    signatures still works, and costs this holder no extra verifications). Ignoring
    is safe because the overall count then counts a subset of what it counted before
    and each owner's count never included them. A counted signer whose key is not in
    ``directory`` is refused (:class:`KeySubstitution`), never a ``KeyError``.

    The holder's own entry (``me``) is not verified when it passes ``own_signature``,
    the signature it made over this very set: the entry must equal it byte for byte
    (Ed25519 signatures are deterministic), else :class:`BadSignature` as a failed
    verification would raise — one verification less per holder (issue #24).
    ``payload`` is the survivor-set encoding the holder signed (O(n) bytes: encoded
    once per job, not again here); ``holders_cache`` the holder's cached
    ``graph.holders(owner, members1)``."""
    if request.survivors != signed:
        raise InconsistentSurvivors("survivor set differs from the one this participant signed")
    survivors = frozenset(request.survivors)
    if payload is None:
        payload = survivors_payload(
            spec_digest=spec.digest, job_id=spec.job_id, survivors=request.survivors
        )
    if holders_cache is None:
        holders_of = {owner: graph.holders(owner, members1) for owner in sorted(owners)}
    else:
        holders_of = {owner: holders_cache(owner) for owner in sorted(owners)}
    countable: set[str] = set()
    for holders in holders_of.values():
        countable.update(holders)
    signers = set()
    for entry in request.signatures:
        if entry.signer not in survivors:
            raise InconsistentSurvivors(f"signature from {entry.signer!r}, who is not a survivor")
        if entry.signer not in countable:
            continue  # outside every revealed owner's holders: ignored, never counted
        what = f"survivor-set signature of {entry.signer!r}"
        if own_signature is not None and entry.signer == me:
            if not hmac.compare_digest(entry.signature, own_signature):
                raise BadSignature(f"{what}: not the signature this participant made")
        else:
            verify(
                pinned_key(directory, entry.signer, what=what), entry.signature, payload, what=what
            )
        signers.add(entry.signer)
    if len(signers) < spec.threshold:
        raise TooFewSurvivors(
            needed=spec.threshold,
            remaining=len(signers),
            stage="unmask",
            what="consistency signatures",
        )
    for owner, holders in holders_of.items():
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
    threshold: int | None = None,
    signed_holders: Callable[[str], Sequence[str]] | None = None,
) -> list[str]:
    """The signers (sorted) whose consistency signatures ``holder``'s check in
    :func:`verify_signed_view` counts — what the coordinator sends it.

    The check needs, for every owner whose share the holder would reveal
    (``revealed``: survivors and dropouts), ``t`` signatures among that owner's
    share holders. On the complete graph that is everyone's. On a Harary graph the
    owners are the holder's closed neighbourhood and their holders its 2-hop
    neighbourhood: O(k), not all n — sending all n made every holder verify n
    signatures, n² Ed25519 verifications per job (at 1,000 participants a million,
    minutes of CPU). Fewer signatures can only make the holder's check fail, never
    pass: it verifies every one it counts, and it ignores (never counts) any other,
    so nothing outside this set is sent.

    With ``threshold`` (the spec's ``t``), only a *sufficient* subset is sent: for each
    owner in turn, signers among its holders that cover the most owners, until it has
    ``t`` of them (or all it can get). Every owner then has ``min(t, available)`` — so
    the holder's check passes exactly when it would have passed with the whole 2-hop
    set — and the holder verifies about ``t`` to ``k + 1`` signatures instead of the 2-hop
    neighbourhood's ``2k + 1`` (issue #24: verification was the largest part of a
    participant's cost at n = 400, and grew with k). On the complete graph every owner's
    holders are everyone, so ``t`` signatures suffice. Deterministic (sorted ties), so a
    coordinator continuing a journaled job sends the same set.

    ``signed_holders(owner)``, where given, is ``owner``'s holders among ``members1``
    that are in ``signed`` (sorted) — the coordinator's per-job cache: every owner is in
    ``k + 1`` holders' requests, and recomputing its holders for each was ≈ 14 % of the
    coordinator's profiled work at n = 1000 (issue #24)."""
    if graph.kind == COMPLETE:
        everyone = sorted(signed)
        return everyone if threshold is None else everyone[:threshold]
    if signed_holders is None:

        def signed_holders(owner: str) -> Sequence[str]:
            return [s for s in graph.holders(owner, members1) if s in signed]

    holders_of = {owner: signed_holders(owner) for owner in sorted(graph.closed(holder) & revealed)}
    if threshold is None:
        return sorted({s for holders in holders_of.values() for s in holders})
    covers: dict[str, int] = {}
    for holders in holders_of.values():
        for s in holders:
            covers[s] = covers.get(s, 0) + 1
    wanted: set[str] = set()
    for holders in holders_of.values():
        have = sum(1 for s in holders if s in wanted)
        for s in sorted((s for s in holders if s not in wanted), key=lambda s: (-covers[s], s)):
            if have >= threshold:
                break
            wanted.add(s)
            have += 1
    return sorted(wanted)
