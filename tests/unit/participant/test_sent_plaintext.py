"""The plaintext releases a site keeps as they left (``participant.sent_plaintext``):
sealed, 0600, found only for the same release and task, deleted with the federation;
a file that fails its check is not used. (The attack it closes is played in
``tests/security/test_job_terms.py``.)"""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np
import pytest

from spherecal import crypto
from spherecal.participant.sent_plaintext import (
    FOLDER,
    SentPlaintext,
    SentPlaintextStore,
    task_digest,
)
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import header_for

VECTOR = np.linspace(-1.0, 1.0, 257) * np.pi
SENT = SentPlaintext(
    federation="fed-1",
    release="task-R",
    task=b"t" * 32,
    vector=VECTOR,
    meta=pb.UpdateMeta(num_samples=222, mean_loss=0.5, num_steps=7),
)


def _store(tmp: Path, log: list[str], key: object = None, pid: str = "p0") -> SentPlaintextStore:
    identity = key if key is not None else crypto.generate_identity()
    return SentPlaintextStore(tmp, pid, identity, log.append)  # type: ignore[arg-type]


def _same(a: SentPlaintext | None, b: SentPlaintext) -> bool:
    assert a is not None
    return (
        (a.federation, a.release, a.task, a.meta) == (b.federation, b.release, b.task, b.meta)
        and a.vector.dtype == np.float64
        and a.vector.tobytes() == b.vector.tobytes()
    )


def test_kept_sealed_0600_and_found_for_its_release_and_task_only(tmp_path: Path) -> None:
    log: list[str] = []
    identity = crypto.generate_identity()
    store = _store(tmp_path, log, identity)
    store.keep("update", SENT)
    path = tmp_path / FOLDER / "update.sent"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert VECTOR.tobytes()[:64] not in path.read_bytes()
    again = _store(tmp_path, log, identity)  # a restarted process
    assert _same(again.find("update", "task-R", b"t" * 32), SENT)
    assert again.find("update", "task-S", b"t" * 32) is None  # another release
    assert again.find("update", "task-R", b"u" * 32) is None  # another task
    assert again.find("ffc", "task-R", b"t" * 32) is None  # another kind
    assert sorted(p.name for p in path.parent.iterdir()) == ["update.sent"]  # no temp
    statistics = SentPlaintext("fed-1", "task-S", b"s" * 32, VECTOR[:10], None)
    again.keep("ffc", statistics)
    assert _same(again.find("ffc", "task-S", b"s" * 32), statistics)
    assert log == []


def test_a_file_that_fails_its_check_is_not_used(tmp_path: Path) -> None:
    log: list[str] = []
    store = _store(tmp_path, log)
    store.keep("update", SENT)
    path = tmp_path / FOLDER / "update.sent"
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 1
    path.write_bytes(bytes(blob))
    assert store.find("update", "task-R", b"t" * 32) is None
    assert not path.exists() and "integrity check" in log[-1]
    store.keep("update", SENT)  # another identity (or participant) cannot read it
    assert _store(tmp_path, log).find("update", "task-R", b"t" * 32) is None
    assert not path.exists()


def test_kept_for_another_federation_goes_when_the_site_joins_one(tmp_path: Path) -> None:
    log: list[str] = []
    store = _store(tmp_path, log)
    store.keep("update", SENT)
    store.keep("ccvr", SentPlaintext("fed-2", "task-C", b"c" * 32, VECTOR, None))
    store.keep_only("fed-1")
    assert store.find("update", "task-R", b"t" * 32) is not None
    assert store.find("ccvr", "task-C", b"c" * 32) is None
    store.clear()  # the federation ended
    assert list((tmp_path / FOLDER).iterdir()) == []


def test_without_a_state_directory_it_is_kept_in_memory(tmp_path: Path) -> None:
    store = SentPlaintextStore(None, "p0", crypto.generate_identity(), lambda _m: None)
    store.keep("update", SENT)
    assert _same(store.find("update", "task-R", b"t" * 32), SENT)
    store.keep_only("fed-2")
    assert store.find("update", "task-R", b"t" * 32) is None
    assert not (tmp_path / FOLDER).exists()


def test_the_task_digest_is_its_content_and_seed_not_its_blob_names() -> None:
    plan = pb.Plan(federation_id="fed-1", rounds=2)
    model = np.arange(5, dtype=np.float64)

    def task(name: str, seed: int, array: np.ndarray = model) -> pb.TrainTask:
        return pb.TrainTask(
            round=0, seed=seed, model=pb.TensorRef(name=name, header=header_for(array))
        )

    assert task_digest(task("a", 7), plan) == task_digest(task("renamed", 7), plan)
    assert task_digest(task("a", 7), plan) != task_digest(task("a", 8), plan)
    assert task_digest(task("a", 7), plan) != task_digest(task("a", 7, model + 1), plan)
    assert task_digest(task("a", 7), plan) != task_digest(
        task("a", 7), pb.Plan(federation_id="fed-2", rounds=2)
    )


def test_a_malformed_record_is_refused() -> None:
    body = SENT.to_bytes()
    with pytest.raises(ValueError):
        SentPlaintext.from_bytes(body[:-8])  # an entry short
