"""``spherecal certs``: ``--days N`` is N whole days, and the guide's commands run as
written.

``--days 0`` used to succeed and write a certificate whose notAfter was the moment it
was issued (notBefore is set back five minutes for slow clocks, so it was "valid" for
those five minutes, all in the past): a site using it was refused in every TLS
handshake, silently. ``--days -1`` ended in the library's own message. Both are now
one line naming ``--days``, before anything is written.

docs/deployment.md step 1 had the operator issue from ``hospital-b.csr`` while
``certs request`` writes ``certs/hospital-b.csr``: run literally, it failed.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest
from cryptography import x509

from spherecal.certs import CLOCK_SKEW, init_ca, issue_participant, request_participant
from spherecal.cli.app import main

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
    assert main(["certs", "revoke", "site-c", "--dir", str(ca), "--days", days]) == 2
    assert not (ca / "crl.pem").exists()
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 3 and all(f"--days {days}: " in line for line in errors), errors
    assert "a revocation list must be" in errors[-1]


@pytest.mark.parametrize("days", [1, 30])
def test_days_n_is_n_whole_days_from_now(tmp_path: Path, days: int) -> None:
    ca = tmp_path / "ca"
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    assert main(["certs", "init", str(ca), "--days", str(days)]) == 0
    request_participant(tmp_path / "site", "site-a")
    csr = tmp_path / "site" / "site-a.csr"
    assert (
        main(["certs", "issue", "site-a", "--dir", str(ca), "--csr", str(csr), "--days", str(days)])
        == 0
    )
    after = dt.datetime.now(dt.UTC)
    for pem in (ca / "ca.pem", ca / "server.pem", ca / "site-a.pem"):
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


def test_the_guides_reissue_command_names_the_copied_request() -> None:
    """The revocation paragraph's re-issue uses the same request path as step 1."""
    text = (REPO / "docs" / "deployment.md").read_text()
    reissues = re.findall(r"certs issue hospital-b --dir certs --csr (\S+?)`", text)
    assert reissues and set(reissues) == {"certs/hospital-b.csr"}, reissues
