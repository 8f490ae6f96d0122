"""A site's identity key is created once, on enrolment — never because of a typo
(issue #23, item 4): the coordinator pins the key at the first join, so a new key
silently made at a mistyped path is a different identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from spherecal.cli.app import main
from spherecal.participant.enrolment import IdentityMissing, enrol, load_or_enrol
from spherecal.participant.settings import ParticipantSettings
from spherecal.proto.identity import load_identity_key


def _public(key_path: Path) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return load_identity_key(key_path).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def test_a_configured_key_that_does_not_exist_is_an_error_not_a_new_identity(
    tmp_path: Path,
) -> None:
    typo = tmp_path / "certs" / "hospital-b.identiy.key"
    settings = ParticipantSettings("p0", state_dir=tmp_path / "state", identity_key=typo)
    with pytest.raises(IdentityMissing, match=r"\[participant\] identity_key") as caught:
        load_or_enrol(settings, say=lambda _m: None)
    assert str(typo) in str(caught.value) and "--init" in str(caught.value)
    assert not typo.exists()


def test_the_default_key_is_created_on_a_sites_first_start_only(tmp_path: Path) -> None:
    said: list[str] = []
    settings = ParticipantSettings("p0", state_dir=tmp_path / "state")
    settings.state_dir.mkdir()
    first = load_or_enrol(settings, said.append)
    assert settings.identity_path.exists() and "first start" in said[0]
    assert load_or_enrol(settings, said.append).public_key() == first.public_key()
    # a site with a history whose key went missing is refused, not re-keyed
    (settings.state_dir / "jobs.db").write_bytes(b"")
    settings.identity_path.unlink()
    with pytest.raises(IdentityMissing, match="holds this site's history"):
        load_or_enrol(settings, said.append)
    assert not settings.identity_path.exists()


def test_enrol_creates_once_and_never_replaces(tmp_path: Path) -> None:
    settings = ParticipantSettings("p0", identity_key=tmp_path / "site.identity.key")
    path, created = enrol(settings)
    before = _public(path)
    assert created
    assert enrol(settings) == (path, False)
    assert _public(path) == before


def _config(tmp_path: Path, identity_key: Path) -> Path:
    config = tmp_path / "participant.toml"
    config.write_text(
        "[participant]\n"
        'id = "p0"\n'
        'coordinator = "127.0.0.1:1"\n'
        "insecure = true\n"
        f'state_dir = "{tmp_path / "state"}"\n'
        f'identity_key = "{identity_key}"\n'
        "[data]\n"
        'dataset = "digits"\n'
    )
    return config


def test_the_cli_names_the_missing_key_and_init_enrols(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "site.identity.key"
    config = _config(tmp_path, key)
    assert main(["participant", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(key) in err and "identity_key" in err
    assert not key.exists()
    assert main(["participant", "--config", str(config), "--init"]) == 0
    assert f"created identity key {key}" in capsys.readouterr().out
    before = _public(key)
    assert main(["participant", "--config", str(config), "--init"]) == 0
    assert "kept the existing" in capsys.readouterr().out and _public(key) == before


# ------------------------------------------------------------- under mutual TLS
# The certificate binds the site's identity key (a urn:spherecal:ed25519: URI SAN): a
# key made here is never the one it binds, and the coordinator refuses its joins.


@pytest.fixture
def requested(tmp_path: Path) -> Path:
    """A CA, and site p0's keys made at the site (``keys/``) and certified from its
    request, as docs/deployment.md step 1 makes them."""
    from spherecal.certs import init_ca, issue_participant, request_participant

    init_ca(tmp_path / "ca")
    csr, _, _ = request_participant(tmp_path / "keys", "p0")
    issue_participant(tmp_path / "ca", "p0", csr=csr)
    return tmp_path


def _tls(tmp_path: Path, identity_key: Path | None, cert: str = "p0.pem") -> ParticipantSettings:
    from spherecal.participant.settings import ClientTLS

    return ParticipantSettings(
        "p0",
        state_dir=tmp_path / "state",
        identity_key=identity_key,
        tls=ClientTLS(ca=tmp_path / "ca" / "ca.pem", cert=tmp_path / "ca" / cert),
    )


def test_under_tls_a_missing_key_points_at_the_request_not_init(requested: Path) -> None:
    typo = requested / "keys" / "p0.identiy.key"
    for configured in (typo, None):  # a mistyped path, or none (the default in state_dir)
        settings = _tls(requested, configured)
        settings.state_dir.mkdir(exist_ok=True)
        with pytest.raises(IdentityMissing) as caught:
            load_or_enrol(settings, say=lambda _m: None)
        said = str(caught.value)
        assert "spherecal certs request p0" in said and "p0.identity.key" in said, said
        assert "--init` would make another key" in said, said
        assert not settings.identity_path.exists()  # no first-start key under TLS
        with pytest.raises(IdentityMissing, match="--init makes no key"):
            enrol(settings)
        assert not settings.identity_path.exists()


def test_under_tls_the_key_must_be_the_one_the_certificate_binds(requested: Path) -> None:
    from spherecal.participant.enrolment import IdentityNotCertified, key_fingerprint

    right = requested / "keys" / "p0.identity.key"
    assert load_or_enrol(_tls(requested, right), say=lambda _m: None)  # the request's key
    assert enrol(_tls(requested, right)) == (right, False)
    other = requested / "other.identity.key"
    enrol(ParticipantSettings("p0", identity_key=other, insecure=True))  # --init's key
    for attempt in (
        lambda: load_or_enrol(_tls(requested, other), say=lambda _m: None),
        lambda: enrol(_tls(requested, other)),  # --init does not get past it either
    ):
        with pytest.raises(IdentityNotCertified) as caught:
            attempt()
        said = str(caught.value)
        assert key_fingerprint(_public(other)) in said and key_fingerprint(_public(right)) in said
        assert "p0.identity.key" in said and "unpin" in said, said


def test_under_tls_a_certificate_of_another_site_is_named(requested: Path) -> None:
    from spherecal.certs import issue_participant
    from spherecal.participant.enrolment import IdentityNotCertified

    issue_participant(requested / "ca", "p1")
    with pytest.raises(IdentityNotCertified, match="is issued for 'p1', not for this site 'p0'"):
        load_or_enrol(
            _tls(requested, requested / "ca" / "p1.identity.key", cert="p1.pem"),
            say=lambda _m: None,
        )
