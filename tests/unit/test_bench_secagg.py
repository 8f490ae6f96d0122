"""``bench/secagg.py``'s main block measures both rings by one method (issue #24): a
warm-up, the ring's first full-size job on its own, then the median of ``repeats`` jobs —
on a small vector here, for the shape and the exactness, not the speed; and its scaling
block holds the Harary degree when asked."""

from __future__ import annotations

from bench.secagg import run


def test_both_rings_report_their_cold_job_apart_from_the_medians() -> None:
    out = run(
        dim=3000,
        participants=4,
        dropouts=1,
        threshold=3,
        graph="complete",
        chunk_size=1024,
        max_in_flight=2,
        seed=1,
        repeats=2,
        ring_bits=64,
    )
    assert set(out["rings"]) == {"64", "32"}
    for bits, ring in out["rings"].items():
        assert ring["runs"] == 2 and len(ring["input_over_keystream_cpu_runs"]) == 2
        assert ring["max_abs_error"] <= ring["error_bound"]  # every job, cold one included
        first = ring["first_job"]
        for key in (
            "input_over_keystream_cpu",
            "mask_gen_over_keystream",
            "input_minor_faults",
            "prepare_input_cpu_ms",
            "prepare_minor_faults",
        ):
            assert key in first and key in ring
        assert first["prepare_input_cpu_ms"] >= 0 and first["prepare_minor_faults"] >= 0
        # 3,000 entries in three framed chunks: the ring's word plus a little framing
        assert int(bits) / 8 < ring["upload_bytes_per_entry"] < int(bits) / 8 + 0.5
    assert out["rings"]["64"]["input_over_keystream_cpu"] == out["input_over_keystream_cpu"]
    assert out["protocol_s_first_run"] == out["rings"]["64"]["first_job"]["protocol_s"]
    assert out["prepare_input"] is True


def test_without_prepare_input_no_prepare_figures_are_reported() -> None:
    """``--no-prepare-input``: the input's buffer is borrowed by ``set_input`` (the
    comparison run); the sums stay exact and no ``prepare_*`` key appears."""
    out = run(
        dim=1500,
        participants=3,
        dropouts=0,
        threshold=2,
        graph="complete",
        chunk_size=1024,
        max_in_flight=2,
        seed=2,
        repeats=1,
        ring_bits=32,
        prepare_input=False,
    )
    assert out["prepare_input"] is False
    for ring in out["rings"].values():
        assert ring["max_abs_error"] <= ring["error_bound"]
        assert not any(k.startswith("prepare_") for k in (*ring, *ring["first_job"]))


def test_the_scaling_block_holds_the_degree_when_asked() -> None:
    """``--scaling-degree``: every n at the given degree, the dropouts spaced along the
    Harary cycle (so none of them are neighbours at this spacing); without it each n
    has its own degree."""
    from bench.secagg_scaling import _scaling_job, scaling
    from spherecal.crypto.spec import default_degree

    held = scaling([10, 40], dim=64, drop_fraction=0.1, seed=0, ring_bits=32, repeats=1, degree=4)
    assert held["degree_held"] == 4
    assert [row["degree"] for row in held["per_n"].values()] == [4, 4]
    assert [row["dropouts"] for row in held["per_n"].values()] == [1, 4]
    assert [row["survivors"] for row in held["per_n"].values()] == [9, 36]
    spec, _, _, report, _ = _scaling_job(
        40, dim=64, drop_fraction=0.1, seed=0, ring_bits=32, degree=4
    )
    cycle = spec.masking_graph.cycle
    dropped = sorted(
        cycle.index(p) for p in set(spec.participants) - set(report.result.contributors)
    )
    assert dropped == [0, 10, 20, 30]
    free = scaling([10, 40], dim=64, drop_fraction=0.1, seed=0, ring_bits=32, repeats=1)
    assert free["degree_held"] is None
    assert [row["degree"] for row in free["per_n"].values()] == [
        default_degree(10, 2),
        default_degree(40, 2),
    ]
    assert held["degree_model"]["per_neighbour_ms"] is None  # one degree: no k term
    assert free["degree_model"] is None  # two points, three parameters


