"""The canonical encoding's native hot paths (``crypto/_fastcodec.c``, issue #24) give
exactly what the Python code that defines them gives, on valid and on malformed input,
and that code runs whenever the helper is absent or switched off.

The side-by-side tests need the extension (``setup.py`` builds it when the project is
installed; ``python setup.py build_ext --inplace`` in a checkout) and skip, saying so,
where it is not built. The fallback tests run everywhere.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import os
import random
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spherecal.crypto import InvalidSpec, JobSpec, MalformedMessage, native
from spherecal.crypto._codec import (
    MAX_ID_BYTES,
    Reader,
    Writer,
    encode_context,
    encode_context_texts,
)
from spherecal.crypto._fields import _CHECKED, sorted_unique
from spherecal.crypto.graph import Graph, _cycle_order, _order_keys

HELPER = native.CODEC
needs_helper = pytest.mark.skipif(
    HELPER is None,
    reason="the native codec helper is not loaded: not built here (python setup.py "
    "build_ext --inplace) or switched off (SPHERECAL_NATIVE_CODEC=0)",
)
REPO = Path(__file__).resolve().parents[3]
ALPHABET = "abz09-_.@\u00e9\u4e2d\U0001f600"


def random_ids(rng: random.Random, n: int) -> tuple[str, ...]:
    ids: set[str] = set()
    while len(ids) < n:
        ids.add("".join(rng.choice(ALPHABET) for _ in range(rng.randrange(1, 30))))
    return tuple(sorted(ids))


Outcome = tuple[str, object]


def outcome(call: Callable[[], object]) -> Outcome:
    """What a call gives: its value, or its exception's type and message."""
    try:
        return ("value", call())
    except Exception as exc:  # compared by the caller, not swallowed
        return (type(exc).__name__, str(exc))


def read_list(data: bytes) -> tuple[str, ...]:
    reader = Reader(data)
    out = reader.texts()
    reader.finish()
    return out


@pytest.fixture
def python_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(native, "CODEC", None)
    yield


def both(monkeypatch: pytest.MonkeyPatch, call: Callable[[], object]) -> tuple[Outcome, Outcome]:
    """``call``'s outcome with the native helpers, then with the Python code alone."""
    with_helper = outcome(call)
    monkeypatch.setattr(native, "CODEC", None)
    python = outcome(call)
    monkeypatch.setattr(native, "CODEC", HELPER)
    return with_helper, python


