"""A held-job write that fails must not let a restarted site sign or answer twice.

A site writes its job to its held-jobs folder before each message of the job leaves
(``participant.held_jobs``), so that a restart answers the coordinator's remaining
steps as the first process did: never a second survivor set signed, never a second
unmask answer. A write that failed was logged and the message sent anyway ("costs
durability only"). That holds only if the folder then holds *nothing* of the job: if
it still holds an earlier record — a filesystem remounted read-only after an I/O
error (ext4's ``errors=remount-ro``) fails the writes *and* the deletions — the
restarted site is back at the masked stage. A coordinator that asks it again then
gets a second signature on another survivor set and a second unmask answer, in which
a peer that survived the first time is a dropout: the site reveals both kinds of
that peer's shares, which Bonawitz et al.'s round 3 exists to prevent.

Played against the real ``SecureSteps`` (held-jobs folder, job-id ledger and release
ledger on disk) of site ``p1`` in a job of five at ``t = 3``: the coordinator shows
``{p0, p1, p2}`` first and, after ``p1``'s restart, ``{p1, p3, p4}`` with ``p0``
dropped, and rebuilds ``p0``'s exact input from ``p1``'s two answers and the honest
others' one each. A site now sends a job's message only once its record is written
or the job's file is gone (``SecureSteps._keep``): on a read-only folder it withdraws
instead, and its one signature and one answer are those of the survivor set it is
asked after its restart.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable
from pathlib import Path
from typing import cast

import numpy as np
import numpy.typing as npt

from spherecal import crypto
from spherecal.crypto import ShareKind
from spherecal.crypto.messages import (
    ConsistencyRequest,
    ConsistencySignature,
    SurvivorSignature,
    UnmaskRequest,
    UnmaskResponse,
    decode_message,
)
from spherecal.participant.failures import failure_kind, wire_reason
from spherecal.participant.faults import Halter
from spherecal.participant.held_jobs import HeldJob, HeldJobStore
from spherecal.participant.policy import PolicySettings
from spherecal.participant.release_ledger import LedgerRules, Release, ReleaseLedger
from spherecal.participant.secure_jobs import SecureSteps
from spherecal.participant.secure_session import SqliteJobLedger
from spherecal.participant.transport import Transport
from spherecal.participant.trust import DirectoryTrust
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.identity import public_key_bytes
from tests.security.test_colluding_holders import rebuild
from tests.security.test_malicious_coordinator import collect

IDS = ("p0", "p1", "p2", "p3", "p4")
SITE, TARGET = "p1", "p0"
FIRST = ("p0", "p1", "p2")  # p0 survived
SECOND = ("p1", "p3", "p4")  # p0 dropped
LENGTH = 8


class Disk:
    """The state directory's filesystem: ``full`` fails every write in the held-jobs
    folder (ENOSPC), ``read_only`` — remounted after an I/O error — every write and
    every deletion (EROFS); reads work either way."""

    def __init__(self) -> None:
        self.full = False
        self.read_only = False

    def write(self) -> None:
        if self.read_only:
            raise OSError(errno.EROFS, "Read-only file system")
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")

    def unlink(self) -> None:
        if self.read_only:
            raise OSError(errno.EROFS, "Read-only file system")


class Store(HeldJobStore):
    def __init__(self, state_dir: Path, identity: object, disk: Disk) -> None:
        super().__init__(state_dir, SITE, identity)  # type: ignore[arg-type]
        self.disk = disk

    def save(self, job_id: bytes, record: HeldJob) -> None:
        self.disk.write()
        super().save(job_id, record)

    def save_masked(self, job_id: bytes, chunks: Iterable[bytes], count: int) -> str:
        self.disk.write()
        return super().save_masked(job_id, chunks, count)

    def delete_record(self, job_id: bytes) -> None:
        self.disk.unlink()
        super().delete_record(job_id)

    def delete(self, job_id: bytes) -> None:
        self.disk.unlink()
        super().delete(job_id)


class Capture:
    """The site's transport: what it submits and uploads, kept for the coordinator."""

    def __init__(self) -> None:
        self.submitted: list[tuple[int, bytes]] = []
        self.chunks: list[bytes] = []

    def submit_secagg(self, request: pb.SecAggSubmission) -> pb.Receipt:
        self.submitted.append((request.stage, bytes(request.message)))
        return pb.Receipt()

    def upload_masked(self, messages: Iterable[pb.MaskedUpload]) -> pb.UploadReceipt:
        self.chunks += [bytes(m.chunk) for m in messages if m.chunk]
        return pb.UploadReceipt()

    def last(self, stage: int) -> bytes:
        return [m for s, m in self.submitted if s == stage][-1]

    def count(self, stage: int) -> int:
        return sum(1 for s, _ in self.submitted if s == stage)


