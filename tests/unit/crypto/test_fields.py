"""``sorted_unique``: the C-level path for ASCII id lists (issue #24) accepts and
refuses exactly what the item-by-item rule does, with the same messages."""

from __future__ import annotations

import random

import pytest

from spherecal.crypto import MalformedMessage
from spherecal.crypto._fields import sorted_unique


def _item_by_item(items: object, what: str) -> str | None:
    """The rule written out per item: the first error's message, or None."""
    if not isinstance(items, tuple):
        return f"{what} must be a tuple"
    for item in items:
        if not (isinstance(item, str) and 0 < len(item.encode("utf-8")) <= 255):
            return f"{what} is not a valid id"
    for a, b in zip(items, items[1:], strict=False):
        if not a < b:
            return f"{what} must be sorted and unique"
    return None


def _outcome(items: object) -> str | None:
    try:
        sorted_unique(items, "members")  # type: ignore[arg-type]
    except MalformedMessage as exc:
        return str(exc)
    return None


class Named(str):
    """A ``str`` subclass: not the fast path's exact type, still a valid id."""


CASES: list[object] = [
    (),
    ("a",),
    ("a", "b", "c"),
    ("b", "a"),
    ("a", "a"),
    ("a", ""),
    ("", "a"),
    ("a", "x" * 255),
    ("a", "x" * 256),
    ("a", "é" * 127),  # 254 bytes
    ("a", "é" * 128),  # 256 bytes in UTF-8, 128 characters: refused
    ("a", b"b"),
    ("a", 3),
    ("a", Named("b")),
    ("a\x00", "b"),
    ["a", "b"],
    ("p10", "p9"),  # string order, not numeric
]


@pytest.mark.parametrize("items", CASES, ids=repr)
def test_same_verdict_and_message_as_item_by_item(items: object) -> None:
    assert _outcome(items) == _item_by_item(items, "members")


def test_random_id_lists_agree() -> None:
    rng = random.Random(7)
    alphabet = "abcxyz019-_é"
    for _ in range(2000):
        ids = [
            "".join(rng.choice(alphabet) for _ in range(rng.choice([0, 1, 2, 3, 5, 256])))
            for _ in range(rng.randrange(0, 8))
        ]
        if rng.random() < 0.6:
            ids = sorted(set(ids))
        items = tuple(ids)
        assert _outcome(items) == _item_by_item(items, "members"), items


def test_a_remembered_list_spares_only_that_very_tuple() -> None:
    """The coordinator's n messages of a job share one member tuple, checked once; any
    other object — equal, reordered, or a list — is checked in full."""
    good = tuple(f"site-{i:04d}" for i in range(200))
    sorted_unique(good, "members")
    sorted_unique(good, "members")  # remembered
    swapped = (good[1], good[0], *good[2:])
    assert _outcome(swapped) == "members must be sorted and unique"
    assert _outcome(list(good)) == "members must be a tuple"
    duplicated = (*good[:100], good[99], *good[101:])
    assert _outcome(duplicated) == "members must be sorted and unique"
    assert _outcome(tuple(good)) is None
    for k in range(20):  # more lists than are remembered: each still checked
        other = tuple(f"x{k:02d}-{i:04d}" for i in range(100))
        assert _outcome(other) is None
        assert _outcome((*other[1:], other[0])) == "members must be sorted and unique"
