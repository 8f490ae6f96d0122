"""The signed ``JoinRequest`` tests send, built in one place (the coordinator checks
its Ed25519 signature over ``join_payload``, its timestamp and its nonce; tests that
probe those checks override one field at a time)."""

from __future__ import annotations

import os
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from spherecal.crypto import generate_identity
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.identity import join_payload, public_key_bytes

#: The data shape of sklearn's digits (what most test federations train on).
DIGITS = pb.DataShape(num_classes=10, in_channels=1, image_height=8, image_width=8)


def signed_join(
    pid: str,
    key: Ed25519PrivateKey | None = None,
    *,
    ts: int | None = None,
    nonce: bytes | None = None,
    public: bytes | None = None,
    data: pb.DataShape | None = DIGITS,
) -> pb.JoinRequest:
    """A join by ``pid`` signed with ``key`` (a fresh identity if none) over whatever
    the fields say: now, a fresh 16-byte nonce and the key's own public bytes unless
    given; ``data=None`` leaves the data shape unset."""
    key = generate_identity() if key is None else key
    public = public_key_bytes(key) if public is None else public
    ts = int(time.time() * 1000) if ts is None else ts
    nonce = os.urandom(16) if nonce is None else nonce
    request = pb.JoinRequest(
        participant_id=pid,
        identity_public_key=public,
        timestamp_ms=ts,
        nonce=nonce,
        signature=key.sign(join_payload(pid, public, ts, nonce)),
    )
    if data is not None:
        request.data.CopyFrom(data)
    return request
