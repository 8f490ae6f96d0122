"""A member whose certificate is revoked has left the federation: nothing waits for it.

Until 2026-11-27 a revoked site stayed an absent member: the coordinator refused its
every call, yet its join window waited ``join_s`` (300 s) for it, and each stage of a
job it was in waited ``rejoin_grace_s`` for it to come back — which, under that
certificate, it cannot. Now the member whose *own* certificate (the one it last joined
with; its serial kept in the store) is on the CA's list leaves
(``Registry.revoked``), as a site that refused the plan does: the join window closes
without it, a job drops it as withdrawn, a restarted coordinator knows it at start,
and a join with a new certificate lets it back in. The list reaches the service
through ``RevocationList.on_change``, as in the server (the whole path over real
mutual TLS: ``tests/security/test_revocation.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography import x509

from spherecal import crypto
from spherecal.certs import init_ca, issue_participant, revoke_participant
from spherecal.coordinator.server.revocation import RevocationList
from spherecal.coordinator.settings import CoordinatorSettings
from spherecal.coordinator.state.registry import Peer
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.identity import load_identity_key
from spherecal.status import render_status

from .service_harness import Harness, settings_for, shared_secure_round

WAITING = "waiting for participants"


def _until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Wait for a state (never a duration asserted): the windows and graces below are
    600 s, so a wait for the revoked member never gets there."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.02)


class Certified(Harness):
    """The harness with each member joining under its CA-issued certificate (the
    identity key bound in it), as the gRPC transport presents it."""

    def __init__(self, settings: CoordinatorSettings, ca: Path) -> None:
        super().__init__(settings)
        self.ca = ca
        self.keys = {p: load_identity_key(ca / f"{p}.identity.key") for p in settings.participants}
        self.crl = RevocationList(ca / "crl.pem", (ca / "ca.pem").read_bytes(), check_every_s=0.0)
        # as build_server wires it: the list at start, then every reload
        self.crl.on_change = self.service.certificates_revoked
        self.service.certificates_revoked(self.crl.serials)

    def join(self, pid: str) -> str:
        peer = Peer(identity=pid, certificate_pem=(self.ca / f"{pid}.pem").read_bytes())
        reply = self.service.join(self.join_request(pid), peer)
        self.sessions[pid] = reply.session
        return reply.session

    def revoke(self, pid: str) -> int:
        """``spherecal certs revoke PID`` and the coordinator's next look at the list."""
        serial = _serial(self.ca, pid)
        revoke_participant(self.ca, pid)
        assert self.crl.is_revoked(serial)  # reloaded: on_change has run
        return serial


def _serial(ca: Path, pid: str) -> int:
    return x509.load_pem_x509_certificate((ca / f"{pid}.pem").read_bytes()).serial_number


@pytest.fixture()
def ca(tmp_path: Path) -> Path:
    directory = tmp_path / "ca"
    init_ca(directory)
    for pid in ("p0", "p1", "p2"):
        issue_participant(directory, pid)
    return directory


def _settings(tmp_path: Path, *, secure: bool) -> CoordinatorSettings:
    settings = settings_for(tmp_path, secure=secure)
    return replace(
        settings,
        timeouts=replace(
            settings.timeouts, join_s=600.0, rejoin_grace_s=600.0, stage_s=600.0, round_s=600.0
        ),
    )


def _roster(harness: Harness) -> dict[str, pb.RosterEntry]:
    status = harness.service.get_federation_status(pb.FederationStatusRequest(), Peer())
    return {r.participant_id: r for r in status.roster}


def test_the_join_window_does_not_wait_for_a_revoked_member(tmp_path: Path, ca: Path) -> None:
    harness = Certified(_settings(tmp_path, secure=False), ca)
    harness.start()
    try:
        harness.join("p2")
        serial = harness.revoke("p2")
        why = (
            f"has a revoked certificate (serial {serial:x}) and can join again only with a new one"
        )
        warning = f"p2 left the federation: it {why}"
        assert harness.federation.warnings == [warning]
        assert harness.registry.joined() == frozenset() and harness.registry.alive() == set()
        entry = _roster(harness)["p2"]
        assert (entry.joined, entry.connected, entry.left) == (False, False, why)
        text = render_status(
            harness.service.get_federation_status(pb.FederationStatusRequest(), Peer())
        )
        (line,) = [x for x in text.splitlines() if x.strip().startswith("p2 ")]
        assert line.split()[1] == "left" and line.endswith(why)
        harness.revoke("p2")  # the same list again: said once
        assert harness.federation.warnings == [warning]
        harness.join("p0")
        assert harness.federation.phase == WAITING  # p1 may still come
        harness.join("p1")
        # every member that has not left is in: round 1 starts, not after 600 s
        assert harness.poll("p1", {"train"}).train.round == 0
        closed = (
            "every participant that has not left joined: continuing with 2 of 3 "
            f"participants, without ['p2'] (p2 {why})"
        )
        assert closed in harness.federation.warnings
        events = [m for (m,) in harness.store.query("SELECT message FROM events ORDER BY id")]
        assert events.index(warning) < events.index(closed)
    finally:
        harness.close()


