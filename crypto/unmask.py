"""Round 4 on the server's side: checking revealed shares, rebuilding secrets, stripping masks.

The server reconstructs exactly the secrets needed to cancel the masks (Bonawitz et
al. 2017, round 4): the self-mask seed ``b_u`` of every survivor and the mask key
``s_sk`` of every participant that dropped after sharing and is a neighbour of a
survivor in the masking graph. Every revealed share is checked against its dealer's
commitment when it arrives, and every rebuilt secret against the dealer's advertised
commitment or public key before the accumulator is touched, so a forged share can
abort the job but never corrupt a returned sum.

Pure functions over the server's records; :class:`~spherecal.crypto.server.SecAggServer` calls
them and turns their errors into an abort.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from spherecal.crypto import shamir
from spherecal.crypto._exceptions import AggregateOutOfRange, ForgedShare, UnexpectedShare
from spherecal.crypto.channel import ShareKind, commitment, commitment_matches
from spherecal.crypto.graph import Graph
from spherecal.crypto.kdf import pairwise_mask_seed, self_mask_seed
from spherecal.crypto.keys import agree, digests_equal, seed_commitment, x25519_public_from_private
from spherecal.crypto.messages import AdvertiseKeys, RevealedShare
from spherecal.crypto.prg import MaskExpander, MaskSeed
from spherecal.crypto.ring import entries_out_of_range
from spherecal.crypto.spec import JobSpec

__all__ = [
    "Commitments",
    "Reveals",
    "aggregate_out_of_range",
    "checked_reveals",
    "masks_to_strip",
    "missing_reveals",
    "strip_masks",
]

# (owner, holder) -> (x, mask-key commitment, seed commitment)
Commitments = dict[tuple[str, str], tuple[int, bytes, bytes]]
# (owner, kind) -> holder -> (x, share)
Reveals = dict[tuple[str, ShareKind], dict[str, tuple[int, bytes]]]


def checked_reveals(
    spec: JobSpec,
    commitments: Commitments,
    *,
    holder: str,
    shares: Iterable[RevealedShare],
    survivors: frozenset[str],
    needed_keys: frozenset[str],
) -> list[tuple[tuple[str, ShareKind], int, bytes]]:
    """Check every share ``holder`` revealed against its dealer's commitment; returns
    them all as ``((owner, kind), x, share)``, or raises for the first bad one
    (:class:`UnexpectedShare` for a share not asked for or not held,
    :class:`ForgedShare` for one that does not match), so the caller stores all or
    nothing."""
    accepted: list[tuple[tuple[str, ShareKind], int, bytes]] = []
    for revealed in shares:
        owner, kind = revealed.owner, revealed.kind
        wanted = survivors if kind is ShareKind.SEED else needed_keys
        if owner not in wanted:
            raise UnexpectedShare(
                f"{holder!r} revealed a {kind.name} share of {owner!r}, which was not asked for"
            )
        record = commitments.get((owner, holder))
        if record is None:
            raise UnexpectedShare(f"{holder!r} holds no share of {owner!r}")
        x, mask_key_commitment, seed_commitment_ = record
        published = seed_commitment_ if kind is ShareKind.SEED else mask_key_commitment
        actual = commitment(
            kind,
            spec_digest=spec.digest,
            job_id=spec.job_id,
            owner=owner,
            holder=holder,
            x=revealed.x,
            share=revealed.share,
            salt=revealed.salt,
        )
        if revealed.x != x or not commitment_matches(published, actual):
            raise ForgedShare(
                f"{holder!r} revealed a share of {owner!r} that does not "
                "match its dealer's commitment"
            )
        accepted.append(((owner, kind), x, revealed.share))
    return accepted


def missing_reveals(
    reveals: Reveals, *, survivors: frozenset[str], needed_keys: frozenset[str], threshold: int
) -> tuple[str, int] | None:
    """The first secret with fewer than ``threshold`` revealed shares, as (what, how
    many), or ``None`` when every needed secret can be rebuilt."""
    for owner in sorted(survivors):
        have = len(reveals.get((owner, ShareKind.SEED), {}))
        if have < threshold:
            return f"revealed shares of the self-mask seed of {owner!r}", have
    for owner in sorted(needed_keys):
        have = len(reveals.get((owner, ShareKind.MASK_KEY), {}))
        if have < threshold:
            return f"revealed shares of the mask key of dropout {owner!r}", have
    return None


def masks_to_strip(
    spec: JobSpec,
    graph: Graph,
    adverts: Mapping[str, AdvertiseKeys],
    reveals: Reveals,
    *,
    survivors: frozenset[str],
    needed_keys: frozenset[str],
) -> list[tuple[MaskSeed, int]]:
    """Rebuild every needed secret, verify it, and derive each mask with the sign that
    cancels it. Raises :class:`ForgedShare` when shares rebuild a secret other than
    the committed one (the caller aborts the job)."""
    masks: list[tuple[MaskSeed, int]] = []
    wanted = [(o, ShareKind.SEED) for o in sorted(survivors)]
    wanted += [(o, ShareKind.MASK_KEY) for o in sorted(needed_keys)]
    rebuilt = dict(
        zip(
            wanted,
            shamir.combine_many([sorted(reveals[key].values()) for key in wanted], spec.threshold),
            strict=True,
        )
    )
    for owner in sorted(survivors):
        seed = rebuilt[(owner, ShareKind.SEED)]
        if not digests_equal(
            seed_commitment(spec.digest, owner, seed), adverts[owner].seed_commitment
        ):
            raise ForgedShare(
                f"shares of {owner!r}'s self-mask seed do not reconstruct the committed seed"
            )
        mask = self_mask_seed(seed, spec_digest=spec.digest, job_id=spec.job_id, owner=owner)
        masks.append((mask, -1))

    for dropout in sorted(needed_keys):
        secret = rebuilt[(dropout, ShareKind.MASK_KEY)]
        if not digests_equal(x25519_public_from_private(secret), adverts[dropout].masking_public):
            raise ForgedShare(
                f"shares of {dropout!r}'s mask key do not reconstruct its advertised key"
            )
        private = X25519PrivateKey.from_private_bytes(secret)
        for survivor in sorted(graph.neighbours(dropout) & survivors):
            shared = agree(private, adverts[survivor].masking_public)
            mask = pairwise_mask_seed(
                shared, spec_digest=spec.digest, job_id=spec.job_id, a=survivor, b=dropout
            )
            # The survivor added +PRG if its id is smaller, -PRG otherwise: undo it.
            masks.append((mask, -1 if survivor < dropout else +1))
    return masks


def strip_masks(
    spec: JobSpec, acc: npt.NDArray[np.unsignedinteger], masks: list[tuple[MaskSeed, int]]
) -> None:
    """Add every ``sign * PRG(mask)`` into the accumulator, tile-major
    (:meth:`MaskExpander.apply_plan`): each tile of the accumulator stays in cache while
    all masks are applied to it, and each mask's cipher context is reused from tile to
    tile (sequential counter)."""
    expander = MaskExpander(min(spec.chunk_size, spec.length), spec.dtype)
    step = expander.max_entries
    for start in range(0, spec.length, step):
        expander.apply_plan(acc[start : start + step], masks, start)
    expander.clear()


def aggregate_out_of_range(
    spec: JobSpec, acc: npt.NDArray[np.unsignedinteger], *, inputs: int
) -> AggregateOutOfRange | None:
    """The error refusing a sum no set of ``inputs`` in-bound inputs could produce
    (see :mod:`spherecal.crypto.server`), or ``None`` when every entry is in range."""
    outside = entries_out_of_range(
        acc,
        inputs=inputs,
        bound=spec.bound,
        scale_bits=spec.scale_bits,
        noise_bound=spec.noise_bound,
        ring_bits=spec.ring_bits,
    )
    if not outside:
        return None
    return AggregateOutOfRange(
        f"{outside} of {spec.length} entries of the sum of {inputs} inputs lie "
        f"outside ±{inputs} × (bound {spec.bound!r} + noise bound "
        f"{spec.noise_bound}): a contributor uploaded an out-of-bound input; "
        "the sum is refused"
    )