class Site:
    """Site ``p1``: its real ``SecureSteps`` on a state directory it keeps across
    restarts."""

    def __init__(
        self, tmp: Path, identity: object, disk: Disk, transport: Capture | None = None
    ) -> None:
        self.tmp, self.identity, self.disk = tmp, identity, disk
        self.transport = transport if transport is not None else Capture()
        self.refused: list[str] = []
        self.lines: list[str] = []
        self.steps = self.start()

    def start(self) -> SecureSteps:
        """A (re)started process: it restores what its held-jobs folder holds."""
        releases = ReleaseLedger(self.tmp / "privacy.db", participant=SITE, rules=LedgerRules())
        steps = SecureSteps(
            participant_id=SITE,
            identity=self.identity,  # type: ignore[arg-type]
            ledger=SqliteJobLedger(self.tmp / "jobs.db"),
            trust=DirectoryTrust(None),
            transport=cast(Transport, self.transport),
            halter=Halter(()),
            releases=releases,
            policy=PolicySettings(share_wait_s=0.0),
            caller=pb.Caller,
            refuse=lambda task, exc: self.refused.append(f"{task[:8]}: {exc}"),
            log=self.lines.append,
            store=Store(self.tmp, self.identity, self.disk),
            federation=lambda: "fed",
        )
        steps.restore_held("fed")
        self.steps = steps
        return steps

    def step(self, job_id: bytes, stage: int, message: bytes) -> None:
        self.steps.step(
            pb.SecAggStep(job_id=job_id, stage=stage, message=message)  # type: ignore[arg-type]
        )


def _signatures(signed: dict[str, bytes]) -> tuple[SurvivorSignature, ...]:
    return tuple(SurvivorSignature(signer=p, signature=s) for p, s in sorted(signed.items()))


