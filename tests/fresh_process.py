"""Run a call in a freshly spawned Python process and return its result.

Why: ``ray.init`` starts its GCS server, monitor, dashboard and raylet with
``subprocess.Popen(preexec_fn=...)``. Python's documentation warns that a
``preexec_fn`` child of a process with other threads can deadlock before it execs,
and a pytest worker is such a process: earlier tests in it leave threads behind
(gRPC's asyncio poller, started by the first ``grpc.aio`` channel, lives as long as
the process). In a clean-clone CI run on 2026-11-27 (at ``e0f8b91``) the raylet of
``test_ray_sites_pin_their_peers_under_tls`` never registered in three starts of
30 s each — no raylet log was ever written, after gRPC had logged "Other threads
are currently calling into gRPC, skipping fork() handlers" at each fork — while the
same test alone passes. A Ray federation in a process of its own starts as
``spherecal simulate --engine ray`` does for a user: nothing else in it.

The call and its arguments go to the child by pickle, between two processes of
this test run (nothing from the network); the result comes back the same way.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["in_fresh_process"]


def in_fresh_process(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a new spawned interpreter (``fn`` importable by
    name); its exception, if any, is raised here."""
    with ProcessPoolExecutor(
        max_workers=1, mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        return pool.submit(fn, *args, **kwargs).result()
