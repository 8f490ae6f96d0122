"""Every participant-side refusal, each with a test that fails if the check is removed."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from spherecal.crypto import (
    BadKey,
    BadSignature,
    ComplaintReason,
    DoubleReveal,
    EncodingOverflow,
    Excluded,
    ForgedShare,
    InconsistentSurvivors,
    InvalidSpec,
    JobAborted,
    JobReplayed,
    KeySubstitution,
    MemoryJobLedger,
    OutOfStage,
    OverlappingReveal,
    ParticipantStage,
    SecAggParticipant,
    ShareComplaint,
    ShareKind,
    TooFewSurvivors,
    UnknownParticipant,
    WrongJob,
    WrongLength,
    WrongRecipient,
    generate_identity,
    identity_public_bytes,
)
from spherecal.crypto.keys import JobKeys, advert_payload, seed_commitment, sign, survivors_payload
from spherecal.crypto.messages import (
    AdvertiseKeys,
    ConsistencyRequest,
    RoutedShare,
    SurvivorSignature,
    UnmaskRequest,
)
from spherecal.crypto.replay import default_ledger
from spherecal.crypto.ring import encode

from .helpers import Net, flip


def advertised(n: int = 4, **kwargs: object) -> Net:
    net = Net(n, **kwargs)  # type: ignore[arg-type]
    net.advertise()
    return net


def until_masked(n: int = 4, **kwargs: object) -> Net:
    net = advertised(n, **kwargs)
    net.share()
    net.masked(close=False)
    return net


def until_unmask(n: int = 4, *, masked_skip: tuple[str, ...] = (), **kwargs: object) -> Net:
    net = advertised(n, **kwargs)
    net.share()
    net.masked(masked_skip)
    return net


def assert_failed(net: Net, pid: str) -> None:
    client = net.clients[pid]
    assert client.stage is ParticipantStage.FAILED
    with pytest.raises(JobAborted):
        client.masked_chunk(0)


# ------------------------------------------------------------------- construction
def test_second_run_of_the_same_job_id_is_refused() -> None:
    net = Net(3, threshold=2, consistency=True)
    with pytest.raises(JobReplayed):
        SecAggParticipant(net.spec, "p00", net.identities["p00"], net.directory, ledger=net.ledger)
    # A different participant, or the same one in another job, is fine.
    other = Net(3, threshold=2, consistency=True)
    SecAggParticipant(
        other.spec, "p00", other.identities["p00"], other.directory, ledger=net.ledger
    )


def test_default_ledger_is_process_wide() -> None:
    net = Net(3, threshold=2, consistency=True)
    SecAggParticipant(net.spec, "p01", net.identities["p01"], net.directory)
    assert ("p01", net.spec.job_id) in default_ledger()
    with pytest.raises(JobReplayed):
        SecAggParticipant(net.spec, "p01", net.identities["p01"], net.directory)


def test_construction_checks_identity_and_membership() -> None:
    net = Net(3, threshold=2, consistency=True)
    ledger = MemoryJobLedger()
    with pytest.raises(UnknownParticipant):
        SecAggParticipant(net.spec, "zz", generate_identity(), net.directory, ledger=ledger)
    with pytest.raises(BadKey, match="directory"):
        SecAggParticipant(net.spec, "p00", generate_identity(), net.directory, ledger=ledger)
    partial = {k: v for k, v in net.directory.items() if k != "p02"}
    with pytest.raises(InvalidSpec, match="directory lacks"):
        SecAggParticipant(net.spec, "p00", net.identities["p00"], partial, ledger=ledger)


# --------------------------------------------------------------------------- input
def test_wrong_length_and_out_of_bound_inputs_are_refused_without_failing_the_job() -> None:
    net = Net(3, threshold=2, length=6)
    client = net.clients["p00"]
    with pytest.raises(WrongLength, match="length 6"):
        client.set_input(np.zeros(5))
    with pytest.raises(EncodingOverflow, match="1 of 6 entries"):
        client.set_input(np.array([0, 0, 0, 0, 0, 2.0]))
    with pytest.raises(EncodingOverflow, match="NaN"):
        client.set_input(np.array([0, 0, 0, 0, 0, np.nan]))
    with pytest.raises(WrongLength):
        client.set_input(np.zeros(6), noise=np.zeros(5, dtype=np.int64))
    with pytest.raises(EncodingOverflow, match="noise bound 0"):
        client.set_input(np.zeros(6), noise=np.ones(6, dtype=np.int64))
    assert not client.has_input and client.stage is ParticipantStage.ADVERTISE
    client.set_input(np.zeros(6))
    with pytest.raises(OutOfStage, match="cannot change"):
        client.set_input(np.ones(6) / 2)


# ------------------------------------------------------------------------- roster
def test_forged_key_in_roster_is_refused() -> None:
    net = advertised()
    roster = net.server.roster_for("p00")
    attacker = JobKeys.generate()
    victim = roster.adverts[1]
    forged = replace(victim, masking_public=attacker.masking_public)
    tampered = replace(roster, adverts=(roster.adverts[0], forged, *roster.adverts[2:]))
    with pytest.raises(KeySubstitution, match=victim.sender) as err:
        net.clients["p00"].share_keys(tampered)
    assert err.value.kind == "key_substitution"
    assert isinstance(err.value.__cause__, BadSignature)
    assert_failed(net, "p00")


def test_replaced_own_keys_are_refused_even_if_validly_signed() -> None:
    net = advertised()
    roster = net.server.roster_for("p00")
    spec = net.spec
    other = JobKeys.generate()
    commitment = seed_commitment(spec.digest, "p00", other.seed)
    payload = advert_payload(
        spec_digest=spec.digest,
        job_id=spec.job_id,
        sender="p00",
        channel_public=other.channel_public,
        masking_public=other.masking_public,
        commitment=commitment,
    )
    fake_own = AdvertiseKeys(
        job_id=spec.job_id,
        sender="p00",
        channel_public=other.channel_public,
        masking_public=other.masking_public,
        seed_commitment=commitment,
        signature=sign(net.identities["p00"], payload),
    )
    tampered = replace(roster, adverts=(fake_own, *roster.adverts[1:]))
    with pytest.raises(KeySubstitution, match="different keys"):
        net.clients["p00"].share_keys(tampered)


def test_roster_for_someone_else_or_another_job_is_refused() -> None:
    net = advertised()
    with pytest.raises(WrongRecipient):
        net.clients["p00"].share_keys(net.server.roster_for("p01"))
    assert_failed(net, "p00")
    roster = net.server.roster_for("p01")
    with pytest.raises(WrongJob):
        net.clients["p01"].share_keys(replace(roster, job_id=b"another job"))


def test_roster_that_leaves_me_out_or_lists_strangers_is_refused() -> None:
    net = advertised()
    roster = net.server.roster_for("p00")
    with pytest.raises(Excluded):
        net.clients["p00"].share_keys(
            replace(roster, members=roster.members[1:], adverts=roster.adverts[1:])
        )
    roster = net.server.roster_for("p01")
    with pytest.raises(UnknownParticipant):
        net.clients["p01"].share_keys(replace(roster, members=(*roster.members, "zz")))


def test_roster_with_too_few_members_is_refused_with_counts() -> None:
    net = advertised(5, threshold=4)
    roster = net.server.roster_for("p00")
    small = replace(roster, members=roster.members[:3], adverts=roster.adverts[:3])
    with pytest.raises(TooFewSurvivors) as err:
        net.clients["p00"].share_keys(small)
    assert (err.value.needed, err.value.remaining, err.value.stage) == (4, 3, "share")
    assert "needed at least 4" in str(err.value) and "only 3 remained" in str(err.value)


def test_roster_missing_a_neighbours_advert_is_refused() -> None:
    net = advertised()
    roster = net.server.roster_for("p00")
    with pytest.raises(InconsistentSurvivors):
        net.clients["p00"].share_keys(replace(roster, adverts=roster.adverts[:-1]))


def test_harary_neighbourhood_below_threshold_is_refused() -> None:
    net = advertised(8, threshold=3, graph="harary", degree=2)
    graph = net.spec.masking_graph
    victim = "p00"
    roster = net.server.roster_for(victim)
    # Pretend one neighbour never advertised: only 2 holders (<t=3) remain around p00.
    gone = sorted(graph.neighbours(victim))[0]
    members = tuple(m for m in roster.members if m != gone)
    adverts = tuple(a for a in roster.adverts if a.sender != gone)
    with pytest.raises(TooFewSurvivors, match="share holders"):
        net.clients[victim].share_keys(replace(roster, members=members, adverts=adverts))


# ------------------------------------------------------------------------- bundle
def test_tampered_share_ciphertext_is_refused() -> None:
    net = advertised()
    net.share()
    bundle = net.server.bundle_for("p00")
    item = bundle.items[1]
    bad = replace(item, share=replace(item.share, ciphertext=flip(item.share.ciphertext, 7)))
    with pytest.raises(ForgedShare, match="authentication"):
        net.clients["p00"].receive_shares(
            replace(bundle, items=(bundle.items[0], bad, *bundle.items[2:]))
        )
    assert_failed(net, "p00")


def test_tampered_share_commitment_or_x_is_refused() -> None:
    net = advertised()
    net.share()
    bundle = net.server.bundle_for("p00")
    item = bundle.items[1]
    bad = replace(item, share=replace(item.share, seed_commitment=bytes(32)))
    with pytest.raises(ForgedShare):
        net.clients["p00"].receive_shares(
            replace(bundle, items=(bundle.items[0], bad, *bundle.items[2:]))
        )
    bundle = net.server.bundle_for("p01")
    item = bundle.items[0]
    bad = replace(item, share=replace(item.share, x=item.share.x + 1))
    with pytest.raises(ForgedShare, match="wrong_position") as err:
        net.clients["p01"].receive_shares(replace(bundle, items=(bad, *bundle.items[1:])))
    complaint = err.value.complaint
    assert isinstance(complaint, ShareComplaint)
    assert (complaint.complainant, complaint.dealer) == ("p01", item.sender)
    assert complaint.reason is ComplaintReason.WRONG_POSITION
    assert net.clients["p01"].complaints == [complaint]


def test_ciphertext_for_someone_else_is_refused() -> None:
    net = advertised()
    net.share()
    mine = net.server.bundle_for("p00")
    theirs = net.server.bundle_for("p01")
    stolen = RoutedShare(sender=mine.items[1].sender, share=theirs.items[1].share)
    assert stolen.share.receiver == "p01"
    with pytest.raises(WrongRecipient, match="addressed to 'p01'"):
        net.clients["p00"].receive_shares(
            replace(mine, items=(mine.items[0], stolen, *mine.items[2:]))
        )
    with pytest.raises(WrongRecipient):
        net.clients["p02"].receive_shares(net.server.bundle_for("p03"))


def test_ciphertext_relabelled_for_me_fails_authentication() -> None:
    net = advertised()
    net.share()
    mine = net.server.bundle_for("p00")
    theirs = net.server.bundle_for("p01")
    # Same dealer, its share for p01 relabelled to p00 (with p00's x): the AAD differs.
    dealer_item = next(i for i in theirs.items if i.sender == "p02")
    my_item = next(i for i in mine.items if i.sender == "p02")
    relabelled = replace(
        dealer_item, share=replace(dealer_item.share, receiver="p00", x=my_item.share.x)
    )
    items = tuple(relabelled if i.sender == "p02" else i for i in mine.items)
    with pytest.raises(ForgedShare):
        net.clients["p00"].receive_shares(replace(mine, items=items))


def test_bundle_with_missing_share_or_too_few_members_is_refused() -> None:
    net = advertised(5, threshold=3)
    net.share()
    bundle = net.server.bundle_for("p00")
    with pytest.raises(InconsistentSurvivors, match="exactly one share"):
        net.clients["p00"].receive_shares(replace(bundle, items=bundle.items[:-1]))
    bundle = net.server.bundle_for("p01")
    with pytest.raises(TooFewSurvivors) as err:
        net.clients["p01"].receive_shares(
            replace(bundle, members=("p00", "p01"), items=bundle.items[:2])
        )
    assert (err.value.needed, err.value.remaining) == (3, 2)
    bundle = net.server.bundle_for("p02")
    with pytest.raises(Excluded):
        net.clients["p02"].receive_shares(replace(bundle, members=("p00", "p01", "p03")))


def test_bundle_listing_a_participant_that_never_advertised_is_refused() -> None:
    net = Net(5, threshold=3)
    net.advertise(skip=["p04"])
    net.share()
    bundle = net.server.bundle_for("p00")
    with pytest.raises(InconsistentSurvivors, match="never advertised"):
        net.clients["p00"].receive_shares(replace(bundle, members=(*bundle.members, "p04")))


# ---------------------------------------------------------------- masked input
def test_masked_chunks_are_deterministic_and_need_input_and_shares() -> None:
    net = advertised(3, threshold=2)
    net.share()
    client = net.clients["p00"]
    with pytest.raises(OutOfStage):
        client.masked_chunk(0)
    client.receive_shares(net.server.bundle_for("p00"))
    with pytest.raises(OutOfStage, match="set_input"):
        client.masked_chunk(0)
    client.set_input(net.inputs["p00"])
    first = [c.to_bytes() for c in client.masked_chunks()]
    assert [c.to_bytes() for c in client.masked_chunks()] == first
    plain = encode(net.inputs["p00"], scale_bits=net.spec.scale_bits, bound=1.0).tobytes()
    assert b"".join(c.payload for c in client.masked_chunks()) != plain
    with pytest.raises(IndexError):
        client.masked_chunk(net.spec.n_chunks)


def test_stage_order_is_enforced() -> None:
    net = Net(3, threshold=2)
    client = net.clients["p00"]
    with pytest.raises(OutOfStage):
        client.unmask(
            UnmaskRequest(job_id=net.spec.job_id, recipient="p00", survivors=(), dropouts=())
        )
    client.advertise_keys()
    with pytest.raises(OutOfStage):
        client.advertise_keys()
    assert client.stage is ParticipantStage.SHARE  # OutOfStage does not fail the job


def test_consistency_round_only_when_the_job_has_one() -> None:
    net = until_unmask(4, threshold=3)
    request = ConsistencyRequest(job_id=net.spec.job_id, survivors=tuple(net.ids))
    with pytest.raises(OutOfStage, match="no consistency"):
        net.clients["p00"].consistency_signature(request)


# ----------------------------------------------------------------------- unmask
def request_for(net: Net, pid: str, **changes: object) -> UnmaskRequest:
    return replace(net.server.unmask_request_for(pid), **changes)  # type: ignore[arg-type]


def test_overlapping_survivors_and_dropouts_are_refused() -> None:
    net = until_unmask(5, threshold=3, masked_skip=("p04",))
    request = request_for(net, "p00", dropouts=("p03", "p04"))
    with pytest.raises(OverlappingReveal, match="both as survivors and as dropouts"):
        net.clients["p00"].unmask(request)
    assert_failed(net, "p00")


def test_unmask_with_fewer_than_t_survivors_is_refused() -> None:
    net = until_unmask(5, threshold=4)
    request = request_for(net, "p00", survivors=("p00", "p01", "p02"), dropouts=("p03", "p04"))
    with pytest.raises(TooFewSurvivors) as err:
        net.clients["p00"].unmask(request)
    assert (err.value.needed, err.value.remaining, err.value.stage) == (4, 3, "unmask")


def test_unmask_below_min_participants_is_refused() -> None:
    net = until_unmask(5, threshold=2, min_participants=4)
    request = request_for(net, "p00", survivors=("p00", "p01", "p02"), dropouts=("p03", "p04"))
    with pytest.raises(TooFewSurvivors, match="needed at least 4"):
        net.clients["p00"].unmask(request)


def test_unmask_listing_me_as_dropout_or_strangers_is_refused() -> None:
    net = until_unmask(5, threshold=3)
    with pytest.raises(InconsistentSurvivors, match="not listed as a survivor"):
        net.clients["p00"].unmask(
            request_for(net, "p00", survivors=("p01", "p02", "p03", "p04"), dropouts=("p00",))
        )
    net2 = Net(5, threshold=3)
    net2.advertise(skip=["p04"])
    net2.share()
    net2.masked()
    with pytest.raises(InconsistentSurvivors, match="outside U2"):
        net2.clients["p00"].unmask(request_for(net2, "p00", dropouts=("p04",)))


def test_unmask_request_for_someone_else_is_refused() -> None:
    net = until_unmask(4, threshold=3)
    with pytest.raises(WrongRecipient):
        net.clients["p00"].unmask(net.server.unmask_request_for("p01"))


def test_disconnected_survivor_group_is_refused() -> None:
    net = Net(8, threshold=2, graph="harary", degree=2, min_participants=3)
    net.advertise()
    net.share()
    net.masked()
    graph = net.spec.masking_graph
    me = "p00"
    left, right = sorted(graph.neighbours(me))
    survivors = tuple(sorted(set(net.ids) - {left, right}))
    request = request_for(net, me, survivors=survivors, dropouts=tuple(sorted({left, right})))
    with pytest.raises(TooFewSurvivors, match="connected to this participant"):
        net.clients[me].unmask(request)


def test_reveals_seed_shares_for_survivors_and_key_shares_for_dropouts_only() -> None:
    net = until_unmask(5, threshold=3, masked_skip=("p04",))
    response = net.clients["p00"].unmask(net.server.unmask_request_for("p00"))
    kinds = {s.owner: s.kind for s in response.shares}
    assert kinds == {
        "p00": ShareKind.SEED,
        "p01": ShareKind.SEED,
        "p02": ShareKind.SEED,
        "p03": ShareKind.SEED,
        "p04": ShareKind.MASK_KEY,
    }
    client = net.clients["p00"]
    assert client.stage is ParticipantStage.DONE
    request = net.server.unmask_request_for("p00")
    # A lost response can be retried: the identical request gets the identical answer.
    assert client.unmask(request) == response
    with pytest.raises(DoubleReveal):  # any other second request is refused
        client.unmask(replace(request, survivors=request.survivors[:-1]))
    with pytest.raises(OutOfStage):
        client.masked_chunk(0)


def test_unmask_of_a_job_with_consistency_needs_the_signed_set_and_signatures() -> None:
    net = until_unmask(5, threshold=3, consistency=True, masked_skip=("p04",))
    net.consistency()
    good = net.server.unmask_request_for("p00")
    assert len(good.signatures) == 3  # t of the 4 survivors' signatures suffice
    client = net.clients

    with pytest.raises(InconsistentSurvivors, match="differs from the one"):
        client["p00"].unmask(
            replace(good, survivors=("p00", "p01", "p02"), dropouts=("p03", "p04"))
        )
    bad_sig = replace(good.signatures[1], signature=flip(good.signatures[1].signature))
    with pytest.raises(BadSignature, match="survivor-set signature"):
        client["p01"].unmask(
            replace(
                net.server.unmask_request_for("p01"),
                signatures=(good.signatures[0], bad_sig, *good.signatures[2:]),
            )
        )
    with pytest.raises(TooFewSurvivors, match="consistency signatures"):
        client["p02"].unmask(
            replace(net.server.unmask_request_for("p02"), signatures=good.signatures[:2])
        )
    stranger = SurvivorSignature(
        signer="p04",
        signature=sign(
            net.identities["p04"],
            survivors_payload(
                spec_digest=net.spec.digest, job_id=net.spec.job_id, survivors=good.survivors
            ),
        ),
    )
    with pytest.raises(InconsistentSurvivors, match="not a survivor"):
        client["p03"].unmask(
            replace(net.server.unmask_request_for("p03"), signatures=(*good.signatures, stranger))
        )


def test_consistency_request_is_checked_like_a_survivor_view() -> None:
    net = until_unmask(5, threshold=3, consistency=True)
    spec = net.spec
    with pytest.raises(TooFewSurvivors):
        net.clients["p00"].consistency_signature(
            ConsistencyRequest(job_id=spec.job_id, survivors=("p00", "p01"))
        )
    with pytest.raises(InconsistentSurvivors):
        net.clients["p01"].consistency_signature(
            ConsistencyRequest(job_id=spec.job_id, survivors=("p00", "p02", "p03"))
        )
    with pytest.raises(WrongJob):
        net.clients["p02"].consistency_signature(
            ConsistencyRequest(job_id=b"other", survivors=tuple(net.ids))
        )


def test_graph_mode_requires_signatures_from_the_owner_holders() -> None:
    # Harary k=4 on 9 participants: each owner has 5 holders, t=3 (2t > 5).
    net = Net(9, threshold=3, graph="harary", degree=4, consistency=True)
    net.advertise()
    net.share()
    net.masked()
    net.consistency()
    graph = net.spec.masking_graph
    me = "p00"
    # every survivor's signature (the coordinator itself sends only a sufficient subset)
    good = replace(
        net.server.unmask_request_for(me),
        signatures=tuple(
            SurvivorSignature(signer=p, signature=net.signatures[p].signature)
            for p in sorted(net.signatures)
        ),
    )
    # Keep only signatures from outside one neighbour's holder set (plus enough
    # overall): p00 must refuse to reveal that neighbour's share.
    owner = sorted(graph.neighbours(me))[0]
    holders = set(graph.closed(owner))
    kept = tuple(s for s in good.signatures if s.signer not in holders or s.signer == me)
    assert len(kept) >= net.spec.threshold
    with pytest.raises(TooFewSurvivors, match="share holders of"):
        net.clients[me].unmask(replace(good, signatures=kept))


def test_repr_hides_secrets() -> None:
    net = Net(3, threshold=2)
    text = repr(net.clients["p00"])
    assert "p00" in text and "stage=advertise" in text
    assert identity_public_bytes(net.identities["p00"]).hex() not in text


# ------------------------------------------------- checks that overlap in easy cases
def test_spec_must_be_a_jobspec() -> None:
    net = Net(3, threshold=2)
    with pytest.raises(InvalidSpec):
        SecAggParticipant(
            net.spec.to_bytes(),  # type: ignore[arg-type]
            "p00",
            net.identities["p00"],
            net.directory,
            ledger=MemoryJobLedger(),
        )


def test_roster_below_min_participants_is_refused_even_with_enough_holders() -> None:
    net = advertised(5, threshold=2, min_participants=4)
    roster = net.server.roster_for("p00")
    small = replace(roster, members=roster.members[:3], adverts=roster.adverts[:3])
    with pytest.raises(TooFewSurvivors) as err:
        net.clients["p00"].share_keys(small)
    assert (err.value.needed, err.value.remaining, err.value.what) == (4, 3, "survivors")


def test_bundle_below_min_participants_is_refused_even_with_enough_holders() -> None:
    net = advertised(5, threshold=2, min_participants=4)
    net.share()
    bundle = net.server.bundle_for("p00")
    small = replace(bundle, members=bundle.members[:3], items=bundle.items[:3])
    with pytest.raises(TooFewSurvivors) as err:
        net.clients["p00"].receive_shares(small)
    assert (err.value.needed, err.value.remaining, err.value.stage) == (4, 3, "masked")


def test_unmask_below_t_is_refused_even_when_min_participants_is_low() -> None:
    net = until_unmask(5, threshold=4, min_participants=2)
    request = request_for(net, "p00", survivors=("p00", "p01", "p02"), dropouts=("p03", "p04"))
    with pytest.raises(TooFewSurvivors) as err:
        net.clients["p00"].unmask(request)
    assert (err.value.needed, err.value.remaining, err.value.what) == (4, 3, "survivors")


def test_harary_bundle_with_too_few_live_neighbours_is_refused() -> None:
    net = advertised(9, threshold=3, graph="harary", degree=4)
    net.share()
    graph = net.spec.masking_graph
    me = "p00"
    gone = set(sorted(graph.neighbours(me))[:3])  # 2 holders left around me (< t = 3)
    bundle = net.server.bundle_for(me)
    members = tuple(m for m in bundle.members if m not in gone)
    items = tuple(i for i in bundle.items if i.sender not in gone)
    with pytest.raises(TooFewSurvivors, match="share holders"):
        net.clients[me].receive_shares(replace(bundle, members=members, items=items))


def test_advert_or_bundle_of_another_job_is_refused() -> None:
    net = advertised()
    roster = net.server.roster_for("p00")
    relabelled = replace(roster.adverts[1], job_id=b"another job")
    with pytest.raises(WrongJob):
        net.clients["p00"].share_keys(
            replace(roster, adverts=(roster.adverts[0], relabelled, *roster.adverts[2:]))
        )
    net2 = advertised()
    net2.share()
    with pytest.raises(WrongJob):
        net2.clients["p00"].receive_shares(
            replace(net2.server.bundle_for("p00"), job_id=b"another job")
        )


def test_share_whose_content_does_not_match_its_commitment_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A malicious dealer publishing commitments that do not match the shares would
    make the holder look like a forger at unmasking; the holder refuses up front."""
    import os

    from spherecal.crypto.channel import SharePlaintext

    net = advertised(4, threshold=3)
    with monkeypatch.context() as m:
        m.setattr(SharePlaintext, "commitment", lambda self, *a, **k: os.urandom(32))
        net.server.receive(net.clients["p03"].share_keys(net.server.roster_for("p03")))
    for p in ("p00", "p01", "p02"):
        net.server.receive(net.clients[p].share_keys(net.server.roster_for(p)))
    net.server.close_stage()
    with pytest.raises(ForgedShare, match="commitment_mismatch") as err:
        net.clients["p00"].receive_shares(net.server.bundle_for("p00"))
    complaint = err.value.complaint
    assert isinstance(complaint, ShareComplaint) and complaint.dealer == "p03"
    assert complaint.reason is ComplaintReason.COMMITMENT_MISMATCH


def test_set_input_after_failure_or_after_unmasking_is_refused() -> None:
    net = until_unmask(4, threshold=3)
    with pytest.raises(OverlappingReveal):
        net.clients["p00"].unmask(request_for(net, "p00", dropouts=("p01",)))
    with pytest.raises(JobAborted):
        net.clients["p00"].set_input(np.zeros(net.spec.length))
    fresh = until_unmask(4, threshold=3)
    fresh.clients["p01"].unmask(fresh.server.unmask_request_for("p01"))
    with pytest.raises(OutOfStage, match="too late"):
        fresh.clients["p01"].set_input(np.zeros(fresh.spec.length))


def test_too_few_consistency_signatures_is_its_own_refusal() -> None:
    net = until_unmask(5, threshold=3, consistency=True)
    net.consistency()
    good = net.server.unmask_request_for("p00")
    with pytest.raises(TooFewSurvivors) as err:
        net.clients["p00"].unmask(replace(good, signatures=good.signatures[:2]))
    assert err.value.what == "consistency signatures"
    assert (err.value.needed, err.value.remaining) == (3, 2)
