"""A participant's SCAFFOLD control variate on disk: retries start from the state
before the retried round, participants sharing a directory never mix, and a damaged
file is refused rather than read as zero."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from spherecal.participant.algorithm_state import ClientStateStore, CorruptClientState


def test_state_before_and_after_each_round(tmp_path: Path) -> None:
    store = ClientStateStore(tmp_path, "f00d", "p0")
    assert store.for_round(0) is None
    a, b = np.arange(4.0), np.arange(4.0) * -2
    store.commit(0, None, {"control": a})
    assert store.for_round(0) is None  # round 0 retried: start from nothing again
    after0 = store.for_round(1)
    assert after0 is not None and np.array_equal(after0["control"], a)
    store.commit(1, after0, {"control": b})
    retry = store.for_round(1)
    assert retry is not None and np.array_equal(retry["control"], a)
    nxt = store.for_round(2)
    assert nxt is not None and np.array_equal(nxt["control"], b)
    # A fresh store object on the same directory (a restarted participant) sees it.
    again = ClientStateStore(tmp_path, "f00d", "p0").for_round(2)
    assert again is not None and np.array_equal(again["control"], b)


def test_participants_and_federations_are_kept_apart(tmp_path: Path) -> None:
    ClientStateStore(tmp_path, "f00d", "p0").commit(0, None, {"control": np.ones(2)})
    assert ClientStateStore(tmp_path, "f00d", "p1").for_round(1) is None
    assert ClientStateStore(tmp_path, "beef", "p0").for_round(1) is None
    with pytest.raises(ValueError, match="safe file name"):
        ClientStateStore(tmp_path, "../escape", "p0")


def test_a_damaged_file_is_refused(tmp_path: Path) -> None:
    store = ClientStateStore(tmp_path, "f00d", "p0")
    store.commit(0, None, {"control": np.ones(3)})
    store.path.write_bytes(b"not an npz file")
    with pytest.raises(CorruptClientState):
        store.for_round(1)