class Attack:
    """A job of five at ``t = 3`` whose coordinator asks ``p1`` for two survivor sets,
    ``p0`` surviving the first and dropped in the second, around ``p1``'s restart."""

    def __init__(
        self, tmp: Path, *, release: bool = False, transport: Capture | None = None
    ) -> None:
        self.release = release
        """Reserve the job's input as a release in the site's ledger (consumed when it
        leaves), as the runner does for every task."""
        identities = {p: crypto.generate_identity() for p in IDS}
        directory = {p: crypto.identity_public_bytes(k) for p, k in identities.items()}
        self.spec = spec = crypto.JobSpec.create(IDS, threshold=3, length=LENGTH, bound=10.0)
        self.job = pb.SecAggJob(
            spec=spec.to_bytes(),
            directory=[
                pb.DirectoryEntry(participant_id=p, identity_public_key=public_key_bytes(k))
                for p, k in identities.items()
            ],
            purpose="ffc",
        )
        self.server = crypto.SecAggServer(spec, directory)
        self.others = {
            p: crypto.SecAggParticipant(spec, p, identities[p], directory) for p in IDS if p != SITE
        }
        self.inputs = {p: np.linspace(-1.0, 1.0, LENGTH) * (k + 1) for k, p in enumerate(IDS)}
        self.disk = Disk()
        self.site = Site(tmp, identities[SITE], self.disk, transport)
        self.answers: list[UnmaskResponse] = []
        self.adverts: dict[str, crypto.AdvertiseKeys] = {}
        self.y0 = np.zeros(0, dtype=np.uint64)
        self._signed: dict[str, bytes] = {}

    def until_masked(self) -> None:
        """An honest job up to the masked stage (every input uploaded)."""
        site, server, spec = self.site, self.server, self.spec
        capture = site.transport
        key = spec.job_id.hex() if self.release else None
        if key is not None:
            moments = Release(kind="ffc", federation="fed", model=b"m" * 32, data=b"d" * 32)
            site.steps.releases.reserve(moments, job=key)
        session = site.steps.start(
            "task", self.job, round_index=None, expected_length=LENGTH, release=key
        )
        assert session is not None
        self.adverts = {p: c.advertise_keys() for p, c in self.others.items()}
        self.adverts[SITE] = crypto.AdvertiseKeys.from_bytes(capture.last(pb.ADVERTISE))
        for p, a in self.adverts.items():
            server.receive(a, sender=p)
        server.close_stage()
        site.step(spec.job_id, pb.SHARE, server.roster_for(SITE).to_bytes())
        server.receive_bytes(capture.last(pb.SHARE), sender=SITE)
        for p, c in self.others.items():
            server.receive(c.share_keys(server.roster_for(p)), sender=p)
        server.close_stage()
        assert site.steps.set_input("task", session, self.inputs[SITE])
        site.step(spec.job_id, pb.MASKED, server.bundle_for(SITE).to_bytes())
        assert capture.chunks, "the site's masked input left"
        for p, c in self.others.items():
            c.receive_shares(server.bundle_for(p))
            c.set_input(self.inputs[p])
            chunks = list(c.masked_chunks())
            if p == TARGET:
                self.y0 = np.concatenate(
                    [np.frombuffer(ch.payload, dtype=np.uint64) for ch in chunks]
                )

    def consistency(self, survivors: tuple[str, ...]) -> None:
        """Everyone in ``survivors`` is asked to sign it (``p1``, the site, too)."""
        capture, spec = self.site.transport, self.spec
        request = ConsistencyRequest(job_id=spec.job_id, survivors=survivors)
        self._signed = {
            p: self.others[p].consistency_signature(request).signature
            for p in survivors
            if p != SITE
        }
        before = capture.count(pb.CONSISTENCY)
        self.site.step(spec.job_id, pb.CONSISTENCY, request.to_bytes())
        if capture.count(pb.CONSISTENCY) > before:
            mine = decode_message(capture.last(pb.CONSISTENCY))
            assert isinstance(mine, ConsistencySignature)
            self._signed[SITE] = mine.signature

    def unmask(self, survivors: tuple[str, ...], dropouts: tuple[str, ...]) -> None:
        """Everyone in ``survivors`` is asked to unmask; each answer is kept."""
        capture, spec = self.site.transport, self.spec
        for p in survivors:
            request = UnmaskRequest(
                job_id=spec.job_id,
                recipient=p,
                survivors=survivors,
                dropouts=dropouts,
                signatures=_signatures(self._signed),
            )
            if p == SITE:
                before = capture.count(pb.UNMASK)
                self.site.step(spec.job_id, pb.UNMASK, request.to_bytes())
                if capture.count(pb.UNMASK) > before:
                    self.answers.append(UnmaskResponse.from_bytes(capture.last(pb.UNMASK)))
            elif len(self._signed) >= self.spec.threshold:
                self.answers.append(self.others[p].unmask(request))

    def recovered(self) -> npt.NDArray[np.float64] | None:
        """``p0``'s input, if both kinds of its shares came back ``t`` times."""
        shares = collect(self.answers)
        seeds = shares.get((TARGET, ShareKind.SEED), [])
        keys = shares.get((TARGET, ShareKind.MASK_KEY), [])
        if len(seeds) < self.spec.threshold or len(keys) < self.spec.threshold:
            return None
        publics = {p: a.masking_public for p, a in self.adverts.items()}
        return rebuild(self.spec, TARGET, self.y0, seeds, keys, publics)

    def site_kinds_of_target(self) -> set[ShareKind]:
        """The kinds of ``p0``'s shares the site revealed, over all its answers."""
        return {
            s.kind
            for stage, message in self.site.transport.submitted
            if stage == pb.UNMASK
            for s in UnmaskResponse.from_bytes(message).shares
            if s.owner == TARGET
        }


def test_a_read_only_disk_and_a_restart_never_make_the_site_sign_or_answer_twice(
    tmp_path: Path,
) -> None:
    """The filesystem goes read-only after the masked stage; the site is asked the
    first set, restarts on the same (again writable) disk and is asked the second."""
    attack = Attack(tmp_path)
    attack.until_masked()
    attack.disk.read_only = True
    attack.consistency(FIRST)
    attack.unmask(FIRST, ())
    attack.disk.read_only = False
    attack.site.start()
    attack.consistency(SECOND)
    attack.unmask(SECOND, (TARGET,))
    recovered = attack.recovered()
    assert recovered is None, "the coordinator rebuilt p0's input from p1's two answers"
    capture = attack.site.transport
    assert capture.count(pb.CONSISTENCY) == 1 and capture.count(pb.UNMASK) == 1
    assert len(attack.site_kinds_of_target()) == 1
    assert any("withdraws rather than send" in line for line in attack.site.lines)
    assert attack.site.refused, "the site withdraws rather than send what it cannot record"