def test_the_degree_model_recovers_its_three_parts() -> None:
    """``F + k·a + n·b`` fitted over rows built from known parts; the allowed
    per-neighbour cost checked against the issue's inequality directly."""
    from bench.secagg_scaling import degree_model

    fixed, per_neighbour, per_member = 0.30, 0.18, 0.0002  # ms, ms, ms (0.2 µs)
    degrees = {"10": 8, "100": 14, "500": 18, "1000": 20}
    rows = {
        n: {"degree": k, "participant_cpu_ms": fixed + k * per_neighbour + int(n) * per_member}
        for n, k in degrees.items()
    }
    model = degree_model(rows)
    assert model is not None
    assert abs(model["fixed_ms"] - fixed) < 1e-6
    assert abs(model["per_neighbour_ms"] - per_neighbour) < 1e-6
    assert abs(model["per_member_us"] - per_member * 1e3) < 1e-3

    def cost(n: int, a: float) -> float:
        return fixed + degrees[str(n)] * a + n * per_member

    for n in ("100", "500", "1000"):
        a = model["per_neighbour_ms_allowed"][n]
        assert abs(cost(int(n), a) - 1.5 * cost(10, a)) < 1e-3  # exactly at the line
        assert cost(int(n), a + 0.01) > 1.5 * cost(10, a + 0.01)  # above it, beyond
        ratio = model["ratio_without_neighbours"][n]
        assert abs(ratio - cost(int(n), 0.0) / cost(10, 0.0)) < 1e-3
    assert model["per_neighbour_ms"] > model["per_neighbour_ms_allowed"]["500"]


def test_the_degree_model_of_a_held_degree_fits_the_rest() -> None:
    from bench.secagg_scaling import degree_model

    rows = {
        n: {"degree": 8, "participant_cpu_ms": 2.0 + int(n) * 0.0015} for n in ("10", "500")
    }
    model = degree_model(rows)
    assert model is not None and model["per_neighbour_ms"] is None
    assert abs(model["per_member_us"] - 1.5) < 1e-3
    assert model["per_neighbour_ms_allowed"] == {"500": None}
    assert abs(model["ratio_without_neighbours"]["500"] - 2.75 / 2.015) < 1e-3
    assert degree_model({"10": rows["10"]}) is None  # one point, two parameters


def test_the_public_key_floor_counts_each_participants_own_operations() -> None:
    """The scaling block's public-key floor counts, inside each participant's own calls
    and not the server's, what the protocol asks per Harary neighbour: at degree ``k``
    (n ≥ 2k + 1, no wrap-around of the neighbourhoods) ``2k + 1`` X25519 agreements —
    a channel key with each of its ``k`` share holders and itself, a masking key with
    each neighbour — and ``2k`` Ed25519 verifications — the ``k`` key advertisements
    and ``k`` consistency signatures, the fewest that give each revealed owner a strict
    majority ``t = k/2 + 1`` of its holders. At one held degree the floor is the same
    for every n; the counting leaves the participant class and libsodium as they were."""
    import nacl.bindings

    from bench.secagg_scaling import public_key_floor
    from spherecal.crypto.participant import SecAggParticipant

    methods = dict(vars(SecAggParticipant))
    sign_open = nacl.bindings.crypto_sign_open
    floor = public_key_floor([10, 40], drop_fraction=0.1, seed=0, ring_bits=32, degree=4)
    for n, row in floor["per_n"].items():
        assert row["participants_counted"] == int(n)
        assert (row["degree"], row["agreements"], row["verifications"]) == (4, 9, 8)
        expected = (9 * floor["agreement_us"] + 8 * floor["verification_us"]) / 1e3
        assert abs(row["floor_ms"] - expected) < 1e-3
    assert floor["floor_ratio"] == {"40": 1.0}
    assert floor["other_work_needed_ms"] == {"40": 0.0}
    assert dict(vars(SecAggParticipant)) == methods
    assert nacl.bindings.crypto_sign_open is sign_open
