"""Active attacks by the coordinator or a participant, end to end."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from spherecal.crypto import (
    BadSignature,
    ForgedShare,
    InconsistentSurvivors,
    JobAborted,
    KeySubstitution,
    OutOfStage,
    OverlappingReveal,
    WrongJob,
)
from spherecal.crypto.keys import JobKeys
from spherecal.crypto.messages import ConsistencyRequest, UnmaskRequest
from tests.unit.crypto.helpers import Net, flip


def test_coordinator_substituting_a_key_is_caught_by_the_signature() -> None:
    """Man in the middle on key agreement: the coordinator swaps p01's masking key
    for its own so it could strip p01's pairwise masks. p00 refuses."""
    net = Net(4, threshold=3)
    net.advertise()
    roster = net.server.roster_for("p00")
    mine = JobKeys.generate()
    swapped = tuple(
        replace(a, masking_public=mine.masking_public, channel_public=mine.channel_public)
        if a.sender == "p01"
        else a
        for a in roster.adverts
    )
    with pytest.raises(KeySubstitution, match="p01") as err:
        net.clients["p00"].share_keys(replace(roster, adverts=swapped))
    assert isinstance(err.value.__cause__, BadSignature)


def test_replayed_advertisement_from_another_job_is_rejected() -> None:
    old = Net(4, threshold=3)
    new = Net(4, threshold=3)
    stale = old.clients["p00"].advertise_keys()
    with pytest.raises(WrongJob):
        new.server.receive(stale, sender="p00")
    # Same bytes relabelled with the new job id: the signature covers the job.
    with pytest.raises(BadSignature):
        new.server.receive(replace(stale, job_id=new.spec.job_id), sender="p00")


def test_forged_share_in_transit_is_caught_by_the_holder() -> None:
    net = Net(4, threshold=3)
    net.advertise()
    net.share()
    bundle = net.server.bundle_for("p02")
    items = tuple(
        replace(i, share=replace(i.share, nonce=flip(i.share.nonce))) if i.sender == "p01" else i
        for i in bundle.items
    )
    with pytest.raises(ForgedShare):
        net.clients["p02"].receive_shares(replace(bundle, items=items))


def test_forged_revealed_share_is_caught_by_the_coordinator() -> None:
    net = Net(4, threshold=3)
    net.advertise()
    net.share()
    net.masked()
    response = net.clients["p00"].unmask(net.server.unmask_request_for("p00"))
    lie = replace(response.shares[0], share=bytes(len(response.shares[0].share)))
    with pytest.raises(ForgedShare):
        net.server.receive(replace(response, shares=(lie, *response.shares[1:])), sender="p00")


def test_asking_for_both_kinds_of_share_is_refused() -> None:
    """Without the consistency round a participant still never reveals both shares
    of one owner in one request."""
    net = Net(4, threshold=2)
    net.advertise()
    net.share()
    net.masked()
    request = net.server.unmask_request_for("p00")
    with pytest.raises(OverlappingReveal):
        net.clients["p00"].unmask(replace(request, dropouts=("p01",)))
    with pytest.raises(JobAborted):  # and it will not be asked again
        net.clients["p00"].unmask(request)


def test_split_view_attack_is_stopped_by_the_consistency_round() -> None:
    """The coordinator tells p00 that p04 survived (to collect p04's seed share) and
    tells others that p04 dropped (to collect its mask-key share). With the signed
    survivor set, a participant reveals only for the set it signed, backed by t
    signatures over that same set — which the coordinator cannot gather for two sets
    when 2t exceeds the holders."""
    net = Net(5, threshold=3, consistency=True)
    net.advertise()
    net.share()
    net.masked()
    spec = net.spec
    everyone = tuple(net.ids)
    without_p04 = everyone[:4]
    sig_all = {
        p: net.clients[p].consistency_signature(
            ConsistencyRequest(job_id=spec.job_id, survivors=everyone)
        )
        for p in ("p00", "p01")
    }
    sig_partial = {
        p: net.clients[p].consistency_signature(
            ConsistencyRequest(job_id=spec.job_id, survivors=without_p04)
        )
        for p in ("p02", "p03")
    }
    from spherecal.crypto.messages import SurvivorSignature

    # Only two signatures exist for each view: below t = 3 for both.
    request_all = UnmaskRequest(
        job_id=spec.job_id,
        recipient="p00",
        survivors=everyone,
        dropouts=(),
        signatures=tuple(SurvivorSignature(p, s.signature) for p, s in sig_all.items()),
    )
    with pytest.raises(Exception) as err:
        net.clients["p00"].unmask(request_all)
    assert "consistency signatures" in str(err.value)
    # Mixing signatures from the other view does not help: they do not verify.
    mixed = UnmaskRequest(
        job_id=spec.job_id,
        recipient="p02",
        survivors=without_p04,
        dropouts=("p04",),
        signatures=tuple(
            sorted(
                [SurvivorSignature(p, s.signature) for p, s in sig_partial.items()]
                + [SurvivorSignature("p01", sig_all["p01"].signature)],
                key=lambda s: s.signer,
            )
        ),
    )
    with pytest.raises(BadSignature):
        net.clients["p02"].unmask(mixed)
    # And a participant cannot be asked to reveal for a set other than the one it signed.
    with pytest.raises(InconsistentSurvivors):
        net.clients["p03"].unmask(replace(mixed, recipient="p03", survivors=everyone, dropouts=()))


def test_participant_never_changes_its_input_within_a_job() -> None:
    net = Net(3, threshold=2)
    net.advertise()
    net.share()
    net.deliver_bundles()
    client = net.clients["p00"]
    client.set_input(np.zeros(net.spec.length))
    with pytest.raises(OutOfStage):
        client.set_input(np.full(net.spec.length, 0.5))
