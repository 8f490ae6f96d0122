"""A training round's sum short of ``[training] min_participants`` is kept, and a retry
of the others is added to it (``coordinator/driver/training_rounds.py``).

Driven through the service core with scripted sites that behave as real ones do about
releases: a site whose update left for the round refuses a second
(``RULE_RELEASE_REPEATED``). Plaintext uploads, so each site's vector — and with it
the round's sum — is chosen here and the result checked against its own computation.
Each part kept or added is held to its own weight bound (issue #22): a part over it
must not pass inside the larger union's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from spherecal.coordinator.errors import ServiceError
from spherecal.coordinator.settings import CoordinatorSettings
from spherecal.coordinator.state.registry import Peer
from spherecal.participant.failures import failure_kind, policy_rule, wire_reason
from spherecal.participant.policy import EvaluationsExhausted, ReleaseRepeated
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import header_for, iter_chunks

from .service_harness import Harness, settings_for

FIRST = ("p0", "p1", "p2")
LATER = ("p3", "p4")
MAX_EXAMPLES = 100


def _settings(tmp: Path) -> CoordinatorSettings:
    base = settings_for(tmp, secure=False, n=5, rounds=1)
    return replace(
        base,
        max_examples_per_site=MAX_EXAMPLES,
        training=replace(base.training, min_participants=5),
        timeouts=replace(base.timeouts, retry_backoff_s=0.0, rejoin_grace_s=5.0),
    )


class Sites:
    """p0–p2 upload their update to the first training task and refuse any later one
    (their update left); p3 and p4 fail the first (a dropout) and upload to the next.
    Statistics and evaluations are refused, so the federation ends after the round."""

    def __init__(self, harness: Harness, weights: dict[str, float]) -> None:
        self.harness = harness
        self.weights = weights
        self.sent: dict[str, np.ndarray] = {}
        self.trained: dict[str, int] = {}
        self.stop = threading.Event()
        ids = harness.settings.participants
        self.threads = [threading.Thread(target=self._site, args=(p,), daemon=True) for p in ids]
        for pid in ids:
            harness.join(pid)
        for thread in self.threads:
            thread.start()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=10)

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

    def _refuse(self, pid: str, task_id: str, error: BaseException) -> None:
        self.harness.service.report_failure(
            pb.FailureReport(
                caller=self.harness.caller(pid),
                task_id=task_id,
                reason=wire_reason(error),
                kind=failure_kind(error),
                rule=policy_rule(error),
            ),
            Peer(),
        )

    def _upload(self, pid: str, task_id: str, vector: np.ndarray) -> None:
        def messages() -> Iterator[pb.TensorUpload]:
            yield pb.TensorUpload(
                header=pb.UploadHeader(
                    caller=self.harness.caller(pid),
                    task_id=task_id,
                    tensor=header_for(vector),
                    update=pb.UpdateMeta(num_samples=1, mean_loss=0.5, num_steps=1),
                )
            )
            for data in iter_chunks(vector, 1 << 16):
                yield pb.TensorUpload(data=data)

        self.harness.service.upload_tensor(messages(), Peer())

    def _site(self, pid: str) -> None:
        service = self.harness.service
        while not self.stop.is_set():
            try:
                instruction = service.next_instruction(
                    pb.InstructionRequest(caller=self.harness.caller(pid), wait_ms=200), Peer()
                )
            except ServiceError:
                continue
            kind = instruction.WhichOneof("kind")
            if kind == "done":
                return
            task = instruction.task_id
            if kind == "statistics":
                self._refuse(pid, task, ReleaseRepeated("the per-class moments already left"))
            elif kind == "evaluate":
                self._refuse(pid, task, EvaluationsExhausted("no more evaluations"))
            elif kind == "train":
                asked = self.trained[pid] = self.trained.get(pid, 0) + 1
                if pid in FIRST and asked > 1:
                    self._refuse(pid, task, ReleaseRepeated("the update of round 1 left"))
                elif pid in LATER and asked == 1:
                    self._refuse(pid, task, RuntimeError("the site's local computation failed"))
                else:
                    length = int(instruction.train.model.header.shape[0])
                    self.sent[pid] = self._vector(pid, length)
                    self._upload(pid, task, self.sent[pid])


def _run(tmp: Path, weights: dict[str, float]) -> tuple[Harness, Sites, np.ndarray]:
    harness = Harness(_settings(tmp)).start()
    before = np.array(harness.federation.progress.global_vector)
    sites = Sites(harness, weights)
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
        assert metrics["weight"] == 50.0
        # no site was asked for a second update: p0–p2 trained once
        assert [sites.trained[p] for p in FIRST] == [1, 1, 1]
        # the model moved by the server step on the sum of all five, computed here
        strategy = harness.federation.strategy
        layout = strategy.layout(before.shape[0])
        sums = layout.unflatten(np.sum([sites.sent[p] for p in FIRST + LATER], axis=0))
        sums.pop("loss")
        fresh = type(strategy)(harness.settings.training, num_participants=5)
        expected = fresh.step(before, sums, num_selected=5)
        np.testing.assert_allclose(
            harness.federation.progress.global_vector, expected, rtol=0, atol=1e-12
        )
    finally:
        sites.close()
        harness.close()


def test_a_short_part_over_its_own_weight_bound_is_not_kept(tmp_path: Path) -> None:
    """p0 claims 330 examples: p0–p2's sum (350) is over 3 × 100 and refused on its
    own, though with p3 and p4 (370 against 5 × 100) the union would pass. Kept
    silently and added, the claim would have moved the model; refused, the round is
    lost (p0–p2's updates left, p3 and p4 cannot make the minimum)."""
    weights = dict.fromkeys(FIRST + LATER, 10.0)
    weights["p0"] = 330.0
    harness, sites, before = _run(tmp_path, weights)
    try:
        (metrics,) = harness.federation.progress.round_metrics
        assert metrics.get("status") == "lost"
        np.testing.assert_array_equal(harness.federation.progress.global_vector, before)
        checks = harness.federation.progress.results["integrity"]["checks"]
        failed = [c["detail"] for c in checks if not c["passed"]]
        assert any("350 exceeds 3 contributors" in d for d in failed), failed
    finally:
        sites.close()
        harness.close()