def test_a_full_disk_deletes_the_record_so_a_restart_answers_nothing(tmp_path: Path) -> None:
    """A write fails, the deletion works: the signature goes, the record is deleted,
    and the site restarted before the unmask stage holds nothing of the job — it is
    lost to the site (durability only) and signs no second survivor set."""
    attack = Attack(tmp_path)
    attack.until_masked()
    attack.disk.full = True
    attack.consistency(FIRST)
    assert attack.site.transport.count(pb.CONSISTENCY) == 1  # the message went
    attack.disk.full = False
    attack.site.start()
    attack.consistency(SECOND)
    attack.unmask(SECOND, (TARGET,))
    capture = attack.site.transport
    assert capture.count(pb.CONSISTENCY) == 1, "the restarted site signed a second set"
    assert capture.count(pb.UNMASK) == 0
    assert any("holds no state" in r for r in attack.site.refused), attack.site.refused
    assert any("its record is deleted" in line for line in attack.site.lines)


# ---------------------------------------------------------------- a withheld input on it
def _masked_step_on_a_read_only_disk(
    tmp: Path, scale: float
) -> tuple[list[tuple[str, int, str]], list[bytes], list[bool]]:
    """Site ``p1``'s job up to its share answer, then the folder goes read-only, its
    input (``scale`` times its own: 100 leaves the job's bound, so it is withheld) is
    set, and the masked step comes. What the coordinator sees: the withdrawals (the
    task id they name, their kind and wire text), the masked chunks, and whether the
    release was charged."""
    attack = Attack(tmp, release=True)
    site, server, spec = attack.site, attack.server, attack.spec
    refusals: list[tuple[str, BaseException]] = []
    site.steps.refuse = lambda task, exc: refusals.append((task, exc))
    key = spec.job_id.hex()
    moments = Release(kind="ffc", federation="fed", model=b"m" * 32, data=b"d" * 32)
    site.steps.releases.reserve(moments, job=key)
    session = site.steps.start(
        "task", attack.job, round_index=None, expected_length=LENGTH, release=key
    )
    assert session is not None
    adverts = {p: c.advertise_keys() for p, c in attack.others.items()}
    adverts[SITE] = crypto.AdvertiseKeys.from_bytes(site.transport.last(pb.ADVERTISE))
    for p, a in adverts.items():
        server.receive(a, sender=p)
    server.close_stage()
    site.step(spec.job_id, pb.SHARE, server.roster_for(SITE).to_bytes())
    server.receive_bytes(site.transport.last(pb.SHARE), sender=SITE)
    for p, c in attack.others.items():
        server.receive(c.share_keys(server.roster_for(p)), sender=p)
    server.close_stage()
    attack.disk.read_only = True
    site.steps.set_input("task", session, attack.inputs[SITE] * scale)
    site.step(spec.job_id, pb.MASKED, server.bundle_for(SITE).to_bytes())
    seen = [
        ("job" if task == key else task, int(failure_kind(exc)), wire_reason(exc))
        for task, exc in refusals
    ]
    charged = [job == key for job, _, _ in site.steps.releases.released()]
    return seen, list(site.transport.chunks), charged


def test_a_read_only_disk_answers_a_withheld_masked_step_as_a_set_ones(tmp_path: Path) -> None:
    """The folder goes read-only between the share answer and the masked step. A set
    input's masked step cannot store its masked input: refused under the job's id,
    uncharged. A withheld one's wrote nothing, charged the release and withdrew with
    the withheld kind and sentence under the task's id — the coordinator told the two
    apart at the masked step, and could ask the set one's purpose again for free
    (before 2026-11-27; this test then fails). Now the withheld job's masked step
    writes its held record where the set one stores its input, and meets the same
    refusal."""
    set_one = _masked_step_on_a_read_only_disk(tmp_path / "set", 1.0)
    withheld = _masked_step_on_a_read_only_disk(tmp_path / "withheld", 100.0)
    assert set_one[1] == [] and withheld[1] == []  # no masked input left either way
    assert len(set_one[0]) == 1
    assert withheld == set_one, (set_one, withheld)
