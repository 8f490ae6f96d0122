"""Server-side rules: typed rejections that leave the job intact, streaming, memory."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from spherecal.crypto import (
    BadKey,
    BadSignature,
    DuplicateMessage,
    Excluded,
    ForgedShare,
    InvalidSpec,
    JobAborted,
    MalformedMessage,
    OutOfStage,
    SecAggServer,
    SenderMismatch,
    Stage,
    TooFewSurvivors,
    UnexpectedShare,
    UnknownParticipant,
    UploadSlotsBusy,
    WrongJob,
    WrongLength,
    WrongRecipient,
    shamir,
)
from spherecal.crypto.consistency import signers_counted
from spherecal.crypto.keys import JobKeys, advert_payload, seed_commitment, sign
from spherecal.crypto.messages import AdvertiseKeys, MaskedChunk, RevealedShare

from .helpers import Net, flip


def assert_correct(net: Net, result: object, contributors: set[str]) -> None:
    assert set(result.contributors) == contributors  # type: ignore[attr-defined]
    error = np.abs(result.values - net.expected(sorted(contributors)))  # type: ignore[attr-defined]
    assert np.all(error <= net.tolerance())


# ------------------------------------------------------------------- advertise
def test_advertise_rejections_keep_the_job_alive() -> None:
    net = Net(4, threshold=3)
    server, clients = net.server, net.clients
    adverts = {p: clients[p].advertise_keys() for p in net.ids}
    with pytest.raises(UnknownParticipant):
        server.receive(replace(adverts["p00"], sender="mallory"))
    with pytest.raises(SenderMismatch):
        server.receive(adverts["p00"], sender="p01")
    with pytest.raises(WrongJob):
        server.receive(replace(adverts["p00"], job_id=b"other"))
    with pytest.raises(BadSignature):
        server.receive(replace(adverts["p00"], signature=flip(adverts["p00"].signature)))
    assert "p00" in server.pending()  # nothing stored
    for p in net.ids:
        server.receive(adverts[p], sender=p)
    with pytest.raises(DuplicateMessage):
        server.receive(adverts["p00"], sender="p00")
    server.close_stage()
    net.share()
    net.masked()
    assert_correct(net, net.unmask(), set(net.ids))


def _signed_advert(net: Net, pid: str, channel: bytes, masking: bytes) -> AdvertiseKeys:
    spec = net.spec
    commitment = seed_commitment(spec.digest, pid, b"\x00" * 16)
    payload = advert_payload(
        spec_digest=spec.digest,
        job_id=spec.job_id,
        sender=pid,
        channel_public=channel,
        masking_public=masking,
        commitment=commitment,
    )
    return AdvertiseKeys(
        job_id=spec.job_id,
        sender=pid,
        channel_public=channel,
        masking_public=masking,
        seed_commitment=commitment,
        signature=sign(net.identities[pid], payload),
    )


def test_low_order_and_copied_keys_are_rejected_even_when_signed() -> None:
    net = Net(4, threshold=3)
    honest = net.clients["p00"].advertise_keys()
    net.server.receive(honest)
    fresh = JobKeys.generate()
    with pytest.raises(BadKey, match="low order"):
        net.server.receive(_signed_advert(net, "p01", bytes(32), fresh.masking_public))
    with pytest.raises(BadKey, match="already in use"):
        net.server.receive(_signed_advert(net, "p01", fresh.channel_public, honest.masking_public))
    with pytest.raises(BadKey, match="already in use"):
        net.server.receive(_signed_advert(net, "p01", fresh.channel_public, fresh.channel_public))


def test_messages_of_another_stage_are_out_of_stage() -> None:
    net = Net(3, threshold=2)
    net.advertise()
    with pytest.raises(OutOfStage):
        net.server.receive(
            MaskedChunk(job_id=net.spec.job_id, sender="p00", index=0, payload=bytes(8 * 4))
        )
    with pytest.raises(OutOfStage):
        net.server.consistency_request()
    with pytest.raises(OutOfStage):
        net.server.finish()
    with pytest.raises(OutOfStage, match="does not accept"):
        net.server.receive(net.server.roster_for("p00"))
    with pytest.raises(MalformedMessage):
        net.server.receive_bytes(b"not a message")


def test_dropout_before_sharing_is_left_out() -> None:
    net = Net(5, threshold=3)
    net.advertise(skip=["p04"])
    assert net.server.advertised == frozenset(net.ids[:4])
    with pytest.raises(Excluded):
        net.server.roster_for("p04")
    net.share(skip=["p03"])
    assert net.server.shared == frozenset(net.ids[:3])
    with pytest.raises(Excluded):
        net.server.bundle_for("p03")
    net.masked()
    result = net.unmask()
    assert result.excluded == ("p03", "p04") and result.dropouts == ()
    assert_correct(net, result, {"p00", "p01", "p02"})


# ----------------------------------------------------------------------- share
def test_share_keys_rejections() -> None:
    net = Net(5, threshold=3)
    net.advertise(skip=["p04"])
    rosters = {p: net.server.roster_for(p) for p in net.ids[:4]}
    msgs = {p: net.clients[p].share_keys(rosters[p]) for p in net.ids[:4]}
    with pytest.raises(Excluded):
        net.server.receive(replace(msgs["p00"], sender="p04"))
    with pytest.raises(WrongRecipient, match="one share to each"):
        net.server.receive(replace(msgs["p00"], shares=msgs["p00"].shares[:-1]))
    swapped = tuple(replace(s, x=len(msgs["p01"].shares) + 1 - s.x) for s in msgs["p01"].shares)
    with pytest.raises(MalformedMessage, match="x-coordinates"):
        net.server.receive(replace(msgs["p01"], shares=swapped))
    for p, m in msgs.items():
        net.server.receive(m, sender=p)
    with pytest.raises(DuplicateMessage):
        net.server.receive(msgs["p00"], sender="p00")
    net.server.close_stage()
    net.masked()
    assert_correct(net, net.unmask(), set(net.ids[:4]))


# --------------------------------------------------------------------- streaming
def test_chunk_rejections_do_not_corrupt_the_sum() -> None:
    net = Net(5, threshold=3, length=11, chunk_size=4)  # chunks of 4, 4, 3 entries
    net.advertise()
    net.share(skip=["p04"])
    net.deliver_bundles()
    server = net.server
    for p in net.ids[:4]:
        net.clients[p].set_input(net.inputs[p])
    chunks = {p: list(net.clients[p].masked_chunks()) for p in net.ids[:4]}
    server.receive(chunks["p00"][0], sender="p00")
    with pytest.raises(DuplicateMessage, match="chunk 0"):
        server.receive(chunks["p00"][0], sender="p00")
    with pytest.raises(WrongLength, match="3 entries"):
        server.absorb_chunk("p00", 2, bytes(chunks["p00"][2].payload) + bytes(8))
    with pytest.raises(WrongLength):
        server.absorb_chunk("p00", 1, chunks["p00"][1].payload[:-1])
    with pytest.raises(MalformedMessage, match="out of range"):
        server.absorb_chunk("p00", 3, chunks["p00"][2].payload)
    with pytest.raises(UnknownParticipant):
        server.absorb_chunk("mallory", 1, chunks["p00"][1].payload)
    with pytest.raises(Excluded):
        server.absorb_chunk("p04", 1, chunks["p00"][1].payload)
    with pytest.raises(SenderMismatch):
        server.receive(chunks["p01"][0], sender="p02")
    with pytest.raises(WrongJob):
        server.receive(replace(chunks["p01"][0], job_id=b"other"), sender="p01")
    # Chunks may arrive in any order.
    for chunk in reversed(chunks["p00"][1:]):
        server.receive(chunk, sender="p00")
    with pytest.raises(DuplicateMessage, match="complete"):
        server.receive(chunks["p00"][1], sender="p00")
    for p in ("p01", "p02", "p03"):
        for chunk in chunks[p]:
            server.absorb_chunk(p, chunk.index, chunk.payload)
    server.close_stage()
    result = net.unmask()
    assert result.dropouts == () and result.excluded == ("p04",)
    assert_correct(net, result, {"p00", "p01", "p02", "p03"})


def test_slots_bound_concurrent_uploads_and_memory() -> None:
    net = Net(4, threshold=3, length=10, chunk_size=2, max_in_flight=1)
    net.advertise()
    net.share()
    net.deliver_bundles()
    for p in net.ids:
        net.clients[p].set_input(net.inputs[p])
    server = net.server
    first = net.clients["p00"].masked_chunk(0)
    server.receive(first, sender="p00")
    # the accumulator + the in-flight upload's one chunk (held to subtract if abandoned)
    assert server.memory_bytes() == 8 * 10 + 8 * 2
    with pytest.raises(UploadSlotsBusy):
        server.receive(net.clients["p01"].masked_chunk(0), sender="p01")
    assert server.uploading() == {"p00"}
    for chunk in list(net.clients["p00"].masked_chunks())[1:]:
        server.receive(chunk, sender="p00")
    for p in ("p01", "p02", "p03"):  # the refused chunk was not stored: resend all
        for chunk in net.clients[p].masked_chunks():
            server.receive(chunk, sender=p)
    assert server.memory_bytes() == 8 * 10  # complete uploads hold nothing beyond the sum
    server.close_stage()
    assert server.memory_bytes() == 8 * 10
    assert_correct(net, net.unmask(), set(net.ids))


def test_server_memory_does_not_grow_with_participants() -> None:
    sizes = []
    for n in (3, 9):
        net = Net(n, threshold=2, length=64, chunk_size=8, max_in_flight=2)
        net.advertise()
        net.share()
        net.masked(close=False)
        sizes.append(net.server.memory_bytes())
    assert sizes[0] == sizes[1] <= 3 * 8 * 64


def test_incomplete_upload_at_the_deadline_is_a_recovered_dropout() -> None:
    net = Net(5, threshold=3, length=9, chunk_size=2)
    net.advertise()
    net.share()
    net.deliver_bundles()
    partial = net.clients["p04"]
    partial.set_input(net.inputs["p04"])
    for chunk in list(partial.masked_chunks())[:3]:  # 3 of 5 chunks, then gone
        net.server.receive(chunk, sender="p04")
    for p in net.ids[:4]:
        net.upload(p)
    assert net.server.uploading() == {"p04"}
    net.server.close_stage()
    result = net.unmask()
    assert result.dropouts == ("p04",)
    assert_correct(net, result, set(net.ids[:4]))


def test_abandoned_upload_can_restart_with_identical_bytes() -> None:
    net = Net(4, threshold=3, length=9, chunk_size=2)
    net.advertise()
    net.share()
    net.deliver_bundles()
    client = net.clients["p00"]
    client.set_input(net.inputs["p00"])
    net.server.receive(client.masked_chunk(0), sender="p00")
    net.server.receive(client.masked_chunk(3), sender="p00")
    assert net.server.abandon_upload("p00") and not net.server.abandon_upload("p00")
    for p in net.ids:
        net.upload(p)
    net.server.close_stage()
    assert_correct(net, net.unmask(), set(net.ids))


def test_min_participants_is_never_undercut() -> None:
    net = Net(6, threshold=3, min_participants=5)
    net.advertise()
    net.share()
    with pytest.raises(TooFewSurvivors) as err:
        net.masked(skip=["p04", "p05"])
    assert (err.value.needed, err.value.remaining, err.value.stage) == (5, 4, "masked")
    assert net.server.stage is Stage.ABORTED
    with pytest.raises(JobAborted):
        net.server.unmask_request_for("p00")
    with pytest.raises(JobAborted):
        net.server.close_stage()


def test_too_few_advertisers_abort_with_counts() -> None:
    net = Net(5, threshold=4)
    with pytest.raises(TooFewSurvivors, match="needed at least 4, only 3 remained"):
        net.advertise(skip=["p03", "p04"])


def test_disconnected_survivor_groups_abort_before_unmasking() -> None:
    net = Net(8, threshold=2, graph="harary", degree=2, min_participants=3)
    net.advertise()
    net.share()
    graph = net.spec.masking_graph
    left, right = sorted(graph.neighbours("p00"))  # isolate p00 on the cycle
    with pytest.raises(TooFewSurvivors, match="connected group"):
        net.masked(skip=[left, right])


def test_harary_prunes_participants_whose_neighbourhood_collapsed() -> None:
    net = Net(9, threshold=3, graph="harary", degree=4, min_participants=3)
    graph = net.spec.masking_graph
    victim = "p00"
    gone = sorted(graph.neighbours(victim))[:3]
    net.advertise(skip=gone)
    # The victim has 2 live holders (< t = 3): it is left out instead of aborting the
    # job (nothing is masked against it yet), and the rest carries on.
    assert victim not in net.server.advertised
    assert all(len(graph.holders(p, net.server.advertised)) >= 3 for p in net.server.advertised)
    net.share()
    net.masked()
    result = net.unmask()
    assert victim in result.excluded
    assert_correct(net, result, set(net.server.advertised))


def test_cascading_prune_reports_the_shortfall() -> None:
    net = Net(8, threshold=3, graph="harary", degree=2)  # a cycle with t = k + 1
    graph = net.spec.masking_graph
    with pytest.raises(TooFewSurvivors, match="enough live neighbours"):
        net.advertise(skip=[sorted(graph.neighbours("p00"))[0]])


# ------------------------------------------------------------------- unmasking
def test_forged_or_unexpected_reveals_are_rejected_and_others_suffice() -> None:
    net = Net(5, threshold=3)
    net.advertise()
    net.share()
    net.masked(skip=["p04"])
    server, clients = net.server, net.clients
    responses = {p: clients[p].unmask(server.unmask_request_for(p)) for p in net.ids[:4]}
    r = responses["p00"]
    forged = replace(r.shares[1], share=flip(r.shares[1].share))
    with pytest.raises(ForgedShare):
        server.receive(replace(r, shares=(r.shares[0], forged, *r.shares[2:])), sender="p00")
    wrong_x = replace(r.shares[1], x=r.shares[1].x % 5 + 1)
    with pytest.raises(ForgedShare):
        server.receive(replace(r, shares=(r.shares[0], wrong_x, *r.shares[2:])), sender="p00")
    # A seed share of the dropout p04 (never requested: it would unmask p04's input).
    dropout_key_share = next(s for s in r.shares if s.owner == "p04")
    seed_of_dropout = RevealedShare(
        "p04", dropout_key_share.kind.SEED, dropout_key_share.x, bytes(20), bytes(16)
    )
    with pytest.raises(UnexpectedShare, match="not asked for"):
        server.receive(replace(r, shares=(*r.shares[:-1], seed_of_dropout)), sender="p00")
    with pytest.raises(SenderMismatch):
        server.receive(r, sender="p01")
    assert not server.can_finish()
    server.receive(responses["p01"], sender="p01")
    server.receive(responses["p02"], sender="p02")
    with pytest.raises(DuplicateMessage):
        server.receive(responses["p02"], sender="p02")
    assert not server.can_finish()
    server.receive(responses["p03"], sender="p03")
    assert server.can_finish()  # p00 was rejected, three honest holders suffice
    with pytest.raises(Excluded):
        server.unmask_request_for("p04")
    assert_correct(net, server.finish(), set(net.ids[:4]))


def test_share_from_a_non_holder_is_unexpected() -> None:
    net = Net(9, threshold=3, graph="harary", degree=4)
    net.advertise()
    net.share()
    net.masked()
    graph = net.spec.masking_graph
    me = "p00"
    stranger = next(p for p in net.ids if p not in graph.closed(me))
    response = net.clients[me].unmask(net.server.unmask_request_for(me))
    share = response.shares[0]
    fake = replace(response, shares=(replace(share, owner=stranger),))
    with pytest.raises(UnexpectedShare, match="holds no share"):
        net.server.receive(fake, sender=me)


def test_too_few_reveals_abort_naming_the_secret() -> None:
    net = Net(5, threshold=4)
    net.advertise()
    net.share()
    net.masked()
    with pytest.raises(TooFewSurvivors) as err:
        net.unmask(skip=["p03", "p04"])
    assert (err.value.needed, err.value.remaining, err.value.stage) == (4, 3, "unmask")
    assert "self-mask seed" in str(err.value)
    assert net.server.stage is Stage.ABORTED


def test_inconsistently_dealt_shares_are_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    net = Net(4, threshold=2)
    net.advertise()
    real_split = shamir.split

    def corrupt(secret: bytes, threshold: int, count: int) -> list[tuple[int, bytes]]:
        shares = real_split(secret, threshold, count)
        if len(secret) == 16:  # the seed: deal one share off the polynomial
            x, s = shares[-1]
            shares[-1] = (x, flip(s))
        return shares

    import spherecal.crypto.dealing as participant_module

    monkeypatch.setattr(participant_module.shamir, "split", corrupt)
    roster = net.server.roster_for("p03")
    net.server.receive(net.clients["p03"].share_keys(roster), sender="p03")
    monkeypatch.setattr(participant_module.shamir, "split", real_split)
    for p in net.ids[:3]:
        net.server.receive(net.clients[p].share_keys(net.server.roster_for(p)), sender=p)
    net.server.close_stage()
    net.masked()
    # Answer from the holders whose set includes the bad share of p03's seed.
    for p in ("p03", "p02"):
        net.server.receive(net.clients[p].unmask(net.server.unmask_request_for(p)), sender=p)
    with pytest.raises(ForgedShare, match="p03"):
        net.server.finish()
    assert net.server.stage is Stage.ABORTED


def test_consistency_rules() -> None:
    net = Net(5, threshold=3, consistency=True)
    net.advertise()
    net.share()
    net.masked(skip=["p04"])
    server = net.server
    request = server.consistency_request()
    sigs = {p: net.clients[p].consistency_signature(request) for p in net.ids[:4]}
    with pytest.raises(BadSignature):
        server.receive(replace(sigs["p00"], signature=flip(sigs["p00"].signature)))
    with pytest.raises(BadSignature):  # p01's signature presented as p00's
        server.receive(replace(sigs["p01"], sender="p00"))
    with pytest.raises(Excluded):
        server.receive(replace(sigs["p00"], sender="p04"))
    server.receive(sigs["p00"], sender="p00")
    with pytest.raises(DuplicateMessage):
        server.receive(sigs["p00"], sender="p00")
    server.receive(sigs["p01"], sender="p01")
    with pytest.raises(TooFewSurvivors, match="consistency signatures"):
        server.close_stage()


def test_consistency_round_then_unmask_only_asks_signers() -> None:
    net = Net(5, threshold=3, consistency=True)
    net.advertise()
    net.share()
    net.masked()
    net.consistency(skip=["p04"])
    assert net.server.pending() == frozenset(net.ids[:4])
    with pytest.raises(Excluded):
        net.server.unmask_request_for("p04")
    assert_correct(net, net.unmask(), set(net.ids))  # p04's input is in the sum


@pytest.mark.parametrize("degree", [4, 8])
def test_harary_unmask_requests_carry_t_signatures_per_revealed_owner(degree: int) -> None:
    """SecAgg+: a holder's check needs ``t`` signatures among the holders of each
    owner it reveals for; the coordinator sends a sufficient subset of the 2-hop
    neighbourhood (not all n, which made the whole job n² verifications, nor the whole
    2-hop ball of 2k + 1): every revealed owner gets exactly ``t`` when its holders
    signed, a dropout's holders still get what they need, and the sum is exact."""
    t = degree // 2 + 1
    net = Net(24, threshold=t, graph="harary", degree=degree, consistency=True)
    net.advertise()
    net.share()
    net.masked(skip=["p05"])  # p05 drops: its holders reveal its mask key
    net.consistency(skip=["p11"])  # p11 survives but does not sign
    graph = net.server.spec.masking_graph
    u1 = net.server.advertised
    for p in sorted(net.server.pending()):
        request = net.server.unmask_request_for(p)
        sent = [s.signer for s in request.signatures]
        assert sent == sorted(set(sent))
        owners = graph.closed(p) & (set(request.survivors) | set(request.dropouts))
        signers = set(net.server.pending())
        ball = set().union(*(graph.holders(o, u1) for o in owners)) & signers
        assert set(sent) <= ball
        for owner in owners:  # t each (the holders that signed number at least t here)
            assert len(set(graph.holders(owner, u1)) & set(sent)) >= t
        assert len(sent) < len(ball)  # fewer verifications than the 2-hop ball
        # the coordinator's per-job cache of each owner's signed holders, filled by the
        # requests before this one, picks what the rule picks computed afresh
        assert sent == signers_counted(
            graph,
            p,
            revealed=frozenset(request.survivors) | frozenset(request.dropouts),
            members1=frozenset(u1),
            signed=dict.fromkeys(signers, b""),
            threshold=t,
        )
    assert_correct(net, net.unmask(), set(net.ids) - {"p05"})


