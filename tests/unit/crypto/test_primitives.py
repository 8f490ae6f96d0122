"""KDF domain separation, keys and signatures, Shamir, the share channel."""

from __future__ import annotations

import itertools
import os

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from spherecal.crypto import BadKey, BadSignature, ForgedShare, shamir
from spherecal.crypto._codec import encode_context
from spherecal.crypto.channel import (
    CIPHERTEXT_BYTES,
    ShareKind,
    SharePlaintext,
    commitment,
    open_share,
    seal_share,
    share_aad,
)
from spherecal.crypto.kdf import channel_key, derive, pairwise_mask_seed, self_mask_seed
from spherecal.crypto.keys import (
    JobKeys,
    agree,
    check_public_key,
    generate_identity,
    identity_public_bytes,
    load_identity_public,
    seed_commitment,
    sign,
    verify,
    x25519_public_from_private,
)

DIGEST = bytes(range(32))
JOB = b"job-1"


# ------------------------------------------------------------------------- KDF
def test_pairwise_seed_is_symmetric_and_separated_by_everything() -> None:
    secret = os.urandom(32)
    base = pairwise_mask_seed(secret, spec_digest=DIGEST, job_id=JOB, a="alice", b="bob")
    assert base == pairwise_mask_seed(secret, spec_digest=DIGEST, job_id=JOB, a="bob", b="alice")
    variants = [
        pairwise_mask_seed(secret, spec_digest=bytes(32), job_id=JOB, a="alice", b="bob"),
        pairwise_mask_seed(secret, spec_digest=DIGEST, job_id=b"job-2", a="alice", b="bob"),
        pairwise_mask_seed(secret, spec_digest=DIGEST, job_id=JOB, a="alice", b="carol"),
        pairwise_mask_seed(os.urandom(32), spec_digest=DIGEST, job_id=JOB, a="alice", b="bob"),
    ]
    assert all(v != base for v in variants)
    # Same secret, different purpose: unrelated keys.
    chan = channel_key(secret, spec_digest=DIGEST, job_id=JOB, a="alice", b="bob")
    assert chan != base.key + base.nonce
    assert self_mask_seed(secret, spec_digest=DIGEST, job_id=JOB, owner="alice") != (
        self_mask_seed(secret, spec_digest=DIGEST, job_id=JOB, owner="bob")
    )


def test_context_encoding_is_injective() -> None:
    assert encode_context("ab", "c") != encode_context("a", "bc")
    assert encode_context(b"1") != encode_context("1") != encode_context(1)
    assert derive(b"k", purpose="x", spec_digest=DIGEST, job_id=JOB, parties=("ab", "c")) != derive(
        b"k", purpose="x", spec_digest=DIGEST, job_id=JOB, parties=("a", "bc")
    )
    with pytest.raises(TypeError):
        encode_context(True)


# ------------------------------------------------------------------------ keys
def test_signatures_verify_and_reject_tampering() -> None:
    identity = generate_identity()
    public = load_identity_public(identity_public_bytes(identity))
    signature = sign(identity, b"payload")
    verify(public, signature, b"payload", what="test")
    with pytest.raises(BadSignature, match="test"):
        verify(public, signature, b"payloaD", what="test")
    with pytest.raises(BadSignature):
        verify(
            load_identity_public(identity_public_bytes(generate_identity())),
            signature,
            b"payload",
            what="test",
        )
    with pytest.raises(BadSignature, match="bytes"):
        verify(public, signature[:-1], b"payload", what="test")
    with pytest.raises(BadKey):
        load_identity_public(b"\x00" * 31)


def test_key_agreement_rejects_low_order_and_malformed_keys() -> None:
    private = X25519PrivateKey.from_private_bytes(os.urandom(32))
    with pytest.raises(BadKey, match="low order"):
        agree(private, bytes(32))
    with pytest.raises(BadKey, match="32 bytes"):
        agree(private, bytes(31))
    with pytest.raises(BadKey):
        check_public_key((1).to_bytes(32, "little"))  # another small-order point
    check_public_key(JobKeys.generate().masking_public)


