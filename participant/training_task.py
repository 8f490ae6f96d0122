"""The participant's training task: one round's update, secure or plaintext.

Why a module of its own: a training round is its own concern — the release reserved
before anything is downloaded, the keys advertised before the data-dependent work,
local training (plain, with local DP-SGD, or a distributed DP-SGD step), the training
weight released once per split (:mod:`spherecal.participant.example_weight`) and fitted
to the job's bound, the strategy's reweighing — while ``runner`` only dispatches tasks.
Like :mod:`spherecal.participant.statistics_task` and
:mod:`spherecal.participant.evaluation_task`, it is a function of the runner's state.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from spherecal import crypto
from spherecal.participant.algorithm_state import ClientStateStore
from spherecal.participant.distributed_dpsgd import distributed_step, require_distributed
from spherecal.participant.dp_gate import PrivacyRefused
from spherecal.participant.dpsgd_round import dpsgd_round
from spherecal.participant.example_weight import training_weight, weight_within_bound
from spherecal.participant.failures import LOCAL_WORK_ERRORS
from spherecal.participant.release_ledger import UPDATE, Release
from spherecal.proto import spherecal_pb2 as pb
from spherecal.spherefed.algorithms.base import ClientResult, parameter_mask
from spherecal.spherefed.fl import LocalUpdate
from spherecal.spherefed.privacy.charge import PrivacyCharge

if TYPE_CHECKING:
    from spherecal.participant.runner import ParticipantRunner
    from spherecal.participant.secure_session import SecureSession
    from spherecal.participant.trainer import LocalTrainer

__all__ = ["train_task"]


def train_task(runner: ParticipantRunner, task_id: str, task: pb.TrainTask) -> None:
    """One training round: the round checked against the joined plan and reserved as
    the round's update release, the keys advertised before any data-dependent work,
    local training (plain, local DP-SGD, or a distributed DP-SGD step), then the
    released training weight, fitted to the job's bound, and the strategy's
    reweighing; masked when the task carries a job, plaintext only with
    ``allow_plaintext``. Local work that fails is withheld to the masked step and
    counted as the round's release (``ParticipantRunner._local_work_failed``)."""
    trainer = runner._trainer()
    purpose = "update"
    runner.halter.check("train", purpose=purpose, round_index=task.round, what=task_id)
    secure = task.HasField("secure")
    try:
        runner._require_planned_round(int(task.round))
        require_distributed(runner.privacy, task)
        if not secure and not runner.settings.allow_plaintext:
            raise runner._no_plaintext("model updates")
        release = runner._reserve(
            task_id,
            Release(
                kind=UPDATE,
                federation=runner._federation(),
                # the key is (federation, round); the model is recorded by its wire
                # digest so that nothing is downloaded before the keys are advertised
                model=bytes(task.model.header.sha256),
                data=runner._fingerprint("train"),
                round=int(task.round),
                noised=runner.settings.privacy.dpsgd or task.HasField("dpsgd"),
            ),
            task.secure if secure else None,
            task,
        )
    except (PrivacyRefused, crypto.SecAggError) as exc:
        runner._refuse(task_id, exc)
        return
    if not secure and runner._send_again(task_id, UPDATE, release, task):
        return  # the same task again: the bytes that left (participant.sent_plaintext)
    if task.HasField("dpsgd"):  # distributed DP-SGD (issue #25)
        distributed_step(
            task_id=task_id,
            task=task,
            release_key=release,
            trainer=trainer,
            privacy=runner.privacy,
            secure=runner.secure,
            releases=runner.releases,
            download=runner._download,
            refuse=runner._refuse,
            log=runner.log,
            federation=runner._federation(),
            plan_rounds=int(runner.plan.rounds) if runner.plan is not None else 1,
        )
        return
    session = None
    if secure:  # advertise and share before the data-dependent work
        session = runner.secure.start(
            task_id,
            task.secure,
            round_index=task.round,
            expected_length=trainer.layout.length,
            release=release,
        )
        if session is None:
            return
    vector = runner._download(task.model, (trainer.length,))
    broadcast = {b.name: runner._download(b.tensor, (trainer.length,)) for b in task.broadcast}
    # the model the update is computed from, as the network runs it (the site's audit
    # pairs two updates of one executed model), and what determines the update bit
    # for bit: an exact update that already left in this federation is refused
    # before any training (ReleaseLedger.admit_update)
    try:
        runner.releases.admit_update(
            release,
            executed=trainer.executed_digest(vector),
            trained=trainer.update_digest(vector, int(task.seed), broadcast),
        )
    except PrivacyRefused as exc:  # depends only on what the coordinator sent
        if session is not None:
            runner.secure.abandon(task_id, session, exc)
        else:
            runner._refuse(task_id, exc)
        return
    t0 = time.monotonic()
    states: tuple[ClientStateStore, dict[str, np.ndarray] | None] | None = None
    if runner.settings.privacy.dpsgd:
        try:
            trainer.require_dpsgd_compatible()
        except ValueError as exc:
            runner.secure.abandon(task_id, session, exc)
            return
        dp_update = _train_dpsgd(runner, task_id, vector, session, release, int(task.round))
        if dp_update is None:  # refused or failed (reported, module dpsgd_round)
            return
        try:
            result = trainer.dpsgd_result(dp_update)
        except LOCAL_WORK_ERRORS as exc:
            runner._local_work_failed(task_id, session, release, exc)
            return
    else:
        try:
            store = _client_states(runner)
            before = store.for_round(task.round)
            result = trainer.train(vector, task.seed, broadcast=broadcast, client_state=before)
        except LOCAL_WORK_ERRORS as exc:  # CorruptClientState is a ValueError
            # e.g. training that diverged on this site's data (FloatingPointError):
            # a refusal that depends on it, withheld to the masked step, never an
            # exit — a site that stopped would tell the coordinator at once
            runner._local_work_failed(task_id, session, release, exc)
            return
        states = (store, before)
    runner.log(
        f"round {task.round + 1}: trained {result.num_steps} steps on {result.num_samples} "
        f"samples in {time.monotonic() - t0:.1f}s"
    )
    bound = crypto.JobSpec.from_bytes(task.secure.spec).bound if secure else None
    try:  # the result's weight, reweighing and layout are local work on the data too
        result, payload = _released_update(runner, trainer, task, result, states, bound)
    except LOCAL_WORK_ERRORS as exc:
        runner._local_work_failed(task_id, session, release, exc)
        return
    if runner.adversary is not None and task.HasField("secure"):
        payload = runner.adversary.update(
            payload,
            trainer.layout.entries,
            bound=crypto.JobSpec.from_bytes(task.secure.spec).bound,
            seed=int(task.seed),
            round_index=int(task.round),
        )
    if session is not None:
        runner.secure.set_input(task_id, session, payload)
    else:
        meta = pb.UpdateMeta(
            num_samples=result.num_samples,
            mean_loss=result.mean_loss,
            num_steps=result.num_steps,
        )
        runner._upload_plain(task_id, payload, meta, release=release, kept=(UPDATE, task))