def test_complete_graph_unmask_requests_carry_t_signatures() -> None:
    """On the complete graph every owner's holders are everyone: ``t`` signatures over
    the signed set prove what the check needs, so each holder verifies ``t``, not n."""
    net = Net(7, threshold=4, consistency=True)
    net.advertise()
    net.share()
    net.masked()
    net.consistency()
    for p in sorted(net.server.pending()):
        request = net.server.unmask_request_for(p)
        assert len(request.signatures) == 4
    assert_correct(net, net.unmask(), set(net.ids))


def test_server_construction_checks() -> None:
    net = Net(3, threshold=2)
    with pytest.raises(InvalidSpec):
        SecAggServer(net.spec, {"p00": net.directory["p00"]})
    with pytest.raises(ValueError):
        SecAggServer(net.spec, net.directory, max_in_flight=0)
    assert "stage=advertise" in repr(net.server)


# ------------------------------------------------- checks that overlap in easy cases
def test_server_spec_must_be_a_jobspec() -> None:
    net = Net(3, threshold=2)
    with pytest.raises(InvalidSpec):
        SecAggServer(net.spec.to_bytes(), net.directory)  # type: ignore[arg-type]


def test_low_order_masking_key_is_rejected() -> None:
    net = Net(4, threshold=3)
    fresh = JobKeys.generate()
    with pytest.raises(BadKey, match="low order"):
        net.server.receive(_signed_advert(net, "p01", fresh.channel_public, bytes(32)))


