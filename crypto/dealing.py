"""Round 1 of Bonawitz et al. 2017 ("ShareKeys"): dealing and opening encrypted shares.

A dealer Shamir-splits its mask key ``s_sk`` and self-mask seed ``b_u`` ``t``-of-``h``
among its holders ``N(u) ∪ {u}`` (holder ``i`` gets x = ``i+1``), commits to each
share (:mod:`spherecal.crypto.channel`) and seals both shares for each holder under their
pairwise channel key, with the commitments bound as associated data. A holder opens
its share and checks both commitments; :func:`open_dealt_share` says *why* a share is
refused, so the holder can sign a complaint naming the dealer
(:mod:`spherecal.crypto.complaints`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from spherecal.crypto import shamir
from spherecal.crypto._exceptions import ForgedShare
from spherecal.crypto.channel import (
    ShareKind,
    SharePlaintext,
    commitment_matches,
    open_share,
    seal_share,
    share_aad,
)
from spherecal.crypto.messages import ComplaintReason, EncryptedShare
from spherecal.crypto.spec import JobSpec

__all__ = ["deal_shares", "open_dealt_share"]


def deal_shares(
    spec: JobSpec,
    *,
    owner: str,
    holders: Sequence[str],
    mask_key: bytes,
    seed: bytes,
    channel_key: Callable[[str], bytes],
) -> tuple[EncryptedShare, ...]:
    """One :class:`EncryptedShare` per holder, in holder order."""
    mask_key_shares = shamir.split(mask_key, spec.threshold, len(holders))
    seed_shares = shamir.split(seed, spec.threshold, len(holders))
    out = []
    for i, holder in enumerate(holders):
        x = i + 1
        plaintext = SharePlaintext.fresh(
            mask_key_share=mask_key_shares[i][1], seed_share=seed_shares[i][1]
        )
        context = dict(spec_digest=spec.digest, job_id=spec.job_id, owner=owner, holder=holder, x=x)
        ck = plaintext.commitment(ShareKind.MASK_KEY, **context)  # type: ignore[arg-type]
        cb = plaintext.commitment(ShareKind.SEED, **context)  # type: ignore[arg-type]
        aad = share_aad(
            spec_digest=spec.digest,
            job_id=spec.job_id,
            sender=owner,
            receiver=holder,
            x=x,
            mask_key_commitment=ck,
            seed_commitment=cb,
        )
        nonce, ciphertext = seal_share(channel_key(holder), plaintext, aad)
        out.append(
            EncryptedShare(
                receiver=holder,
                x=x,
                mask_key_commitment=ck,
                seed_commitment=cb,
                nonce=nonce,
                ciphertext=ciphertext,
            )
        )
    return tuple(out)


def open_dealt_share(
    spec: JobSpec, share: EncryptedShare, *, dealer: str, holder: str, x: int, key: bytes
) -> SharePlaintext | ComplaintReason:
    """The decrypted shares, or why they are refused (wrong position, failed AES-GCM
    tag, or a share that does not match its published commitment)."""
    if share.x != x:
        return ComplaintReason.WRONG_POSITION
    aad = share_aad(
        spec_digest=spec.digest,
        job_id=spec.job_id,
        sender=dealer,
        receiver=holder,
        x=x,
        mask_key_commitment=share.mask_key_commitment,
        seed_commitment=share.seed_commitment,
    )
    try:
        plaintext = open_share(key, share.nonce, share.ciphertext, aad, what=dealer)
    except ForgedShare:
        return ComplaintReason.DECRYPTION_FAILED
    for kind, published in (
        (ShareKind.MASK_KEY, share.mask_key_commitment),
        (ShareKind.SEED, share.seed_commitment),
    ):
        actual = plaintext.commitment(
            kind, spec_digest=spec.digest, job_id=spec.job_id, owner=dealer, holder=holder, x=x
        )
        if not commitment_matches(published, actual):
            return ComplaintReason.COMMITMENT_MISMATCH
    return plaintext
