"""A coordinator colluding with members of a job splits the honest share holders.

Bonawitz et al. 2017 (active security, Theorem 6.5): with the signed survivor-set
round, a coordinator shows one group of holders a survivor set in which the target
``X`` survived (they reveal the seed shares of ``b_X``) and another group one in which
``X`` dropped (they reveal the mask-key shares of ``s_X``). Each honest holder signs
one set and answers once, so each group needs ``t`` signatures on its set among
``X``'s holders — and ``c`` colluding members sign both and hand over both share kinds.
With ``h`` holders, ``c`` of them colluding, the two groups exist exactly when
``2(t − c) ≤ h − c``, i.e. ``2t ≤ h + c``: the default majority ``2t > h`` protects
against the coordinator alone, and at ``n = 5, t = 3`` one colluding member is enough
to read an honest site's exact input.

A site states how many members of a job it assumes collude with the coordinator
(``[privacy] colluders``, the assumption its DP noise already plans with) and refuses
a job whose threshold does not cover them (``2t > h + c``, ``RULE_THRESHOLD_TOO_LOW``,
at spec time: before any key leaves). Played here at the crypto layer (real
``SecAggParticipant``\\ s) and against a real :class:`ParticipantRunner` whose
coordinator runs the attack (:class:`SplitViewRing`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

import spherecal.crypto.policy as policy_module
from spherecal import crypto
from spherecal.coordinator.driver.model import GlobalModel
from spherecal.crypto import (
    ConsistencyRequest,
    JobSpec,
    SecAggPolicy,
    ShareKind,
    UnmaskRequest,
    shamir,
)
from spherecal.crypto.keys import agree, sign, survivors_payload
from spherecal.crypto.messages import (
    ConsistencySignature,
    MaskedChunk,
    SurvivorSignature,
    UnmaskResponse,
    decode_message,
)
from spherecal.participant.data import LocalData
from spherecal.proto import spherecal_pb2 as pb
from spherecal.spherefed.privacy.settings import PrivacySettings
from spherecal.spherefed.stats import ffc_layout_size
from tests.security.hostile_ring import (
    IDENTITIES,
    PEERS,
    TARGET,
    HostileRing,
    RingJob,
    make_job,
    run_target,
    target_settings,
)
from tests.security.test_malicious_coordinator import Job, collect, strip

COLLUDER = "p4"


# ====================================================================== the attack
def split(ids: list[str], colluders: list[str], x: str) -> tuple[list[str], list[str]]:
    """The honest members in two halves, the target ``x`` in the first."""
    honest = [p for p in ids if p not in colluders]
    honest.remove(x)
    first = len(honest) // 2
    return [x, *honest[:first]], honest[first:]


def _signatures(
    spec: JobSpec,
    survivors: tuple[str, ...],
    honest: dict[str, bytes],
    colluders: Iterable[str],
    identities: Mapping[str, Ed25519PrivateKey] = IDENTITIES,
) -> tuple[SurvivorSignature, ...]:
    """The honest members' signatures over ``survivors`` and the colluders' (who sign
    whatever the coordinator asks)."""
    payload = survivors_payload(spec_digest=spec.digest, job_id=spec.job_id, survivors=survivors)
    entries = dict(honest)
    for c in colluders:
        entries[c] = sign(identities[c], payload)
    return tuple(SurvivorSignature(signer=p, signature=s) for p, s in sorted(entries.items()))


def rebuild(
    spec: JobSpec,
    x: str,
    y: npt.NDArray[np.uint64],
    seed_shares: list[tuple[int, bytes]],
    key_shares: list[tuple[int, bytes]],
    masking_public: dict[str, bytes],
) -> npt.NDArray[np.float64]:
    """``x``'s input from its masked vector and both kinds of its shares."""
    seed = shamir.combine(seed_shares, spec.threshold)
    key = X25519PrivateKey.from_private_bytes(shamir.combine(key_shares, spec.threshold))
    pairs = {v: agree(key, public) for v, public in masking_public.items() if v != x}
    return strip(spec, y, x, seed, pairs)