def test_too_few_key_sharers_abort_at_the_share_stage() -> None:
    net = Net(5, threshold=4)
    net.advertise()
    with pytest.raises(TooFewSurvivors) as err:
        net.share(skip=["p03", "p04"])
    assert (err.value.needed, err.value.remaining, err.value.stage) == (4, 3, "share")
    assert err.value.what == "survivors"


def test_cascading_prune_at_the_share_stage_reports_the_shortfall() -> None:
    net = Net(8, threshold=3, graph="harary", degree=2)
    net.advertise()
    with pytest.raises(TooFewSurvivors, match="enough live neighbours") as err:
        net.share(skip=[sorted(net.spec.masking_graph.neighbours("p00"))[0]])
    assert err.value.stage == "share"


def test_min_participants_abort_names_the_survivor_count() -> None:
    net = Net(6, threshold=3, min_participants=5)
    net.advertise()
    net.share()
    with pytest.raises(TooFewSurvivors) as err:
        net.masked(skip=["p04", "p05"])
    assert err.value.what == "survivors" and (err.value.needed, err.value.remaining) == (5, 4)


def test_unrecoverable_neighbourhood_aborts_when_masked_inputs_close() -> None:
    net = Net(9, threshold=4, graph="harary", degree=4)
    net.advertise()
    net.share()
    graph = net.spec.masking_graph
    gone = sorted(graph.neighbours("p00"))[:2]  # p00 keeps 3 live holders (< t = 4)
    with pytest.raises(TooFewSurvivors, match="live share holders") as err:
        net.masked(skip=gone)
    assert err.value.stage == "masked"


