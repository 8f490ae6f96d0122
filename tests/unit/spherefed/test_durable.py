"""Durable writes (``spherefed.durable``): every writer of a file that a process must
find again after a crash syncs the folder after its rename, so the rename itself
survives a power loss; a site's held-job record after the first is one appended record
made durable by one ``fdatasync`` (issue #24). Observed on the real system calls:
``os.fsync``, ``os.fdatasync`` and ``os.replace`` still run; a wrapper records which
path each one touched, in order."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from spherecal.coordinator.driver.model import Checkpoints
from spherecal.coordinator.state.storage_faults import storage_failure
from spherecal.participant.algorithm_state import ClientStateStore
from spherecal.participant.held_jobs import HeldJobStore
from spherecal.spherefed import durable
from spherecal.spherefed.durable import fsync_folder, replace_durably
from spherecal.spherefed.saved import save_state_dict

Calls = list[tuple[str, Path]]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Calls]:
    """``("fsync", path)``, ``("fdatasync", path)`` and ``("replace", final)`` in the
    order they happened (a sync is recorded once it returned)."""
    seen: Calls = []
    real_fsync, real_fdatasync, real_replace = os.fsync, os.fdatasync, os.replace

    def fsync(fd: int) -> None:
        where = Path(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)
        seen.append(("fsync", where))

    def fdatasync(fd: int) -> None:
        where = Path(os.readlink(f"/proc/self/fd/{fd}"))
        real_fdatasync(fd)
        seen.append(("fdatasync", where))

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        real_replace(src, dst)
        seen.append(("replace", Path(dst).resolve()))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(os, "replace", replace)
    yield seen


def _folder_synced_after_rename(calls: Calls, final: Path) -> bool:
    final = final.resolve()
    renames = [i for i, call in enumerate(calls) if call == ("replace", final)]
    return bool(renames) and ("fsync", final.parent) in calls[renames[-1] + 1 :]


def test_replace_durably_renames_then_syncs_the_folder(tmp_path: Path, calls: Calls) -> None:
    final = tmp_path / "state.bin"
    final.write_bytes(b"old")
    tmp = tmp_path / ".state.bin.tmp"
    tmp.write_bytes(b"new")
    replace_durably(tmp, final)
    assert final.read_bytes() == b"new" and not tmp.exists()
    assert _folder_synced_after_rename(calls, final)


def test_fsync_folder_syncs_that_folder(tmp_path: Path, calls: Calls) -> None:
    fsync_folder(tmp_path)
    assert calls == [("fsync", tmp_path.resolve())]


def _writers(root: Path) -> dict[str, tuple[Callable[[], object], Path]]:
    store = ClientStateStore(root / "site", "fed", "p0")
    held = HeldJobStore(root / "held-site", "p0", Ed25519PrivateKey.generate())
    return {
        "saved model": (
            lambda: save_state_dict({"w": torch.ones(3)}, root / "out" / "model_none.pt"),
            root / "out" / "model_none.pt",
        ),
        "coordinator checkpoint": (
            lambda: Checkpoints(root / "ckpt").save(0, np.ones(4)),
            root / "ckpt" / "round-00001.pt",
        ),
        "site algorithm state": (
            lambda: store.commit(1, None, {"x": np.ones(2)}),
            store.path,
        ),
        "site held masked input": (
            lambda: held.save_masked(b"\x01" * 16, [b"\x00" * 64], 1),
            held.masked_path(b"\x01" * 16),
        ),
    }


@pytest.mark.parametrize(
    "writer",
    ["saved model", "coordinator checkpoint", "site algorithm state", "site held masked input"],
)
def test_every_writer_syncs_the_folder_after_its_rename(
    tmp_path: Path, calls: Calls, writer: str
) -> None:
    write, final = _writers(tmp_path)[writer]
    write()
    assert final.exists()
    assert _folder_synced_after_rename(calls, final), calls


def test_mutation_a_rename_without_the_folder_sync_is_caught(
    tmp_path: Path, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(durable, "fsync_folder", lambda folder: None)
    final = tmp_path / "f"
    tmp = tmp_path / "f.tmp"
    tmp.write_bytes(b"x")
    replace_durably(tmp, final)
    assert not _folder_synced_after_rename(calls, final)


# ------------------------------------------------------------------ appends (issue #24)
def test_append_durably_writes_at_the_end_it_is_given_then_fdatasyncs(
    tmp_path: Path, calls: Calls
) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"head" + b"torn tail")
    assert durable.append_durably(path, b"record", at=4)
    assert path.read_bytes() == b"headrecord"  # the torn tail is cut off first
    assert calls == [("fdatasync", path.resolve())]
    calls.clear()
    assert not durable.append_durably(path, b"x", at=100)  # not the file it wrote
    assert path.read_bytes() == b"headrecord" and calls == []
    with pytest.raises(FileNotFoundError):
        durable.append_durably(tmp_path / "none", b"x", at=0)


def _appended_durably(calls: Calls, path: Path, before: Callable[[], bool]) -> bool:
    """The job's file was synced by one ``fdatasync`` and nothing else: no temporary
    file, no rename, no folder sync — and the sync came after the record reached the
    file (``before``: the file was then as it is now)."""
    return calls == [("fdatasync", path.resolve())] and bool(before())


def test_a_held_job_record_after_the_first_is_one_append_and_one_fdatasync(
    tmp_path: Path, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first save creates the log atomically (rename, then the folder synced);
    each later one appends a record that is durable, by one ``fdatasync`` of that
    file, when ``save`` returns (the message it precedes leaves only then)."""
    from spherecal.participant import held_jobs

    held = HeldJobStore(tmp_path, "p0", Ed25519PrivateKey.generate())
    job = b"\x01" * 16
    record = held_jobs.HeldJob("fed", b"job", 1, None, (), b'{"state": 1}')
    held.save(job, record)
    path = held.path(job)
    assert _folder_synced_after_rename(calls, path)
    size = path.stat().st_size
    calls.clear()
    seen_at_sync: list[bytes] = []
    recorded = os.fdatasync  # the fixture's recording wrapper

    def fdatasync(fd: int) -> None:  # what the file held when it was synced
        seen_at_sync.append(path.read_bytes())
        recorded(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    held.save(job, record)
    assert path.stat().st_size > size
    assert _appended_durably(calls, path, lambda: seen_at_sync[-1] == path.read_bytes())


def test_mutation_an_append_without_its_sync_is_caught(
    tmp_path: Path, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spherecal.participant import held_jobs

    def unsynced(path: Path, data: bytes, *, at: int) -> bool:
        with path.open("r+b") as f:
            f.seek(at)
            f.write(data)
        return True

    held = HeldJobStore(tmp_path, "p0", Ed25519PrivateKey.generate())
    job = b"\x01" * 16
    record = held_jobs.HeldJob("fed", b"job", 1, None, (), b'{"state": 1}')
    held.save(job, record)
    calls.clear()
    monkeypatch.setattr(held_jobs, "append_durably", unsynced)
    held.save(job, record)
    assert held.load(job) == record  # written, readable ...
    assert not _appended_durably(calls, held.path(job), lambda: True)  # ... not durable


def test_the_record_without_keys_replaces_the_log_durably(tmp_path: Path, calls: Calls) -> None:
    """After the masked input is stored, its record (no keys) is a new log renamed
    over the old one with the folder synced: no key record survives a power loss
    beside the stored masked input."""
    from spherecal import crypto
    from spherecal.participant import held_jobs

    held = HeldJobStore(tmp_path, "p0", Ed25519PrivateKey.generate())
    job = b"\x01" * 16
    with_keys = held_jobs.HeldJob("fed", b"job", 1, None, (), b'{"state": 1}')
    masked = crypto.HeldState(
        job_id=job,
        participant_id="p0",
        stage=crypto.HeldStage.MASKED,
        members1=("p0",),
        members2=("p0",),
        held=(),
    )
    without = held_jobs.HeldJob("fed", b"job", 1, None, (), masked.to_bytes())
    held.save(job, with_keys)
    held.save(job, with_keys)  # appended
    calls.clear()
    held.save(job, without)
    assert _folder_synced_after_rename(calls, held.path(job)), calls
    assert not any(call[0] == "fdatasync" for call in calls)


def test_the_masked_input_is_synced_before_the_record_naming_it(
    tmp_path: Path, calls: Calls
) -> None:
    """The masked input keeps its atomic write: fsynced, renamed and its folder synced
    before ``save_masked`` returns (``held_upload`` then writes the record naming it)."""
    held = HeldJobStore(tmp_path, "p0", Ed25519PrivateKey.generate())
    job = b"\x01" * 16
    chunks = [bytes([k]) * (1 << 20) for k in range(3)]
    held.save_masked(job, chunks, len(chunks))
    final = held.masked_path(job)
    fsyncs = [i for i, call in enumerate(calls) if call[0] == "fsync" and call[1] != final.parent]
    assert len(fsyncs) == 1 and _folder_synced_after_rename(calls, final)
    assert fsyncs[0] < calls.index(("replace", final.resolve()))
    assert list(held.masked_chunks(job)) == chunks


def test_a_full_disk_during_a_checkpoint_names_the_file_and_leaves_no_partial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``torch.save`` writes through a file object, whose ``ENOSPC`` carries no file
    name: the coordinator's fatal line then named only its state directory (the stop
    and storage integration test, on a machine fast enough for the disk to fill during
    a checkpoint). The error now names the file written, and the partial file is gone."""

    def full(obj: object, fh: object) -> None:
        fh.write(b"partial")  # type: ignore[attr-defined]
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", full)
    root = tmp_path / "state"
    with pytest.raises(OSError) as info:
        Checkpoints(root / "checkpoints").save(0, np.ones(4))
    partial = root / "checkpoints" / "round-00001.pt.tmp"
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(partial)
    assert not partial.exists() and not (root / "checkpoints" / "round-00001.pt").exists()
    fault = storage_failure(root, info.value)  # as the federation reports it
    assert fault is not None and str(partial) in str(fault) and "ENOSPC" in str(fault)
