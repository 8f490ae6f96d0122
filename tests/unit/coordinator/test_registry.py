"""Registry: roster, join proofs, pinned keys, sessions, certificate identity, liveness."""

from __future__ import annotations

import os
import time
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from spherecal.certs import init_ca, issue_participant
from spherecal.coordinator.errors import ServiceError
from spherecal.coordinator.state.registry import Peer, Registry
from spherecal.coordinator.state.store import Store
from spherecal.crypto import generate_identity
from spherecal.proto import spherecal_pb2 as pb
from tests.joins import signed_join


def _join(
    pid: str,
    key: Ed25519PrivateKey | None = None,
    *,
    ts: int | None = None,
    nonce: bytes | None = None,
) -> pb.JoinRequest:
    return signed_join(pid, key, ts=ts, nonce=nonce, data=None)


@pytest.fixture
def registry(tmp_path: Path):  # type: ignore[no-untyped-def]
    store = Store(tmp_path / "s.db")
    yield Registry(
        ("p0", "p1"), store, require_certificates=False, heartbeat_timeout_s=5, clock_skew_s=60
    )
    store.close()


def _code(fn) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(ServiceError) as info:
        fn()
    return info.value.code


def test_join_opens_a_session_and_pins_the_key(registry: Registry) -> None:
    key = generate_identity()
    member = registry.join(_join("p0", key), Peer())
    assert member.session and member.index == 0
    caller = pb.Caller(participant_id="p0", session=member.session)
    assert registry.authenticate(caller, Peer()).participant_id == "p0"
    assert registry.alive() == frozenset({"p0"})
    # Same key again: new session, the old one is dead.
    again = registry.join(_join("p0", key), Peer())
    assert again.session != caller.session
    assert _code(lambda: registry.authenticate(caller, Peer())) is grpc.StatusCode.UNAUTHENTICATED
    # A different key for a pinned id is refused.
    assert _code(lambda: registry.join(_join("p0"), Peer())) is grpc.StatusCode.PERMISSION_DENIED


def test_join_refusals(registry: Registry) -> None:
    assert (
        _code(lambda: registry.join(_join("mallory"), Peer())) is grpc.StatusCode.PERMISSION_DENIED
    )
    old = _join("p1", ts=int(time.time() * 1000) - 3_600_000)
    assert _code(lambda: registry.join(old, Peer())) is grpc.StatusCode.UNAUTHENTICATED
    forged = _join("p1")
    forged.signature = bytes(64)
    assert _code(lambda: registry.join(forged, Peer())) is grpc.StatusCode.UNAUTHENTICATED
    short = _join("p1")
    short.identity_public_key = b"x"
    assert _code(lambda: registry.join(short, Peer())) is grpc.StatusCode.INVALID_ARGUMENT
    key, nonce = generate_identity(), os.urandom(16)
    ts = int(time.time() * 1000)
    registry.join(_join("p1", key, ts=ts, nonce=nonce), Peer())
    replay = _join("p1", key, ts=ts, nonce=nonce)
    assert _code(lambda: registry.join(replay, Peer())) is grpc.StatusCode.ALREADY_EXISTS


def test_pinned_keys_survive_a_restart(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    reg = Registry(
        ("p0",), store, require_certificates=False, heartbeat_timeout_s=5, clock_skew_s=60
    )
    reg.join(_join("p0"), Peer())
    restarted = Registry(
        ("p0",), store, require_certificates=False, heartbeat_timeout_s=5, clock_skew_s=60
    )
    assert _code(lambda: restarted.join(_join("p0"), Peer())) is grpc.StatusCode.PERMISSION_DENIED
    store.close()


def test_certificate_identity_must_match_every_request(tmp_path: Path) -> None:
    init_ca(tmp_path)
    issue_participant(tmp_path, "p0")
    from spherecal.proto.identity import load_identity_key

    key = load_identity_key(tmp_path / "p0.identity.key")
    pem = (tmp_path / "p0.pem").read_bytes()
    store = Store(tmp_path / "s.db")
    reg = Registry(
        ("p0", "p1"), store, require_certificates=True, heartbeat_timeout_s=5, clock_skew_s=60
    )
    p0 = Peer(identity="p0", certificate_pem=pem)
    assert _code(lambda: reg.join(_join("p0", key), Peer())) is grpc.StatusCode.UNAUTHENTICATED
    assert _code(lambda: reg.join(_join("p1", key), p0)) is grpc.StatusCode.UNAUTHENTICATED
    assert (
        _code(lambda: reg.join(_join("p0"), p0)) is grpc.StatusCode.PERMISSION_DENIED
    )  # not the bound key
    member = reg.join(_join("p0", key), p0)
    caller = pb.Caller(participant_id="p0", session=member.session or "")
    assert reg.authenticate(caller, p0).participant_id == "p0"
    other = Peer(identity="p1", certificate_pem=pem)
    assert _code(lambda: reg.authenticate(caller, other)) is grpc.StatusCode.UNAUTHENTICATED
    store.close()


def test_presence_makes_a_participant_alive_until_its_stream_drops(registry: Registry) -> None:
    member = registry.join(_join("p1"), Peer())
    registry.presence_opened(member)
    assert "p1" in registry.alive(now=time.monotonic() + 3600)  # connected: never timed out
    registry.presence_closed(member)
    assert "p1" not in registry.alive()  # disconnected: dead at once
    registry.authenticate(pb.Caller(participant_id="p1", session=member.session or ""), Peer())
    assert "p1" in registry.alive()  # a call revives it


@pytest.mark.parametrize("stream", [True, False], ids=["stream-open", "before-its-stream"])
def test_one_live_session_per_identity(registry: Registry, stream: bool) -> None:
    """A second process (another connection) with a live identity is refused, while the
    first's presence stream is open and in the moments between its join and that stream:
    a twin joining then was let in until 2026-11-26 (only an open stream counted), took
    the session, and the two knocked each other off for the whole federation (seen on a
    fast machine, where the twin's join came 0.1 s after the first's)."""
    key = generate_identity()
    first = registry.join(_join("p1", key), Peer(address="ipv4:10.0.0.1:40000"))
    if stream:
        registry.presence_opened(first, "ipv4:10.0.0.1:40000")
    session = first.session
    with pytest.raises(ServiceError) as info:
        registry.join(_join("p1", key), Peer(address="ipv4:10.0.0.2:50000"))
    assert info.value.code is grpc.StatusCode.ALREADY_EXISTS
    assert info.value.reason == pb.IDENTITY_IN_USE  # retryable
    assert "'p1' is already connected from ipv4:10.0.0.1:40000" in info.value.message
    assert registry.member("p1").session == session  # the first is not disturbed
    # the live process itself may join again over its own connection
    again = registry.join(_join("p1", key), Peer(address="ipv4:10.0.0.1:40000"))
    assert again.session != session
    # once the first is gone a restarted process gets in: its stream closed (a crash),
    # or, never opened, it was silent past the heartbeat timeout (5 s here)
    if stream:
        registry.presence_closed(first)
    else:
        registry.member("p1").last_seen -= 6
    assert "p1" not in registry.alive()
    assert registry.join(_join("p1", key), Peer(address="ipv4:10.0.0.2:50001")).session
