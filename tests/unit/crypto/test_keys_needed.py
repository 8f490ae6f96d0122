"""A participant needs identity keys only for the parties whose signatures it checks.

``crypto.keys_needed(spec, u)``: ``u``, its masking-graph neighbours and, with the
consistency round, their neighbours (the holders of every owner whose shares ``u``
holds). These tests check that set against an independent computation from the
Harary edges, run whole jobs where every participant holds only those keys, and
check that a signature from anyone else is refused (adverts) or ignored and never
counted (consistency signatures).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import replace

import numpy as np
import pytest

from spherecal.crypto import (
    InvalidSpec,
    JobSpec,
    KeySubstitution,
    SecAggParticipant,
    SurvivorSignature,
    TooFewSurvivors,
    UnknownParticipant,
    generate_identity,
    identity_public_bytes,
    keys_needed,
    run_protocol,
)
from spherecal.crypto._codec import encode_context
from spherecal.crypto.consistency import verify_signed_view
from spherecal.crypto.graph import harary_edges, max_closed_size
from spherecal.crypto.kdf import LABEL
from spherecal.crypto.keys import load_identity_public, sign, survivors_payload
from spherecal.crypto.policy import check_roster_keys
from spherecal.crypto.ring import decode, encode

from .helpers import Net, flip


def _spec(
    n: int, degree: int, *, consistency: bool, graph: str = "harary", job_id: bytes | None = None
) -> JobSpec:
    ids = [f"s{i:03d}" for i in range(n)]
    largest = max_closed_size(graph, n, degree if graph == "harary" else n - 1)
    return JobSpec.create(
        ids,
        threshold=largest // 2 + 1,
        length=4,
        bound=1.0,
        graph=graph,
        degree=degree if graph == "harary" else None,
        consistency_check=consistency,
        job_id=job_id,
    )


def _independent_needed(spec: JobSpec, me: str) -> set[str]:
    """Closed 1- or 2-hop neighbourhood from the Harary edges and the documented vertex
    order (SHA-256 of the job id and participant id), by matrix powers."""
    order = sorted(
        spec.participants,
        key=lambda p: hashlib.sha256(encode_context(LABEL, "graph-order", spec.job_id, p)).digest(),
    )
    n = len(order)
    reach = np.eye(n, dtype=np.int64)
    for i, j in harary_edges(n, spec.degree):
        reach[i, j] = reach[j, i] = 1
    if spec.consistency_check:
        reach = reach @ reach
    row = reach[order.index(me)]
    return {order[i] for i in range(n) if row[i] > 0}


@pytest.mark.parametrize(
    ("n", "degree"), [(33, 4), (40, 5), (41, 5), (57, 7), (100, 14), (101, 13)]
)
@pytest.mark.parametrize("consistency", [True, False])
def test_needed_set_is_the_closed_one_or_two_hop_neighbourhood(
    n: int, degree: int, consistency: bool
) -> None:
    spec = _spec(n, degree, consistency=consistency)
    for me in spec.participants[:: max(1, n // 9)]:
        needed = keys_needed(spec, me)
        assert needed == _independent_needed(spec, me)
        assert me in needed
        assert spec.masking_graph.neighbours(me) <= needed
        if consistency:
            # the circulant part alone gives 2k+1 when k is even; odd k adds diameters
            assert len(needed) <= min(n, (degree + 2) ** 2)
            if degree % 2 == 0:
                assert len(needed) == min(n, 2 * degree + 1)
        else:
            assert len(needed) <= degree + 2
        assert len(needed) < n


def test_complete_graph_needs_everyone_and_strangers_are_refused() -> None:
    for consistency in (True, False):
        spec = _spec(7, 6, consistency=consistency, graph="complete")
        for me in spec.participants:
            assert keys_needed(spec, me) == frozenset(spec.participants)
    with pytest.raises(UnknownParticipant):
        keys_needed(spec, "nobody")
    with pytest.raises(UnknownParticipant):
        keys_needed(_spec(40, 6, consistency=True), "nobody")


@pytest.mark.parametrize(
    ("n", "degree", "drop"),
    [
        (40, 6, {"s003": "advertise", "s011": "share", "s017": "masked", "s025": "unmask"}),
        (48, 7, {"s001": "share", "s020": "masked", "s030": "consistency", "s040": "unmask"}),
    ],
)
def test_jobs_with_only_the_needed_keys_give_the_bit_identical_sum(
    n: int, degree: int, drop: dict[str, str]
) -> None:
    # a fixed job id (hence a fixed graph) so the dropouts are the same in each run;
    # every run_protocol has its own replay ledger
    spec = _spec(n, degree, consistency=True, job_id=b"directory-%d" % n)
    rng = np.random.default_rng(n)
    inputs = {p: rng.uniform(-1.0, 1.0, spec.length) for p in spec.participants}
    narrow = run_protocol(spec, inputs, drop=drop, rng=random.Random(1))
    full = run_protocol(
        spec,
        inputs,
        drop=drop,
        rng=random.Random(1),
        full_directory=True,
    )
    gone = {p for p, stage in drop.items() if stage in ("advertise", "share", "masked")}
    assert set(narrow.result.contributors) == set(spec.participants) - gone
    assert narrow.result.contributors == full.result.contributors
    assert narrow.result.values.tobytes() == full.result.values.tobytes()
    # independent: the ring sum of the contributors' encodings, decoded
    ring = np.zeros(spec.length, dtype=np.uint64)
    for p in narrow.result.contributors:
        ring += encode(inputs[p], scale_bits=spec.scale_bits, bound=spec.bound, length=spec.length)
    assert narrow.result.values.tobytes() == decode(ring, scale_bits=spec.scale_bits).tobytes()


def test_a_participant_missing_one_needed_entry_refuses_and_extra_entries_are_unused() -> None:
    identity = generate_identity()
    for gap_is_me in (False, True):
        spec = _spec(40, 6, consistency=True)  # a fresh job id: a fresh vertex order
        me = spec.participants[0]
        keys = {p: identity_public_bytes(generate_identity()) for p in spec.participants}
        keys[me] = identity_public_bytes(identity)
        needed = sorted(keys_needed(spec, me))
        outsider = next(p for p in spec.participants if p not in needed)
        # entries for anyone else may be missing, or garbage: they are never loaded
        only = {p: keys[p] for p in needed} | {outsider: b"not a key"}
        gap = me if gap_is_me else next(p for p in needed if p != me)
        partial = {p: k for p, k in only.items() if p != gap}
        with pytest.raises(InvalidSpec, match=r"lacks 1 of the 13 participants whose signatures"):
            SecAggParticipant(spec, me, identity, partial)
        SecAggParticipant(spec, me, identity, only)


def _signed_harary_net() -> Net:
    """Harary k = 4 on 40 (t = 3): each 2-hop set is 9 participants of 40."""
    net = Net(40, threshold=3, graph="harary", degree=4, consistency=True)
    net.advertise()
    net.share()
    net.masked()
    net.consistency()
    return net


def _signature(net: Net, signer: str, survivors: tuple[str, ...]) -> SurvivorSignature:
    payload = survivors_payload(
        spec_digest=net.spec.digest, job_id=net.spec.job_id, survivors=survivors
    )
    return SurvivorSignature(signer=signer, signature=sign(net.identities[signer], payload))


def test_signatures_from_outside_the_needed_set_are_ignored_not_verified_not_counted() -> None:
    net = _signed_harary_net()
    me = "p00"
    needed = keys_needed(net.spec, me)
    good = net.server.unmask_request_for(me)
    assert {s.signer for s in good.signatures} <= needed
    outsiders = [p for p in good.survivors if p not in needed]
    extra = tuple(_signature(net, p, good.survivors) for p in outsiders)
    forged = tuple(replace(s, signature=flip(s.signature)) for s in extra)
    # Too few counted signatures plus many valid outside ones: still refused, the
    # outside ones never count toward t.
    few = tuple(s for s in good.signatures if s.signer == me) + extra
    assert len(few) >= net.spec.threshold
    with pytest.raises(TooFewSurvivors, match="consistency signatures"):
        verify_signed_view(
            net.spec,
            net.spec.masking_graph,
            {p: load_identity_public(net.directory[p]) for p in needed},
            replace(good, signatures=few),
            signed=good.survivors,
            owners=net.spec.masking_graph.closed(me),
            members1=frozenset(net.server.advertised),
        )
    # The real participant: a request padded with every outsider's signature, a
    # third of them forged, is answered (nothing of theirs is verified or counted),
    # and the answer completes the job exactly.
    padded = tuple(sorted(good.signatures + extra[:20] + forged[20:], key=lambda s: s.signer))
    response = net.clients[me].unmask(replace(good, signatures=padded))
    assert {s.owner for s in response.shares} == set(net.spec.masking_graph.closed(me))
    net.server.receive(response, sender=me)
    for p in sorted(net.server.pending() - {me}):
        net.server.receive(net.clients[p].unmask(net.server.unmask_request_for(p)), sender=p)
    result = net.server.finish()
    assert result.contributors == tuple(net.ids)
    assert np.max(np.abs(result.values - net.expected(net.ids))) <= net.tolerance()


def test_a_counted_signer_without_a_pinned_key_is_a_refusal_not_a_key_error() -> None:
    net = _signed_harary_net()
    me = "p00"
    good = net.server.unmask_request_for(me)
    counted = good.signatures[-1].signer
    assert counted != me
    directory = {
        p: load_identity_public(net.directory[p]) for p in keys_needed(net.spec, me) if p != counted
    }
    with pytest.raises(KeySubstitution, match=f"no pinned identity key for {counted!r}"):
        verify_signed_view(
            net.spec,
            net.spec.masking_graph,
            directory,
            good,
            signed=good.survivors,
            owners=net.spec.masking_graph.closed(me),
            members1=frozenset(net.server.advertised),
        )
    roster = net.rosters[me]
    sender = next(a.sender for a in roster.adverts if a.sender != me)
    with pytest.raises(KeySubstitution, match=f"no pinned identity key for {sender!r}"):
        check_roster_keys(
            net.spec,
            roster.adverts,
            {p: k for p, k in directory.items() if p != sender},
            me=me,
            own=next(a for a in roster.adverts if a.sender == me),
        )
