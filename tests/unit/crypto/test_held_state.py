"""A participant rebuilt from its held state after its masked input left answers the
rest of the job exactly as the first one would have (issue #20) — and no more: it
never masks again, never signs a second survivor set, never reveals twice."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from spherecal.crypto import (
    BadKey,
    DoubleReveal,
    HeldStage,
    HeldState,
    InconsistentSurvivors,
    KeySubstitution,
    MalformedMessage,
    OutOfStage,
    ParticipantStage,
    SecAggParticipant,
    WrongJob,
    WrongRecipient,
    keys_needed,
)
from spherecal.crypto import messages as crypto_messages
from spherecal.crypto.messages import UnmaskRequest

from .helpers import MECHANICS_POLICY, Net


def _resumed(net: Net, pid: str, state: HeldState) -> SecAggParticipant:
    return SecAggParticipant.resume(
        net.spec,
        pid,
        net.identities[pid],
        {q: net.directory[q] for q in keys_needed(net.spec, pid)},
        HeldState.from_bytes(state.to_bytes()),  # through its encoding, as on disk
        policy=MECHANICS_POLICY,
    )


def _masked(consistency: bool) -> Net:
    net = Net(4, threshold=4, consistency=consistency)
    net.advertise()
    net.share()
    net.masked()
    return net


@pytest.mark.parametrize("consistency", [True, False])
def test_a_resumed_participant_finishes_the_job_with_the_exact_sum(consistency: bool) -> None:
    # threshold 4 of 4: without p2's answers the job could not finish at all
    net = _masked(consistency)
    net.clients["p02"] = _resumed(net, "p02", net.clients["p02"].held_state())
    assert net.clients["p02"].has_input and net.clients["p02"].stage is ParticipantStage.MASKED
    if consistency:
        net.consistency()
    result = net.unmask()
    assert result.contributors == tuple(net.ids) and result.dropouts == ()
    np.testing.assert_allclose(result.values, net.expected(net.ids), atol=net.tolerance())


def test_resumed_after_signing_answers_unmask_and_verifies_the_signed_view() -> None:
    net = _masked(True)
    net.consistency()
    state = net.clients["p01"].held_state()
    assert state.stage is HeldStage.SIGNED and state.signed_survivors == tuple(net.ids)
    net.clients["p01"] = _resumed(net, "p01", state)
    result = net.unmask()
    np.testing.assert_allclose(result.values, net.expected(net.ids), atol=net.tolerance())


def test_a_resumed_participant_never_masks_again() -> None:
    net = _masked(False)
    resumed = _resumed(net, "p00", net.clients["p00"].held_state())
    with pytest.raises(OutOfStage, match="never computed twice"):
        resumed.masked_chunk(0)
    with pytest.raises(OutOfStage):
        resumed.set_input(net.inputs["p00"])


def test_a_resumed_answer_repeats_identically_and_refuses_a_different_request() -> None:
    net = _masked(False)
    request = net.server.unmask_request_for("p03")
    first = net.clients["p03"].unmask(request)
    state = net.clients["p03"].held_state()
    assert state.stage is HeldStage.DONE and state.held == ()  # the secrets are gone
    resumed = _resumed(net, "p03", state)
    assert resumed.unmask(request) == first
    other = UnmaskRequest(
        job_id=request.job_id,
        recipient="p03",
        survivors=("p00", "p01", "p03"),
        dropouts=("p02",),
    )
    with pytest.raises(DoubleReveal):
        resumed.unmask(other)


def test_held_state_of_another_job_or_participant_is_refused() -> None:
    net = _masked(False)
    state = net.clients["p00"].held_state()
    with pytest.raises(WrongJob):
        _resumed(net, "p00", replace(state, job_id=b"\x01" * len(state.job_id)))
    with pytest.raises(WrongRecipient):
        _resumed(net, "p01", state)


def test_a_share_at_the_wrong_position_is_refused() -> None:
    net = _masked(False)
    state = net.clients["p00"].held_state()
    dealer, x, plaintext = state.held[0]
    moved = replace(state, held=((dealer, x + 1, plaintext), *state.held[1:]))
    with pytest.raises(InconsistentSurvivors):
        _resumed(net, "p00", moved)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"[]",
        b'{"version": 2}',
        b'{"version": 1, "job_id": "zz"}',
    ],
)
def test_malformed_held_state_is_refused(data: bytes) -> None:
    with pytest.raises(MalformedMessage):
        HeldState.from_bytes(data)


def test_held_state_structure_is_checked() -> None:
    net = _masked(False)
    state = net.clients["p00"].held_state()
    with pytest.raises(MalformedMessage):  # owner not in U2
        HeldState.from_bytes(replace(state, members2=("p01", "p02")).to_bytes())
    with pytest.raises(MalformedMessage):  # an answer without the done stage
        HeldState.from_bytes(replace(state, answered=(b"a", b"b")).to_bytes())
    with pytest.raises(OutOfStage):  # nothing to keep before the keys are advertised
        Net(4).clients["p00"].held_state()
    assert state.keys is None and state.own_advert is None  # never keys with the input
    with pytest.raises(MalformedMessage):  # keys at the masked stage
        HeldState.from_bytes(replace(state, keys=(b"a" * 32, b"b" * 32, b"c" * 16)).to_bytes())


# ---------------------------------------------------------------- before the masked stage
# (issue #20: the job keys are held from the advertise stage on)


def test_resumed_after_advertising_it_deals_with_the_same_keys_and_the_sum_is_exact() -> None:
    net = Net(4, threshold=4, consistency=True)
    advert = net.clients["p01"].advertise_keys()
    state = net.clients["p01"].held_state()
    assert state.stage is HeldStage.ADVERTISED and state.keys is not None
    assert state.own_advert == advert.to_bytes()
    net.clients["p01"] = _resumed(net, "p01", state)
    assert net.clients["p01"].stage is ParticipantStage.SHARE
    for p in net.ids:
        sent = advert if p == "p01" else net.clients[p].advertise_keys()
        net.server.receive(sent, sender=p)
    net.server.close_stage()
    net.share()
    net.masked()
    net.consistency()
    result = net.unmask()
    assert result.contributors == tuple(net.ids)
    np.testing.assert_allclose(result.values, net.expected(net.ids), atol=net.tolerance())


def test_resumed_after_sharing_it_opens_its_bundle_and_masks_its_input_once() -> None:
    net = Net(4, threshold=4, consistency=False)
    net.advertise()
    net.share()
    state = net.clients["p02"].held_state()
    assert state.stage is HeldStage.SHARED and len(state.adverts) == 4
    assert state.members2 == () and state.held == ()
    resumed = _resumed(net, "p02", state)
    assert resumed.stage is ParticipantStage.RECEIVE_SHARES and not resumed.has_input
    net.clients["p02"] = resumed
    net.masked()  # its bundle opens with the channel keys of the held keys
    result = net.unmask()
    np.testing.assert_allclose(result.values, net.expected(net.ids), atol=net.tolerance())


def test_held_keys_that_do_not_match_the_advertisement_sent_are_refused() -> None:
    net = Net(4, threshold=4)
    net.clients["p01"].advertise_keys()
    state = net.clients["p01"].held_state()
    assert state.keys is not None
    other = Net(4, threshold=4)  # another job's keys
    other.clients["p01"].advertise_keys()
    foreign = other.clients["p01"].held_state().keys
    assert foreign is not None
    with pytest.raises(BadKey):
        _resumed(net, "p01", replace(state, keys=foreign))
    swapped = (state.keys[1], state.keys[0], state.keys[2])
    with pytest.raises(BadKey):
        _resumed(net, "p01", replace(state, keys=swapped))


def test_a_held_roster_is_checked_again() -> None:
    net = Net(4, threshold=4)
    net.advertise()
    net.share()
    state = net.clients["p00"].held_state()
    with pytest.raises(InconsistentSurvivors):  # a neighbour's advertisement missing
        _resumed(net, "p00", replace(state, adverts=state.adverts[1:]))
    forged = crypto_messages.AdvertiseKeys.from_bytes(state.adverts[1])
    forged = replace(forged, masking_public=forged.channel_public)  # signature no longer holds
    adverts = (state.adverts[0], forged.to_bytes(), *state.adverts[2:])
    with pytest.raises(KeySubstitution):
        _resumed(net, "p00", replace(state, adverts=adverts))


def test_early_held_state_structure_is_checked() -> None:
    net = Net(4, threshold=4)
    net.advertise()
    net.share()
    shared = net.clients["p00"].held_state()
    for bad in (
        replace(shared, keys=None),  # the shared stage without its keys
        replace(shared, own_advert=None),
        replace(shared, adverts=()),  # ... or its roster
        replace(shared, members2=("p00",)),  # no bundle before the masked stage
        replace(shared, members1=("p01", "p02")),  # U1 without its owner
        replace(shared, keys=(b"a" * 31, b"b" * 32, b"c" * 16)),  # not a key
        replace(shared, stage=HeldStage.ADVERTISED),  # a roster before the share stage
    ):
        with pytest.raises(MalformedMessage):
            HeldState.from_bytes(bad.to_bytes())


def test_a_version_one_document_is_still_read() -> None:
    import json

    net = _masked(False)
    state = net.clients["p00"].held_state()
    doc = json.loads(state.to_bytes())
    for key in ("keys", "own_advert", "adverts"):
        del doc[key]
    doc["version"] = 1
    assert HeldState.from_bytes(json.dumps(doc).encode()) == state
