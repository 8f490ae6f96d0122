"""``SecAggParticipant.prepare_input`` (issue #24): the input's buffer borrowed and made
resident before the input exists, then encoded into by ``set_input`` — the same bytes
as without it, refused in the wrong stages, and the loan given back on every path
(none lent twice, none kept after the job)."""

from __future__ import annotations

import gc
import random
import resource
from dataclasses import replace

import numpy as np
import pytest

from spherecal.crypto import ring
from spherecal.crypto._exceptions import EncodingOverflow, JobAborted, OutOfStage, WrongJob
from spherecal.crypto.participant import ParticipantStage
from spherecal.crypto.ring import borrow, encode, give_back
from spherecal.crypto.simulation import run_protocol
from spherecal.crypto.spec import JobSpec

from .helpers import Net, advertised_client

pytestmark = pytest.mark.usefixtures("fresh_ring_pool")  # tests/conftest.py


def _loans() -> list[np.ndarray]:
    """The buffers on loan now (the bases, not the views)."""
    return [base for _, base in ring._lent.values()]


def _shared(net: Net) -> Net:
    net.advertise()
    net.share()
    return net


def test_set_input_encodes_into_the_prepared_buffer_with_the_same_bytes() -> None:
    net = _shared(Net(4, length=700, chunk_size=256))
    client = net.clients["p00"]
    client.prepare_input()
    (base,) = _loans()
    assert base.nbytes == 700 * 8
    client.set_input(net.inputs["p00"])
    assert np.shares_memory(client._encoded, base)
    assert len(ring._lent) == 1  # the prepared loan itself, not a second one
    expected = encode(net.inputs["p00"], scale_bits=net.spec.scale_bits, bound=1.0)
    assert client._encoded is not None and np.array_equal(client._encoded, expected)


def test_a_prepared_spare_of_another_ring_gives_the_same_bytes() -> None:
    """A reused, larger spare (a 64-bit buffer of 900 entries) hosts a 32-bit input of
    700: ``set_input`` writes exactly the encoding, nothing left of the spare's past."""
    old = borrow(900, 64)
    old.fill(0x0123456789ABCDEF)
    give_back(old)
    client = advertised_client(700, ring_bits=32)
    client.prepare_input()
    assert not ring._spare  # the spare is the prepared loan
    vector = np.random.default_rng(5).uniform(-1.0, 1.0, 700)
    client.set_input(vector)
    expected = encode(vector, scale_bits=client.spec.scale_bits, bound=1.0, ring_bits=32)
    assert client._encoded is not None and np.array_equal(client._encoded, expected)


def test_the_sum_is_exact_with_every_participant_prepared() -> None:
    """A whole job where every participant (dropouts too) prepares after its share
    answer: the sum equals the independently encoded inputs of the contributors, and
    after the job only the dropped participants' loans remain until they go."""
    ids = [f"p{i}" for i in range(5)]
    rng = np.random.default_rng(11)
    inputs = {p: rng.uniform(-1.0, 1.0, 600) for p in ids}
    spec = JobSpec.create(ids, threshold=3, length=600, bound=1.0)
    report = run_protocol(
        spec, inputs, drop={"p1": "masked"}, rng=random.Random(2), prepare_input=True
    )
    expected = np.zeros(600, dtype=ring.RING_DTYPE)
    for p in ids:
        if p != "p1":
            expected += encode(inputs[p], scale_bits=spec.scale_bits, bound=1.0)
    assert np.array_equal(report.result.ring_sum, expected)
    assert set(report.prepare_seconds) == set(ids)  # the dropout prepared too
    gc.collect()  # the dropout's participant is gone with run_protocol's frame
    assert not ring._lent
    assert len(ring._spare) == 4 and all(not s.any() for s in ring._spare)


def test_prepare_twice_keeps_one_loan() -> None:
    net = _shared(Net(3, length=300))
    client = net.clients["p01"]
    client.prepare_input()
    first = _loans()
    client.prepare_input()  # idempotent
    assert _loans() == first and len(first) == 1


