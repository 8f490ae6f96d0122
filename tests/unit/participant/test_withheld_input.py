"""A started job whose input the site will not send (``SecureSteps.withhold``): the
refusal depends on the data, so it is answered at the job's masked step and charged
there as the job's release — never at once, never for free
(``tests/security/test_refusal_oracle.py`` plays the attack this stops).

The real site (``SecureSteps`` with its held-jobs folder and ledgers on disk) against
the real coordinator job, as in ``test_held_keys``."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from spherecal import crypto
from spherecal.participant.failures import LOCAL_WORK_ERRORS, LOCAL_WORK_FAILED, wire_reason
from spherecal.participant.faults import HaltPoint
from spherecal.participant.policy import ReleaseRepeated
from spherecal.participant.release_ledger import Release
from spherecal.spherefed.privacy.ledger import BudgetExceeded
from tests.unit.participant.test_held_keys import IDS, Federation, Killed

OUT_OF_BOUND = np.full(40, 1e9)  # the job's bound is 1e6 (make_job)


@pytest.fixture
def fed(tmp_path: Path) -> Iterator[Federation]:
    federation = Federation(tmp_path)
    yield federation
    federation.close()


def _to_masked_step(fed: Federation) -> None:
    """Everyone's advertise and share stages (p1 one step each): p1's masked step next."""
    fed.others("advertise")
    fed.job.advance(frozenset(IDS))
    fed.site_step()
    fed.others("share")
    fed.job.advance(frozenset(IDS))
    assert fed.job.stage_name == "masked"


def _killed_after_the_charge(fed: Federation) -> None:
    """p1 withholds an out-of-bound input and dies at its masked step between the
    charge and the withdrawal."""
    steps = fed.start_site((HaltPoint("charged"),))
    session = fed.start_task()
    assert session is not None
    assert not steps.set_input("task-1", session, OUT_OF_BOUND)
    _to_masked_step(fed)
    with pytest.raises(Killed):
        fed.site_step()


def _answer(fed: Federation) -> str:
    """What the site's ledger says left in p1's release's place."""
    conn = sqlite3.connect(fed.tmp_path / "privacy.db")
    try:
        (row,) = conn.execute("SELECT answer FROM site_releases WHERE state = 'released'")
        return str(row[0])
    finally:
        conn.close()


def _refusals(fed: Federation) -> list[str]:
    return [line for line in fed.log if line.startswith("refused")]


def test_an_out_of_bound_input_is_withheld_until_the_masked_step(fed: Federation) -> None:
    steps = fed.start_site()
    session = fed.start_task()
    assert session is not None
    assert not steps.set_input("task-1", session, OUT_OF_BOUND)
    # nothing answered, nothing charged, the job still held
    assert _refusals(fed) == [] and fed.released() == 0
    assert fed.job.job_id in steps.jobs and steps.withheld(fed.job.job_id)
    _to_masked_step(fed)
    assert _refusals(fed) == []  # the share answer went as for any input
    fed.site_step()
    (refusal,) = _refusals(fed)
    assert refusal.startswith("refused task-1") and "refusing to encode" in refusal
    assert fed.released() == 1  # charged, as the upload would have been
    assert _answer(fed) == "refusal"  # and the site's audit says what left
    assert fed.job.job_id not in steps.jobs and not steps.withheld(fed.job.job_id)
    assert steps.store is not None and steps.store.job_ids() == []
    assert fed.transport.streamed == []  # no byte of an input left
    # the same statistics again, under any job id: the ledger refuses
    with pytest.raises(ReleaseRepeated):
        steps.releases.reserve(
            Release(kind="ffc", federation="fed-1", model=b"m" * 32, data=b"d" * 32),
            job="another-job",
        )


