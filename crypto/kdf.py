"""HKDF-SHA256 with domain separation by (protocol, purpose, job, parties).

Why: one X25519 shared secret or one seed must never feed two different uses, and
a key from one job must never be valid in another (docs/design.md §3: "never reuse
a mask or a key across jobs"). Every derivation therefore binds

* the protocol label and version (``spherecal/secagg/v2``),
* the *purpose* (pairwise mask, self mask, share channel),
* the job: its id and the digest of the whole canonical :class:`~spherecal.crypto.spec.JobSpec`
  (used as the HKDF salt), so two coordinators that disagree on any job parameter
  derive unrelated keys instead of silently mixing jobs,
* the parties, in a canonical order where the key is symmetric.

The info string is an injective encoding (:func:`spherecal.crypto._codec.encode_context`), so
no two distinct (purpose, job, parties) tuples share a key (RFC 5869 §3.2).
"""

from __future__ import annotations

from collections.abc import Sequence

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from spherecal.crypto._codec import encode_context
from spherecal.crypto.prg import MaskSeed

LABEL = "spherecal/secagg/v2"

PURPOSE_PAIRWISE_MASK = "pairwise-mask"
PURPOSE_SELF_MASK = "self-mask"
PURPOSE_SHARE_CHANNEL = "share-channel"

__all__ = [
    "LABEL",
    "channel_key",
    "derive",
    "pairwise_mask_seed",
    "self_mask_seed",
]


def derive(
    secret: bytes,
    *,
    purpose: str,
    spec_digest: bytes,
    job_id: bytes,
    parties: Sequence[str],
    length: int = 32,
) -> bytes:
    """HKDF-SHA256(secret, salt=spec digest, info=(label, purpose, job, parties))."""
    info = encode_context(LABEL, purpose, job_id, *parties)
    hkdf = HKDF(algorithm=hashes.SHA256(), length=length, salt=spec_digest, info=info)
    return hkdf.derive(secret)


def pairwise_mask_seed(
    shared_secret: bytes, *, spec_digest: bytes, job_id: bytes, a: str, b: str
) -> MaskSeed:
    """Seed of the mask shared by ``a`` and ``b`` (symmetric in the pair)."""
    lo, hi = sorted((a, b))
    material = derive(
        shared_secret,
        purpose=PURPOSE_PAIRWISE_MASK,
        spec_digest=spec_digest,
        job_id=job_id,
        parties=(lo, hi),
    )
    return MaskSeed.from_bytes(material)


def self_mask_seed(seed: bytes, *, spec_digest: bytes, job_id: bytes, owner: str) -> MaskSeed:
    """Seed of ``owner``'s self mask ``PRG(b_u)`` from its secret ``b_u``."""
    material = derive(
        seed,
        purpose=PURPOSE_SELF_MASK,
        spec_digest=spec_digest,
        job_id=job_id,
        parties=(owner,),
    )
    return MaskSeed.from_bytes(material)


def channel_key(
    shared_secret: bytes, *, spec_digest: bytes, job_id: bytes, a: str, b: str
) -> bytes:
    """AES-256-GCM key of the share channel between ``a`` and ``b`` (symmetric; the
    direction is bound by the associated data, see :mod:`spherecal.crypto.channel`)."""
    lo, hi = sorted((a, b))
    return derive(
        shared_secret,
        purpose=PURPOSE_SHARE_CHANNEL,
        spec_digest=spec_digest,
        job_id=job_id,
        parties=(lo, hi),
    )
