"""Signed share complaints: how an honest holder names a dealer whose share failed.

Why: a malicious participant can deal shares that fail authentication and so make
every retry of a job fail. The holder that detects it (:mod:`spherecal.crypto.participant`)
signs a :class:`~spherecal.crypto.messages.ShareComplaint` with its long-term identity key
over (spec digest, job id, complainant, dealer, reason); the coordinator verifies it
(:func:`verify_complaint`, used by :meth:`crypto.SecAggServer.receive_complaint`) and
may exclude every dealer accused by at least one valid complaint when it retries.

What a valid complaint proves: that the *complainant* says so, about a share the
coordinator routed to it in this job — not that the dealer cheated (the shares are
encrypted end to end, and the dealer's ``ShareKeys`` is not signed, so neither the
coordinator nor a third party can check the claim). A malicious complainant can thus
get one peer excluded per job; it cannot forge another participant's complaint, move
a complaint to another job or dealer, or have it counted twice. See
``docs/threat_model.md``.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from spherecal.crypto._exceptions import DuplicateMessage, WrongJob
from spherecal.crypto.keys import complaint_payload, sign, verify
from spherecal.crypto.messages import ComplaintReason, ShareComplaint
from spherecal.crypto.spec import JobSpec

__all__ = ["ComplaintRecord", "sign_complaint", "verify_complaint"]


def sign_complaint(
    identity: Ed25519PrivateKey,
    spec: JobSpec,
    *,
    complainant: str,
    dealer: str,
    reason: ComplaintReason,
) -> ShareComplaint:
    payload = complaint_payload(
        spec_digest=spec.digest,
        job_id=spec.job_id,
        complainant=complainant,
        dealer=dealer,
        reason=int(reason),
    )
    return ShareComplaint(
        job_id=spec.job_id,
        complainant=complainant,
        dealer=dealer,
        reason=reason,
        signature=sign(identity, payload),
    )


def verify_complaint(spec: JobSpec, complainant_key: Ed25519PublicKey, msg: ShareComplaint) -> None:
    """Raise :class:`WrongJob` or :class:`BadSignature` unless ``msg`` is signed by
    ``complainant_key`` for this very job spec."""
    if msg.job_id != spec.job_id:
        raise WrongJob("complaint belongs to another job")
    payload = complaint_payload(
        spec_digest=spec.digest,
        job_id=spec.job_id,
        complainant=msg.complainant,
        dealer=msg.dealer,
        reason=int(msg.reason),
    )
    verify(complainant_key, msg.signature, payload, what=f"complaint of {msg.complainant!r}")


class ComplaintRecord:
    """Verified complaints of one job: dealer -> complainants (each pair once)."""

    def __init__(self) -> None:
        self._by_dealer: dict[str, set[str]] = {}

    def add(self, msg: ShareComplaint) -> None:
        """Record a verified complaint; a replay raises :class:`DuplicateMessage`."""
        accusers = self._by_dealer.setdefault(msg.dealer, set())
        if msg.complainant in accusers:
            raise DuplicateMessage(f"{msg.complainant!r} already complained about {msg.dealer!r}")
        accusers.add(msg.complainant)

    def accused(self) -> dict[str, tuple[str, ...]]:
        return {d: tuple(sorted(c)) for d, c in sorted(self._by_dealer.items()) if c}