def test_job_keys_are_fresh_and_hidden_from_repr() -> None:
    a, b = JobKeys.generate(), JobKeys.generate()
    assert a.seed != b.seed and a.masking_public != b.masking_public
    assert a.channel_public != a.masking_public
    assert x25519_public_from_private(a.masking_private_bytes()) == a.masking_public
    text = repr(a)
    assert a.seed.hex() not in text and a.masking_private_bytes().hex() not in text


def test_seed_commitment_binds_owner_and_job() -> None:
    seed = os.urandom(16)
    c = seed_commitment(DIGEST, "alice", seed)
    assert c != seed_commitment(DIGEST, "bob", seed)
    assert c != seed_commitment(bytes(32), "alice", seed)
    assert c != seed_commitment(DIGEST, "alice", os.urandom(16))


# ---------------------------------------------------------------------- Shamir
@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 7), data=st.data(), size=st.sampled_from([16, 32]))
def test_any_t_shares_rebuild_the_secret(n: int, data: st.DataObject, size: int) -> None:
    t = data.draw(st.integers(1, n))
    secret = os.urandom(size)
    shares = shamir.split(secret, t, n)
    assert [x for x, _ in shares] == list(range(1, n + 1))
    subset = data.draw(st.permutations(shares)).copy()[:t]
    assert shamir.combine(subset, t) == secret
    if t > 1:  # t-1 shares interpolate to something else (overwhelmingly likely)
        assert shamir.combine(subset[: t - 1], t - 1) != secret


def test_every_threshold_subset_of_a_small_sharing_works() -> None:
    secret = os.urandom(32)
    shares = shamir.split(secret, 3, 5)
    for subset in itertools.combinations(shares, 3):
        assert shamir.combine(list(subset), 3) == secret


def independent_interpolation(subset: list[tuple[int, bytes]], size: int) -> bytes:
    """p(0) limb by limb with Python integers, written apart from shamir.py."""
    prime = 2**31 - 1
    limbs = len(subset[0][1]) // 4
    value = 0
    for k in range(limbs):
        total = 0
        for j, (xj, share) in enumerate(subset):
            term = int.from_bytes(share[4 * k : 4 * k + 4], "big")
            for m, (xm, _) in enumerate(subset):
                if m != j:
                    term = term * xm * pow(xm - xj, -1, prime) % prime
            total = (total + term) % prime
        value |= total << (30 * k)
    return (value % (1 << (8 * size))).to_bytes(size, "big")


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 9), data=st.data(), size=st.sampled_from([16, 32]))
def test_combine_matches_an_independent_interpolation(
    n: int, data: st.DataObject, size: int
) -> None:
    t = data.draw(st.integers(1, n))
    secret = os.urandom(size)
    shares = shamir.split(secret, t, n)
    assert all(len(s) == shamir.share_bytes(size) for _, s in shares)
    assert shamir.share_bytes(16) == 20 and shamir.share_bytes(32) == 36
    subset = sorted(data.draw(st.permutations(shares))[:t])
    assert independent_interpolation(subset, size) == secret == shamir.combine(subset, t)


def test_shares_are_field_elements_and_fewer_than_t_look_uniform() -> None:
    """Every share element is < p; and with t = 2 a single share of a fixed secret takes
    many different values over fresh dealings (the random coefficient hides it)."""
    secret = bytes(16)
    seen = set()
    for _ in range(200):
        (_, share), _ = shamir.split(secret, 2, 2)
        elements = [int.from_bytes(share[i : i + 4], "big") for i in range(0, len(share), 4)]
        assert all(e < 2**31 - 1 for e in elements)
        seen.add(share)
    assert len(seen) == 200


def test_a_forged_share_rebuilds_another_secret_without_an_error() -> None:
    secret = os.urandom(32)
    shares = shamir.split(secret, 3, 4)
    x, s = shares[0]
    forged = (x, bytes([s[0] ^ 0x40]) + s[1:])
    assert shamir.combine([forged, *shares[1:3]], 3) != secret
    assert shamir.combine([(x, b"\xff" * 36), *shares[1:3]], 3) != secret  # elements >= p


