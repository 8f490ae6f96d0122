"""Signed share complaints (participant side) and their verification by the server."""

from __future__ import annotations

from dataclasses import replace

import pytest

from spherecal.crypto import (
    BadComplaint,
    BadSignature,
    ComplaintReason,
    DuplicateMessage,
    Excluded,
    ForgedShare,
    JobSpec,
    MalformedMessage,
    OutOfStage,
    SecAggPolicy,
    SenderMismatch,
    ShareComplaint,
    Stage,
    TooFewSurvivors,
    WrongJob,
    decode_message,
)
from spherecal.crypto.complaints import sign_complaint, verify_complaint
from spherecal.crypto.keys import load_identity_public
from spherecal.crypto.messages import ShareBundle

from .helpers import Net, flip


def _corrupt(bundle: ShareBundle, dealer: str) -> ShareBundle:
    items = tuple(
        replace(i, share=replace(i.share, ciphertext=flip(i.share.ciphertext, 5)))
        if i.sender == dealer
        else i
        for i in bundle.items
    )
    return replace(bundle, items=items)


def _complaint_from(net: Net, holder: str, dealer: str) -> ShareComplaint:
    """A real participant refuses a corrupted share from ``dealer`` and signs."""
    with pytest.raises(ForgedShare) as err:
        net.clients[holder].receive_shares(_corrupt(net.server.bundle_for(holder), dealer))
    complaint = err.value.complaint
    assert isinstance(complaint, ShareComplaint)
    return complaint


def _shared(n: int = 5, **kwargs: object) -> Net:
    net = Net(n, threshold=n // 2 + 1, consistency=True, policy=SecAggPolicy(), **kwargs)  # type: ignore[arg-type]
    net.advertise()
    net.share()
    return net


def test_refused_share_yields_a_signed_complaint_the_server_accepts() -> None:
    net = _shared()
    complaint = _complaint_from(net, "p00", "p02")
    assert (complaint.complainant, complaint.dealer) == ("p00", "p02")
    assert complaint.reason is ComplaintReason.DECRYPTION_FAILED
    wire = decode_message(complaint.to_bytes())
    assert wire == complaint and ShareComplaint.from_bytes(complaint.to_bytes()) == complaint
    net.server.receive(wire, sender="p00")
    assert net.server.accused() == {"p02": ("p00",)}
    # A second honest holder complaining about the same dealer is counted too.
    net.server.receive(_complaint_from(net, "p01", "p02"), sender="p01")
    assert net.server.accused() == {"p02": ("p00", "p01")}


def test_forged_tampered_and_replayed_complaints_are_rejected_and_not_counted() -> None:
    net = _shared()
    genuine = _complaint_from(net, "p00", "p02")
    server = net.server
    # Forged: p03 signs a complaint in p01's name.
    forged = sign_complaint(
        net.identities["p03"],
        net.spec,
        complainant="p01",
        dealer="p02",
        reason=ComplaintReason.DECRYPTION_FAILED,
    )
    with pytest.raises(BadSignature):
        server.receive(forged, sender="p01")
    # Tampered: the signature covers dealer p02 and the reason, not p04 / another reason.
    with pytest.raises(BadSignature):
        server.receive(replace(genuine, dealer="p04"), sender="p00")
    with pytest.raises(BadSignature):
        server.receive(replace(genuine, reason=ComplaintReason.COMMITMENT_MISMATCH), sender="p00")
    with pytest.raises(BadSignature):
        server.receive(replace(genuine, signature=flip(genuine.signature)), sender="p00")
    # Relayed by someone else over an authenticated transport.
    with pytest.raises(SenderMismatch):
        server.receive(genuine, sender="p03")
    assert server.accused() == {}
    server.receive(genuine, sender="p00")
    # Replayed within the job: counted once.
    with pytest.raises(DuplicateMessage):
        server.receive(genuine, sender="p00")
    assert server.accused() == {"p02": ("p00",)}
    # Replayed into another job (same ids, same identity keys): refused.
    with pytest.raises(WrongJob):
        server.receive(replace(genuine, job_id=b"another job"), sender="p00")
    other = JobSpec.create(net.ids, threshold=3, length=net.spec.length, bound=1.0)
    moved = replace(genuine, job_id=other.job_id)  # job id rewritten: signature breaks
    with pytest.raises(BadSignature):
        verify_complaint(other, load_identity_public(net.directory["p00"]), moved)
    verify_complaint(net.spec, load_identity_public(net.directory["p00"]), genuine)


def test_complaint_about_a_share_never_routed_or_before_routing_is_refused() -> None:
    net = Net(5, threshold=3, consistency=True)
    net.advertise()
    early = sign_complaint(
        net.identities["p00"],
        net.spec,
        complainant="p00",
        dealer="p01",
        reason=ComplaintReason.DECRYPTION_FAILED,
    )
    with pytest.raises(OutOfStage):
        net.server.receive(early, sender="p00")
    net.share(skip=("p04",))  # p04 never dealt: nobody received a share from it
    net.deliver_bundles()
    about_p04 = sign_complaint(
        net.identities["p00"],
        net.spec,
        complainant="p00",
        dealer="p04",
        reason=ComplaintReason.DECRYPTION_FAILED,
    )
    with pytest.raises(BadComplaint):
        net.server.receive(about_p04, sender="p00")
    by_p04 = sign_complaint(
        net.identities["p04"],
        net.spec,
        complainant="p04",
        dealer="p00",
        reason=ComplaintReason.DECRYPTION_FAILED,
    )
    with pytest.raises(Excluded):  # p04 is not in U2
        net.server.receive(by_p04, sender="p04")
    assert net.server.accused() == {}


def test_complaints_are_accepted_after_the_job_aborts() -> None:
    """The dealer's forged shares make the job fail; the coordinator still learns
    whom the honest holders accuse, to exclude it on retry."""
    net = _shared(3)
    complaints = [_complaint_from(net, p, "p02") for p in ("p00", "p01")]
    with pytest.raises(TooFewSurvivors):
        net.server.close_stage()  # nobody uploaded: the job aborts
    assert net.server.stage is Stage.ABORTED
    for c in complaints:
        net.server.receive(c, sender=c.complainant)
    assert net.server.accused() == {"p02": ("p00", "p01")}


def test_own_share_failure_names_nobody_and_malformed_complaints_do_not_decode() -> None:
    net = _shared()
    with pytest.raises(ForgedShare) as err:
        net.clients["p00"].receive_shares(_corrupt(net.server.bundle_for("p00"), "p00"))
    assert err.value.complaint is None and net.clients["p00"].complaints == []
    good = sign_complaint(
        net.identities["p01"],
        net.spec,
        complainant="p01",
        dealer="p02",
        reason=ComplaintReason.WRONG_POSITION,
    ).to_bytes()
    bad_reason = bytearray(good)
    bad_reason[-65] = 9  # the reason byte precedes the 64-byte signature
    with pytest.raises(MalformedMessage, match="reason"):
        decode_message(bytes(bad_reason))
    with pytest.raises(MalformedMessage):
        decode_message(good + b"\x00")
    with pytest.raises(MalformedMessage, match="itself"):
        replace(ShareComplaint.from_bytes(good), dealer="p01")
