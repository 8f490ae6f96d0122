"""A training round's sum short of ``[training] min_participants`` is kept, and a retry
of the others is added to it (``coordinator/driver/training_rounds.py``).

Driven through the service core by scripted sites that run the real protocol
(``crypto.SecAggParticipant``) on vectors chosen here — so the round's sum is checked
against its own computation — and behave as real sites do about releases: a site
whose update left for the round refuses a second (``RULE_RELEASE_REPEATED``). Each
part kept or added is held to its own weight bound (issue #22): a part over it must
not pass inside the larger union's. (Plaintext rounds keep nothing: a retry asks the
same task again, and a site whose upload left sends the same bytes.)
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from spherecal import crypto
from spherecal.coordinator.settings import CoordinatorSettings
from spherecal.coordinator.state.registry import Peer
from spherecal.participant.policy import EvaluationsExhausted, ReleaseRepeated
from spherecal.proto import spherecal_pb2 as pb

from .service_harness import Harness, ScriptedSites, settings_for

FIRST = ("p0", "p1", "p2", "p3")
LATER = ("p4", "p5", "p6")
"""Seven sites: the first job's threshold (4 of 7) lets the four make it; the three
others make a job of their own (the secure minimum is 3)."""
MAX_EXAMPLES = 100


def _settings(tmp: Path) -> CoordinatorSettings:
    base = settings_for(tmp, secure=True, n=7, rounds=1)
    return replace(
        base,
        max_examples_per_site=MAX_EXAMPLES,
        # the update bound is max_examples × this: room for a weight above 100
        training=replace(base.training, min_participants=7, max_update_change=5.0),
        timeouts=replace(base.timeouts, retry_backoff_s=0.0, rejoin_grace_s=5.0),
    )


class Sites(ScriptedSites):
    """p0–p3 send their update in the first training job and refuse any later one
    (their update left); p4–p6 fail the first (a dropout before advertising) and take
    part in the next. Statistics and evaluations are refused, so the federation ends
    after the round."""

    def __init__(self, harness: Harness, weights: dict[str, float]) -> None:
        super().__init__(harness)
        self.weights = weights
        self.sent: dict[str, np.ndarray] = {}
        self.trained: dict[str, int] = {}
        self.clients: dict[tuple[str, bytes], crypto.SecAggParticipant] = {}

    def _vector(self, pid: str, model_length: int) -> np.ndarray:
        layout = self.harness.federation.strategy.layout(model_length)
        rng = np.random.default_rng(int(pid[1:]))
        weight = self.weights[pid]
        sizes = dict(layout.entries)
        payload: dict[str, np.ndarray | float] = {
            name: rng.normal(scale=1e-3, size=size) * weight for name, size in sizes.items()
        }
        payload["weight"] = weight
        payload["loss"] = 0.5
        return layout.flatten(payload)

    def _submit(self, pid: str, job: bytes, stage: pb.SecAggStage, message: bytes) -> None:
        self.harness.service.submit_secagg(
            pb.SecAggSubmission(
                caller=self.harness.caller(pid), job_id=job, stage=stage, message=message
            ),
            Peer(),
        )

    def _train(self, pid: str, instruction: pb.Instruction) -> None:
        secure = instruction.train.secure
        spec = crypto.JobSpec.from_bytes(secure.spec)
        directory = {e.participant_id: e.identity_public_key for e in secure.directory}
        client = crypto.SecAggParticipant(spec, pid, self.harness.keys[pid], directory)
        self.sent[pid] = self._vector(pid, int(instruction.train.model.header.shape[0]))
        client.set_input(self.sent[pid])
        self.clients[(pid, spec.job_id)] = client
        self._submit(pid, spec.job_id, pb.ADVERTISE, client.advertise_keys().to_bytes())

    def _step(self, pid: str, step: pb.SecAggStep) -> None:
        client = self.clients[(pid, bytes(step.job_id))]
        data = bytes(step.message)
        job = bytes(step.job_id)
        if step.stage == pb.SHARE:
            shares = client.share_keys(crypto.KeyRoster.from_bytes(data))
            self._submit(pid, job, pb.SHARE, shares.to_bytes())
        elif step.stage == pb.MASKED:
            client.receive_shares(crypto.ShareBundle.from_bytes(data))
            chunks = [chunk.to_bytes() for chunk in client.masked_chunks()]
            first = pb.MaskedUpload(caller=self.harness.caller(pid), job_id=job, chunk=chunks[0])
            rest = [pb.MaskedUpload(chunk=chunk) for chunk in chunks[1:]]
            self.harness.service.upload_masked(iter([first, *rest]), Peer())
        elif step.stage == pb.CONSISTENCY:
            request = crypto.ConsistencyRequest.from_bytes(data)
            self._submit(pid, job, pb.CONSISTENCY, client.consistency_signature(request).to_bytes())
        elif step.stage == pb.UNMASK:
            response = client.unmask(crypto.UnmaskRequest.from_bytes(data))
            self._submit(pid, job, pb.UNMASK, response.to_bytes())

    def handle(self, pid: str, instruction: pb.Instruction) -> None:
        kind = instruction.WhichOneof("kind")
        task = instruction.task_id
        if kind == "statistics":
            self.refuse(pid, task, ReleaseRepeated("the per-class moments already left"))
        elif kind == "evaluate":
            self.refuse(pid, task, EvaluationsExhausted("no more evaluations"))
        elif kind == "secagg":
            self._step(pid, instruction.secagg)
        elif kind == "train":
            asked = self.trained[pid] = self.trained.get(pid, 0) + 1
            if pid in FIRST and asked > 1:
                self.refuse(pid, task, ReleaseRepeated("the update of round 1 left"))
            elif pid in LATER and asked == 1:
                self.refuse(pid, task, RuntimeError("the site's local computation failed"))
            else:
                self._train(pid, instruction)


def _run(tmp: Path, weights: dict[str, float]) -> tuple[Harness, Sites, np.ndarray]:
    harness = Harness(_settings(tmp)).start()
    before = np.array(harness.federation.progress.global_vector)
    sites = Sites(harness, weights).start()
    harness.thread.join(timeout=120)
    assert not harness.thread.is_alive(), "the federation did not end"
    return harness, sites, before


def test_a_short_rounds_retry_of_the_others_is_added_to_the_sum_kept(tmp_path: Path) -> None:
    weights = dict.fromkeys(FIRST + LATER, 10.0)
    harness, sites, before = _run(tmp_path, weights)
    try:
        (metrics,) = harness.federation.progress.round_metrics
        assert metrics.get("status") != "lost", harness.federation.progress.status_reasons
        assert metrics["attempt"] == 2
        assert metrics["contributors"] == list(FIRST + LATER)
        assert metrics["parts"] == [list(FIRST), list(LATER)]
        assert metrics["weight"] == 70.0
        # no site was asked for a second update: p0–p3 trained once
        assert [sites.trained[p] for p in FIRST] == [1, 1, 1, 1]
        # the model moved by the server step on the sum of all five, computed here
        strategy = harness.federation.strategy
        layout = strategy.layout(before.shape[0])
        sums = layout.unflatten(np.sum([sites.sent[p] for p in FIRST + LATER], axis=0))
        sums.pop("loss")
        fresh = type(strategy)(harness.settings.training, num_participants=7)
        expected = fresh.step(before, sums, num_selected=7)
        # within the ring's fixed-point step (each entry's rounding, seven sites)
        np.testing.assert_allclose(
            harness.federation.progress.global_vector, expected, rtol=0, atol=1e-6
        )
        updates = [j for j in harness.store.query("SELECT purpose FROM jobs") if j[0] == "update"]
        assert len(updates) == 2
    finally:
        sites.close()
        harness.close()


def test_a_short_part_over_its_own_weight_bound_is_not_kept(tmp_path: Path) -> None:
    """p0 claims 420 examples: p0–p3's sum (450) is over 4 × 100 (and the noise's
    slack) and refused on its own, though with p4–p6 (480 against 7 × 100) the union
    would pass. Kept silently and added, the claim would have moved the model;
    refused, the round is lost (p0–p3's updates left; p4–p6 cannot make the minimum)."""
    weights = dict.fromkeys(FIRST + LATER, 10.0)
    weights["p0"] = 420.0
    harness, sites, before = _run(tmp_path, weights)
    try:
        (metrics,) = harness.federation.progress.round_metrics
        assert metrics.get("status") == "lost"
        np.testing.assert_array_equal(harness.federation.progress.global_vector, before)
        checks = harness.federation.progress.results["integrity"]["checks"]
        failed = [c["detail"] for c in checks if not c["passed"]]
        assert any("450 exceeds 4 contributors" in d for d in failed), failed
    finally:
        sites.close()
        harness.close()