def crypto_attack(n: int, t: int, colluders: int, policy: SecAggPolicy) -> bool:
    """Play the split views on ``n`` real participants at threshold ``t`` with the
    last ``colluders`` of them colluding: True when the target's exact input comes
    out. Raises the refusal a participant gives."""
    ids = [f"p{i:02d}" for i in range(n)]
    spec = JobSpec.create(ids, threshold=t, length=6, bound=1.0, consistency_check=True)
    job = Job(spec, policy)  # every participant checks the spec against its policy here
    x, bad = ids[0], ids[n - colluders :]
    job.honest_until_masked()
    for p in ids:
        job.clients[p].receive_shares(job.server.bundle_for(p))
    y = job.masked_input(x)
    first, second = split(ids, bad, x)
    views = {"a": tuple(sorted([*first, *bad])), "b": tuple(sorted([*second, *bad]))}
    members = {"a": first, "b": second}
    responses = []
    for view, survivors in views.items():
        request = ConsistencyRequest(job_id=spec.job_id, survivors=survivors)
        honest = {p: job.clients[p].consistency_signature(request).signature for p in members[view]}
        signatures = _signatures(spec, survivors, honest, bad, job.identities)
        for h in members[view]:
            dropouts = () if view == "a" else (x,)
            responses.append(
                job.clients[h].unmask(
                    UnmaskRequest(
                        job_id=spec.job_id,
                        recipient=h,
                        survivors=survivors,
                        dropouts=dropouts,
                        signatures=signatures,
                    )
                )
            )
    shares = collect(responses)
    for c in bad:  # a colluding member hands over both kinds of what it holds
        position, plaintext = job.clients[c]._held[x]
        for kind in (ShareKind.SEED, ShareKind.MASK_KEY):
            shares.setdefault((x, kind), []).append((position, plaintext.share(kind)[0]))
    seed_shares = shares.get((x, ShareKind.SEED), [])
    key_shares = shares.get((x, ShareKind.MASK_KEY), [])
    if len(seed_shares) < t or len(key_shares) < t:
        return False
    publics = {p: a.masking_public for p, a in job.adverts.items()}
    got = rebuild(spec, x, y, seed_shares, key_shares, publics)
    return bool(np.all(np.abs(got - job.inputs[x]) <= 4 * 2.0**-spec.scale_bits))


# ---------------------------------------------------------------- crypto layer
SPLITTABLE = [(5, 3, 1), (7, 4, 1), (8, 5, 2), (9, 5, 1), (10, 6, 2)]
"""(n, t, c) with the default majority ``2t > n`` but ``2t ≤ n + c``."""


@pytest.mark.parametrize(("n", "t", "c"), SPLITTABLE)
def test_colluders_split_a_majority_threshold(n: int, t: int, c: int) -> None:
    """The bound is real: a site that assumes no colluder (the default) is read by
    the coordinator and ``c`` members whenever ``2t ≤ n + c``."""
    assert 2 * t > n and 2 * t <= n + c
    assert crypto_attack(n, t, c, SecAggPolicy())


@pytest.mark.parametrize(("n", "t", "c"), SPLITTABLE)
def test_a_site_assuming_colluders_refuses_the_job(n: int, t: int, c: int) -> None:
    with pytest.raises(crypto.ThresholdTooLow, match=rf"2t > {n} \+ {c}"):
        crypto_attack(n, t, c, SecAggPolicy(colluders=c))


@pytest.mark.parametrize(("n", "c"), [(5, 1), (7, 1), (8, 2), (10, 2), (6, 0)])
def test_the_threshold_that_covers_the_colluders_is_accepted(n: int, c: int) -> None:
    """The smallest threshold with ``2t > n + c`` is accepted by a site assuming ``c``
    colluders, and the split then finds too few members for one of its two views:
    the honest members refuse to sign it."""
    t = (n + c) // 2 + 1
    spec = JobSpec.create([f"p{i:02d}" for i in range(n)], threshold=t, length=6, bound=1.0)
    policy_module.check_spec(SecAggPolicy(colluders=c), spec)
    with pytest.raises(crypto.TooFewSurvivors):
        crypto_attack(n, t, c, SecAggPolicy(colluders=c))


