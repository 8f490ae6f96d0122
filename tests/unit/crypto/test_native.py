"""The native masking kernel (issue #24) gives the numpy paths' bytes, and the numpy
paths run whenever it is absent or switched off.

The side-by-side tests need the extension (``setup.py`` builds it when the project is
installed; ``python setup.py build_ext --inplace`` in a checkout) and skip, saying so,
where it is not built. The fallback tests run everywhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spherecal.crypto import EncodingOverflow, MalformedMessage, MaskedChunk, native, prg
from spherecal.crypto.prg import MaskExpander, MaskSeed, keystream_words
from spherecal.crypto.ring import encode, encode_into

U64, U32 = np.dtype("<u8"), np.dtype("<u4")
KERNEL = native.KERNEL
needs_kernel = pytest.mark.skipif(
    KERNEL is None,
    reason="the native masking kernel is not built here (python setup.py build_ext --inplace)",
)
REPO = Path(__file__).resolve().parents[3]


def seeds(count: int, rng: np.random.Generator) -> list[MaskSeed]:
    return [MaskSeed(key=rng.bytes(16), nonce=rng.bytes(12)) for _ in range(count)]


def ecb_words(seed: MaskSeed, n: int, dtype: np.dtype) -> np.ndarray:
    """The v2 keystream built independently (AES-ECB of each counter block)."""
    nbytes = n * dtype.itemsize
    base = int.from_bytes(seed.nonce, "big")
    blocks = b"".join(
        (base % (1 << 96)).to_bytes(12, "big") + (2 + j).to_bytes(4, "big")
        for j in range(-(-nbytes // 16))
    )
    enc = Cipher(algorithms.AES(seed.key), modes.ECB()).encryptor()
    return np.frombuffer(enc.update(blocks)[:nbytes], dtype=dtype).copy()


@pytest.fixture
def numpy_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(native, "KERNEL", None)
    yield


@pytest.mark.parametrize("dtype", [U64, U32])
def test_known_answer_of_the_native_keystream(dtype: np.dtype, kernel_engine: str) -> None:
    seed = seeds(1, np.random.default_rng(1))[0]
    n = 5000 + 16 // dtype.itemsize - 1  # a partial last block
    assert np.array_equal(
        keystream_words(seed, 0, n, dtype, native=True), ecb_words(seed, n, dtype)
    )


ENGINES = () if KERNEL is None else tuple(KERNEL.engines())


def ctr_reference(key: bytes, counter: bytes, nbytes: int) -> bytes:
    """AES-128-CTR from the ``cryptography`` package (OpenSSL's 128-bit increment)."""
    return Cipher(algorithms.AES(key), modes.CTR(counter)).encryptor().update(bytes(nbytes))


@pytest.fixture(params=ENGINES or ["none"])
def kernel_engine(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each engine this CPU runs, forced for the test (all four on the development
    machine of 2026-11-26: vaes512, vaes, aesni, openssl)."""
    if KERNEL is None:
        pytest.skip("the native masking kernel is not built here")
    with native.use_engine(request.param):
        yield request.param


def test_every_engine_is_exercised_where_the_cpu_has_it() -> None:
    """The engine list is what the CPU flags say, so the parametrised tests below cover
    the own AES wherever it can run (a build that lost it would show here)."""
    if KERNEL is None:
        pytest.skip("the native masking kernel is not built here")
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    words = set(flags.split())
    assert ENGINES[-1] == "openssl"
    if not os.environ.get(native.ENGINE_ENV):  # by default the fastest engine runs
        assert KERNEL.engine() == ENGINES[0]
    if {"aes", "sse4_1"} <= words:
        assert "aesni" in ENGINES
    if {"aes", "avx2", "vaes"} <= words:
        assert "vaes" in ENGINES
        wide = {"avx512f", "avx512bw"} <= words
        assert ENGINES[0] == ("vaes512" if wide else "vaes")


@needs_kernel
@settings(max_examples=60, deadline=None)
@given(
    nbytes=st.integers(0, 5000),
    counter=st.one_of(
        st.integers(0, 2**32 - 1),
        st.just(2 + (1 << 26) - 1),  # the last counter of a v2 segment
        st.integers(2**32 - 400, 2**32 - 1),  # a carry out of the 32-bit word
    ),
    seed=st.integers(0, 2**32 - 1),
)
def test_known_answers_of_every_engine_against_cryptography_aes_ctr(
    nbytes: int, counter: int, seed: int
) -> None:
    """Bare keystream of each engine, any length (not a multiple of 16 or of a vector
    group), any counter: the ``cryptography`` package's AES-CTR, byte for byte."""
    assert KERNEL is not None
    rng = np.random.default_rng(seed)
    key, block = rng.bytes(16), rng.bytes(12) + counter.to_bytes(4, "big")
    expected = ctr_reference(key, block, nbytes)
    for name in ENGINES:
        with native.use_engine(name):
            out = bytearray(b"\xa5" * (nbytes + 64))
            KERNEL.keystream(memoryview(out)[:nbytes], key, block)
            assert bytes(out[:nbytes]) == expected, name
            assert out[nbytes:] == b"\xa5" * 64  # not a byte past the end


@needs_kernel
def test_a_counter_that_carries_past_32_bits_is_openssls_128_bit_increment() -> None:
    """The own engines count in the low 32-bit word; where a call would carry out of it
    the kernel takes OpenSSL's path. Mutation check: a 32-bit wrap (what the own engines
    would produce) differs from the reference, and the kernel gives the reference."""
    assert KERNEL is not None
    key, nonce = bytes(range(16)), b"\x01" * 11 + b"\xff"
    block = nonce + (2**32 - 2).to_bytes(4, "big")
    expected = ctr_reference(key, block, 4 * 16)
    ecb = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    wrapped = ecb.update(
        b"".join(nonce + ((2**32 - 2 + j) % 2**32).to_bytes(4, "big") for j in range(4))
    )
    assert wrapped[:32] == expected[:32] and wrapped[32:] != expected[32:]
    for name in ENGINES:
        with native.use_engine(name):
            out = bytearray(64)
            KERNEL.keystream(out, key, block)
            assert bytes(out) == expected
            target = np.zeros(8, dtype=U64)
            KERNEL.apply(target, None, key, block, b"\x01", 8)
            assert target.tobytes() == expected


@needs_kernel
@settings(max_examples=40, deadline=None)
@given(
    entries=st.integers(0, 3000),
    masks=st.sampled_from([0, 1, 2, 3, 5, 16, 17, 34]),
    narrow=st.booleans(),
    in_place=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_every_engine_adds_the_reference_keystream_in_the_ring(
    entries: int, masks: int, narrow: bool, in_place: bool, seed: int
) -> None:
    """kernel.apply against an independent computation (cryptography's AES-CTR, numpy's
    wrapping add/sub) for each engine: odd and even mask counts, more masks than one key
    group (16), odd sizes; guard words around target and source stay untouched."""
    assert KERNEL is not None
    dtype = U32 if narrow else U64
    rng = np.random.default_rng(seed)
    keys = rng.bytes(16 * masks)
    counters = b"".join(
        rng.bytes(12) + int(rng.integers(0, 1 << 26)).to_bytes(4, "big") for _ in range(masks)
    )
    signs = [int(rng.choice([-1, 1])) for _ in range(masks)]
    source: Any = rng.integers(0, 1 << 62, entries + 8).astype(dtype)
    expected = source[4 : 4 + entries].copy()
    for i, sign in enumerate(signs):
        ks = np.frombuffer(
            ctr_reference(keys[16 * i : 16 * i + 16], counters[16 * i : 16 * i + 16],
                          entries * dtype.itemsize),
            dtype=dtype,
        )  # fmt: skip
        expected = expected + ks if sign > 0 else expected - ks
    for name in ENGINES:
        with native.use_engine(name):
            buf: Any = np.full(entries + 8, 0x5A5A5A5A, dtype=dtype)
            src = source.copy()
            if in_place:
                buf[4 : 4 + entries] = src[4 : 4 + entries]
            KERNEL.apply(
                buf[4 : 4 + entries], None if in_place else src[4 : 4 + entries], keys,
                counters, bytes(s & 0xFF for s in signs), dtype.itemsize,
            )  # fmt: skip
            assert buf[4 : 4 + entries].tobytes() == expected.tobytes(), name
            assert (buf[:4] == 0x5A5A5A5A).all() and (buf[4 + entries :] == 0x5A5A5A5A).all()
            assert np.array_equal(src, source)  # the source is only read


@needs_kernel
def test_the_engine_switch_refuses_what_the_cpu_lacks_and_restores() -> None:
    assert KERNEL is not None
    before = KERNEL.engine()
    with pytest.raises(ValueError, match="not available"):
        KERNEL.set_engine("des")
    with native.use_engine("openssl"):
        assert native.engine() == "openssl" and not native.own_engine()
        assert MaskExpander(16, U64, engine="gcm").native is False
    assert KERNEL.engine() == before and native.engines() == ENGINES


@needs_kernel
def test_asking_for_the_kernel_gets_ctr_where_gcm_is_openssls_faster_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel runs the CTR form of the keystream only. On a processor where OpenSSL's
    GCM path outruns its CTR path (AVX-512: 26 against 12 GB/s on the development machine
    of 2026-11-26) and the kernel is on OpenSSL's EVP engine, ``native=True`` must still
    get CTR, not the "fastest" GCM and a refusal (it did until then). Without an explicit
    ``native`` the faster OpenSSL path stays the numpy path's choice."""
    monkeypatch.setattr(prg, "fastest_engine", lambda: "gcm")
    with native.use_engine("openssl"):
        asked = MaskExpander(64, U64, native=True)
        assert asked.engine == "ctr" and asked.native
        assert MaskExpander(64, U64).engine == "gcm"
        assert MaskExpander(64, U64, native=False).engine == "gcm"
        seed = seeds(1, np.random.default_rng(3))[0]
        target = np.zeros(64, dtype=U64)
        asked.apply(target, seed, 0, +1)
        assert np.array_equal(target, keystream_words(seed, 0, 64, U64, engine="gcm"))


@needs_kernel
def test_the_engine_environment_variable_forces_an_engine_or_is_refused() -> None:
    base = {**os.environ, "PYTHONPATH": str(REPO)}
    code = "from spherecal.crypto import native\nprint(native.engine())\n"
    for name in ENGINES:
        env = {**base, native.ENGINE_ENV: name}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == name
    env = {**base, native.ENGINE_ENV: "rot13"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode != 0 and "SPHERECAL_NATIVE_ENGINE='rot13'" in done.stderr


@needs_kernel
def test_the_kernel_masks_in_threads_with_the_gil_released() -> None:
    """Calls from several threads at once (the GIL released inside) each give their
    own reference bytes: no shared keystream or key-schedule state."""
    import threading

    assert KERNEL is not None
    rng = np.random.default_rng(11)
    jobs = []
    for _ in range(4):
        key, block = rng.bytes(16), rng.bytes(12) + (2).to_bytes(4, "big")
        jobs.append((key, block, np.frombuffer(ctr_reference(key, block, 1 << 20), dtype=U64)))
    results: dict[int, bool] = {}

    def work(i: int) -> None:
        key, block, ks = jobs[i]
        target = np.zeros(ks.shape[0], dtype=U64)
        for _ in range(5):
            target[:] = 0
            KERNEL.apply(target, None, key, block, b"\xff", 8)
        results[i] = bool(np.array_equal(target, (0 - ks.astype(np.uint64))))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {0: True, 1: True, 2: True, 3: True}


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],  # the engine, per test
)
@given(
    total=st.integers(1, 9000),
    chunk_blocks=st.integers(1, 700),
    masks=st.integers(0, 6),
    narrow=st.booleans(),
    in_place=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_native_plans_equal_the_numpy_path_byte_for_byte(
    kernel_engine: str,
    total: int,
    chunk_blocks: int,
    masks: int,
    narrow: bool,
    in_place: bool,
    seed: int,
) -> None:
    """Random plans (any count of masks, odd and even, any signs), chunk sizes across the
    kernel's 8 KiB blocks, partial last blocks, with and without a separate source."""
    dtype = U32 if narrow else U64
    rng = np.random.default_rng(seed)
    plan = [(s, int(rng.choice([-1, 1]))) for s in seeds(masks, rng)]
    chunk = chunk_blocks * 16 // dtype.itemsize
    source: Any = rng.integers(0, 1 << 62, total).astype(dtype)
    fast, slow = MaskExpander(chunk, dtype, native=True), MaskExpander(chunk, dtype, native=False)
    for start in range(0, total, chunk):
        part = source[start : start + chunk]
        a, b = part.copy(), part.copy()
        if in_place:
            fast.apply_plan(a, plan, start)
            slow.apply_plan(b, plan, start)
        else:
            fast.apply_plan(a, plan, start, source=part)
            slow.apply_plan(b, plan, start, source=part)
        assert a.tobytes() == b.tobytes()
        prefix = rng.bytes(int(rng.integers(0, 40)))
        framed = fast.masked_bytes(prefix, plan, start, part)
        assert framed == slow.masked_bytes(prefix, plan, start, part) == prefix + b.tobytes()


@pytest.mark.parametrize("dtype", [U64, U32])
def test_native_calls_split_at_segment_boundaries(
    monkeypatch: pytest.MonkeyPatch, dtype: np.dtype, kernel_engine: str
) -> None:
    """A chunk straddling a segment (shrunk to 4 blocks, the nonce base about to wrap)
    takes the next nonce in both paths, in place and framed."""
    monkeypatch.setattr(prg, "SEGMENT_BLOCKS", 4)
    monkeypatch.setattr(prg, "SEGMENT_BYTES", 64)
    rng = np.random.default_rng(3)
    plan = [
        (MaskSeed(key=rng.bytes(16), nonce=b"\xff" * 11 + b"\xfe"), 1),
        *[(s, -1) for s in seeds(2, rng)],
    ]
    per_block = 16 // dtype.itemsize
    chunk = 7 * per_block
    source = rng.integers(0, 1 << 62, 40 * per_block).astype(dtype)
    fast, slow = MaskExpander(chunk, dtype, native=True), MaskExpander(chunk, dtype, native=False)
    for start in (0, 7 * per_block, 2 * per_block, 33 * per_block):
        part = source[start : start + chunk]
        a, b = np.empty_like(part), np.empty_like(part)
        fast.apply_plan(a, plan, start, source=part)
        slow.apply_plan(b, plan, start, source=part)
        assert a.tobytes() == b.tobytes()
        assert fast.masked_bytes(b"hdr", plan, start, part) == b"hdr" + b.tobytes()


@needs_kernel
def test_the_kernel_refuses_malformed_calls() -> None:
    assert KERNEL is not None
    target = np.zeros(8, dtype=U64)
    key, ctr = bytes(16), bytes(16)
    with pytest.raises(ValueError, match="signs"):
        KERNEL.apply(target, None, key, ctr, b"\x02", 8)
    with pytest.raises(ValueError, match="key and counter"):
        KERNEL.apply(target, None, key + b"x", ctr, b"\x01", 8)
    with pytest.raises(ValueError, match="word_bytes"):
        KERNEL.apply(target, None, key, ctr, b"\x01", 3)
    with pytest.raises(ValueError, match="source"):
        KERNEL.apply(target, np.zeros(4, dtype=U64), key, ctr, b"\x01", 8)
    with pytest.raises(ValueError, match="whole words"):
        KERNEL.apply_new(b"", bytes(12), key, ctr, b"\x01", 8)
    with pytest.raises(TypeError):
        KERNEL.apply(b"read-only", None, key, ctr, b"\x01", 8)
    assert not target.any()  # nothing written by a refused call


def _values(rng: np.random.Generator, n: int, f: int) -> np.ndarray:
    """Uniform values plus exact ties (k + 1/2 after scaling), zeros of both signs and
    the bound itself."""
    x = rng.uniform(-1.0, 1.0, n)
    ties = (rng.integers(-(1 << 20), 1 << 20, n // 4) + 0.5) / 2.0**f
    x[: n // 4] = np.clip(ties, -1.0, 1.0)
    x[-4:] = [0.0, -0.0, 1.0, -1.0]
    return x


@needs_kernel
@pytest.mark.parametrize("ring_bits", [64, 32])
@pytest.mark.parametrize("f", [0, 7, 20, 50])
def test_native_encoding_equals_the_numpy_encoding(ring_bits: int, f: int) -> None:
    x = _values(np.random.default_rng(f), 20_001, f)
    fast = encode(x, scale_bits=f, bound=1.0, ring_bits=ring_bits)  # tile-wise (scratch)
    whole = np.empty_like(fast)
    encode_into(whole, x, scale_bits=f, bound=1.0)  # check everything, then encode
    assert whole.tobytes() == fast.tobytes()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(native, "KERNEL", None)
        slow = encode(x, scale_bits=f, bound=1.0, ring_bits=ring_bits)
    assert fast.tobytes() == slow.tobytes()
    signed = np.rint(x * 2.0**f).astype(np.int64)
    assert np.array_equal(fast, signed.astype(fast.dtype))  # independent: np.rint


@needs_kernel
@pytest.mark.parametrize("bad", [1.0000000000000002, -1.5, np.nan, np.inf, -np.inf])
def test_native_encoding_refuses_out_of_bound_and_writes_nothing(bad: float) -> None:
    """The range check is the overflow guarantee's enforcement: one bad entry anywhere
    (here the last of a long vector) refuses the whole vector before a word is written."""
    assert KERNEL is not None
    x = np.random.default_rng(0).uniform(-1.0, 1.0, 10_000)
    x[-1] = bad
    for dtype in (U64, U32):
        out = np.full(x.shape[0], 7, dtype=dtype)
        assert KERNEL.encode(out, x, 2.0**20, 1.0) is False
        assert (out == 7).all()
        with pytest.raises(EncodingOverflow, match="1 of 10000 entries"):
            encode_into(out, x, scale_bits=20, bound=1.0)
        assert (out == 7).all()
        # scratch: refused as well, whatever it wrote (a tile-wise check and encode)
        assert KERNEL.encode(out, x, 2.0**20, 1.0, True) is False
        with pytest.raises(EncodingOverflow, match="1 of 10000 entries"):
            encode_into(out, x, scale_bits=20, bound=1.0, scratch=True)
        x[3] = bad  # in the first tile: nothing encoded past it
        out[:] = 7
        assert KERNEL.encode(out, x, 2.0**20, 1.0, True) is False
        assert (out[2048:] == 7).all()
        x[3] = 0.0
    x[-1] = 1.0  # the bound itself is in
    assert KERNEL.encode(np.empty(x.shape[0], dtype=U64), x, 2.0**20, 1.0) is True
    with pytest.raises(ValueError, match="one 4- or 8-byte word"):
        KERNEL.encode(np.empty(3, dtype=U64), x, 1.0, 1.0)


@pytest.mark.usefixtures("numpy_only")
def test_without_the_kernel_the_numpy_paths_run() -> None:
    """The fallback, forced: an expander chooses numpy, refuses to require the kernel,
    and masking, framing and encoding still give the independent reference's bytes."""
    assert not native.available() and not prg.native_kernel_available()
    expander = MaskExpander(64, U64)
    assert expander.native is False
    with pytest.raises(ValueError, match="not loaded"):
        MaskExpander(64, U64, native=True)
    seed = seeds(1, np.random.default_rng(2))[0]
    source = np.arange(64, dtype=U64)
    framed = expander.masked_bytes(b"p", [(seed, -1)], 0, source)
    assert framed == b"p" + (source - ecb_words(seed, 64, U64)).tobytes()
    assert encode([0.5, -0.25], scale_bits=2, bound=1.0).tolist() == [2, (1 << 64) - 1]


def test_the_gcm_engine_never_takes_the_native_kernel() -> None:
    assert MaskExpander(16, U64, engine="gcm").native is False
    if KERNEL is not None:
        with pytest.raises(ValueError, match="CTR engine only"):
            MaskExpander(16, U64, engine="gcm", native=True)
        assert MaskExpander(16, U64, engine="ctr").native is True


def test_the_environment_switch_turns_the_kernel_off() -> None:
    env = {**os.environ, native.ENV: "0", "PYTHONPATH": str(REPO)}
    code = (
        "from spherecal.crypto import native, prg\n"
        "assert native.KERNEL is None and not prg.native_kernel_available()\n"
        "assert prg.MaskExpander(8).native is False\n"
        "print('numpy path')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "numpy path"


def test_a_framed_chunk_is_its_plain_encoding_and_checks_what_it_is_given() -> None:
    payload = np.arange(6, dtype=U32).tobytes()
    plain = MaskedChunk(job_id=b"j" * 16, sender="site-3", index=2, payload=payload)
    chunk = MaskedChunk.framed(b"j" * 16, "site-3", 2, len(payload), lambda p: p + payload)
    assert chunk.to_bytes() == plain.to_bytes()
    assert chunk == plain and bytes(chunk.payload) == payload
    assert MaskedChunk.from_bytes(chunk.to_bytes()) == plain
    with pytest.raises(MalformedMessage, match="prefix and nbytes"):
        MaskedChunk.framed(b"j" * 16, "site-3", 2, len(payload), lambda p: p + payload[:-4])
    with pytest.raises(MalformedMessage, match="prefix and nbytes"):
        MaskedChunk.framed(b"j" * 16, "site-3", 2, len(payload), lambda p: b"x" + p[1:] + payload)


def test_a_strided_target_takes_the_numpy_path_with_the_same_result() -> None:
    rng = np.random.default_rng(5)
    plan = [(s, sign) for s, sign in zip(seeds(3, rng), (1, -1, 1), strict=True)]
    wide: Any = np.zeros(64, dtype=U64)
    strided = wide[::2]  # not contiguous: the kernel cannot take it
    MaskExpander(32, U64).apply_plan(strided, plan, 0)
    flat: Any = np.zeros(32, dtype=U64)
    MaskExpander(32, U64, native=False).apply_plan(flat, plan, 0)
    assert np.array_equal(strided, flat) and not wide[1::2].any()


def test_the_start_up_line_says_which_native_code_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(native.ENV, raising=False)
    monkeypatch.delenv(native.CODEC_ENV, raising=False)
    monkeypatch.setattr(native, "KERNEL", None)
    monkeypatch.setattr(native, "CODEC", None)
    absent = native.describe()
    assert "masking kernel not built" in absent
    assert "encoding hot paths not built" in absent
    assert "setup.py build_ext --inplace" in absent  # how to get them
    assert native.startup_message() == f"WARNING: {absent}"  # a slow path nobody chose
    monkeypatch.setenv(native.ENV, "0")
    monkeypatch.setenv(native.CODEC_ENV, "0")
    off = native.describe()
    assert f"{native.ENV}=0" in off and f"{native.CODEC_ENV}=0" in off
    assert "build_ext" not in off  # switched off on purpose: no build hint
    assert native.startup_message() == off  # chosen: said plainly (INFO)
    monkeypatch.delenv(native.CODEC_ENV)  # one off on purpose, the other missing
    assert native.startup_message().startswith("WARNING: ")
    assert "build_ext" in native.describe()  # the missing one gets the hint


@needs_kernel
def test_the_start_up_line_names_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "CODEC", object())
    line = native.describe()
    assert f"masking kernel on {native.engine()}" in line
    assert "encoding hot paths in C" in line
    assert "build_ext" not in line
    assert native.startup_message() == f"DEBUG: {line}"  # a healthy start stays quiet