def test_wrong_stages_are_refused_with_the_typed_errors() -> None:
    net = Net(3, length=300)
    client = net.clients["p00"]
    with pytest.raises(OutOfStage, match="advertise"):
        client.prepare_input()  # before the advertisement
    assert not ring._lent
    net.advertise()
    net.share()
    client.set_input(net.inputs["p00"])
    with pytest.raises(OutOfStage, match="already set"):
        client.prepare_input()
    assert len(ring._lent) == 1  # only set_input's buffer
    net.masked()
    net.unmask()
    assert client.stage is ParticipantStage.DONE
    with pytest.raises(OutOfStage, match="too late"):
        client.prepare_input()
    assert not ring._lent  # every finished participant gave its buffer back
    assert len(ring._spare) == 3


def test_a_refused_input_gives_the_prepared_buffer_back_zeroed() -> None:
    net = _shared(Net(3, length=500))
    client = net.clients["p02"]
    client.prepare_input()
    (base,) = _loans()
    with pytest.raises(EncodingOverflow):
        client.set_input(np.full(500, 2.0))  # out of bound: refused, job goes on
    assert not ring._lent and client._loan is None
    (spare,) = ring._spare
    assert spare is base and not spare.any()
    client.prepare_input()  # the input is still unset: it may be prepared again
    assert _loans() == [base]
    client.set_input(net.inputs["p02"])
    assert np.shares_memory(client._encoded, base) and len(ring._lent) == 1


def test_an_abort_after_prepare_gives_the_buffer_back() -> None:
    """A refusal of a coordinator message (here a bundle of another job) ends the job:
    the prepared buffer comes back zeroed, and a later call is :class:`JobAborted`."""
    net = _shared(Net(3, length=400))
    client = net.clients["p00"]
    client.prepare_input()
    (base,) = _loans()
    base[:] = 7  # as if something had been written: the give-back must zero it
    bundle = net.server.bundle_for("p00")
    bad = replace(bundle, job_id=b"\x02" * len(bundle.job_id))
    with pytest.raises(WrongJob):
        client.receive_shares(bad)
    assert client.stage is ParticipantStage.FAILED
    assert not ring._lent
    (spare,) = ring._spare
    assert spare is base and not spare.any()
    with pytest.raises(JobAborted):
        client.prepare_input()
    with pytest.raises(JobAborted):
        client.set_input(net.inputs["p00"])
    assert not ring._lent


def test_a_job_that_never_gets_its_input_keeps_no_loan() -> None:
    """A participant prepares and is dropped (the site withdraws, the coordinator moves
    on): its buffer goes with it — no loan left, and never spare (never zeroed)."""
    net = _shared(Net(3, length=400))
    net.clients["p01"].prepare_input()
    assert len(ring._lent) == 1
    del net.clients["p01"]
    gc.collect()
    assert not ring._lent and not ring._spare


def test_prepared_participants_never_share_a_buffer() -> None:
    net = _shared(Net(4, length=800))
    spare = borrow(800, 64)
    give_back(spare)  # one spare: the first to prepare takes it, the others get new ones
    for client in net.clients.values():
        client.prepare_input()
    bases = _loans()
    assert len(bases) == 4 and not ring._spare
    for i, a in enumerate(bases):
        for b in bases[i + 1 :]:
            assert not np.shares_memory(a, b)
    net.masked()
    net.unmask()
    assert not ring._lent and len(ring._spare) == 4  # each given back once


_LINUX_THREAD_FAULTS = hasattr(resource, "RUSAGE_THREAD")


def _thread_faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


@pytest.mark.skipif(not _LINUX_THREAD_FAULTS, reason="counts one thread's page faults (Linux)")
def test_the_prepared_buffer_is_resident_before_the_input() -> None:
    """The point of the call: ``set_input`` into a prepared new buffer faults (almost)
    no page, where the same call into a new unprepared buffer faults many. 48 MB per
    input: above glibc's largest mmap threshold, so each new buffer is new memory
    whatever this process freed before."""
    length = 6 << 20  # entries: 48 MiB at 64 bits
    pages = length * 8 // 4096
    net = _shared(Net(3, length=length, chunk_size=1 << 20))
    vector = np.full(length, 0.25)  # written: resident before the measurement
    prepared, plain = net.clients["p00"], net.clients["p01"]
    prepared.prepare_input()
    f0 = _thread_faults()
    prepared.set_input(vector)
    with_prepare = _thread_faults() - f0
    f0 = _thread_faults()
    plain.set_input(vector)  # the control: a new buffer faulted in by the encoding
    without = _thread_faults() - f0
    assert without > pages // 64  # the control does fault (a fault may map several pages)
    assert with_prepare * 16 < without