def _released_update(
    runner: ParticipantRunner,
    trainer: LocalTrainer,
    task: pb.TrainTask,
    result: ClientResult,
    states: tuple[ClientStateStore, dict[str, np.ndarray] | None] | None,
    bound: float | None,
) -> tuple[ClientResult, npt.NDArray[np.float64]]:
    """The trained result as it is released: weighted by the released training weight
    (fitted to the job's ``bound``), reweighed by the strategy, its client state kept
    (SCAFFOLD's ``c_k``), flattened; (the result as released, the vector)."""
    weight = training_weight(
        runner.releases,
        runner._federation(),
        runner._fingerprint("train"),
        result.num_samples,
        runner.policy.example_count_noise_sd,
        runner.log,
    )
    if bound is not None:
        weight = _weight_within(runner, trainer, result, weight, bound, int(task.round))
    result = trainer.strategy.reweighed(
        result, weight, trainer.config, trainable=parameter_mask(trainer.model, trainer.keys)
    )
    if states is not None and result.client_state is not None:
        # kept as reweighed (SCAFFOLD's c_k for the released count's steps), before
        # anything of the round leaves
        store, before = states
        store.commit(task.round, before, result.client_state)
    return result, trainer.flatten(result, loss_bound=bound)


def _weight_within(
    runner: ParticipantRunner,
    trainer: LocalTrainer,
    result: ClientResult,
    weight: int,
    bound: float,
    round_index: int,
) -> int:
    """The training weight the round's update carries in a secure job of entry
    bound ``bound``: the released weight, or the largest below it whose count
    entries fit the bound (:func:`weight_within_bound`, which says why), logged
    here only.

    The update's own entries (``ñ_k Δ_k``, SCAFFOLD's control variates) are not
    fitted: outside the bound they stay a refusal counted as the round's update
    (``SecureSteps.withhold``). Clipping them would change a model the coordinator
    still steps as if it were not — silently, where a too-tight declared
    ``max_update_change`` now loses the round and says so — for a bit the exact
    update already gives away: without DP-SGD a coordinator can difference two
    rounds for the site's exact update (``docs/threat_model.md``, *Different
    training rounds*), and with DP-SGD the update is noised, so a refusal by it
    is post-processing. Each round is one release either way."""
    fitted = weight_within_bound(
        trainer.strategy, trainer.layout, result, weight, trainer.config, bound
    )
    if fitted < weight:
        runner.log(
            f"round {round_index + 1}: this site's training weight {weight} does not fit "
            f"the job's bound {bound:g}: this update is weighted as a site of {fitted} "
            "examples"
        )
    return fitted


def _client_states(runner: ParticipantRunner) -> ClientStateStore:
    """This federation's algorithm-state file (SCAFFOLD's ``c_k``)."""
    plan = runner.plan
    federation_id = plan.federation_id if plan is not None else ""
    return ClientStateStore(runner.settings.state_dir, federation_id or "default", runner.pid)


def _train_dpsgd(
    runner: ParticipantRunner,
    task_id: str,
    vector: npt.NDArray[np.float64],
    session: SecureSession | None,
    release: str,
    round_index: int,
) -> LocalUpdate | None:
    """DP-SGD for this round (``spherecal.participant.dpsgd_round``); None when the
    plan is refused (at once, the job's state dropped) or the admitted round's
    training failed (withheld to the masked step, charged as the round's release)."""

    def refuse(refused_task: str, error: BaseException) -> None:
        runner.secure.forget(session)
        runner._refuse(refused_task, error)

    def failed(error: BaseException) -> None:
        runner._local_work_failed(task_id, session, release, error)

    def charged(charge: PrivacyCharge) -> None:  # the round's ε, in the release's row
        runner.releases.annotate(
            release,
            epsilon=float(charge.epsilon),
            delta=float(charge.delta),
            noise={"mechanism": charge.mechanism, "local_dpsgd": dict(charge.noise)},
        )

    return dpsgd_round(
        runner._trainer(),
        runner.settings.privacy,
        runner.privacy,
        runner.pid,
        task_id,
        vector,
        federation_id=runner.plan.federation_id if runner.plan is not None else "",
        round_index=round_index,
        plan_rounds=int(runner.plan.rounds) if runner.plan is not None else 1,
        refuse=refuse,
        failed=failed,
        log=runner.log,
        charged=charged,
    )
