"""Per-job key bundles (X25519 ``c`` and ``s`` pairs, self-mask seed ``b_u``) and
Ed25519 signatures over them.

Why two X25519 pairs (Bonawitz et al. 2017, round 0 "AdvertiseKeys"): ``c`` only encrypts the
Shamir shares in transit; ``s`` only derives pairwise masks. If a participant drops
after sharing, its ``s`` private key is reconstructed to remove its masks — which
must not also open the share channels it used, so the two keys are independent.

Why signatures (the paper's variant secure against an active adversary): without them the
coordinator could substitute its own public keys for a participant's (a
man-in-the-middle on key agreement) and strip that participant's masks. Each
advertisement is signed by the participant's long-term Ed25519 identity key over
(protocol label, job spec digest, job id, participant id, both public keys and the
commitment to ``b_u``), and every signature is verified before the key is used.

All secret randomness comes from ``os.urandom`` (X25519 private keys are 32 random
bytes, clamped by X25519 itself).

Verification runs on libsodium (PyNaCl), not on OpenSSL through ``cryptography``
(issue #24): a participant of a SecAgg+ job verifies about ``2k`` signatures (its
neighbours' advertisements and their consistency signatures), the largest part of its
cost, and libsodium's ``crypto_sign_verify_detached`` takes about half the CPU time of
OpenSSL's Ed25519 verification on the project's machines (65 vs 120–150 µs). It is at
least as strict: besides RFC 8032's equation (cofactorless, ``S < L``, the encoded
``R`` compared byte for byte) it refuses non-canonical and small-order public keys and
a small-order ``R``, which OpenSSL accepts — so no signature that OpenSSL refuses is
accepted here (tested on the edge cases). Signing, key objects and the directory stay
on ``cryptography``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# cryptography loads its OpenSSL backend at the first key object made, not at import:
# 8 ms of a process's first job keys (12.1 → 4.2 ms here), paid on the first secure
# job's advertise step. Imported with this module instead, i.e. when a site or
# coordinator starts (and once in the simulation's fork server).
import cryptography.hazmat.backends.openssl.backend  # noqa: F401
import nacl.bindings
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from nacl.exceptions import BadSignatureError

from spherecal.crypto._codec import encode_context, encode_context_texts
from spherecal.crypto._exceptions import BadKey, BadSignature, KeySubstitution
from spherecal.crypto.kdf import LABEL

KEY_BYTES = 32
SIGNATURE_BYTES = 64
SEED_BYTES = 16
DIGEST_BYTES = 32

__all__ = [
    "JobKeys",
    "KEY_BYTES",
    "SEED_BYTES",
    "SIGNATURE_BYTES",
    "agree",
    "advert_payload",
    "check_public_key",
    "complaint_payload",
    "generate_identity",
    "identity_public_bytes",
    "load_identity_public",
    "pinned_key",
    "seed_commitment",
    "sign",
    "survivors_payload",
    "verify",
    "verify_openssl",
    "x25519_public_from_private",
]


def generate_identity() -> Ed25519PrivateKey:
    """A fresh long-term Ed25519 identity key (from ``os.urandom``)."""
    return Ed25519PrivateKey.from_private_bytes(os.urandom(32))


def identity_public_bytes(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    """Raw 32-byte public key, the form a participant directory stores."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def load_identity_public(value: bytes | Ed25519PublicKey) -> Ed25519PublicKey:
    """Accept a raw 32-byte Ed25519 public key or a key object."""
    if isinstance(value, Ed25519PublicKey):
        return value
    if len(value) != KEY_BYTES:
        raise BadKey(f"an Ed25519 public key has {KEY_BYTES} bytes, got {len(value)}")
    try:
        return Ed25519PublicKey.from_public_bytes(bytes(value))
    except ValueError as exc:
        raise BadKey("malformed Ed25519 public key") from exc


def _x25519_public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def x25519_public_from_private(private: bytes) -> bytes:
    """Public key of a raw X25519 private key (checks a reconstructed ``s_sk``)."""
    return _x25519_public_bytes(X25519PrivateKey.from_private_bytes(private))


def agree(private: X25519PrivateKey, peer_public: bytes) -> bytes:
    """X25519 shared secret; a malformed or low-order peer key raises :class:`BadKey`
    (a low-order key would force an all-zero, publicly known secret)."""
    if len(peer_public) != KEY_BYTES:
        raise BadKey(f"an X25519 public key has {KEY_BYTES} bytes, got {len(peer_public)}")
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as exc:
        raise BadKey("X25519 public key of low order or malformed") from exc


