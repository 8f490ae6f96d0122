"""The masked-upload path reads each chunk once for the sum and hashes it once
(issue #24): the receipt is the SHA-256 of the chunks' audited digests, and the
traffic accounting equals protobuf's own ``ByteSize`` without serialising again."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from spherecal import crypto
from spherecal.coordinator.server.uploads import _masked_wire_size
from spherecal.coordinator.state.registry import Peer
from spherecal.proto import spherecal_pb2 as pb

from .service_harness import Harness, settings_for, shared_secure_round


@pytest.mark.parametrize("size", [4, 120, 124, 128, 16380, 16384, 2_097_152, 2_097_156])
def test_wire_size_equals_protobufs_own(size: int) -> None:
    chunk = bytes(size)
    assert (
        _masked_wire_size(pb.MaskedUpload(chunk=chunk), chunk)
        == pb.MaskedUpload(chunk=chunk).ByteSize()
    )
    first = pb.MaskedUpload(caller=pb.Caller(participant_id="p0"), job_id=b"j" * 16, chunk=chunk)
    assert _masked_wire_size(first, chunk) == first.ByteSize()


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(settings_for(tmp_path, secure=True)).start()
    try:
        yield harness
    finally:
        harness.close()


def test_receipt_digests_the_audited_chunk_digests(secure: Harness) -> None:
    job, clients = shared_secure_round(secure, ("p0", "p1", "p2"))
    c = clients["p0"]
    c.receive_shares(crypto.ShareBundle.from_bytes(secure.poll("p0", {"secagg"}).secagg.message))
    chunks = [chunk.to_bytes() for chunk in c.masked_chunks()]
    assert len(chunks) > 1
    messages = [pb.MaskedUpload(caller=secure.caller("p0"), job_id=job.job_id, chunk=chunks[0])]
    messages += [pb.MaskedUpload(chunk=chunk) for chunk in chunks[1:]]
    receipt = secure.service.upload_masked(iter(messages), Peer())
    digests = [hashlib.sha256(chunk).digest() for chunk in chunks]
    assert receipt.sha256 == hashlib.sha256(b"".join(digests)).digest()
    assert receipt.num_bytes == sum(len(chunk) for chunk in chunks)
    audited = secure.store.query(
        "SELECT kind, sha256 FROM audit WHERE sender='p0' AND stage='masked' "
        "AND status='accepted' ORDER BY id"
    )
    assert [row[1] for row in audited] == [d.hex() for d in digests]
    assert secure.service.traffic.snapshot()["p0"]["masked"]["received"] == sum(
        m.ByteSize() for m in messages
    )
