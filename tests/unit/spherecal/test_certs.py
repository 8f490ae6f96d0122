"""``spherecal certs``: ``--days N`` is N whole days, and the guide's commands run as
written.

``--days 0`` used to succeed and write a certificate whose notAfter was the moment it
was issued (notBefore is set back five minutes for slow clocks, so it was "valid" for
those five minutes, all in the past): a site using it was refused in every TLS
handshake, silently. ``--days -1`` ended in the library's own message. Both are now
one line naming ``--days``, before anything is written.

A CA outside its validity window signed certificates and CRLs that every peer
refused, and ``--days`` could outlast the CA: ``issue`` and ``revoke`` refuse such a
CA in one line naming ``ca.pem`` and its dates, and ``issue`` refuses a ``--days``
ending after the CA's end, naming the longest possible (without ``--days``, the
certificate ends with a CA that ends within the year).

docs/deployment.md step 1 had the operator issue from ``hospital-b.csr`` while
``certs request`` writes ``certs/hospital-b.csr``: run literally, it failed.

``[tls] crl`` must name a file that exists, and only the first ``certs revoke`` wrote
one: the first revocation took a coordinator restart. ``certs init`` now writes an
empty CA-signed ``crl.pem`` that the guide's coordinator config names from the start;
``certs crl`` writes one for a CA made before.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest
from cryptography import x509

from spherecal.certs import (
    CLOCK_SKEW,
    init_ca,
    issue_participant,
    request_participant,
    revoke_participant,
)
from spherecal.cli.app import main
from spherecal.coordinator.server.revocation import load_verified_crl
from tests.cert_dates import redate

REPO = Path(__file__).resolve().parents[3]


def _window(pem: Path) -> tuple[dt.datetime, dt.datetime]:
    cert = x509.load_pem_x509_certificate(pem.read_bytes())
    return cert.not_valid_before_utc, cert.not_valid_after_utc


@pytest.mark.parametrize("days", ["0", "-1"])
def test_days_below_one_is_one_line_naming_days_and_writes_nothing(
    tmp_path: Path, days: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = tmp_path / "ca"
    init_ca(ca)
    site = tmp_path / "site"
    request_participant(site, "site-a")
    before = set(ca.iterdir())
    argv = ["certs", "issue", "site-a", "--dir", str(ca), "--csr", str(site / "site-a.csr")]
    assert main([*argv, "--days", days]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert err.startswith(f"spherecal certs: error: --days {days}: a certificate must be")
    assert "not valid after date" not in err  # the library's message, no more
    assert set(ca.iterdir()) == before  # no certificate written
    # the keys made at the CA: nothing made either
    assert main(["certs", "issue", "site-b", "--dir", str(ca), "--days", days]) == 2
    assert set(ca.iterdir()) == before
    # a new CA: no directory made
    assert main(["certs", "init", str(tmp_path / "ca2"), "--days", days]) == 2
    assert not (tmp_path / "ca2").exists()
    # the CRL's lifetime, by the same rule
    issue_participant(ca, "site-c")
    listed = (ca / "crl.pem").read_bytes()  # the empty list `init` wrote
    assert main(["certs", "revoke", "site-c", "--dir", str(ca), "--days", days]) == 2
    assert main(["certs", "crl", "--dir", str(ca), "--days", days]) == 2
    assert (ca / "crl.pem").read_bytes() == listed
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 4 and all(f"--days {days}: " in line for line in errors), errors
    assert all("a revocation list must be" in line for line in errors[-2:])


@pytest.mark.parametrize("days", [1, 30])
def test_days_n_is_n_whole_days_from_now(tmp_path: Path, days: int) -> None:
    ca = tmp_path / "ca"
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    assert main(["certs", "init", str(ca), "--days", str(days)]) == 0
    # issued from a CA of the default 365 days (N days from a CA of N days, made a
    # moment earlier, would outlive it: refused, tested below)
    issuer = tmp_path / "ca365"
    assert main(["certs", "init", str(issuer)]) == 0
    request_participant(tmp_path / "site", "site-a")
    csr = tmp_path / "site" / "site-a.csr"
    argv = ["certs", "issue", "site-a", "--dir", str(issuer), "--csr", str(csr)]
    assert main([*argv, "--days", str(days)]) == 0
    after = dt.datetime.now(dt.UTC)
    for pem in (ca / "ca.pem", ca / "server.pem", issuer / "site-a.pem"):
        start, end = _window(pem)
        # N days from the moment it was issued; the start alone is set back
        assert end - start == dt.timedelta(days=days) + CLOCK_SKEW, pem
        assert before + dt.timedelta(days=days) <= end <= after + dt.timedelta(days=days)
        assert start + CLOCK_SKEW <= after


def test_days_past_what_x509_holds_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["certs", "init", str(tmp_path / "ca"), "--days", "99999999"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--days 99999999: past the year 9999" in err, err
    assert not (tmp_path / "ca").exists()


def _step_one() -> list[list[str]]:
    """The ``spherecal`` commands of deployment.md's step 1 ("**1. Certificates.**"),
    in order."""
    text = (REPO / "docs" / "deployment.md").read_text()
    start = text.index("**1. Certificates.**")
    block = text[start:].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split() for line in block.splitlines() if line.startswith("spherecal ")]
    assert [c[1:3] for c in commands] == [
        ["certs", "init"],
        ["certs", "request"],
        ["certs", "issue"],
    ]
    return [c[1:] for c in commands]


def test_the_guides_certificate_commands_run_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Machines A and B as two directories: each command runs where the guide says, the
    request is copied as its comment says, and every file the comments promise is
    there."""
    a, b = tmp_path / "A", tmp_path / "B"
    a.mkdir()
    b.mkdir()
    init, request, issue = _step_one()
    monkeypatch.chdir(a)
    assert main(init) == 0, capsys.readouterr().err
    monkeypatch.chdir(b)
    assert main(request) == 0, capsys.readouterr().err
    assert (b / "certs" / "hospital-b.csr").is_file()
    assert (b / "certs" / "hospital-b.key").is_file()
    assert (b / "certs" / "hospital-b.identity.key").is_file()
    # "copy B's certs/hospital-b.csr to A's certs/"
    (a / "certs" / "hospital-b.csr").write_bytes((b / "certs" / "hospital-b.csr").read_bytes())
    monkeypatch.chdir(a)
    assert main(issue) == 0, capsys.readouterr().err
    assert (a / "certs" / "hospital-b.pem").is_file()
    assert not (a / "certs" / "hospital-b.key").exists()  # nothing private at the CA
    # and on one machine, as the note under the block says, with nothing copied
    one = tmp_path / "one"
    one.mkdir()
    monkeypatch.chdir(one)
    for command in (init, request, issue):
        assert main(command) == 0, capsys.readouterr().err
    assert (one / "certs" / "hospital-b.pem").is_file()


