"""``[tls] peer_keys``: the members the sites agreed on, pinned with their identity keys.

A site checks its peers' keys against CA-signed certificates, so whoever holds the CA
key can issue a certificate for a new member, or for an existing name with another
key, and seat such members in a job beside one real site. Pinned, a directory entry
must name a listed member with exactly its key; the file is read strictly; the site
must be listed under its own key; ``spherecal certs pin`` prints the lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from spherecal.certs import init_ca, issue_participant
from spherecal.cli.app import main
from spherecal.crypto import generate_identity, identity_public_bytes
from spherecal.participant.main import _peer_keys
from spherecal.participant.settings import ClientTLS, ParticipantSettings
from spherecal.participant.trust import (
    DirectoryTrust,
    UntrustedDirectory,
    load_peer_keys,
    pin_line,
)
from spherecal.preflight import PreflightError, check_participant
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.identity import load_identity_key, public_key_bytes


def _entry(directory: Path, name: str) -> pb.DirectoryEntry:
    key = public_key_bytes(load_identity_key(directory / f"{name}.identity.key"))
    return pb.DirectoryEntry(
        participant_id=name,
        identity_public_key=key,
        certificate_pem=(directory / f"{name}.pem").read_bytes(),
    )


def test_the_ca_holders_new_members_are_refused_once_pinned(tmp_path: Path) -> None:
    ca = tmp_path / "ca"
    init_ca(ca)
    for name in ("p0", "p1"):
        issue_participant(ca, name)
    agreed = {name: bytes(_entry(ca, name).identity_public_key) for name in ("p0", "p1")}
    honest = [_entry(ca, "p0"), _entry(ca, "p1")]
    # the CA's holder issues a new member, and "p1" again under a key of its own
    issue_participant(ca, "p9")
    issue_participant(ca, "p1", new_identity=True)
    minted, replaced = _entry(ca, "p9"), _entry(ca, "p1")
    root = (ca / "ca.pem").read_bytes()

    unpinned = DirectoryTrust(root)  # the mutation check: the CA alone admits both
    assert set(unpinned.verify([honest[0], minted, replaced], ["p0", "p1", "p9"])) == {
        "p0",
        "p1",
        "p9",
    }
    pinned = DirectoryTrust(root, pins=agreed)
    assert pinned.verify(honest, ["p0", "p1"]) == agreed
    with pytest.raises(UntrustedDirectory, match="'p9' is not a member pinned"):
        pinned.verify([honest[0], minted], ["p0", "p9"])
    with pytest.raises(UntrustedDirectory, match="not the one pinned for it"):
        pinned.verify([honest[0], replaced], ["p0", "p1"])


def test_the_file_is_read_strictly(tmp_path: Path) -> None:
    key = identity_public_bytes(generate_identity())
    good = tmp_path / "peers.txt"
    good.write_text(f"# the members\n\n{pin_line('p0', key)}  # site A\nP-1 {'ab' * 32}\n")
    assert load_peer_keys(good) == {"p0": key, "P-1": bytes.fromhex("ab" * 32)}
    cases = {
        "p0\n": "line 1: expected `NAME HEX`",
        f"p0 {key.hex()} extra\n": "line 1: expected",
        "p0 zz\n": "line 1: the key of 'p0' is not hexadecimal",
        f"# x\np0 {key.hex()[:-2]}\n": "line 2: the key of 'p0' has 31 bytes",
        f"p0 {key.hex()}\np0 {key.hex()}\n": "line 2: 'p0' is listed twice",
        "# nobody\n": "no member listed",
    }
    for text, message in cases.items():
        bad = tmp_path / "bad.txt"
        bad.write_text(text)
        with pytest.raises(ValueError, match=message) as caught:
            load_peer_keys(bad)
        assert "[tls] peer_keys = " in str(caught.value) and "bad.txt" in str(caught.value)
    with pytest.raises(ValueError, match="cannot read it"):
        load_peer_keys(tmp_path / "missing.txt")


def _settings(tmp_path: Path, peer_keys: Path | None) -> ParticipantSettings:
    return ParticipantSettings(
        participant_id="p0",
        coordinator="coord.example.org:50051",
        tls=ClientTLS(peer_keys=peer_keys),
        state_dir=tmp_path / "state",
    )


def test_a_site_must_be_pinned_under_its_own_key(tmp_path: Path) -> None:
    me, other = generate_identity(), generate_identity()
    mine = pin_line("p0", identity_public_bytes(me))
    peers = tmp_path / "peers.txt"
    peers.write_text(f"{mine}\n{pin_line('p1', identity_public_bytes(other))}\n")
    said: list[str] = []
    pins = _peer_keys(_settings(tmp_path, peers), me, said.append)
    assert pins is not None and set(pins) == {"p0", "p1"}
    assert said == [f"peers pinned: 2 members from {peers}"]
    with pytest.raises(ValueError, match="does not pin this site") as caught:
        _peer_keys(_settings(tmp_path, peers), other, said.append)  # a file made for another
    assert pin_line("p0", identity_public_bytes(other)) in str(caught.value)
    said.clear()
    assert _peer_keys(_settings(tmp_path, None), me, said.append) is None
    (note,) = said
    assert "trusted as the federation's CA issued them" in note and "peer_keys" in note


def test_preflight_names_a_malformed_file(tmp_path: Path) -> None:
    ca = tmp_path / "ca"
    init_ca(ca)
    issue_participant(ca, "p0")
    peers = tmp_path / "peers.txt"
    peers.write_text("p0 not-hex\n")
    settings = ParticipantSettings(
        participant_id="p0",
        tls=ClientTLS(ca=ca / "ca.pem", cert=ca / "p0.pem", key=ca / "p0.key", peer_keys=peers),
        state_dir=tmp_path / "state",
    )
    with pytest.raises(PreflightError, match="participant.toml: .*line 1: the key of 'p0'"):
        check_participant(settings, "participant.toml")


def test_certs_pin_prints_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ca = tmp_path / "ca"
    init_ca(ca)
    issue_participant(ca, "hospital-b")
    path = ca / "hospital-b.identity.key"
    assert main(["certs", "pin", "hospital-b", "--identity-key", str(path)]) == 0
    expected = pin_line("hospital-b", identity_public_bytes(load_identity_key(path)))
    assert capsys.readouterr().out == expected + "\n"
    assert load_peer_keys(_written(tmp_path, expected))["hospital-b"] == bytes(
        _entry(ca, "hospital-b").identity_public_key
    )
    assert main(["certs", "pin", "x", "--identity-key", str(tmp_path / "none.key")]) == 2
    assert "no such file" in capsys.readouterr().err


def _written(tmp_path: Path, line: str) -> Path:
    path = tmp_path / "pins.txt"
    path.write_text(line + "\n")
    return path