@needs_helper
@pytest.mark.parametrize("n", [0, 1, 2, 17, 500])
def test_a_list_reads_the_same_natively(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    ids = random_ids(random.Random(n), n)
    data = Writer().texts(ids).getvalue()
    native_out, python_out = both(monkeypatch, lambda: read_list(data))
    assert native_out == python_out == ("value", ids)


@needs_helper
def test_ids_between_other_fields_leave_the_reader_where_python_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ids = random_ids(random.Random(7), 40)
    data = Writer().u32(9).texts(ids).blob(b"tail").getvalue()

    def read() -> tuple[int, tuple[str, ...], bytes]:
        reader = Reader(memoryview(data))
        value = (reader.u32(), reader.texts(), reader.blob())
        reader.finish()
        return value

    assert both(monkeypatch, read) == (("value", (9, ids, b"tail")),) * 2


@needs_helper
def test_every_truncation_fails_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    data = Writer().texts(random_ids(random.Random(3), 6)).getvalue()
    for cut in range(len(data)):
        piece = data[:cut]
        native_out, python_out = both(monkeypatch, lambda: read_list(piece))  # noqa: B023
        assert native_out == python_out
        assert native_out[0] == "MalformedMessage"


@needs_helper
@pytest.mark.parametrize(
    "defect",
    [
        "overlong",  # a length over MAX_ID_BYTES
        "bad-utf8",  # a lone continuation byte
        "surrogate",  # UTF-8 of a surrogate, which strict decoding refuses
        "overlong-utf8",  # an overlong encoding of "/"
        "count",  # a count far beyond what the bytes hold
        "trailing",  # one byte after the list
    ],
)
def test_each_defect_fails_with_the_same_error(
    monkeypatch: pytest.MonkeyPatch, defect: str
) -> None:
    good = [b"alpha", b"beta"]
    items = {
        "overlong": [b"x" * (MAX_ID_BYTES + 1)],
        "bad-utf8": [b"ok", b"a\x80b"],
        "surrogate": [b"\xed\xa0\x80"],
        "overlong-utf8": [b"\xc0\xaf"],
    }.get(defect, good)
    count = (1 << 20) if defect == "count" else len(items)
    data = struct.pack(">I", count) + b"".join(struct.pack(">I", len(i)) + i for i in items)
    if defect == "trailing":
        data += b"\x00"
    native_out, python_out = both(monkeypatch, lambda: read_list(data))
    assert native_out == python_out
    assert native_out[0] == "MalformedMessage"


@needs_helper
def test_the_helper_refuses_without_allocating_for_an_impossible_count() -> None:
    assert HELPER is not None
    assert HELPER.read_texts(b"\x00\x00\x00\x01a", 0, 1 << 40, MAX_ID_BYTES) is None
    assert HELPER.read_texts(b"", 0, 1, MAX_ID_BYTES) is None
    assert HELPER.read_texts(b"\x00\x00\x00\x01a", 9, 0, MAX_ID_BYTES) is None
    assert HELPER.read_texts(b"\x00\x00\x00\x01a", 0, 1, MAX_ID_BYTES) == (("a",), 5)


@needs_helper
@pytest.mark.parametrize("seed", range(6))
def test_the_cycle_order_is_the_same_natively(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = random.Random(seed)
    ids = random_ids(rng, rng.choice([2, 3, 10, 100, 600]))
    job_id = rng.randbytes(rng.randrange(1, 64))
    reference = tuple(sorted(ids, key=_order_keys(job_id)))
    assert both(monkeypatch, lambda: _cycle_order(ids, job_id)) == (("value", reference),) * 2
    if len(ids) > 3:
        graph = Graph(ids, "harary", 3, job_id)
        monkeypatch.setattr(native, "CODEC", None)
        python_graph = Graph(ids, "harary", 3, job_id)
        assert all(graph.neighbours(p) == python_graph.neighbours(p) for p in ids)


@needs_helper
def test_order_digests_are_sha256_of_the_context_encoding() -> None:
    """Against hashlib and the context encoding built by hand (not through the code
    under test): ``SHA-256(prefix || 0x01 || u32be(len) || utf8)``."""
    assert HELPER is not None
    ids = ["p1", "\u00e9t\u00e9", ""]
    prefix = os.urandom(33)
    expected = [
        hashlib.sha256(prefix + b"\x01" + struct.pack(">I", len(p.encode())) + p.encode()).digest()
        for p in ids
    ]
    assert HELPER.order_digests(prefix, ids) == expected
    with pytest.raises(TypeError):
        HELPER.order_digests(prefix, ["ok", 3])
    with pytest.raises(UnicodeEncodeError):
        HELPER.order_digests(prefix, ["\ud800"])


@needs_helper
@pytest.mark.parametrize("n", [0, 1, 450])
def test_a_context_with_an_id_list_encodes_the_same(
    monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    ids = random_ids(random.Random(n + 1), n)
    head = ("spherecal", "survivors", os.urandom(32), b"job")
    reference = encode_context(*head, *ids)
    encoded = both(monkeypatch, lambda: encode_context_texts(*head, texts=ids))
    assert encoded == (("value", reference),) * 2


@pytest.mark.parametrize("graph", ["complete", "harary"])
@pytest.mark.parametrize("ring_bits", [32, 64])
def test_a_decoded_spec_digest_is_the_digest_of_its_encoding(graph: str, ring_bits: int) -> None:
    """``from_bytes`` takes the digest from the bytes it read; it must be what
    re-encoding gives (the reader is canonical, the constructor only checks)."""
    ids = random_ids(random.Random(ring_bits), 12)
    spec = JobSpec.create(
        ids,
        threshold=5,
        length=1001,
        bound=0.3,
        graph=graph,
        ring_bits=ring_bits,
        noise_bound=7,
    )
    data = spec.to_bytes()
    decoded = JobSpec.from_bytes(data)
    assert decoded.digest == hashlib.sha256(decoded.to_bytes()).digest() == spec.digest
    assert decoded == spec


def test_python_paths_run_without_the_helper(python_only: None) -> None:
    ids = random_ids(random.Random(11), 30)
    assert read_list(Writer().texts(ids).getvalue()) == ids
    with pytest.raises(MalformedMessage, match="not valid UTF-8"):
        read_list(struct.pack(">II", 1, 1) + b"\xff")
    job_id = b"job"
    assert _cycle_order(ids, job_id) == tuple(sorted(ids, key=_order_keys(job_id)))
    assert encode_context_texts("a", texts=ids) == encode_context("a", *ids)


def test_the_environment_switch_turns_the_helper_off() -> None:
    code = "from spherecal.crypto import native; print(native.CODEC is None)"
    env = {**os.environ, native.CODEC_ENV: "0"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "True"


class Kind(enum.IntEnum):
    SEED = 1


class Label(str):
    pass


CONTEXT_PARTS: list[tuple[object, ...]] = [
    (),
    ("",),
    (b"",),
    (0,),
    ((1 << 64) - 1,),
    ("spherecal", "share-commitment", 2, b"\x00" * 32, b"job", "p1", "p\u00e9", 7),
    ("\U0001f600", b"\xff" * 300, 1 << 40),
    (Kind.SEED, "a"),  # an int subclass: encoded as its value
    (Label("x"), b"y"),  # a str subclass: the Python path
    (bytearray(b"ab"), memoryview(b"cd")),  # other buffers: the Python path
    (1 << 64,),  # too large: struct.error, from the Python path
    (-1,),  # negative: struct.error
    (True,),  # booleans are refused
    ("\ud800",),  # a lone surrogate cannot be encoded
]


@needs_helper
@pytest.mark.parametrize("parts", CONTEXT_PARTS, ids=range(len(CONTEXT_PARTS)))
def test_a_context_encodes_the_same_natively(
    monkeypatch: pytest.MonkeyPatch, parts: tuple[object, ...]
) -> None:
    native_out, python_out = both(monkeypatch, lambda: encode_context(*parts))  # type: ignore[arg-type]
    assert native_out == python_out


@needs_helper
def test_the_native_context_is_the_writer_encoding_by_hand() -> None:
    """Against the encoding written out by hand, not through the code under test."""
    assert HELPER is not None
    expected = (
        struct.pack(">I", 3)
        + b"\x00"
        + struct.pack(">Q", 5)
        + b"\x01"
        + struct.pack(">I", 2)
        + "\u00e9".encode()
        + b"\x02"
        + struct.pack(">I", 1)
        + b"z"
    )
    assert HELPER.encode_context((5, "\u00e9", b"z")) == expected
    assert HELPER.encode_context((bytearray(b"z"),)) is None


ID_LISTS: list[tuple[object, ...] | list[str]] = [
    (),
    ("a",),
    ("a", "b", "c"),
    ("b", "a"),  # unsorted
    ("a", "a"),  # duplicate
    ("", "a"),  # empty id
    ("x" * 255, "y"),
    ("x" * 256,),  # over 255 bytes
    ("\u00e9" * 127 + "a",),  # 255 bytes of UTF-8 in 128 characters
    ("\u00e9" * 128,),  # 256 bytes of UTF-8 in 128 characters
    ("a\tb",),  # not printable: the spec refuses it, messages do not
    ("a", 3),  # not a str
    ("\ud800",),  # a lone surrogate
    ["a", "b"],  # not a tuple
    (Label("a"), "b"),  # a str subclass
]


def sorted_unique_outcome(items: object) -> Outcome:
    _CHECKED.clear()  # no memo: each call checks
    return outcome(lambda: sorted_unique(items, "members"))  # type: ignore[arg-type]


@needs_helper
@pytest.mark.parametrize("items", ID_LISTS, ids=range(len(ID_LISTS)))
def test_an_id_list_is_accepted_or_refused_alike(
    monkeypatch: pytest.MonkeyPatch, items: tuple[object, ...]
) -> None:
    native_out, python_out = both(monkeypatch, lambda: sorted_unique_outcome(items))
    assert native_out == python_out


@needs_helper
@pytest.mark.parametrize("items", ID_LISTS, ids=range(len(ID_LISTS)))
def test_a_spec_roster_is_accepted_or_refused_alike(
    monkeypatch: pytest.MonkeyPatch, items: tuple[object, ...]
) -> None:
    good = JobSpec.create(["p0", "p1", "p2"], threshold=2, length=10, bound=1.0)

    def validate() -> None:
        object.__setattr__(good, "participants", items)
        good.validate()

    native_out, python_out = both(monkeypatch, validate)
    assert native_out == python_out
    if len(items) >= 2 and native_out[0] == "value":
        assert isinstance(items, tuple) and items == tuple(sorted(set(items)))  # type: ignore[type-var]
    if items == ("a\tb",):
        assert native_out[0] == InvalidSpec.__name__


@needs_helper
@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    count=st.integers(min_value=0, max_value=40),
    body=st.binary(max_size=400),
    ids=st.lists(st.text(max_size=12), max_size=12),
)
def test_any_bytes_read_the_same_natively(
    monkeypatch: pytest.MonkeyPatch, count: int, body: bytes, ids: list[str]
) -> None:
    """Arbitrary bytes after a count, and well-formed lists with a random tail cut or
    appended: the native reader and the Python loop agree on the value or the error
    (the reader parses bytes straight from the network)."""
    raw = struct.pack(">I", count) + body
    native_out, python_out = both(monkeypatch, lambda: read_list(raw))
    assert native_out == python_out
    try:
        well_formed = Writer().texts(ids).getvalue()
    except UnicodeEncodeError:  # a surrogate: not encodable, nothing to read
        return
    for data in (
        well_formed,
        well_formed[: len(body) % (len(well_formed) + 1)],
        well_formed + body[:3],
    ):
        native_out, python_out = both(monkeypatch, functools.partial(read_list, data))
        assert native_out == python_out


@needs_helper
@pytest.mark.parametrize(
    "ids",
    [
        (),
        ("a",),
        random_ids(random.Random(5), 300),
        ["x", "\u00e9\U0001f600"],
        ("ok", "\ud800"),
        ("a", 3),
    ],
    ids=["empty", "one", "300", "list", "surrogate", "not-str"],
)
def test_a_list_writes_the_same_natively(monkeypatch: pytest.MonkeyPatch, ids: object) -> None:
    """The coordinator writes U1, U2 and the survivor sets for every participant: the
    native writer gives the Python loop's bytes, or leaves its error to it."""
    native_out, python_out = both(monkeypatch, lambda: Writer().texts(ids).getvalue())  # type: ignore[arg-type]
    assert native_out == python_out
    if native_out[0] == "value":
        assert read_list(native_out[1]) == tuple(ids)  # type: ignore[arg-type]
    generated = both(monkeypatch, lambda: Writer().texts(iter(["b", "c"])).getvalue())
    assert generated == (("value", Writer().texts(("b", "c")).getvalue()),) * 2


@needs_helper
def test_refused_input_leaves_no_reference_behind() -> None:
    """Every id list and context part a site or the coordinator reads off the network
    passes through this C code: a reference it took on an error path and never gave back
    would keep the refused message's objects alive forever — a memory leak per malformed
    message. Each function, fed input it refuses, returns its inputs' reference counts
    to what they were."""
    assert HELPER is not None
    ids = [f"p{i:04d}" for i in range(50)]
    good = HELPER.write_texts(ids)
    assert good is not None
    cases: list[tuple[Callable[..., object], tuple[object, ...]]] = [
        (HELPER.read_texts, (good[: len(good) // 2], 0, 50, MAX_ID_BYTES)),
        (HELPER.read_texts, (good, 0, 10**6, MAX_ID_BYTES)),
        (HELPER.read_texts, (good[:4] + b"\xff" + good[5:], 0, 50, MAX_ID_BYTES)),
        (HELPER.read_texts, (good, 0, 50, 2)),
        (HELPER.write_texts, ([*ids, "\ud800"],)),
        (HELPER.write_texts, ([*ids, b"x"],)),
        (HELPER.sorted_ids, ((*ids, ids[0]), MAX_ID_BYTES, True)),
        (HELPER.sorted_ids, ((*ids, None), MAX_ID_BYTES, True)),
        (HELPER.encode_context, (("label", 1 << 70, ids[0]),)),
        (HELPER.encode_context, (("label", 1.5, ids[0]),)),
        (HELPER.encode_context, (("label", "\ud800", ids[0]),)),
        (HELPER.context_texts, ([*ids, 7],)),
        (HELPER.order_digests, (b"head", [*ids, 7])),
    ]
    for call, args in cases:
        # the arguments and, for a list or tuple, each of its items
        watched = [*args, *(x for a in args if isinstance(a, (list, tuple)) for x in a)]
        before = [sys.getrefcount(x) for x in watched]
        for _ in range(100):
            with contextlib.suppress(Exception):  # the outcome is compared elsewhere
                call(*args)
        after = [sys.getrefcount(x) for x in watched]
        assert after == before, f"{call.__name__}{args!r:.80}: references leaked"
