"""A participant told the federation ended exits 0 when it reached its end (completed
or degraded: the outputs exist) and 1 when it failed — the wording is the contract
(``spherecal.proto.federation_end``)."""

from __future__ import annotations

import grpc
import pytest

from spherecal.participant.backoff import ParticipantExit, stop_if_ended
from spherecal.proto.federation_end import SUCCESSFUL_STATUSES, ended_details, ended_status


@pytest.mark.parametrize(("status", "code"), [("completed", 0), ("degraded", 0), ("failed", 1)])
def test_exit_code_follows_the_final_status(status: str, code: int) -> None:
    details = ended_details("ab12", status, "federation degraded: ccvr: no classifier")
    assert ended_status(details) == status
    with pytest.raises(ParticipantExit) as stop:
        stop_if_ended(grpc.StatusCode.FAILED_PRECONDITION, details)
    assert stop.value.code == code


def test_only_completed_and_degraded_count_as_reaching_the_end() -> None:
    assert frozenset({"completed", "degraded"}) == SUCCESSFUL_STATUSES