def test_a_job_drops_a_revoked_member_without_waiting_for_it(tmp_path: Path, ca: Path) -> None:
    """Revoked with its masked input not yet in: the masked stage closes once the
    others' are, without the 600 s grace of a site that restarts; the job names why."""
    harness = Certified(_settings(tmp_path, secure=True), ca)
    harness.start()
    try:
        job_spec, clients = shared_secure_round(harness, ("p0", "p1", "p2"))
        task = harness.federation.board.task
        assert task is not None and task.job is not None
        job = task.job
        harness.revoke("p2")
        _until(lambda: "p2" in job.withdrawn, "the job dropped p2")
        assert job.withdrawn["p2"].startswith("left the federation: it has a revoked certificate")
        for pid in ("p0", "p1"):  # the others' masked inputs
            step = harness.poll(pid, {"secagg"}).secagg
            assert step.stage == pb.MASKED
            client = clients[pid]
            client.receive_shares(crypto.ShareBundle.from_bytes(step.message))
            chunks = [chunk.to_bytes() for chunk in client.masked_chunks()]
            first = pb.MaskedUpload(
                caller=harness.caller(pid), job_id=job_spec.job_id, chunk=chunks[0]
            )
            rest = [pb.MaskedUpload(chunk=chunk) for chunk in chunks[1:]]
            harness.service.upload_masked(iter([first, *rest]), Peer())
        _until(lambda: "p2" in job.dropped, "the masked stage closed without p2")
        assert job.dropped["p2"].startswith(
            "masked: withdrew: left the federation: it has a revoked certificate"
        )
    finally:
        harness.close()


def test_a_new_certificate_lets_it_back_in(tmp_path: Path, ca: Path) -> None:
    """Re-issued (same identity key: the pin holds), it joins again and is a member
    like any other; the old certificate, still on the list, does not push it out."""
    harness = Certified(_settings(tmp_path, secure=False), ca)
    try:
        harness.join("p2")
        old = harness.revoke("p2")
        assert "p2" in harness.registry.left()
        issue_participant(ca, "p2")  # a new certificate, a new serial
        assert _serial(ca, "p2") != old
        harness.join("p2")
        assert harness.registry.joined() == {"p2"} and harness.registry.left() == {}
        assert _roster(harness)["p2"].left == ""
        harness.revoke("p1")  # the list changes again, the old serial still on it
        assert harness.registry.joined() == {"p2"} and harness.registry.left() == {}
        harness.service.certificates_revoked(frozenset({old}))
        assert harness.registry.joined() == {"p2"} and harness.registry.left() == {}
    finally:
        harness.store.close()


def test_a_restarted_coordinator_knows_a_member_revoked_while_it_was_down(
    tmp_path: Path, ca: Path
) -> None:
    """The serial of the certificate each member joined with is in the store: a list
    that holds it at start makes the member leave before the join window opens."""
    first = Certified(_settings(tmp_path, secure=False), ca)
    first.join("p2")
    first.store.close()  # the coordinator goes down
    serial = _serial(ca, "p2")
    revoke_participant(ca, "p2")  # revoked while it is down
    harness = Certified(_settings(tmp_path, secure=False), ca)
    assert harness.registry.left() == {
        "p2": f"has a revoked certificate (serial {serial:x}) and can join again only "
        "with a new one"
    }
    harness.start()
    try:
        harness.join("p0")
        harness.join("p1")
        assert harness.poll("p1", {"train"}).train.round == 0  # not after 600 s
        assert any("without ['p2'] (p2 has a revoked" in w for w in harness.federation.warnings)
    finally:
        harness.close()
