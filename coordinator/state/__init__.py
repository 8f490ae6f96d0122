"""What the coordinator keeps: durable state and the roster.

``store``      SQLite (one writer thread): participants, rounds, jobs, audit, events;
               a commit anyone waits for is synced first (power loss)
``schema``     the database schema, and how an older database is brought up to date
``registry``   roster, join proofs, pinned identity keys, sessions, liveness
``spool``      plaintext uploads spooled and summed in roster order (determinism)
``state_dir``  what a state directory holds, and the checks before it is used
``lifecycle``  a federation that ended is read-only to a restart (or set aside whole)
``read_only``  a database read with nothing created or changed beside it (the audits,
               --check-state)
``storage_faults``  which write failures are fatal (disk full, I/O, read-only) and their line
``job_journal``  each secure job's messages, masked sum and result: a restart continues it
``journal_blobs``  the journal's vector-sized payloads as files, durable before their rows
"""