def _revoked(ca: Path) -> set[int]:
    crl = load_verified_crl(
        (ca / "crl.pem").read_bytes(), x509.load_pem_x509_certificate((ca / "ca.pem").read_bytes())
    )
    return {entry.serial_number for entry in crl}


def test_init_writes_an_empty_ca_signed_list_that_ends_with_the_ca(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = tmp_path / "ca"
    assert main(["certs", "init", str(ca), "--days", "30"]) == 0
    assert str(ca / "crl.pem") in capsys.readouterr().out.splitlines()
    assert _revoked(ca) == set()  # verifies against the CA, revokes nothing
    crl = x509.load_pem_x509_crl((ca / "crl.pem").read_bytes())
    start, end = _window(ca / "ca.pem")
    assert (crl.last_update_utc, crl.next_update_utc) == (start, end)
    # `revoke` adds to it
    issue_participant(ca, "site-a")
    revoke_participant(ca, "site-a")
    assert _revoked(ca) == {
        x509.load_pem_x509_certificate((ca / "site-a.pem").read_bytes()).serial_number
    }


def test_certs_crl_writes_the_list_anew_keeping_its_entries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CA made before ``init`` wrote its list gets an empty one; a list with entries
    keeps them, with a new lifetime; a list the CA did not sign is refused, unchanged."""
    ca = tmp_path / "ca"
    init_ca(ca)
    (ca / "crl.pem").unlink()  # as a CA made before 2026-11-27 is
    assert main(["certs", "crl", "--dir", str(ca), "--days", "7"]) == 0
    assert capsys.readouterr().out.strip() == str(ca / "crl.pem")
    assert _revoked(ca) == set()
    issue_participant(ca, "site-a")
    serial = x509.load_pem_x509_certificate((ca / "site-a.pem").read_bytes()).serial_number
    revoke_participant(ca, "site-a")
    assert main(["certs", "crl", "--dir", str(ca), "--days", "3"]) == 0
    assert _revoked(ca) == {serial}
    crl = x509.load_pem_x509_crl((ca / "crl.pem").read_bytes())
    assert crl.next_update_utc is not None
    assert crl.next_update_utc - crl.last_update_utc == dt.timedelta(days=3) + CLOCK_SKEW
    other = tmp_path / "other"
    init_ca(other)
    foreign = (other / "crl.pem").read_bytes()
    (ca / "crl.pem").write_bytes(foreign)
    assert main(["certs", "crl", "--dir", str(ca)]) == 2
    assert "does not verify against the client CA" in capsys.readouterr().err
    assert (ca / "crl.pem").read_bytes() == foreign
    capsys.readouterr()
    assert main(["certs", "crl", "--dir", str(tmp_path / "nowhere")]) == 2
    assert "no CA in" in capsys.readouterr().err


def _guide_coordinator_tls() -> dict[str, str]:
    """The ``[tls]`` table of deployment.md's step 2 (the coordinator's config)."""
    import tomllib

    text = (REPO / "docs" / "deployment.md").read_text()
    start = text.index("**2. Coordinator config**")
    block = text[start:].split("```toml\n", 1)[1].split("```", 1)[0]
    tls: dict[str, str] = tomllib.loads(block)["tls"]
    return tls


def test_the_guides_coordinator_names_the_list_step_one_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The coordinator's ``[tls] crl`` is set from the first day, to a file step 1's
    ``certs init`` wrote: a later ``certs revoke`` then needs no restart."""
    tls = _guide_coordinator_tls()
    assert tls.get("crl") == "certs/crl.pem", tls
    monkeypatch.chdir(tmp_path)
    init, _, _ = _step_one()
    assert main(init) == 0, capsys.readouterr().err
    for key in ("cert", "key", "client_ca", "crl"):
        assert (tmp_path / tls[key]).is_file(), key
    assert _revoked(tmp_path / "certs") == set()