def test_a_failed_local_work_is_withheld_the_same_way(fed: Federation) -> None:
    steps = fed.start_site()
    session = fed.start_task()
    assert session is not None
    steps.withhold("task-1", session, ValueError("loss nan at example 17"))
    assert _refusals(fed) == [] and fed.released() == 0
    _to_masked_step(fed)
    fed.site_step()
    assert len(_refusals(fed)) == 1 and fed.released() == 1


def test_a_job_that_ended_before_its_masked_step_answers_nothing(fed: Federation) -> None:
    """The coordinator moved on first (the job dropped): a withdrawal now would tell
    it what no upload could have; nothing is sent or charged."""
    steps = fed.start_site()
    session = fed.start_task()
    assert session is not None
    steps.forget(session)  # what "the coordinator moved on" does to the job
    assert not steps.set_input("task-1", session, OUT_OF_BOUND)
    steps.withhold("task-1", session, ValueError("loss nan at example 17"))
    assert _refusals(fed) == [] and fed.released() == 0
    assert any("nothing is sent" in line for line in fed.log), fed.log
    assert not steps.withheld(fed.job.job_id)


def test_killed_after_the_charge_the_restarted_site_refuses_again_charging_once(
    fed: Federation,
) -> None:
    _killed_after_the_charge(fed)
    assert fed.released() == 1 and _refusals(fed) == []  # charged, not yet answered
    steps = fed.start_site()
    session = fed.start_task()  # the task again: the held job, its local work again
    assert session is not None
    assert not steps.set_input("task-1", session, OUT_OF_BOUND)
    fed.site_step()
    assert len(_refusals(fed)) == 1 and fed.released() == 1


def test_an_input_in_bound_after_the_restart_is_not_sent(fed: Federation) -> None:
    """Killed after the charge; after the restart the local work yields an input that
    fits (an allocation that failed the first time, another draw of DP-SGD's noise):
    the job's outcome was fixed before the restart, so the site withdraws again and no
    input leaves. Until 2026-11-27 the withheld mark lived in memory only and the
    restarted site sent that input — a second outcome for one job."""
    _killed_after_the_charge(fed)
    steps = fed.start_site()
    assert any("its input was withheld (EncodingOverflow)" in line for line in fed.log)
    session = fed.start_task()
    assert session is not None  # not settled: its work runs again, as a set input's must
    assert not steps.set_input("task-1", session, fed.inputs["p1"])
    fed.site_step()
    assert fed.transport.streamed == [] and fed.released() == 1
    (refusal,) = _refusals(fed)
    assert "withheld before this site's restart: EncodingOverflow" in refusal
    assert _answer(fed) == "refusal"
    assert steps.store is not None and steps.store.job_ids() == []


def test_withheld_before_the_restart_before_the_charge_is_withheld_after(
    fed: Federation,
) -> None:
    """Killed between its local work and its masked step (nothing charged yet): the
    held record says withheld, written before ``withhold`` returned."""
    steps = fed.start_site()
    session = fed.start_task()
    assert session is not None
    steps.withhold("task-1", session, MemoryError("cannot allocate 1.2 GiB"))
    assert steps.store is not None
    record = steps.store.load(fed.job.job_id)
    assert record.withheld == "MemoryError"  # the class's name, never its text
    assert "1.2 GiB" not in record.to_bytes().decode()
    _to_masked_step(fed)  # its share answer (after the work) keeps the mark
    assert steps.store.load(fed.job.job_id).withheld == "MemoryError"
    steps = fed.start_site()  # the restart
    session = fed.start_task()
    assert session is not None
    assert not steps.set_input("task-1", session, fed.inputs["p1"])  # it fits now
    fed.site_step()
    assert fed.transport.streamed == [] and fed.released() == 1
    assert len(_refusals(fed)) == 1 and _answer(fed) == "refusal"


