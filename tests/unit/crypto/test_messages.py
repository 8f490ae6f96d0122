"""Canonical encodings: roundtrip, strictness, fuzzing."""

from __future__ import annotations

import contextlib
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spherecal.crypto import MalformedMessage, ShareKind
from spherecal.crypto.messages import (
    AdvertiseKeys,
    ConsistencyRequest,
    ConsistencySignature,
    EncryptedShare,
    KeyRoster,
    MaskedChunk,
    Message,
    RevealedShare,
    RoutedShare,
    ShareBundle,
    ShareKeys,
    SurvivorSignature,
    UnmaskRequest,
    UnmaskResponse,
    decode_message,
)

from .helpers import Net

ids = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
id_sets = st.lists(ids, max_size=5, unique=True).map(lambda xs: tuple(sorted(xs)))
job_ids = st.binary(min_size=1, max_size=64)


def advert(sender: str = "alice", job: bytes = b"job") -> AdvertiseKeys:
    return AdvertiseKeys(
        job_id=job,
        sender=sender,
        channel_public=os.urandom(32),
        masking_public=os.urandom(32),
        seed_commitment=os.urandom(32),
        signature=os.urandom(64),
    )


def enc_share(receiver: str, x: int = 1) -> EncryptedShare:
    return EncryptedShare(
        receiver=receiver,
        x=x,
        mask_key_commitment=os.urandom(32),
        seed_commitment=os.urandom(32),
        nonce=os.urandom(12),
        ciphertext=os.urandom(104),
    )


def samples() -> list[Message]:
    return [
        advert(),
        KeyRoster(
            job_id=b"j",
            recipient="bob",
            members=("alice", "bob"),
            adverts=(advert("alice"), advert("bob")),
        ),
        ShareKeys(job_id=b"j", sender="alice", shares=(enc_share("alice", 1), enc_share("bob", 2))),
        ShareBundle(
            job_id=b"j",
            recipient="bob",
            members=("alice", "bob"),
            items=(RoutedShare("alice", enc_share("bob", 2)),),
        ),
        MaskedChunk(job_id=b"j", sender="alice", index=3, payload=os.urandom(8 * 5)),
        ConsistencyRequest(job_id=b"j", survivors=("alice", "bob")),
        ConsistencySignature(job_id=b"j", sender="bob", signature=os.urandom(64)),
        UnmaskRequest(
            job_id=b"j",
            recipient="bob",
            survivors=("alice", "bob"),
            dropouts=("carol",),
            signatures=(SurvivorSignature("alice", os.urandom(64)),),
        ),
        UnmaskResponse(
            job_id=b"j",
            sender="bob",
            shares=(
                RevealedShare("alice", ShareKind.SEED, 1, os.urandom(20), os.urandom(16)),
                RevealedShare("carol", ShareKind.MASK_KEY, 2, os.urandom(36), os.urandom(16)),
            ),
        ),
    ]


@pytest.mark.parametrize("message", samples(), ids=lambda m: type(m).__name__)
def test_roundtrip_is_canonical(message: Message) -> None:
    data = message.to_bytes()
    decoded = decode_message(data)
    assert decoded == message
    assert type(message).from_bytes(data) == message
    assert decoded.to_bytes() == data


@pytest.mark.parametrize("message", samples(), ids=lambda m: type(m).__name__)
def test_every_truncation_and_trailing_byte_is_rejected(message: Message) -> None:
    data = message.to_bytes()
    for cut in range(len(data)):
        with pytest.raises(MalformedMessage):
            type(message).from_bytes(data[:cut])
    with pytest.raises(MalformedMessage, match="trailing"):
        type(message).from_bytes(data + b"\x00")


def test_header_checks() -> None:
    data = advert().to_bytes()
    with pytest.raises(MalformedMessage, match="magic"):
        AdvertiseKeys.from_bytes(b"XXXX" + data[4:])
    with pytest.raises(MalformedMessage, match="unsupported protocol version 4"):
        AdvertiseKeys.from_bytes(data[:4] + b"\x04" + data[5:])
    # The retired versions are refused by name, so an old peer learns why.
    with pytest.raises(MalformedMessage, match="version 1 .* no longer supported"):
        AdvertiseKeys.from_bytes(data[:4] + b"\x01" + data[5:])
    with pytest.raises(MalformedMessage, match="version 2 .*not bound to the task"):
        AdvertiseKeys.from_bytes(data[:4] + b"\x02" + data[5:])
    with pytest.raises(MalformedMessage, match="different message type"):
        ShareKeys.from_bytes(data)
    with pytest.raises(MalformedMessage, match="unknown message type"):
        decode_message(data[:5] + b"\x7f" + data[6:])
    with pytest.raises(MalformedMessage):
        decode_message(b"SC")


