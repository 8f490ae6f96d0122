"""The participant's statistics task: FFC's or CCVR's sums of the model's features.

Why a module of its own: computing a calibration statistic is its own concern — which
release it is (the ledger's reservation, the DP plan and its charge), the exact or the
DP-quantised statistics, the feature pass overlapped with the key exchange — while
``runner`` only dispatches tasks. As :mod:`spherecal.participant.evaluation_task`, it is
a function of the runner's state.

**The overlapped feature pass** (issue #24). A secure statistics job starts with two
rounds that do not depend on the data: the participant advertises its keys as soon as
the task arrives, then waits for the job's share step and answers it. Done one after the
other with the feature pass, those rounds sat in front of it (on the 2-core box the
feature passes started 0.15–0.3 s later than without secure aggregation, while the
processor idled through the rounds' waits). So the pass runs on a worker thread while
they are exchanged. The two messages still leave when they would and never wait for
the work, but they are computed while it runs, so **the share answer's moment follows
the example count, weakly** (measured with ``bench/timing_channel.py``, 20 + 12
federations: FFC and CCVR share answers r 0.21–0.44, 7–20 ms later per 100 examples;
``docs/threat_model.md``, *Timing*). In the same setting the masked input's moment
follows the local work more strongly (r 0.61–0.75), so the overlap adds a weaker second
reading of what that moment already shows rather than something the setting hid. The
overlap is therefore taken only where that moment is not hidden — ``[policy]
min_local_work_s = 0``, the default (``SecureSteps.overlaps_local_work``); a site that
hides it keeps keys, shares, then the work, strictly in that order, and neither message
follows the count (measured). The worker is always waited for before the task returns
(also when the job is refused or the coordinator moved on: the result is then dropped),
so no later task shares the trainer with a pass still running. While it waits for the
pass, the main thread long-polls for the job's next instruction
(``SecureSteps.await_next_step``): the masked step is then in hand when the input is
set, instead of one more round trip later (the last site's is on the job's critical
path); nothing is computed or sent for it before the input exists.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from spherecal import crypto
from spherecal.crypto.dp import sample_noise
from spherecal.participant.dp_gate import BudgetExceeded, PrivacyRefused
from spherecal.participant.failures import LOCAL_WORK_ERRORS
from spherecal.participant.release_ledger import Release
from spherecal.proto import spherecal_pb2 as pb
from spherecal.spherefed.stats import (
    ccvr_layout_size,
    ffc_layout_size,
    unit_norm_examples_within,
)

if TYPE_CHECKING:
    from spherecal.participant.runner import ParticipantRunner
    from spherecal.participant.trainer import LocalTrainer

__all__ = ["statistics_task"]


def statistics_task(runner: ParticipantRunner, task_id: str, task: pb.StatisticsTask) -> None:
    """FFC or CCVR statistics of the model on the local training split: masked (with
    this site's DP noise when the task carries a DP plan), plaintext only with
    ``allow_plaintext``; the release reserved in the site's ledger first."""
    trainer = runner._trainer()
    kind = {pb.FFC: "ffc", pb.CCVR: "ccvr"}.get(task.kind)
    if kind is None:
        runner._refuse(task_id, ValueError(f"unknown statistics kind {task.kind}"))
        return
    secure = task.HasField("secure")
    try:
        runner.privacy.require_noise(task)
        if not secure and not runner.settings.allow_plaintext:
            raise runner._no_plaintext("statistics")
        vector = runner._download(task.model, (trainer.length,))
        release = runner._reserve(
            task_id,
            Release(
                kind=kind,
                federation=runner._federation(),
                model=trainer.executed_digest(vector),
                data=runner._fingerprint("train"),
                noised=secure and task.HasField("privacy"),
            ),
            task.secure if secure else None,
            task,
        )
    except (PrivacyRefused, crypto.SecAggError) as exc:
        runner._refuse(task_id, exc)
        return
    if not secure and runner._send_again(task_id, kind, release, task):
        return  # the same task again: the bytes that left (participant.sent_plaintext)
    if task.HasField("privacy") and secure:
        _private_statistics(runner, task_id, task, kind, release)
        return
    d, c = trainer.feature_dim, trainer.num_classes
    length = ffc_layout_size(d, c) if kind == "ffc" else ccvr_layout_size(d, c)
    limit = _example_limit(runner, task, kind) if secure else None
    session = None
    if secure and runner.secure.overlaps_local_work:
        # the feature pass runs while the keys and shares are exchanged (module
        # docstring: only where that reveals nothing); leaving the block waits for it
        with ThreadPoolExecutor(1, thread_name_prefix=f"{kind}-statistics") as worker:
            work = worker.submit(_statistics_of, runner, trainer, vector, kind, limit)
            session = runner.secure.start(
                task_id,
                task.secure,
                round_index=None,
                expected_length=length,
                release=release,
                overlapped=True,
                donates_input=True,
            )
            if session is None:
                return  # the result is dropped once computed: nothing of it leaves
            runner.secure.await_next_step(session, work)
            try:
                stats, seconds = work.result()
            except LOCAL_WORK_ERRORS as exc:  # may depend on the data: counted as the release
                runner._local_work_failed(task_id, session, release, exc)
                return
    else:
        if secure:
            session = runner.secure.start(
                task_id,
                task.secure,
                round_index=None,
                expected_length=length,
                release=release,
                donates_input=True,
            )
            if session is None:
                return
        try:
            stats, seconds = _statistics_of(runner, trainer, vector, kind, limit)
        except LOCAL_WORK_ERRORS as exc:
            runner._local_work_failed(task_id, session, release, exc)
            return
    runner.log(f"{kind} statistics: {stats.shape[0]} entries in {seconds:.1f}s")
    if session is not None:
        # the statistics vector is given up: it is encoded in its own memory (no
        # second buffer of its size to fault in; issue #24)
        runner.secure.set_input(task_id, session, stats, donate=True)
    else:
        runner._upload_plain(task_id, stats, None, release=release, kept=(kind, task))


def _example_limit(runner: ParticipantRunner, task: pb.StatisticsTask, kind: str) -> int:
    """The most training examples this site's exact statistics may count in the
    secure job.

    FFC's and CCVR's statistics carry counts (the example count, the class counts),
    and with a unit-norm head (``‖z‖ = 1``) every other entry is at most the example
    count too (``unit_norm_entry_bound``), so the job's bound — which the coordinator
    chooses — caps the count. A site that refused by it would tell the coordinator,
    past secure aggregation, exactly whether it holds more than the count the bound
    allows: one exact bit per bound it asks with, about the exact count where the
    site otherwise releases only a noised training weight. So a larger training split
    contributes a uniformly random subset of the largest size that fits
    (``unit_norm_examples_within``), as a DP release does above its ``max_examples``;
    only this site's log says so.

    With any other head the counts are fitted the same way — until 2026-11-27 they
    were not, and a coordinator that chose a ``learnable`` head and shrank the
    features read the count as the largest entry — while a feature entry outside the
    bound (nothing bounds ``‖z‖``) stays a refusal that depends on the data, answered
    at the masked step and counted as the release (``SecureSteps.withhold``;
    ``docs/privacy.md``)."""
    bound = crypto.JobSpec.from_bytes(task.secure.spec).bound
    limit = unit_norm_examples_within(bound)
    held = runner.data.train_size
    if held > limit:
        runner.log(
            f"{kind} statistics: this site holds {held} examples, more than the job's "
            f"bound {bound:g} allows ({limit}): these statistics use a random {limit} of them"
        )
    return limit


def _statistics_of(
    runner: ParticipantRunner,
    trainer: LocalTrainer,
    vector: npt.NDArray[np.float64],
    kind: str,
    limit: int | None = None,
) -> tuple[npt.NDArray[np.float64], float]:
    """The statistics vector of ``kind`` (over at most ``limit`` random examples)
    and the seconds it took."""
    t0 = time.monotonic()
    stats = trainer.statistics(vector, kind, max_examples=limit)
    if runner.adversary is not None:
        stats = trainer.attacked_statistics(runner.adversary, kind, stats)
    return stats, time.monotonic() - t0


def _private_statistics(
    runner: ParticipantRunner, task_id: str, task: pb.StatisticsTask, kind: str, release_key: str
) -> None:
    """A DP release: plan and charge locally first (refusing over budget), then
    exact statistics in the isometric layout, plus integer noise in the ring.

    The statistics cover at most the release's public ``max_examples`` examples: a
    site holding more uses a random subset of that size rather than refusing (a
    refusal would tell the coordinator its count, one free bit per bound it asks
    with); only this site's own log says so."""
    trainer = runner._trainer()
    release = task.privacy
    if release.kind != kind:
        runner._refuse(task_id, PrivacyRefused(f"DP plan for {release.kind}, job is {kind}"))
        return
    try:
        spec = crypto.JobSpec.from_bytes(task.secure.spec)
        plan, noise_plan, entry = runner.privacy.admit(
            spec.job_id.hex(),
            release,
            spec,
            dim=trainer.feature_dim,
            num_classes=trainer.num_classes,
            federation=runner._federation(),
            per_kind=not runner.releases.rules.one_release_per_model,
        )
    except (PrivacyRefused, BudgetExceeded, crypto.SecAggError) as exc:
        runner._refuse(task_id, exc)
        return
    runner.releases.annotate(
        release_key,
        epsilon=float(entry["epsilon"]),
        delta=float(plan.delta),
        noise={"mechanism": plan.mechanism, "plan": plan.noise.to_json()},
    )
    runner.log(
        f"{kind} DP release: {plan.mechanism}, ε = {entry['epsilon']:.4g} at δ = "
        f"{plan.delta:g}; local total ε = {entry['epsilon_total']:.4g}"
    )
    session = runner.secure.start(
        task_id,
        task.secure,
        round_index=None,
        expected_length=plan.length,
        release=release_key,
        donates_input=True,
    )
    if session is None:
        return
    vector = runner._download(task.model, (trainer.length,))
    bound = int(release.max_examples)
    held = runner.data.train_size
    if held > bound:
        runner.log(
            f"{kind} DP release: this site holds {held} examples, above the job's public "
            f"bound {bound}: this release uses a random {bound} of them"
        )
    t0 = time.monotonic()
    try:
        stats = trainer.private_statistics(
            vector, kind, quant_bits=plan.quant_bits, max_examples=bound
        )
    except LOCAL_WORK_ERRORS as exc:  # may depend on the data: counted as the release
        runner.secure.withhold(task_id, session, exc)
        return
    noise = sample_noise(noise_plan)
    runner.log(f"{kind} statistics: {stats.shape[0]} entries in {time.monotonic() - t0:.1f}s")
    runner.secure.set_input(task_id, session, stats, noise=noise, donate=True)
