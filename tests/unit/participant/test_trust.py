"""Peers' identity keys are accepted only when a CA-signed certificate binds them."""

from __future__ import annotations

from pathlib import Path

import pytest

from spherecal.certs import init_ca, issue_participant
from spherecal.participant.trust import DirectoryTrust, UntrustedDirectory
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.identity import load_identity_key, public_key_bytes


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    init_ca(root / "ca")
    init_ca(root / "other")
    for name in ("p0", "p1"):
        issue_participant(root / "ca", name)
    issue_participant(root / "other", "p1")
    return root


def _entry(directory: Path, name: str, as_id: str | None = None) -> pb.DirectoryEntry:
    key = public_key_bytes(load_identity_key(directory / f"{name}.identity.key"))
    return pb.DirectoryEntry(
        participant_id=as_id or name,
        identity_public_key=key,
        certificate_pem=(directory / f"{name}.pem").read_bytes(),
    )


def test_certified_directory_is_accepted(pki: Path) -> None:
    trust = DirectoryTrust((pki / "ca" / "ca.pem").read_bytes())
    entries = [_entry(pki / "ca", "p0"), _entry(pki / "ca", "p1")]
    keys = trust.verify(entries, ["p0", "p1"])
    assert keys["p0"] == entries[0].identity_public_key


def test_substituted_or_foreign_entries_are_refused(pki: Path) -> None:
    trust = DirectoryTrust((pki / "ca" / "ca.pem").read_bytes())
    good = _entry(pki / "ca", "p0")
    swapped = pb.DirectoryEntry()
    swapped.CopyFrom(good)
    swapped.identity_public_key = _entry(pki / "ca", "p1").identity_public_key
    with pytest.raises(UntrustedDirectory, match="differs from its certificate"):
        trust.verify([swapped, _entry(pki / "ca", "p1")], ["p0", "p1"])
    with pytest.raises(UntrustedDirectory, match="not issued"):
        trust.verify([good, _entry(pki / "other", "p1")], ["p0", "p1"])
    with pytest.raises(UntrustedDirectory, match="offered as"):
        trust.verify([good, _entry(pki / "ca", "p0", as_id="p1")], ["p0", "p1"])
    with pytest.raises(UntrustedDirectory, match="no entry"):
        trust.verify([good], ["p0", "p1"])
    bare = pb.DirectoryEntry(participant_id="p1", identity_public_key=b"k" * 32)
    with pytest.raises(UntrustedDirectory, match="no certificate"):
        trust.verify([good, bare], ["p0", "p1"])
    with pytest.raises(UntrustedDirectory, match="twice"):
        trust.verify([good, good], ["p0"])


def test_without_a_ca_the_directory_is_taken_as_given() -> None:
    trust = DirectoryTrust(None)
    entry = pb.DirectoryEntry(participant_id="p0", identity_public_key=b"k" * 32)
    assert trust.verify([entry], ["p0"]) == {"p0": b"k" * 32}
    assert not trust.verifies_certificates


def test_only_the_needed_entries_are_verified_and_returned(pki: Path) -> None:
    """The participant checks the entries of the parties whose signatures it checks
    (``crypto.keys_needed``); entries for anyone else are ignored — a foreign
    certificate or a duplicate there neither fails nor is returned."""
    trust = DirectoryTrust((pki / "ca" / "ca.pem").read_bytes())
    good = _entry(pki / "ca", "p0")
    foreign = _entry(pki / "other", "p1")
    assert trust.verify([good, foreign, foreign], {"p0"}) == {"p0": good.identity_public_key}
    bogus = pb.DirectoryEntry(participant_id="p9", identity_public_key=b"short")
    assert trust.verify([bogus, good], ["p0"]) == {"p0": good.identity_public_key}
    with pytest.raises(UntrustedDirectory, match="no entry for job participant 'p1'"):
        trust.verify([good, bogus], {"p0", "p1"})
    with pytest.raises(UntrustedDirectory, match="not issued"):
        trust.verify([good, foreign], {"p0", "p1"})