def check_public_key(public: bytes) -> None:
    """Reject an X25519 public key that no honest participant could have produced."""
    agree(X25519PrivateKey.from_private_bytes(os.urandom(32)), public)


@dataclass(frozen=True)
class JobKeys:
    """One participant's secrets for one job. Never reused across jobs."""

    channel: X25519PrivateKey = field(repr=False)
    masking: X25519PrivateKey = field(repr=False)
    seed: bytes = field(repr=False)  # b_u: self-mask seed

    @classmethod
    def generate(cls) -> JobKeys:
        return cls(
            channel=X25519PrivateKey.from_private_bytes(os.urandom(32)),
            masking=X25519PrivateKey.from_private_bytes(os.urandom(32)),
            seed=os.urandom(SEED_BYTES),
        )

    @property
    def channel_public(self) -> bytes:
        return _x25519_public_bytes(self.channel)

    @property
    def masking_public(self) -> bytes:
        return _x25519_public_bytes(self.masking)

    def masking_private_bytes(self) -> bytes:
        """Raw ``s_sk`` — the secret that is Shamir-shared for dropout recovery."""
        return self.masking.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )


def seed_commitment(spec_digest: bytes, owner: str, seed: bytes) -> bytes:
    """Binding commitment to ``b_u`` (a 128-bit uniformly random secret, so the hash
    hides it). Lets the server verify a reconstructed self-mask seed."""
    return hashlib.sha256(
        encode_context(LABEL, "seed-commitment", spec_digest, owner, seed)
    ).digest()


def advert_payload(
    *,
    spec_digest: bytes,
    job_id: bytes,
    sender: str,
    channel_public: bytes,
    masking_public: bytes,
    commitment: bytes,
) -> bytes:
    """What an advertisement signature covers."""
    return encode_context(
        LABEL, "advertise", spec_digest, job_id, sender, channel_public, masking_public, commitment
    )


def survivors_payload(*, spec_digest: bytes, job_id: bytes, survivors: Sequence[str]) -> bytes:
    """What a consistency-check signature covers: the exact survivor set ``U3``."""
    return encode_context_texts(LABEL, "survivors", spec_digest, job_id, texts=sorted(survivors))


def complaint_payload(
    *, spec_digest: bytes, job_id: bytes, complainant: str, dealer: str, reason: int
) -> bytes:
    """What a share-complaint signature covers: (job spec, job, who complains, about
    which dealer, why) — so a complaint cannot be moved to another job or dealer."""
    return encode_context(
        LABEL, "share-complaint", spec_digest, job_id, complainant, dealer, str(reason)
    )


def sign(identity: Ed25519PrivateKey, payload: bytes) -> bytes:
    return identity.sign(payload)


def verify(public: Ed25519PublicKey, signature: bytes, payload: bytes, *, what: str) -> None:
    """Verify (libsodium, see the module docstring) or raise :class:`BadSignature`
    naming ``what`` was signed."""
    if len(signature) != SIGNATURE_BYTES:
        raise BadSignature(f"{what}: signature has {len(signature)} bytes")
    try:
        nacl.bindings.crypto_sign_open(bytes(signature) + payload, public.public_bytes_raw())
    except (BadSignatureError, ValueError) as exc:
        raise BadSignature(f"{what}: signature does not verify") from exc


def verify_openssl(
    public: Ed25519PublicKey, signature: bytes, payload: bytes, *, what: str
) -> None:
    """The same check on OpenSSL (``cryptography``): the reference the libsodium path is
    tested against, and what :func:`verify` ran before issue #24."""
    if len(signature) != SIGNATURE_BYTES:
        raise BadSignature(f"{what}: signature has {len(signature)} bytes")
    try:
        public.verify(signature, payload)
    except InvalidSignature as exc:
        raise BadSignature(f"{what}: signature does not verify") from exc


def pinned_key(
    directory: Mapping[str, Ed25519PublicKey], signer: str, *, what: str
) -> Ed25519PublicKey:
    """``signer``'s pinned identity key, or a refusal: a participant holds keys only for
    the parties whose signatures it checks (:func:`spherecal.crypto.spec.keys_needed`), so a
    signature it is asked to check from anyone else cannot be checked and is refused
    (:class:`KeySubstitution`) rather than failing with a ``KeyError``."""
    key = directory.get(signer)
    if key is None:
        raise KeySubstitution(
            f"{what}: this participant holds no pinned identity key for {signer!r} "
            "(not among the parties whose signatures it checks in this job)"
        )
    return key


def digests_equal(a: bytes, b: bytes) -> bool:
    """Constant-time comparison for commitments and MAC-like values."""
    return hmac.compare_digest(a, b)