def test_combine_many_reuses_coefficients_per_x_set_correctly() -> None:
    secrets = [os.urandom(32) for _ in range(6)]
    dealt = [shamir.split(s, 3, 5) for s in secrets]
    picks = [[d[0], d[2], d[4]] if i % 2 else [d[1], d[2], d[3]] for i, d in enumerate(dealt)]
    assert shamir.combine_many(picks, 3) == secrets
    assert shamir.combine_many([], 3) == []
    # Mixed lengths in one call: each group is combined apart.
    short = shamir.split(b"k" * 16, 3, 5)
    assert shamir.combine_many([picks[0], short[:3], picks[1]], 3) == [
        secrets[0],
        b"k" * 16,
        secrets[1],
    ]
    with pytest.raises(ValueError, match="non-zero"):
        shamir.combine([(0, bytes(20)), (1, bytes(20))], 2)


def test_shamir_misuse() -> None:
    with pytest.raises(ValueError):
        shamir.split(b"", 2, 3)
    with pytest.raises(ValueError):
        shamir.split(os.urandom(16), 4, 3)
    shares = shamir.split(os.urandom(16), 2, 3)
    with pytest.raises(ValueError, match="need 2"):
        shamir.combine(shares[:1], 2)
    with pytest.raises(ValueError, match="duplicate"):
        shamir.combine([shares[0], shares[0]], 2)
    with pytest.raises(ValueError, match="same length"):
        shamir.combine([shares[0], (2, b"x" * 36)], 2)


# --------------------------------------------------------------------- channel
def _aad(**overrides: object) -> bytes:
    fields: dict[str, object] = dict(
        spec_digest=DIGEST,
        job_id=JOB,
        sender="alice",
        receiver="bob",
        x=2,
        mask_key_commitment=b"k" * 32,
        seed_commitment=b"s" * 32,
    )
    fields.update(overrides)
    return share_aad(**fields)  # type: ignore[arg-type]


def test_share_channel_roundtrip_and_binding() -> None:
    key = os.urandom(32)
    plaintext = SharePlaintext.fresh(mask_key_share=os.urandom(36), seed_share=os.urandom(20))
    nonce, ciphertext = seal_share(key, plaintext, _aad())
    assert len(ciphertext) == CIPHERTEXT_BYTES
    assert open_share(key, nonce, ciphertext, _aad(), what="t") == plaintext
    for changed in (
        _aad(sender="carol"),
        _aad(receiver="carol"),
        _aad(sender="bob", receiver="alice"),
        _aad(job_id=b"job-2"),
        _aad(x=3),
        _aad(seed_commitment=b"S" * 32),
        _aad(spec_digest=bytes(32)),
    ):
        with pytest.raises(ForgedShare, match="authentication"):
            open_share(key, nonce, ciphertext, changed, what="t")
    bad = bytearray(ciphertext)
    bad[5] ^= 1
    with pytest.raises(ForgedShare):
        open_share(key, nonce, bytes(bad), _aad(), what="t")
    with pytest.raises(ForgedShare):
        open_share(os.urandom(32), nonce, ciphertext, _aad(), what="t")
    with pytest.raises(ForgedShare, match="size"):
        open_share(key, nonce, ciphertext[:-1], _aad(), what="t")
    text = repr(plaintext)
    assert plaintext.seed_share.hex() not in text


def test_commitments_bind_every_field() -> None:
    args: dict[str, object] = dict(
        spec_digest=DIGEST,
        job_id=JOB,
        owner="alice",
        holder="bob",
        x=1,
        share=b"\x01" * 16,
        salt=b"\x02" * 16,
    )
    base = commitment(ShareKind.SEED, **args)  # type: ignore[arg-type]
    assert base != commitment(ShareKind.MASK_KEY, **args)  # type: ignore[arg-type]
    for field, value in [
        ("owner", "carol"),
        ("holder", "carol"),
        ("x", 2),
        ("share", b"\x03" * 16),
        ("salt", b"\x04" * 16),
        ("job_id", b"j"),
    ]:
        changed = dict(args, **{field: value})
        assert commitment(ShareKind.SEED, **changed) != base  # type: ignore[arg-type]
