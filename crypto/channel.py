"""AES-GCM encryption of Shamir shares between two participants, via the coordinator.

Why: the coordinator routes every share (pull model, participants never talk to
each other), so shares must be confidential and authenticated end to end
(Bonawitz et al. 2017, round 1 "ShareKeys": ``e_{u,v} = AE.enc(KA(c_u^SK, c_v^PK),
u||v||shares)``).
The key comes from X25519 on the ``c`` pairs through HKDF (:mod:`spherecal.crypto.kdf`); the
associated data binds (job, sender, receiver, x, commitments), so the coordinator
can neither redirect a ciphertext to another receiver nor replay one from another
job or direction — decryption simply fails (:class:`ForgedShare`).

Commitments. Shamir sharing cannot detect a wrong share, and at unmasking
time the *coordinator* must check what holders reveal. So the dealer publishes, per
holder and per kind, ``H(label, kind, job, owner, holder, x, share, salt)`` with a
fresh 16-byte salt (hiding even if shares had structure). The commitments ride in
the clear next to the ciphertext and inside its associated data, so the holder also
confirms they match what it decrypted. A holder later reveals ``(x, share, salt)`` of
*one* kind, which the coordinator checks against the dealer's commitment.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from spherecal.crypto._codec import encode_context
from spherecal.crypto._exceptions import ForgedShare, MalformedMessage
from spherecal.crypto.kdf import LABEL
from spherecal.crypto.shamir import share_bytes

NONCE_BYTES = 12
TAG_BYTES = 16
SALT_BYTES = 16
MASK_KEY_SHARE_BYTES = share_bytes(32)  # s_sk: 9 limbs of GF(2^31 - 1), 36 bytes
SEED_SHARE_BYTES = share_bytes(16)  # b_u: 5 limbs, 20 bytes
PLAINTEXT_BYTES = MASK_KEY_SHARE_BYTES + SEED_SHARE_BYTES + 2 * SALT_BYTES
CIPHERTEXT_BYTES = PLAINTEXT_BYTES + TAG_BYTES
COMMITMENT_BYTES = 32

__all__ = [
    "CIPHERTEXT_BYTES",
    "COMMITMENT_BYTES",
    "NONCE_BYTES",
    "SharePlaintext",
    "ShareKind",
    "commitment",
    "open_share",
    "seal_share",
    "share_aad",
    "share_length",
]


class ShareKind(enum.IntEnum):
    """Which secret a revealed share belongs to."""

    SEED = 1  # b_u: revealed only for survivors
    MASK_KEY = 2  # s_u^SK: revealed only for dropouts


def share_length(kind: ShareKind) -> int:
    return SEED_SHARE_BYTES if kind is ShareKind.SEED else MASK_KEY_SHARE_BYTES


@dataclass(frozen=True)
class SharePlaintext:
    """What one holder receives from one dealer: its share of each secret + salts."""

    mask_key_share: bytes = field(repr=False)
    seed_share: bytes = field(repr=False)
    mask_key_salt: bytes = field(repr=False)
    seed_salt: bytes = field(repr=False)

    @classmethod
    def fresh(cls, *, mask_key_share: bytes, seed_share: bytes) -> SharePlaintext:
        return cls(mask_key_share, seed_share, os.urandom(SALT_BYTES), os.urandom(SALT_BYTES))

    def to_bytes(self) -> bytes:
        return self.mask_key_share + self.seed_share + self.mask_key_salt + self.seed_salt

    @classmethod
    def from_bytes(cls, data: bytes) -> SharePlaintext:
        if len(data) != PLAINTEXT_BYTES:
            raise MalformedMessage("share plaintext has the wrong length")
        a = MASK_KEY_SHARE_BYTES
        b = a + SEED_SHARE_BYTES
        c = b + SALT_BYTES
        return cls(data[:a], data[a:b], data[b:c], data[c:])

    def share(self, kind: ShareKind) -> tuple[bytes, bytes]:
        """``(share, salt)`` of one kind."""
        if kind is ShareKind.SEED:
            return self.seed_share, self.seed_salt
        return self.mask_key_share, self.mask_key_salt

    def commitment(
        self, kind: ShareKind, *, spec_digest: bytes, job_id: bytes, owner: str, holder: str, x: int
    ) -> bytes:
        share, salt = self.share(kind)
        return commitment(
            kind,
            spec_digest=spec_digest,
            job_id=job_id,
            owner=owner,
            holder=holder,
            x=x,
            share=share,
            salt=salt,
        )


def commitment(
    kind: ShareKind,
    *,
    spec_digest: bytes,
    job_id: bytes,
    owner: str,
    holder: str,
    x: int,
    share: bytes,
    salt: bytes,
) -> bytes:
    """Hash commitment to one share (see module docstring)."""
    context = encode_context(
        LABEL, "share-commitment", int(kind), spec_digest, job_id, owner, holder, x, share, salt
    )
    return hashlib.sha256(context).digest()


def commitment_matches(expected: bytes, actual: bytes) -> bool:
    """Constant-time comparison of commitments."""
    return hmac.compare_digest(expected, actual)


def share_aad(
    *,
    spec_digest: bytes,
    job_id: bytes,
    sender: str,
    receiver: str,
    x: int,
    mask_key_commitment: bytes,
    seed_commitment: bytes,
) -> bytes:
    """Associated data of a share ciphertext: direction, job and commitments."""
    return encode_context(
        LABEL,
        "share-channel",
        spec_digest,
        job_id,
        sender,
        receiver,
        x,
        mask_key_commitment,
        seed_commitment,
    )


def seal_share(key: bytes, plaintext: SharePlaintext, aad: bytes) -> tuple[bytes, bytes]:
    """Encrypt; returns ``(nonce, ciphertext)``. Nonces are random: each key
    encrypts one message per direction per job, so collisions are impossible in
    honest use and negligible otherwise."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce, AESGCM(key).encrypt(nonce, plaintext.to_bytes(), aad)


def open_share(
    key: bytes, nonce: bytes, ciphertext: bytes, aad: bytes, *, what: str
) -> SharePlaintext:
    """Decrypt and authenticate, or raise :class:`ForgedShare`."""
    if len(nonce) != NONCE_BYTES or len(ciphertext) != CIPHERTEXT_BYTES:
        raise ForgedShare(f"{what}: share ciphertext has the wrong size")
    try:
        data = AESGCM(key).decrypt(nonce, ciphertext, aad)
    except InvalidTag as exc:
        raise ForgedShare(f"{what}: share ciphertext fails authentication") from exc
    return SharePlaintext.from_bytes(data)
