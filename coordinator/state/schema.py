"""The coordinator database's schema (``spherecal.coordinator.state.store``), and how an older
database is brought up to it.

Why a module of its own: the store's module is about the single-writer thread and
its operations; the table definitions and their migrations are data, versioned with
each release, which a reader of the store's behaviour need not wade through (and a
reviewer of a migration finds in one place).
"""

from __future__ import annotations

import sqlite3

__all__ = ["ADDED_COLUMNS", "SCHEMA", "SCHEMA_VERSION", "add_missing_columns"]

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS participants (
    participant_id  TEXT PRIMARY KEY,
    roster_index    INTEGER NOT NULL,
    identity_key    BLOB,
    certificate_sha256 TEXT,
    first_joined    REAL,
    last_joined     REAL,
    joins           INTEGER NOT NULL DEFAULT 0,
    left_reason     TEXT,
    certificate_serial TEXT
);
CREATE TABLE IF NOT EXISTS rounds (
    round            INTEGER PRIMARY KEY,
    status           TEXT NOT NULL,
    attempt          INTEGER NOT NULL,
    started          REAL,
    finished         REAL,
    checkpoint_path  TEXT,
    checkpoint_sha256 TEXT,
    metrics          TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS jobs (
    job_id        TEXT PRIMARY KEY,
    purpose       TEXT NOT NULL,
    round         INTEGER,
    status        TEXT NOT NULL,
    created       REAL NOT NULL,
    finished      REAL,
    participants  TEXT NOT NULL,
    threshold     INTEGER NOT NULL,
    vector_length INTEGER NOT NULL,
    spec_sha256   TEXT NOT NULL,
    contributors  TEXT,
    dropouts      TEXT,
    excluded      TEXT,
    error         TEXT
);
CREATE TABLE IF NOT EXISTS audit (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    ts        REAL NOT NULL,
    sender    TEXT NOT NULL,
    job       TEXT,
    stage     TEXT NOT NULL,
    kind      TEXT NOT NULL,
    bytes     INTEGER NOT NULL,
    sha256    TEXT NOT NULL,
    status    TEXT NOT NULL,
    code      TEXT,
    detail    TEXT
);
CREATE INDEX IF NOT EXISTS audit_job ON audit (job);
CREATE TABLE IF NOT EXISTS revealed_shares (
    job       TEXT NOT NULL,
    holder    TEXT NOT NULL,
    owner     TEXT NOT NULL,
    kind      TEXT NOT NULL,
    ts        REAL NOT NULL,
    PRIMARY KEY (job, holder, owner, kind)
);
CREATE TABLE IF NOT EXISTS masked_samples (
    job       TEXT NOT NULL,
    sender    TEXT NOT NULL,
    purpose   TEXT,
    ts        REAL NOT NULL,
    sample    BLOB NOT NULL,
    PRIMARY KEY (job, sender)
);
CREATE TABLE IF NOT EXISTS dp_releases (
    job_id        TEXT PRIMARY KEY,
    kind          TEXT NOT NULL,
    ts            REAL NOT NULL,
    plan_json     TEXT NOT NULL,
    contributors  TEXT NOT NULL,
    charge_json   TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS policy_events (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    ts           REAL NOT NULL,
    type         TEXT NOT NULL,
    participant  TEXT NOT NULL,
    job          TEXT,
    purpose      TEXT,
    kind         TEXT NOT NULL,
    rule         TEXT,
    reason       TEXT NOT NULL,
    complainants TEXT
);
CREATE TABLE IF NOT EXISTS job_journal_jobs (
    job_id        TEXT PRIMARY KEY,
    slot          TEXT NOT NULL,
    purpose       TEXT NOT NULL,
    round         INTEGER,
    job           BLOB NOT NULL,
    first_stage_s REAL NOT NULL,
    state         TEXT NOT NULL,
    created       REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS job_journal_jobs_slot ON job_journal_jobs (slot);
CREATE TABLE IF NOT EXISTS job_journal (
    job_id   TEXT NOT NULL,
    seq      INTEGER NOT NULL,
    kind     TEXT NOT NULL,
    stage    INTEGER,
    sender   TEXT,
    data     BLOB,
    PRIMARY KEY (job_id, seq)
);
CREATE TABLE IF NOT EXISTS job_results (
    job_id        TEXT PRIMARY KEY,
    contributors  TEXT NOT NULL,
    dropouts      TEXT NOT NULL,
    excluded      TEXT NOT NULL,
    value_bytes   BLOB NOT NULL,
    sha256        TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    ts       REAL NOT NULL,
    level    TEXT NOT NULL,
    message  TEXT NOT NULL
);
"""


ADDED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("policy_events", "complainants", "TEXT"),
    ("participants", "left_reason", "TEXT"),
    ("participants", "certificate_serial", "TEXT"),
)
"""Columns added after a table was first released: (table, column, type). A state
directory written before gets them on open (NULL in old rows), so a resumed
coordinator reads its own database whatever version wrote it."""


def add_missing_columns(conn: sqlite3.Connection) -> None:
    for table, column, kind in ADDED_COLUMNS:
        present = {str(row[1]) for row in conn.execute(f"PRAGMA table_info({table})")}
        if column not in present:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
