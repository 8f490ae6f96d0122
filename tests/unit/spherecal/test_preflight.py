"""TLS material is checked at start-up, with one line naming the config key (issue
#23, item 3): a key that does not belong to its certificate, a CA file that holds no
certificate. gRPC's own diagnosis of the same mistakes was wrong ("cannot listen … is
the address local?" at the coordinator, "cannot reach the coordinator" at a site)."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from spherecal.certs import init_ca, issue_participant
from spherecal.cli.app import main
from spherecal.participant.policy import PolicySettings
from spherecal.participant.settings import ClientTLS, ParticipantSettings
from spherecal.preflight import PreflightError, check_coordinator, check_participant


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    init_ca(directory)
    issue_participant(directory, "p0")
    issue_participant(directory, "p1")
    return directory


def _coordinator(tmp_path: Path, certs: Path, **tls: Path | None) -> SimpleNamespace:
    files = {
        "cert": certs / "server.pem",
        "key": certs / "server.key",
        "client_ca": certs / "ca.pem",
        "crl": None,
    } | tls
    return SimpleNamespace(
        participants=("p0", "p1", "p2"),
        secagg=SimpleNamespace(updates=True, statistics=True, evaluation=True, min_participants=3),
        server=SimpleNamespace(insecure=False),
        tls=SimpleNamespace(**files),
        out_dir=tmp_path / "out",
    )


def _participant(tmp_path: Path, certs: Path, **tls: Path | None) -> ParticipantSettings:
    files = {"ca": certs / "ca.pem", "cert": certs / "p0.pem", "key": certs / "p0.key"} | tls
    return ParticipantSettings(
        participant_id="p0",
        tls=ClientTLS(ca=files["ca"], cert=files["cert"], key=files["key"]),
        state_dir=tmp_path / "state",
        out_dir=tmp_path / "out",
        policy=PolicySettings(trust_ca_for_members=True),  # pinning: test_peer_keys.py
    )


def test_matching_material_passes(tmp_path: Path, certs: Path) -> None:
    check_coordinator(_coordinator(tmp_path, certs), "c.toml")
    check_participant(_participant(tmp_path, certs), "p.toml")


def test_a_key_of_another_certificate_is_named(tmp_path: Path, certs: Path) -> None:
    with pytest.raises(PreflightError, match=r"\[tls\] key = .*p1\.key.* does not belong to"):
        check_participant(_participant(tmp_path, certs, key=certs / "p1.key"), "p.toml")
    with pytest.raises(PreflightError, match=r"c\.toml: \[tls\] key = .*p0\.key.*server\.pem"):
        check_coordinator(_coordinator(tmp_path, certs, key=certs / "p0.key"), "c.toml")


def test_unparseable_material_is_named(tmp_path: Path, certs: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(PreflightError, match=r"\[tls\] client_ca = .*junk\.pem.*not a PEM"):
        check_coordinator(_coordinator(tmp_path, certs, client_ca=junk), "c.toml")
    with pytest.raises(PreflightError, match=r"\[tls\] ca = .*junk\.pem.*not a PEM"):
        check_participant(_participant(tmp_path, certs, ca=junk), "p.toml")
    with pytest.raises(PreflightError, match=r"\[tls\] key = .*junk\.pem.*not an unencrypted"):
        check_participant(_participant(tmp_path, certs, key=junk), "p.toml")
    with pytest.raises(PreflightError, match=r"\[tls\] cert = .*junk\.pem.*not a PEM"):
        check_participant(_participant(tmp_path, certs, cert=junk), "p.toml")


def test_the_coordinator_command_says_it_in_one_line(
    tmp_path: Path, certs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "certs"
    shutil.copytree(certs, mine)
    shutil.copy(mine / "p0.key", mine / "server.key")  # the wrong key in the right place
    config = tmp_path / "coordinator.toml"
    config.write_text(
        '[federation]\nparticipants = ["p0", "p1", "p2"]\n'
        f'state_dir = "{tmp_path / "state"}"\nout_dir = "{tmp_path / "out"}"\n'
        '[server]\nlisten = "127.0.0.1:0"\n'
        f'[tls]\ncert = "{mine / "server.pem"}"\nkey = "{mine / "server.key"}"\n'
        f'client_ca = "{mine / "ca.pem"}"\n'
    )
    assert main(["coordinator", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert "[tls] key" in err and "does not belong to" in err and "listen" not in err


def test_unset_tls_material_is_named_before_anything_starts(
    tmp_path: Path, certs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unset ``[tls]`` key used to surface only once the coordinator had created its
    state ("TLS needs [tls] cert and key", naming no file), and a participant's once it
    was running; now it is one line naming the file and the keys, before any work."""
    with pytest.raises(PreflightError, match=r"^c\.toml: \[tls\] client_ca not set: mutual"):
        check_coordinator(_coordinator(tmp_path, certs, client_ca=None), "c.toml")
    with pytest.raises(PreflightError, match=r"^p\.toml: \[tls\] cert, \[tls\] key not set"):
        check_participant(_participant(tmp_path, certs, cert=None, key=None), "p.toml")
    config = tmp_path / "coordinator.toml"
    config.write_text(
        '[federation]\nparticipants = ["p0", "p1", "p2"]\n'
        f'state_dir = "{tmp_path / "state"}"\nout_dir = "{tmp_path / "out"}"\n'
        '[server]\nlisten = "127.0.0.1:0"\n'
        f'[tls]\ncert = "{certs / "server.pem"}"\nkey = "{certs / "server.key"}"\n'
    )
    assert main(["coordinator", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert "coordinator.toml: [tls] client_ca not set" in err
    assert not (tmp_path / "state").exists()  # nothing was created


def test_a_roster_too_small_for_secure_aggregation_is_refused(
    tmp_path: Path, certs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two sites with secure aggregation on (the default minimum is 3) used to start,
    wait for both sites and then fail every round at the job's creation."""
    two = _coordinator(tmp_path, certs)
    two.participants = ("p0", "p1")
    with pytest.raises(PreflightError, match=r"c\.toml: \[federation\] participants lists 2"):
        check_coordinator(two, "c.toml")
    two.secagg = SimpleNamespace(
        updates=False, statistics=False, evaluation=False, min_participants=3
    )
    check_coordinator(two, "c.toml")  # nothing secure: nothing to refuse
    config = tmp_path / "coordinator.toml"
    config.write_text(
        '[federation]\nparticipants = ["hospital-a", "hospital-b"]\n'
        f'state_dir = "{tmp_path / "state"}"\nout_dir = "{tmp_path / "out"}"\n'
        '[server]\nlisten = "127.0.0.1:0"\ninsecure = true\n'
    )
    assert main(["coordinator", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert "[secure_aggregation] min_participants = 3" in err and "at least 3 sites" in err
    assert not (tmp_path / "state").exists()


# ------------------------------------------------------ a certificate's lifetime
def test_the_validity_window_refuses_outside_and_warns_near_its_end(
    tmp_path: Path, certs: Path
) -> None:
    """A TLS peer refuses a certificate outside its window without a word to its
    holder, so the start-up check says it; within ``EXPIRY_WARNING_DAYS`` of the end it
    is a warning. The dates are the certificate's own (``now`` stands in for the
    clock)."""
    import datetime as dt

    from cryptography import x509

    from spherecal.preflight import (
        CLIENT_RENEWAL,
        EXPIRY_WARNING_DAYS,
        certificate_window,
    )

    pem = certs / "p0.pem"
    cert = x509.load_pem_x509_certificate(pem.read_bytes())
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    second = dt.timedelta(seconds=1)
    warn_from = end - dt.timedelta(days=EXPIRY_WARNING_DAYS)
    assert certificate_window("[tls] cert", pem, CLIENT_RENEWAL, now=start) is None
    assert certificate_window("[tls] cert", pem, CLIENT_RENEWAL, now=warn_from - second) is None
    soon = certificate_window("[tls] cert", pem, CLIENT_RENEWAL, now=warn_from + second)
    assert soon is not None and soon.startswith("WARNING: [tls] cert = ")
    assert f"expires on {end:%Y-%m-%d %H:%M} UTC" in soon and "certs request p0" in soon
    assert certificate_window("[tls] cert", pem, CLIENT_RENEWAL, now=end) is not None
    with pytest.raises(PreflightError, match=f"expired on {end:%Y-%m-%d %H:%M} UTC"):
        certificate_window("[tls] cert", pem, CLIENT_RENEWAL, now=end + second)
    with pytest.raises(PreflightError, match=f"is not valid until {start:%Y-%m-%d %H:%M} UTC"):
        certificate_window("[tls] cert", pem, CLIENT_RENEWAL, now=start - second)
    assert certificate_window("[tls] cert", None, CLIENT_RENEWAL) is None


def test_the_service_checks_name_their_own_certificate(tmp_path: Path, certs: Path) -> None:
    from tests.cert_dates import redate

    soon = redate(certs, certs / "p0.pem", start_days=-1, end_days=2, out=tmp_path / "soon.pem")
    (warning,) = check_participant(_participant(tmp_path, certs, cert=soon), "p.toml")
    assert warning.startswith("WARNING: p.toml: [tls] cert = ") and "soon.pem" in warning
    assert check_participant(_participant(tmp_path, certs), "p.toml") == []
    old = redate(certs, certs / "server.pem", start_days=-9, end_days=-2, out=tmp_path / "old.pem")
    with pytest.raises(PreflightError, match=r"^c\.toml: \[tls\] cert = .*old\.pem' expired on"):
        check_coordinator(_coordinator(tmp_path, certs, cert=old), "c.toml")
    assert check_coordinator(_coordinator(tmp_path, certs), "c.toml") == []
