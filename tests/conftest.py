"""Test-wide settings.

The models under test are tiny, and `make test` runs one pytest-xdist worker per core
of the 2-core box: a native thread pool per worker sized to every core (torch's
intra-op pool, OpenBLAS under numpy) only adds contention — two workers' BLAS calls
with two threads each on two cores spin against each other (a 1281 × 1281 ``eigvalsh``
took 9–17 s that way under load against 0.9 s on one thread). So every test runs its
native pools single-threaded, and the processes tests start inherit the same through
the environment (a library reads it when it loads). This changes speed, not results.

The hooks below queue the test files longest first for xdist and, when asked, record
when each test ran (``tests/schedule.py``).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator

for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import pytest  # noqa: E402
import torch  # noqa: E402  (after the environment above, read when the pools load)
from threadpoolctl import threadpool_limits  # noqa: E402

from tests.schedule import load_table, longest_first, now, record  # noqa: E402

torch.set_num_threads(1)
threadpool_limits(limits=1)  # numpy may have loaded OpenBLAS before this file


@pytest.fixture
def fresh_ring_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No spare buffers, loans or donated vectors left by other tests: the encoded-input
    pool of ``spherecal.crypto.ring`` is process-wide (a test asserting what is spare or
    on loan uses it, ``pytest.mark.usefixtures("fresh_ring_pool")``)."""
    from spherecal.crypto import ring

    monkeypatch.setattr(ring, "_spare", deque(maxlen=ring.SPARE_BUFFERS))
    monkeypatch.setattr(ring, "_lent", {})
    monkeypatch.setattr(ring, "_adopted", set())
    yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Queue the test files longest first (``tests/schedule.py`` says why): with
    ``--dist loadfile --no-loadscope-reorder`` a long file no longer starts last."""
    items[:] = longest_first(items, load_table())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """Record the test's span (setup through teardown) when a timeline is asked for."""
    start = now()
    try:
        return (yield)
    finally:
        record(item.nodeid, start, now())