@pytest.mark.parametrize("withheld", [False, True])
def test_after_a_restart_a_masked_step_before_the_task_is_refused_alike(
    fed: Federation, withheld: bool
) -> None:
    """A restarted site whose job's masked step comes before its task does: a set
    input was not kept and a withheld one must not be told apart — both are refused
    as out of order, under the job's id, uncharged. (Answered with the charged
    withdrawal, the withheld job would say which it was for a site restart.)"""
    steps = fed.start_site()
    session = fed.start_task()
    assert session is not None
    if withheld:
        assert not steps.set_input("task-1", session, OUT_OF_BOUND)
    else:
        assert steps.set_input("task-1", session, fed.inputs["p1"])
    _to_masked_step(fed)
    steps = fed.start_site()  # restarted: the masked step comes first
    fed.site_step()
    (refusal,) = _refusals(fed)
    assert refusal.startswith(f"refused {fed.job.job_id.hex()[:8]}")
    assert "the masked stage came before this site's input" in refusal
    assert fed.released() == 0 and fed.transport.streamed == []
    assert steps.jobs == {}


def test_a_length_mismatch_is_refused_at_once(fed: Federation) -> None:
    """The vector's length is the plan's, not the data's: no reason to wait."""
    steps = fed.start_site()
    session = fed.start_task()
    assert session is not None
    assert not steps.set_input("task-1", session, np.zeros(39))
    assert len(_refusals(fed)) == 1 and fed.released() == 0
    assert fed.job.job_id not in steps.jobs


# ---------------------------------------------------------------- the wire's text
def test_the_wire_text_of_a_data_dependent_refusal_is_fixed() -> None:
    overflow = crypto.EncodingOverflow("entries outside |x| <= 1000.0: largest 12345.678")
    assert wire_reason(overflow) == wire_reason(crypto.EncodingOverflow("other"))
    assert "12345" not in wire_reason(overflow)
    for local in (
        ValueError("loss nan at example 17"),
        RuntimeError("CUDA error at batch 3"),
        OSError("disk full at /srv/site/data/patient-17.npz"),
    ):
        assert wire_reason(local) == LOCAL_WORK_FAILED


def test_a_failed_allocation_is_failed_local_work_not_an_exit() -> None:
    """How much memory a task needs follows the split's size, so a failed allocation
    is withheld and counted like any failed local work (its text fixed on the wire);
    it used to escape the tasks' handlers and end the site, an answer at once."""
    try:
        np.empty(1 << 62, dtype=np.uint8)  # numpy's own failed allocation
    except LOCAL_WORK_ERRORS as exc:
        failed: BaseException = exc
    assert isinstance(failed, MemoryError)
    assert wire_reason(failed) == LOCAL_WORK_FAILED


def test_an_exhausted_budget_names_the_limit_not_what_was_spent() -> None:
    exceeded = BudgetExceeded(
        subject="p0",
        limit="total",
        budget_epsilon=0.5,
        spent_epsilon=0.375,
        release_epsilon=1.0,
        projected_epsilon=1.375,
        delta=1e-5,
        release_kind="ffc",
    )
    text = wire_reason(exceeded)
    assert "total budget ε = 0.5" in text and "this release ε = 1" in text
    assert "0.375" not in text and "1.375" not in text  # the site's history
    assert "0.375" in str(exceeded)  # the site's own log keeps it


def test_an_earlier_release_is_not_named_on_the_wire() -> None:
    repeated = ReleaseRepeated(
        "exact statistics of this site's data already left it (job 3f2a, ffc, "
        "federation 'oncology-trial-B')"
    )
    assert "oncology" not in wire_reason(repeated) and "3f2a" not in wire_reason(repeated)


def test_the_wire_text_of_a_refusal_about_the_job_is_its_own() -> None:
    """Refusals of what the coordinator sent keep their text: the operator needs it
    and it says nothing the coordinator did not send."""
    spec = crypto.InvalidSpec("threshold 2 is below the policy's minimum 3")
    assert wire_reason(spec) == str(spec)
    too_few = crypto.TooFewParticipants("the job has 2 participants; this site needs 3")
    assert wire_reason(too_few) == str(too_few)
