"""The participant process: local data, training, statistics, the ``crypto``
secure-aggregation client, and the gRPC client (pull model: it never listens).

Modules, one idea each:

``settings``           every setting, as frozen dataclasses (TOML parsing: ``spherecal.config``)
``main``               ``run_participant``: wire it all up and run until done (how it ended)
``enrolment``          the site's identity key: loaded, or created once (never on a typo)
``runner``             the main loop: join, pull instructions, act, push results, reconnect
``backoff``            exit reasons and the reconnect back-off
``plan_refusal``       the plan checked at join; refusing it out loud (the coordinator is told)
``transport``          the transport protocol (gRPC in deployments, in-process in unit tests)
``grpc_transport``     the gRPC transport (TLS / mutual TLS; plaintext on loopback only)
``loop_transport``     the gRPC transport on a shared asyncio loop (many virtual participants)
``downloads``          a published tensor downloaded with its checks
``data``               local data, or this participant's slice of a shared dataset
``trainer``            local training, statistics and evaluation (as the reference runner)
``algorithm_state``    the participant's own algorithm state (SCAFFOLD's c_k) on disk
``dpsgd_round``        one DP-SGD round, charged to the site's own ledger first
``distributed_dpsgd``  a distributed DP-SGD step: admit, charge, clipped sum + noise share
``secure_session``     one secure-aggregation job's message cache; the persistent job ledger
``secure_jobs``        driving secure jobs over the network: advertise, share, mask, unmask
``held_jobs``          a job's state on disk from its keys on (taken up after a restart)
``held_upload``        storing the masked input and dropping the keys before the upload
``sent_plaintext``     a plaintext release kept as it left: the same task gets the same bytes
``trust``              verifying peers' identity keys against the federation CA
``policy``             the ``[policy]`` table: what the site refuses, whatever it is asked
``release_ledger``     what has left the site: each release at most once per its key
``release_rules``      which release the site refuses, given what already left it
``example_weight``     the count updates are weighted by: drawn with DP noise once per data split
``fixed_plan``         one plan per federation: its checks against the data answered once
``dp_gate``            the privacy gate of noisy calibration releases (plan, charge, refuse)
``evaluation_checks``  the checks on an evaluation task, and the counts' secure layout
``evaluation_task``    the evaluation task: counts of the model and its calibrated heads
``training_task``      the training task: one round's update, its weight and its release
``statistics_task``    the statistics task: FFC's or CCVR's sums, exact or with DP noise
``results``            every site's final models, written to its ``out_dir``
``failures``           the typed withdrawal a participant reports, and why
``faults``             fault injection (halt at a protocol stage) for tests and simulate
``adversary``          TEST ONLY: a dishonest site's local computation (issue #22's attacks)
"""