def test_unrecoverable_neighbourhood_aborts_when_signatures_close() -> None:
    net = Net(9, threshold=3, graph="harary", degree=4, consistency=True)
    net.advertise()
    net.share()
    net.masked()
    graph = net.spec.masking_graph
    gone = sorted(graph.neighbours("p00"))[:3]  # p00 keeps 2 signing holders (< t = 3)
    with pytest.raises(TooFewSurvivors, match="live share holders") as err:
        net.consistency(skip=gone)
    assert err.value.stage == "consistency"


def test_inconsistent_mask_key_shares_of_a_dropout_are_detected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    net = Net(4, threshold=2)
    net.advertise()
    real_split = shamir.split

    def corrupt(secret: bytes, threshold: int, count: int) -> list[tuple[int, bytes]]:
        shares = real_split(secret, threshold, count)
        if len(secret) == 32:  # the mask key: deal one share off the polynomial
            x, s = shares[0]
            shares[0] = (x, flip(s))
        return shares

    import spherecal.crypto.dealing as participant_module

    with monkeypatch.context() as m:
        m.setattr(participant_module.shamir, "split", corrupt)
        net.server.receive(net.clients["p03"].share_keys(net.server.roster_for("p03")))
    for p in net.ids[:3]:
        net.server.receive(net.clients[p].share_keys(net.server.roster_for(p)), sender=p)
    net.server.close_stage()
    net.masked(skip=["p03"])  # p03 drops: its mask key must be rebuilt
    for p in ("p00", "p01"):  # p00 holds the share that is off the polynomial
        net.server.receive(net.clients[p].unmask(net.server.unmask_request_for(p)), sender=p)
    with pytest.raises(ForgedShare, match="advertised key"):
        net.server.finish()


def test_the_masked_snapshot_is_a_read_only_view_of_the_sum_until_finish() -> None:
    """Issue #24: ``masked_snapshot`` lends the sum (no 7.6 MB copy per job in the
    service) — read-only, so a journal writing it cannot change what ``finish``
    unmasks; the sum is the participants' masked chunks added in the ring."""
    net = Net(4, length=300, chunk_size=64)
    net.advertise()
    net.share()
    net.deliver_bundles()
    expected = np.zeros(300, dtype=np.uint64)
    for p in net.ids:
        net.clients[p].set_input(net.inputs[p])
        for i in range(net.spec.n_chunks):
            chunk = net.clients[p].masked_chunk(i)
            start, stop = net.spec.chunk_bounds(i)
            expected[start:stop] += np.frombuffer(chunk.payload, dtype="<u8")
            net.server.receive(chunk, sender=p)
    net.server.close_stage()
    survivors, total = net.server.masked_snapshot()
    assert survivors == frozenset(net.ids)
    assert np.array_equal(total, expected)
    assert not total.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        total[0] = 0
    result = net.unmask()
    np.testing.assert_allclose(result.values, net.expected(net.ids), atol=net.tolerance())
