"""Durable replacement (``spherefed.durable``): every writer of a file that a process
must find again after a crash syncs the folder after its rename, so the rename itself
survives a power loss. Observed on the real system calls: ``os.fsync`` and
``os.replace`` still run; a wrapper records which path each one touched, in order."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from spherecal.coordinator.driver.model import Checkpoints
from spherecal.participant.algorithm_state import ClientStateStore
from spherecal.participant.held_jobs import HeldJobStore
from spherecal.spherefed import durable
from spherecal.spherefed.durable import fsync_folder, replace_durably
from spherecal.spherefed.saved import save_state_dict

Calls = list[tuple[str, Path]]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Calls]:
    """``("fsync", path)`` and ``("replace", final)`` in the order they happened."""
    seen: Calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        seen.append(("fsync", Path(os.readlink(f"/proc/self/fd/{fd}"))))
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        real_replace(src, dst)
        seen.append(("replace", Path(dst).resolve()))

    monkeypatch.setattr(os, "fsync", fsync)
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
