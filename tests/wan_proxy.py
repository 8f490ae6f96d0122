"""An emulated wide-area link for tests: a loopback TCP proxy (asyncio) that adds
one-way delay with jitter, a bandwidth limit, and partitions that cut connections.

Why in the test helpers: every other test talks over loopback, where a gRPC call
takes microseconds and nothing is ever cut mid-stream; the deployment talks over
links with tens of milliseconds and megabits (issue #20 measured 3.8× at 40 ms /
20 Mbit/s). One proxy stands between the coordinator and each site, so a test can
give each site its own link and partition some of them.

Model of a link (each direction separately): a chunk read from one side waits its
turn on the wire (``bytes / rate``: the link is busy while a chunk is serialised),
then ``delay ± jitter`` of propagation; chunks leave in order (jitter never
reorders a TCP stream). :meth:`WanProxy.partition` aborts every open connection
(both ends see a reset, as after a router loss) and, until :meth:`WanProxy.heal`,
resets every new one at once — so a site sees UNAVAILABLE and backs off, and the
coordinator sees its presence stream end.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from dataclasses import dataclass, field

__all__ = ["LinkProfile", "WanProxy"]


@dataclass(frozen=True)
class LinkProfile:
    """One direction's delay, jitter (uniform ±) and bandwidth."""

    delay_s: float = 0.040
    jitter_s: float = 0.010
    bits_per_s: float = 20e6


@dataclass
class _Link:
    """One direction of one connection: when the wire is next free, and the last
    delivery time (so that jitter never reorders)."""

    profile: LinkProfile
    rng: random.Random
    busy_until: float = 0.0
    last_due: float = 0.0

    def due(self, now: float, nbytes: int) -> float:
        start = max(now, self.busy_until)
        self.busy_until = start + 8.0 * nbytes / self.profile.bits_per_s
        jitter = self.rng.uniform(-self.profile.jitter_s, self.profile.jitter_s)
        due = max(self.busy_until + max(0.0, self.profile.delay_s + jitter), self.last_due)
        self.last_due = due
        return due


@dataclass
class ProxyStats:
    connections: int = 0
    cut: int = 0
    """Connections aborted by a partition."""
    refused: int = 0
    """Connections reset at once because a partition was on."""
    bytes_up: int = 0
    """Site → coordinator."""
    bytes_down: int = 0
    partitions: list[float] = field(default_factory=list)


class WanProxy:
    """Listen on a loopback port; forward to ``target_port`` through an emulated link.

    Runs its own event loop on a daemon thread; :meth:`close` stops it."""

    def __init__(
        self,
        target_port: int,
        profile: LinkProfile = LinkProfile(),
        *,
        seed: int = 0,
        target_host: str = "127.0.0.1",
    ) -> None:
        self.target = (target_host, target_port)
        self.profile = profile
        self.stats = ProxyStats()
        self._rng = random.Random(seed)
        self._partitioned = False
        self._open: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(started,), name="wan-proxy", daemon=True
        )
        self._thread.start()
        started.wait(10)
        assert self._server is not None, "the proxy did not start"
        self.port: int = self._server.sockets[0].getsockname()[1]

    # ------------------------------------------------------------ control (any thread)
    def retarget(self, port: int) -> None:
        """Forward new connections to ``port`` (a restarted coordinator)."""
        self.target = (self.target[0], port)

    def partition(self) -> None:
        """Cut every open connection and reset new ones until :meth:`heal`."""
        self._call(self._partition)

    def heal(self) -> None:
        self._call(self._heal)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._call(self._shutdown)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _call(self, fn: object) -> None:
        future = asyncio.run_coroutine_threadsafe(fn(), self._loop)  # type: ignore[operator]
        future.result(10)

    # ------------------------------------------------------------ the loop's side
    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._accept, "127.0.0.1", 0)
        )
        started.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _partition(self) -> None:
        self._partitioned = True
        self.stats.partitions.append(self._loop.time())
        for writer in list(self._open):
            self.stats.cut += 1
            writer.transport.abort()
        self._open.clear()

    async def _heal(self) -> None:
        self._partitioned = False

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._open):
            writer.transport.abort()
        # End every connection's task here: a task left pending when the loop stops is
        # closed later by the garbage collector, inside whatever test runs then, and its
        # `finally` (which awaits) raises "coroutine ignored GeneratorExit" there.
        current = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not current]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _accept(self, site_r: asyncio.StreamReader, site_w: asyncio.StreamWriter) -> None:
        if self._partitioned:
            self.stats.refused += 1
            site_w.transport.abort()
            return
        try:
            coord_r, coord_w = await asyncio.open_connection(*self.target)
        except OSError:
            site_w.transport.abort()
            return
        self.stats.connections += 1
        self._open.update((site_w, coord_w))
        up = _Link(self.profile, random.Random(self._rng.random()))
        down = _Link(self.profile, random.Random(self._rng.random()))
        try:
            await asyncio.gather(
                self._pump(site_r, coord_w, up, upward=True),
                self._pump(coord_r, site_w, down, upward=False),
            )
        finally:
            for w in (site_w, coord_w):
                self._open.discard(w)
                w.transport.abort()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        link: _Link,
        *,
        upward: bool,
    ) -> None:
        """Read as fast as the sender writes; deliver each chunk at its due time."""
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def deliver() -> None:
            while (item := await queue.get()) is not None:
                due, data = item
                wait = due - self._loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(deliver())
        try:
            while data := await reader.read(65536):
                if upward:
                    self.stats.bytes_up += len(data)
                else:
                    self.stats.bytes_down += len(data)
                queue.put_nowait((link.due(self._loop.time(), len(data)), data))
            queue.put_nowait(None)
            await sender
            with contextlib.suppress(OSError, RuntimeError):
                writer.write_eof()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if not sender.done():
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await sender