def test_colluders_must_be_a_count() -> None:
    for bad in (-1, True, 1.5):
        with pytest.raises(crypto.InvalidSpec, match="colluders"):
            SecAggPolicy(colluders=bad)  # type: ignore[arg-type]
    assert SecAggPolicy.from_mapping({"colluders": 2}).colluders == 2


# ====================================================================== the service
class SplitViewRing(HostileRing):
    """A coordinator colluding with ``p4`` that, after the masked stage, shows the
    target ``p0`` and ``p1`` the survivor set ``{p0, p1, p4}`` and ``p2``, ``p3`` the
    set ``{p2, p3, p4}``; ``p4`` signs both. It then asks ``p0`` and ``p1`` for seed
    shares (``p0`` survived) and ``p2``, ``p3`` for mask-key shares (``p0`` dropped),
    takes both kinds from ``p4`` and strips the target's masked upload:
    :attr:`recovered` is the target's input."""

    def __init__(self, *, federation: str, model: GlobalModel) -> None:
        super().__init__(federation=federation, model=model)
        self.recovered: npt.NDArray[np.float64] | None = None
        self._masked: dict[int, bytes] = {}
        self._views = {
            "a": ((TARGET, "p1"), (TARGET, "p1", COLLUDER)),
            "b": (("p2", "p3"), ("p2", "p3", COLLUDER)),
        }
        self._signed: dict[str, tuple[SurvivorSignature, ...]] = {}
        self._responses: list[UnmaskResponse] = []

    def upload_masked(self, messages: Iterable[pb.MaskedUpload]) -> pb.UploadReceipt:
        def kept() -> Iterable[pb.MaskedUpload]:
            for message in messages:
                if message.chunk:
                    chunk = decode_message(bytes(message.chunk))
                    assert isinstance(chunk, MaskedChunk)
                    self._masked[chunk.index] = bytes(chunk.payload)
                yield message

        return super().upload_masked(kept())

    def _advance(self, job: RingJob) -> None:
        server = job.server
        assert server is not None
        if server.stage is not crypto.Stage.MASKED:
            super()._advance(job)
            return
        server.close_stage()  # the masked stage: every upload is in; now the split
        spec = job.spec
        for view, (members, survivors) in self._views.items():
            request = ConsistencyRequest(job_id=spec.job_id, survivors=survivors)
            honest = {
                p: job.clients[p].consistency_signature(request).signature
                for p in members
                if p != TARGET
            }
            self._signed[view] = _signatures(spec, survivors, honest, [COLLUDER])
        for p in self._views["b"][0]:  # p0 dropped, they are told
            self._responses.append(self._unmask(job, p, "b"))
        request = ConsistencyRequest(job_id=spec.job_id, survivors=self._views["a"][1])
        self._step(job, pb.CONSISTENCY, request.to_bytes())

    def _unmask(self, job: RingJob, recipient: str, view: str) -> UnmaskResponse:
        """An honest member's answer to the view it signed."""
        return job.clients[recipient].unmask(self._unmask_request(job, recipient, view))

    def _unmask_request(self, job: RingJob, recipient: str, view: str) -> UnmaskRequest:
        return UnmaskRequest(
            job_id=job.spec.job_id,
            recipient=recipient,
            survivors=self._views[view][1],
            dropouts=() if view == "a" else (TARGET,),
            signatures=self._signed[view],
        )

    def submit_secagg(self, request: pb.SecAggSubmission) -> pb.Receipt:
        job = self.jobs[bytes(request.job_id)]
        if request.stage not in (pb.CONSISTENCY, pb.UNMASK):
            return super().submit_secagg(request)
        self.target_stages.append(pb.SecAggStage.Name(request.stage))
        message = decode_message(bytes(request.message))
        if isinstance(message, ConsistencySignature):
            signed = dict((s.signer, s.signature) for s in self._signed["a"])
            signed[TARGET] = message.signature
            self._signed["a"] = tuple(
                SurvivorSignature(signer=p, signature=s) for p, s in sorted(signed.items())
            )
            for p in self._views["a"][0]:  # p0 survived, they are told
                if p != TARGET:
                    self._responses.append(self._unmask(job, p, "a"))
            unmask = self._unmask_request(job, TARGET, "a")
            self._step(job, pb.UNMASK, unmask.to_bytes())
            return pb.Receipt()
        assert isinstance(message, UnmaskResponse)
        self._responses.append(message)
        self._rebuild(job)
        return pb.Receipt()

    def _rebuild(self, job: RingJob) -> None:
        spec = job.spec
        shares = collect(self._responses)
        position, plaintext = job.clients[COLLUDER]._held[TARGET]
        for kind in (ShareKind.SEED, ShareKind.MASK_KEY):
            shares.setdefault((TARGET, kind), []).append((position, plaintext.share(kind)[0]))
        y = np.concatenate(
            [np.frombuffer(self._masked[i], dtype=np.uint64) for i in sorted(self._masked)]
        )
        # every member's advertised masking key, as the colluder received them
        publics = {p: a.masking_public for p, a in job.clients[COLLUDER]._adverts.items()}
        self.recovered = rebuild(
            spec,
            TARGET,
            y,
            shares[(TARGET, ShareKind.SEED)],
            shares[(TARGET, ShareKind.MASK_KEY)],
            publics,
        )


