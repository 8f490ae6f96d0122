"""Rounds 0 and 1 on the server's side: routing public keys and encrypted shares.

The server never sees a share in the clear: it checks each advertisement's signature
and keys, hands every participant the adverts of its share holders (SecAgg+ graph of
Bell et al. 2020), stores the encrypted shares each dealer addressed to its holders,
and keeps the dealers' share commitments so that round 4 (:mod:`spherecal.crypto.unmask`) can
reject a forged reveal. :func:`prune_unrecoverable` is the rule that decides who may
still be masked against after each of these rounds.

:class:`ShareRouter` knows nothing of stages or senders' eligibility: the
:class:`~spherecal.crypto.server.SecAggServer` checks those first. Every ``add_*`` stores the
whole message or raises a typed error and stores nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from spherecal.crypto._exceptions import BadKey, DuplicateMessage, MalformedMessage, WrongRecipient
from spherecal.crypto.graph import Graph
from spherecal.crypto.keys import advert_payload, check_public_key, verify
from spherecal.crypto.messages import (
    AdvertiseKeys,
    EncryptedShare,
    KeyRoster,
    RoutedShare,
    ShareBundle,
    ShareKeys,
)
from spherecal.crypto.spec import JobSpec
from spherecal.crypto.unmask import Commitments

__all__ = ["ShareRouter", "prune_unrecoverable"]


def prune_unrecoverable(spec: JobSpec, graph: Graph, live: Iterable[str]) -> frozenset[str]:
    """Drop participants with fewer than ``t`` live share holders, until stable:
    their secrets could not be recovered, and before any input is masked against
    them leaving them out costs nothing."""
    current = set(live)
    if spec.graph == "complete":  # every participant holds everyone's shares
        return frozenset(current) if len(current) >= spec.threshold else frozenset()
    changed = True
    while changed:
        changed = False
        for p in sorted(current):
            if len(graph.holders(p, current)) < spec.threshold:
                current.discard(p)
                changed = True
    return frozenset(current)


class ShareRouter:
    """The adverts, encrypted shares and share commitments of one job."""

    def __init__(
        self, spec: JobSpec, graph: Graph, directory: Mapping[str, Ed25519PublicKey]
    ) -> None:
        self.spec = spec
        self._graph = graph
        self._directory = directory
        self.adverts: dict[str, AdvertiseKeys] = {}
        self._public_keys: set[bytes] = set()
        self.share_msgs: dict[str, ShareKeys] = {}
        self._share_index: dict[tuple[str, str], EncryptedShare] = {}  # (dealer, holder)
        self.commitments: Commitments = {}
        self._sorted: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {}

    # ------------------------------------------------------------- round 0
    def add_advert(self, msg: AdvertiseKeys) -> None:
        """Store a signed key advertisement: refused when duplicate, badly signed, or
        carrying an invalid or already used public key."""
        if msg.sender in self.adverts:
            raise DuplicateMessage(f"{msg.sender!r} already advertised keys")
        verify(
            self._directory[msg.sender],
            msg.signature,
            advert_payload(
                spec_digest=self.spec.digest,
                job_id=self.spec.job_id,
                sender=msg.sender,
                channel_public=msg.channel_public,
                masking_public=msg.masking_public,
                commitment=msg.seed_commitment,
            ),
            what=f"key advertisement of {msg.sender!r}",
        )
        check_public_key(msg.channel_public)
        check_public_key(msg.masking_public)
        keys = {msg.channel_public, msg.masking_public}
        if len(keys) != 2 or keys & self._public_keys:
            # Honest keys are fresh random points; a repeat means a copied key.
            raise BadKey(f"{msg.sender!r} advertised a public key that is already in use")
        self._public_keys |= keys
        self.adverts[msg.sender] = msg

    def _members(self, which: str, members: frozenset[str]) -> tuple[str, ...]:
        """``members`` sorted, once per set rather than once per recipient: every
        roster carries ``U1`` and every bundle ``U2`` (O(n log n) each, n of them per
        job; issue #24). The same tuple object each time, so its message check is
        done once too (``_fields.sorted_unique``)."""
        cached = self._sorted.get(which)
        if cached is None or cached[0] is not members:
            cached = self._sorted[which] = (members, tuple(sorted(members)))
        return cached[1]

    def roster_for(self, participant: str, u1: frozenset[str]) -> KeyRoster:
        """The adverts of ``participant``'s share holders in ``U1``."""
        holders = self._graph.holders(participant, u1)
        return KeyRoster(
            job_id=self.spec.job_id,
            recipient=participant,
            members=self._members("u1", u1),
            adverts=tuple(self.adverts[h] for h in holders),
        )

    # ------------------------------------------------------------- round 1
    def add_shares(self, msg: ShareKeys, u1: frozenset[str]) -> None:
        """Store a dealer's encrypted shares: exactly one to each of its holders in
        ``U1``, in holder order, with x-coordinates 1..holders."""
        if msg.sender in self.share_msgs:
            raise DuplicateMessage(f"{msg.sender!r} already shared its keys")
        holders = self._graph.holders(msg.sender, u1)
        if tuple(s.receiver for s in msg.shares) != holders:
            raise WrongRecipient(
                f"{msg.sender!r} must send one share to each of its {len(holders)} holders in U1"
            )
        if [s.x for s in msg.shares] != list(range(1, len(holders) + 1)):
            raise MalformedMessage("share x-coordinates must be 1..holders in holder order")
        self.share_msgs[msg.sender] = msg
        for s in msg.shares:
            self._share_index[(msg.sender, s.receiver)] = s
            self.commitments[(msg.sender, s.receiver)] = (
                s.x,
                s.mask_key_commitment,
                s.seed_commitment,
            )

    def bundle_for(self, participant: str, u2: frozenset[str]) -> ShareBundle:
        """The shares addressed to ``participant`` by its dealers in ``U2``."""
        items = []
        for dealer in self._graph.holders(participant, u2):
            share = self._share_index[(dealer, participant)]
            items.append(RoutedShare(sender=dealer, share=share))
        return ShareBundle(
            job_id=self.spec.job_id,
            recipient=participant,
            members=self._members("u2", u2),
            items=tuple(items),
        )
