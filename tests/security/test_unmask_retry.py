"""An unmask request asked again does not rewrite what the site's audit records.

A site answers one unmask request per job; asked again — its answer was lost, say
(the submission failed and the coordinator re-sends the step) — it sends the same
answer, byte for byte, whatever the new request says (``SecureSession.respond``). It
also records, with the job's release, the survivor set its input was summed with and
who signed it (``site_releases.survivors``, ``signers``): the site's own audit
(``spherecal audit --site``) compares releases of one computation by it, and skips a
pair whose survivor sets are equal ("the same sum twice"). That record was taken from
*every* unmask request the site was sent, answered or not, so a coordinator that
re-sent the step with any survivor set it liked — no signature of it checked, since
nothing new is answered — wrote that set into the site's audit, and could make two
releases over different survivors look like one sum. The site now records the set of
the request it answered, once.

Played against the real ``SecureSteps`` and release ledger of site ``p1``
(``tests.security.test_held_write_failure.Attack``): its first unmask submission fails
with UNAVAILABLE, the coordinator re-sends the step naming every member a survivor.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import grpc
import pytest

from spherecal.crypto.messages import SurvivorSignature, UnmaskRequest, UnmaskResponse
from spherecal.participant.transport import TransportError
from spherecal.proto import spherecal_pb2 as pb
from tests.security.test_held_write_failure import FIRST, IDS, SITE, Attack, Capture


class Lossy(Capture):
    """The site's first unmask submission is lost (UNAVAILABLE)."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = False

    def submit_secagg(self, request: pb.SecAggSubmission) -> pb.Receipt:
        if request.stage == pb.UNMASK and not self.lost:
            self.lost = True
            self.submitted.append((request.stage, bytes(request.message)))
            raise TransportError(grpc.StatusCode.UNAVAILABLE, "connection reset")
        return super().submit_secagg(request)


def _recorded(tmp: Path, job: str) -> tuple[list[str], list[str]]:
    conn = sqlite3.connect(tmp / "privacy.db")
    try:
        survivors, signers = conn.execute(
            "SELECT survivors, signers FROM site_releases WHERE job = ?", (job,)
        ).fetchone()
    finally:
        conn.close()
    return json.loads(survivors), json.loads(signers)


def test_a_resent_unmask_step_does_not_rewrite_the_recorded_survivors(tmp_path: Path) -> None:
    attack = Attack(tmp_path, release=True, transport=Lossy())
    attack.until_masked()
    attack.consistency(FIRST)
    with pytest.raises(TransportError):  # the runner's loop backs off and polls again
        attack.unmask(FIRST, ())
    job = attack.spec.job_id
    assert _recorded(tmp_path, job.hex()) == (list(FIRST), list(FIRST))
    forged = UnmaskRequest(
        job_id=job,
        recipient=SITE,
        survivors=IDS,
        dropouts=(),
        signatures=tuple(SurvivorSignature(signer=p, signature=b"\0" * 64) for p in IDS),
    )
    attack.site.step(job, pb.UNMASK, forged.to_bytes())
    capture = attack.site.transport
    first, again = [m for s, m in capture.submitted if s == pb.UNMASK]
    assert again == first  # the same answer: nothing new revealed
    assert UnmaskResponse.from_bytes(again).sender == SITE
    assert _recorded(tmp_path, job.hex()) == (list(FIRST), list(FIRST)), (
        "the site's audit now records a survivor set it never answered for"
    )
