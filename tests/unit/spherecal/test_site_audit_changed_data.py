"""``spherecal audit --site`` lists exact per-class moments of changed data: under
``[policy] exact_moments_of_changed_data = true`` (or in a ledger written before the
default refused it) a second exact release is admitted when the site's data changed
between two federations (a new fingerprint), and if both models computed the same
features, the difference of the two is the statistics of the records that changed."""

from __future__ import annotations

import json
from pathlib import Path

from spherecal.participant.release_ledger import REFUSAL, LedgerRules, Release, ReleaseLedger
from spherecal.site_audit import format_site_audit, read_site_audit, run_site_audit, site_audit_html


def _moments(federation: str, data: bytes, *, noised: bool = False) -> Release:
    return Release(
        kind="ccvr", federation=federation, model=federation.encode().ljust(32, b"."),
        data=data * 32, noised=noised,
    )  # fmt: skip


def _ledger(tmp_path: Path, releases: list[tuple[str, Release, str]]) -> None:
    ledger = ReleaseLedger(
        tmp_path / "privacy.db",
        participant="p0",
        rules=LedgerRules(exact_in_one_federation=False),  # the site's explicit choice
    )
    for job, release, answer in releases:
        ledger.reserve(release, job=job)
        ledger.consume(job, answer=answer)
    ledger.close()


def test_exact_moments_of_grown_data_in_two_federations_are_listed(tmp_path: Path) -> None:
    _ledger(
        tmp_path,
        [
            ("january", _moments("fed-a", b"1"), "input"),
            ("june", _moments("fed-b", b"2"), "input"),  # one record added: new fingerprint
        ],
    )
    audit = read_site_audit(tmp_path)
    (pair,) = audit.changed_data
    assert (pair.first, pair.second) == ("january", "june")
    assert (pair.first_federation, pair.second_federation) == ("fed-a", "fed-b")
    assert audit.ok  # a possibility to weigh, not an exact pair: the exit status is 0
    text = format_site_audit(audit)
    assert "exact moments of changed data: 1" in text and "records that changed" in text
    assert "records that changed" in site_audit_html(audit)
    status, out = run_site_audit(tmp_path, as_json=True)
    assert status == 0
    assert json.loads(out)["exact_moments_of_changed_data"][0]["second"] == "june"


def test_noised_refused_or_same_federation_releases_are_not_listed(tmp_path: Path) -> None:
    _ledger(
        tmp_path,
        [
            ("exact", _moments("fed-a", b"1"), "input"),
            ("noised", _moments("fed-b", b"2", noised=True), "input"),  # DP: accounted
            ("refused", _moments("fed-c", b"3"), REFUSAL),  # nothing of the input left
        ],
    )
    audit = read_site_audit(tmp_path)
    assert audit.changed_data == []
    assert "exact moments of changed data: 0" in format_site_audit(audit)
