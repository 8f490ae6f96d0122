"""``[tls] peer_keys``: the members the sites agreed on, pinned with their identity keys.

A site checks its peers' keys against CA-signed certificates, so whoever holds the CA
key can issue a certificate for a new member, or for an existing name with another
key, and seat such members in a job beside one real site. Pinned, a directory entry
must name a listed member with exactly its key; the file is read strictly; the site
must be listed under its own key; without the file a site under TLS does not start
unless it says the CA alone decides (``[policy] trust_ca_for_members``, a logged
weakening); ``spherecal certs pin`` prints the lines."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from spherecal.certs import init_ca, issue_participant
from spherecal.cli.app import main
from spherecal.crypto import generate_identity, identity_public_bytes
from spherecal.participant.policy import PolicySettings
from spherecal.participant.settings import ClientTLS, ParticipantSettings
from spherecal.participant.trust import (
    DirectoryTrust,
    MembersNotPinned,
    UntrustedDirectory,
    load_peer_keys,
    pin_line,
    pins_fingerprint,
    site_directory_trust,
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


def _settings(
    tmp_path: Path, peer_keys: Path | None, *, trust_ca: bool = False
) -> ParticipantSettings:
    ca = tmp_path / "ca.pem"
    if not ca.exists():
        init_ca(tmp_path / "pki")
        ca.write_bytes((tmp_path / "pki" / "ca.pem").read_bytes())
    return ParticipantSettings(
        participant_id="p0",
        coordinator="coord.example.org:50051",
        tls=ClientTLS(ca=ca, peer_keys=peer_keys),
        state_dir=tmp_path / "state",
        policy=PolicySettings(trust_ca_for_members=trust_ca),
    )


def test_a_site_must_be_pinned_under_its_own_key(tmp_path: Path) -> None:
    me, other = generate_identity(), generate_identity()
    mine = pin_line("p0", identity_public_bytes(me))
    peers = tmp_path / "peers.txt"
    peers.write_text(f"{mine}\n{pin_line('p1', identity_public_bytes(other))}\n")
    said: list[str] = []
    trust = site_directory_trust(_settings(tmp_path, peers), identity_public_bytes(me), said.append)
    assert trust.verifies_certificates and trust.pinned == {
        "p0": identity_public_bytes(me),
        "p1": identity_public_bytes(other),
    }
    assert said == [
        f"peers pinned: 2 members from {peers} (fingerprint "
        f"{pins_fingerprint(load_peer_keys(peers))}: the same at every site)"
    ]
    with pytest.raises(MembersNotPinned, match="does not pin this site") as caught:
        site_directory_trust(  # a file made for another site
            _settings(tmp_path, peers), identity_public_bytes(other), said.append
        )
    assert pin_line("p0", identity_public_bytes(other)) in str(caught.value)


def test_unpinned_peers_are_refused_unless_the_site_says_the_ca_decides(tmp_path: Path) -> None:
    """The safe setting is the default: a site under TLS without ``[tls] peer_keys``
    does not start, and the refusal tells it how to pin (its own line included) and
    which explicit key says the CA alone decides; that key is a logged weakening, and
    with a pin file beside it the configuration contradicts itself."""
    me = identity_public_bytes(generate_identity())
    said: list[str] = []
    with pytest.raises(MembersNotPinned, match=r"\[tls\] peer_keys is not set") as caught:
        site_directory_trust(_settings(tmp_path, None), me, said.append)
    message = str(caught.value)
    assert pin_line("p0", me) in message and "spherecal certs pin" in message
    assert "trust_ca_for_members = true" in message and said == []

    relaxed = _settings(tmp_path, None, trust_ca=True)
    trust = site_directory_trust(relaxed, me, said.append)
    assert trust.verifies_certificates and trust.pinned is None  # the CA alone decides
    assert said == [
        "peers are trusted as the federation's CA issued them ([policy] trust_ca_for_members)"
    ]
    (weakened,) = [r for r in relaxed.policy.relaxations() if "trust_ca_for_members" in r]
    assert "read this site's input from the sum" in weakened
    assert not any("trust_ca" in r for r in PolicySettings().relaxations())

    peers = tmp_path / "peers.txt"
    peers.write_text(pin_line("p0", me) + "\n")
    with pytest.raises(MembersNotPinned, match="remove one of the two"):
        site_directory_trust(_settings(tmp_path, peers, trust_ca=True), me, said.append)
    with pytest.raises(ValueError, match="trust_ca_for_members must be true or false"):
        PolicySettings(trust_ca_for_members="yes")  # type: ignore[arg-type]


def test_loopback_simulations_take_the_directory_as_given(tmp_path: Path) -> None:
    insecure = replace(_settings(tmp_path, None), insecure=True, coordinator="127.0.0.1:1")
    trust = site_directory_trust(insecure, identity_public_bytes(generate_identity()), print)
    assert not trust.verifies_certificates and trust.pinned is None


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


def test_the_fingerprint_names_the_list_not_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sites compare one short code instead of every key: the same members and keys
    in any order, with any comments, give the same code; one key bit, one name, one
    member more or less gives another. Checked against SHA-256 computed here."""
    import hashlib

    keys = {name: identity_public_bytes(generate_identity()) for name in ("a", "b", "c")}
    lines = [pin_line(name, key) for name, key in keys.items()]
    one = tmp_path / "one.txt"
    one.write_text("\n".join(lines) + "\n")
    other = tmp_path / "other.txt"
    other.write_text("# the sites' list\n\n" + "\n".join(reversed(lines)) + "  # read aloud\n")
    code = pins_fingerprint(load_peer_keys(one))
    assert code == pins_fingerprint(load_peer_keys(other))
    expected = hashlib.sha256(
        b"spherecal peer_keys fingerprint v1\n" + "".join(f"{x}\n" for x in sorted(lines)).encode()
    ).hexdigest()[:20]
    assert code.replace("-", "") == expected and len(code.split("-")) == 5

    flipped = dict(keys, b=bytes([keys["b"][0] ^ 1]) + keys["b"][1:])
    renamed = {("B" if k == "b" else k): v for k, v in keys.items()}
    fewer = {k: v for k, v in keys.items() if k != "c"}
    more = dict(keys, d=identity_public_bytes(generate_identity()))
    assert len({code, *(pins_fingerprint(x) for x in (flipped, renamed, fewer, more))}) == 5

    assert main(["certs", "pins", str(other)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"3 members, fingerprint {code}"
    assert [row.split()[0] for row in out[:-1]] == ["a", "b", "c"]
    assert out[0].split()[1] == keys["a"].hex()[:16] + "…"
    (tmp_path / "bad.txt").write_text("a zz\n")
    assert main(["certs", "pins", str(tmp_path / "bad.txt")]) == 2
    assert "line 1: the key of 'a' is not hexadecimal" in capsys.readouterr().err