def test_construction_enforces_structure() -> None:
    with pytest.raises(MalformedMessage, match="sorted"):
        ConsistencyRequest(job_id=b"j", survivors=("b", "a"))
    with pytest.raises(MalformedMessage, match="sorted"):
        ConsistencyRequest(job_id=b"j", survivors=("a", "a"))
    with pytest.raises(MalformedMessage, match="32 bytes"):
        AdvertiseKeys(
            job_id=b"j",
            sender="a",
            channel_public=b"x",
            masking_public=bytes(32),
            seed_commitment=bytes(32),
            signature=bytes(64),
        )
    with pytest.raises(MalformedMessage, match="whole ring words"):
        MaskedChunk(job_id=b"j", sender="a", index=0, payload=b"1234567")
    with pytest.raises(MalformedMessage, match="revealed share"):
        RevealedShare("a", ShareKind.SEED, 1, os.urandom(36), os.urandom(16))
    with pytest.raises(MalformedMessage, match="job_id"):
        ConsistencyRequest(job_id=b"", survivors=())
    with pytest.raises(MalformedMessage, match="x-coordinate"):
        enc_share("a", x=0)
    with pytest.raises(MalformedMessage, match="share senders"):
        ShareBundle(
            job_id=b"j",
            recipient="a",
            members=(),
            items=(RoutedShare("b", enc_share("a")), RoutedShare("a", enc_share("a"))),
        )


def test_unknown_share_kind_is_malformed() -> None:
    message = samples()[-1]
    data = bytearray(message.to_bytes())
    # The first revealed share's kind byte follows: header(6) job(4+1) sender(4+3) count(4)
    # owner(4+5).
    offset = 6 + 5 + 7 + 4 + 9
    assert data[offset] == int(ShareKind.SEED)
    data[offset] = 9
    with pytest.raises(MalformedMessage, match="share kind"):
        UnmaskResponse.from_bytes(bytes(data))


@settings(max_examples=60, deadline=None)
@given(job=job_ids, sender=ids, members=id_sets, payload=st.binary(max_size=64))
def test_random_fields_roundtrip(
    job: bytes, sender: str, members: tuple[str, ...], payload: bytes
) -> None:
    payload = payload[: len(payload) // 8 * 8]
    for message in (
        MaskedChunk(job_id=job, sender=sender, index=7, payload=payload),
        ConsistencyRequest(job_id=job, survivors=members),
        UnmaskRequest(job_id=job, recipient=sender, survivors=members, dropouts=members),
        KeyRoster(
            job_id=job,
            recipient=sender,
            members=members,
            adverts=tuple(advert(m, job) for m in members),
        ),
    ):
        assert decode_message(message.to_bytes()) == message


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_only_ever_raise_malformed(data: bytes) -> None:
    for candidate in (data, b"SCSA\x01" + data):
        with contextlib.suppress(MalformedMessage):
            decode_message(candidate)


@settings(max_examples=200, deadline=None)
@given(
    index=st.integers(0, 10_000), bit=st.integers(0, 7), which=st.integers(0, len(samples()) - 1)
)
def test_bit_flips_decode_to_malformed_or_a_different_valid_message(
    index: int, bit: int, which: int
) -> None:
    message = samples()[which]
    data = bytearray(message.to_bytes())
    data[index % len(data)] ^= 1 << bit
    try:
        decoded = decode_message(bytes(data))
    except MalformedMessage:
        return
    assert decoded != message
    assert decoded.to_bytes() == bytes(data)  # still canonical


def test_real_protocol_messages_roundtrip() -> None:
    net = Net(n=3, threshold=2, length=5, chunk_size=2, consistency=False)
    net.run()
    messages: list[Message] = [
        *net.share_msgs.values(),
        *net.rosters.values(),
        *net.bundles.values(),
        *net.unmask_requests.values(),
        *net.responses.values(),
    ]
    for message in messages:
        assert decode_message(message.to_bytes()) == message


def test_reprs_do_not_leak_payloads() -> None:
    chunk = MaskedChunk(job_id=b"j", sender="a", index=0, payload=b"\xab" * 64)
    assert "ab" * 8 not in repr(chunk) and "\\xab" not in repr(chunk)
    share = RevealedShare("a", ShareKind.SEED, 1, b"\xcd" * 20, b"\xef" * 16)
    assert "\\xcd" not in repr(share) and "\\xef" not in repr(share)