def _ffc_task(ring: HostileRing, task_id: str, job: RingJob, model: GlobalModel) -> pb.Instruction:
    ref = ring.publish(f"model-{task_id}", model.initial_vector)
    return pb.Instruction(
        task_id=task_id,
        statistics=pb.StatisticsTask(kind=pb.FFC, model=ref, secure=ring.secure(job, "ffc")),
    )


def _ffc_job(model: GlobalModel, threshold: int = 3) -> RingJob:
    """An FFC job over p0…p4 (complete graph), at the default majority ``t = 3``."""
    length = ffc_layout_size(model.feature_dim, model.num_classes)
    return make_job(PEERS, length, threshold=threshold)


def _play(tmp: Path, model: GlobalModel, data: LocalData, *, colluders: int) -> SplitViewRing:
    ring = SplitViewRing(federation="fed", model=model)
    ring.script = [_ffc_task(ring, "ffc", _ffc_job(model), model)]
    settings = dataclasses.replace(
        target_settings(tmp), privacy=PrivacySettings(colluders=colluders)
    )
    run_target(settings, ring, data)
    return ring


def _honest_release(tmp: Path, model: GlobalModel, data: LocalData) -> npt.NDArray[np.float64]:
    """The target's FFC statistics, from an honest job over the same roster (the
    others' inputs known): what the attack should not be able to read."""
    ring = HostileRing(federation="fed", model=model)
    job = _ffc_job(model)
    ring.script = [_ffc_task(ring, "ffc", job, model)]
    run_target(target_settings(tmp), ring, data)
    return job.target_release()


def test_one_colluder_reads_a_site_that_assumes_none(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """The residual, stated: at the default (no colluder assumed) the coordinator and
    one member of a 5-member job at ``t = 3`` read the site's exact statistics."""
    truth = _honest_release(tmp_path / "honest", model, data)
    ring = _play(tmp_path / "target", model, data, colluders=0)
    assert ring.failures == []
    assert ring.recovered is not None
    np.testing.assert_allclose(ring.recovered, truth, atol=1e-6)


def test_a_site_assuming_one_colluder_refuses_before_its_keys_leave(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    ring = _play(tmp_path, model, data, colluders=1)
    assert ring.recovered is None, "the coordinator and p4 read the site's statistics"
    assert ring.refusal("ffc") == ("POLICY_REFUSAL", "RULE_THRESHOLD_TOO_LOW")
    assert ring.target_stages == []  # not even its advertisement: a spec-time refusal
    (report,) = ring.failures
    assert "2t > 5 + 1" in report.reason


def test_a_site_assuming_one_colluder_takes_part_at_a_threshold_covering_it(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """At ``t = 4`` of 5 (``8 > 5 + 1``) the site takes part; the honest job ends."""
    ring = HostileRing(federation="fed", model=model)
    job = _ffc_job(model, threshold=4)
    ring.script = [_ffc_task(ring, "ffc", job, model)]
    settings = dataclasses.replace(target_settings(tmp_path), privacy=PrivacySettings(colluders=1))
    run_target(settings, ring, data)
    assert ring.failures == [] and job.result is not None