def test_the_guides_reissue_command_names_the_copied_request() -> None:
    """The revocation paragraph's re-issue uses the same request path as step 1."""
    text = (REPO / "docs" / "deployment.md").read_text()
    reissues = re.findall(r"certs issue hospital-b --dir certs --csr (\S+?)`", text)
    assert reissues and set(reissues) == {"certs/hospital-b.csr"}, reissues


# ------------------------------------------------ a certificate never outlives its CA
def _when(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def _ca_with_a_site(tmp_path: Path) -> tuple[Path, Path]:
    """A CA (``certs init``) that issued site-a's certificate from its request, and the
    request, for issuing again."""
    ca = tmp_path / "ca"
    init_ca(ca)
    site = tmp_path / "site"
    request_participant(site, "site-a")
    issue_participant(ca, "site-a", csr=site / "site-a.csr")
    return ca, site / "site-a.csr"


def _listing(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_an_expired_ca_issues_and_revokes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CA past its end signed certificates (and CRLs) that every TLS peer refused,
    with exit 0. Now each is one line naming ca.pem and its dates, nothing written."""
    ca, csr = _ca_with_a_site(tmp_path)
    redate(ca, ca / "ca.pem", start_days=-400, end_days=-1)  # the same CA, ended
    loaded = x509.load_pem_x509_certificate((ca / "ca.pem").read_bytes())
    start, end = _when(loaded.not_valid_before_utc), _when(loaded.not_valid_after_utc)
    said = f"the CA {ca / 'ca.pem'} expired on {end} (valid {start} to {end}): it cannot "
    before = _listing(ca)
    for argv, doing in (
        (["issue", "site-a", "--csr", str(csr)], "issue a certificate"),
        (["issue", "site-b"], "issue a certificate"),  # keys made here: none made
        (["issue", "site-a", "--csr", str(csr), "--days", "30"], "issue a certificate"),
        (["revoke", "site-a"], "sign a revocation list"),
        (["crl"], "sign a revocation list"),
    ):
        assert main(["certs", *argv, "--dir", str(ca)]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0, err
        assert err.startswith(f"spherecal certs: error: {said}{doing} that verifies"), err
        assert "spherecal certs init NEWDIR" in err
        assert _listing(ca) == before, argv


def test_a_ca_not_yet_valid_is_refused_naming_the_clock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca, csr = _ca_with_a_site(tmp_path)
    redate(ca, ca / "ca.pem", start_days=3, end_days=300)  # a clock behind the CA's
    loaded = x509.load_pem_x509_certificate((ca / "ca.pem").read_bytes())
    before = _listing(ca)
    for argv in (["issue", "site-a", "--csr", str(csr)], ["revoke", "site-a"], ["crl"]):
        assert main(["certs", *argv, "--dir", str(ca)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0, err
        assert (
            f"the CA {ca / 'ca.pem'} is not valid until {_when(loaded.not_valid_before_utc)} "
            f"(valid {_when(loaded.not_valid_before_utc)} to "
            f"{_when(loaded.not_valid_after_utc)})"
        ) in err, err
        assert "check this machine's clock (it says " in err
        assert _listing(ca) == before


def test_days_past_the_cas_end_is_refused_naming_the_longest_possible(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--days 31`` from a CA made for 30 days wrote a certificate ending a day after
    its CA, which no peer accepts from the CA's end on. Refused, naming ``--days 29``
    (30 whole days no longer fit: the CA's 30 began at its ``init``); that one issues."""
    ca = tmp_path / "ca"
    init_ca(ca, days=30)
    request_participant(tmp_path / "site", "site-a")
    csr = tmp_path / "site" / "site-a.csr"
    ca_end = x509.load_pem_x509_certificate((ca / "ca.pem").read_bytes()).not_valid_after_utc
    argv = ["certs", "issue", "site-a", "--dir", str(ca), "--csr", str(csr)]
    before = _listing(ca)
    for days in ("31", "30", "365"):
        assert main([*argv, "--days", days]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0, err
        assert err.startswith(f"spherecal certs: error: --days {days}: site-a.pem would end on ")
        assert f"after the CA {ca / 'ca.pem'} does ({ca_end:%Y-%m-%d %H:%M:%S} UTC)" in err, err
        assert "the longest possible now is --days 29 (or leave --days out" in err, err
        assert _listing(ca) == before
    assert main([*argv, "--days", "29"]) == 0
    assert capsys.readouterr().err == ""
    _, end = _window(ca / "site-a.pem")
    assert ca_end - dt.timedelta(days=1) <= end <= ca_end


def test_without_days_a_certificate_ends_with_a_ca_that_ends_sooner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No ``--days``: 365 days, or the CA's end if sooner — and a line on stderr saying
    so, since the date to renew by is not the one the default promises."""
    ca = tmp_path / "ca"
    init_ca(ca, days=10)
    ca_end = x509.load_pem_x509_certificate((ca / "ca.pem").read_bytes()).not_valid_after_utc
    assert main(["certs", "issue", "site-a", "--dir", str(ca)]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0] == str(ca / "site-a.pem")  # stdout: the paths
    _, end = _window(ca / "site-a.pem")
    assert end == ca_end
    err = captured.err.strip()
    assert err.count("\n") == 0, err
    assert err.startswith(f"{ca / 'site-a.pem'} is valid until {_when(ca_end)} (")
    assert f"when the CA {ca / 'ca.pem'} ends" in err
    # a CA of the default lifetime: the certificate ends with it, minutes early at most
    # — nothing worth a line
    init_ca(tmp_path / "ca365")
    assert main(["certs", "issue", "site-a", "--dir", str(tmp_path / "ca365")]) == 0
    assert capsys.readouterr().err == ""
    ca365 = x509.load_pem_x509_certificate((tmp_path / "ca365" / "ca.pem").read_bytes())
    assert _window(tmp_path / "ca365" / "site-a.pem")[1] == ca365.not_valid_after_utc
