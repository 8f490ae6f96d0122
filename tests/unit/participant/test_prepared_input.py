"""The site prepares its input's buffer once its share step is answered (issue #24,
``SecureSteps._prepare_input``): ``set_input`` then encodes into that buffer, the job
ends with the exact sum, and the loan ends with the job — also for a job taken up again
after a restart, and for one the site drops before its input.

Both sides are the real ones, as in ``test_held_keys``: the site's ``SecureSteps`` with
its held-jobs folder and ledgers on disk, the coordinator's ``SecureJob``."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from spherecal import crypto
from spherecal.crypto import ring
from spherecal.participant.secure_session import SecureSession
from tests.unit.participant.test_held_keys import IDS, Federation, _finish

pytestmark = pytest.mark.usefixtures("fresh_ring_pool")  # tests/conftest.py


@pytest.fixture
def fed(tmp_path: Path) -> Iterator[Federation]:
    federation = Federation(tmp_path)
    yield federation
    federation.close()


def _client(fed: Federation) -> crypto.SecAggParticipant:
    assert fed.steps is not None
    return fed.steps.jobs[fed.job.job_id].client


def _start_session(fed: Federation, *, donates_input: bool = False) -> SecureSession:
    """p1's task up to its local work: the job started, nothing computed yet."""
    session = fed.start_task(donates_input=donates_input)
    assert session is not None
    return session


def _start(fed: Federation) -> crypto.SecAggParticipant:
    return _start_session(fed).client


def test_the_started_job_holds_its_prepared_buffer_and_encodes_into_it(fed: Federation) -> None:
    fed.start_site()
    client = _start(fed)
    assert client.stage is crypto.ParticipantStage.SHARE  # share_wait_s = 0: not awaited
    assert client._loan is not None and client._encoded is None  # prepared, no input yet
    prepared = client._loan
    assert len(ring._lent) == 1
    assert fed.steps is not None
    assert fed.steps.set_input("task-1", fed.steps.jobs[fed.job.job_id], fed.inputs["p1"])
    assert client._encoded is prepared and len(ring._lent) == 1
    fed.others("advertise")
    fed.job.advance(frozenset(IDS))
    fed.site_step()
    fed.others("share")
    fed.job.advance(frozenset(IDS))
    _finish(fed, from_stage="masked")  # the exact sum, the release charged once
    # every participant (p1 and the three plain ones) gave its buffer back, zeroed
    assert not ring._lent and len(ring._spare) == 4
    assert any(spare is prepared.base for spare in ring._spare)
    assert not any(spare.any() for spare in ring._spare)


def test_a_job_taken_up_after_a_restart_is_prepared_again(fed: Federation) -> None:
    """Killed in its local work (shares dealt, no input): the restarted process
    continues the held job and prepares its buffer before the work runs again."""
    fed.start_site()
    fed.through_shares()
    fed.others("masked")
    fed.gone("masked")
    fed.start_site()
    client = _start(fed)  # continue_held: the held session, prepared
    assert client.stage is crypto.ParticipantStage.RECEIVE_SHARES
    assert client._loan is not None and client._encoded is None
    prepared = client._loan
    assert fed.steps is not None
    assert fed.steps.set_input("task-1", fed.steps.jobs[fed.job.job_id], fed.inputs["p1"])
    assert client._encoded is prepared
    fed.site_step()
    fed.job.advance(frozenset(IDS))
    _finish(fed)
    assert client._loan is None and id(prepared) not in ring._lent


def test_a_job_the_site_drops_before_its_input_keeps_its_buffer_spare(fed: Federation) -> None:
    """The local work fails after the job started: the site withdraws, the forgotten
    job's participant is closed, and its prepared buffer is zeroed and kept for the
    site's next job (it was freed with the job before: the next job faulted in anew)."""
    steps = fed.start_site()
    client = _start(fed)
    prepared = client._loan
    assert prepared is not None and len(ring._lent) == 1
    prepared[:] = 7  # as if written: the spare must come back zeroed
    steps.abandon("task-1", steps.jobs[fed.job.job_id], ValueError("local work failed"))
    assert fed.job.job_id not in steps.jobs
    assert not ring._lent
    assert len(ring._spare) == 1 and ring._spare[0] is prepared.base
    assert not ring._spare[0].any()
    assert client.stage is crypto.ParticipantStage.FAILED
    with pytest.raises(crypto.SecAggError):  # closed: it answers nothing more
        client.set_input(fed.inputs["p1"])
    client.close()  # a second close does nothing
    assert len(ring._spare) == 1
    again = ring.borrow(40, 64)  # the next job of the same size gets that memory
    assert again.base is prepared.base


def test_a_vector_refused_after_prepare_gives_the_buffer_back(fed: Federation) -> None:
    """An out-of-bound input is withheld (the site withdraws at the job's masked step,
    ``test_withheld_input``): the prepared buffer is zeroed and spare once the job is
    forgotten."""
    steps = fed.start_site()
    prepared = _start(fed)._loan
    assert prepared is not None
    assert not steps.set_input("task-1", steps.jobs[fed.job.job_id], np.full(40, 1e9))
    assert steps.withheld(fed.job.job_id)
    fed.others("advertise")
    fed.job.advance(frozenset(IDS))
    fed.site_step()
    fed.others("share")
    fed.job.advance(frozenset(IDS))
    fed.site_step()  # the masked step: charged, then the withdrawal
    assert any("refused" in line for line in fed.log), fed.log
    assert fed.job.job_id not in steps.jobs
    gc.collect()
    assert not ring._lent
    assert len(ring._spare) == 1 and ring._spare[0] is prepared.base
    assert not ring._spare[0].any()


def test_a_statistics_job_that_donates_its_vector_prepares_nothing_and_encodes_in_it(
    fed: Federation,
) -> None:
    """``statistics_task`` starts its job with ``donates_input`` (issue #24): no buffer
    is prepared, ``set_input(donate=True)`` encodes into the statistics vector's own
    memory, the job ends with the exact sum (``_finish``: every site's input summed,
    the release charged once), and the vector's memory ends zeroed, never a spare."""
    steps = fed.start_site()
    session = _start_session(fed, donates_input=True)
    client = session.client
    assert client._loan is None and not ring._lent  # nothing prepared
    vector = np.array(fed.inputs["p1"], dtype=np.float64, copy=True)
    assert steps.set_input("task-1", session, vector, donate=True)
    assert client._encoded is not None and np.shares_memory(client._encoded, vector)
    spec = fed.job.spec
    expected = crypto.encode(fed.inputs["p1"], scale_bits=spec.scale_bits, bound=spec.bound)
    assert np.array_equal(client._encoded, expected)
    fed.others("advertise")
    fed.job.advance(frozenset(IDS))
    fed.site_step()
    fed.others("share")
    fed.job.advance(frozenset(IDS))
    _finish(fed, from_stage="masked")
    assert not ring._lent
    assert not any(np.shares_memory(spare, vector) for spare in ring._spare)
    assert not vector.any()


def test_a_job_taken_up_after_a_restart_by_a_donating_task_prepares_nothing(
    fed: Federation,
) -> None:
    """The statistics task of a held job continued after a restart also donates its
    vector: the continued session prepares no buffer (one would be used instead of the
    vector's memory), encodes into the vector and sums exactly."""
    fed.start_site()
    fed.through_shares()
    fed.others("masked")
    fed.gone("masked")
    steps = fed.start_site()
    lent = set(ring._lent)  # the killed process's loan, not this one's
    session = _start_session(fed, donates_input=True)  # continue_held, donating
    client = session.client
    assert client.stage is crypto.ParticipantStage.RECEIVE_SHARES
    assert client._loan is None and set(ring._lent) == lent  # nothing prepared
    vector = np.array(fed.inputs["p1"], dtype=np.float64, copy=True)
    assert steps.set_input("task-1", session, vector, donate=True)
    assert client._encoded is not None and np.shares_memory(client._encoded, vector)
    fed.site_step()
    fed.job.advance(frozenset(IDS))
    _finish(fed)
    assert set(ring._lent) <= lent and not vector.any()
