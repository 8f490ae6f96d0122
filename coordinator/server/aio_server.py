"""The coordinator's ``grpc.aio`` server on an event loop of its own (issue #14).

Why asyncio: with the synchronous gRPC server every waiting participant held two
threads — one per open ``Presence`` stream and one per waiting ``NextInstruction``
long poll — so at 1,000 participants the coordinator had ~2,000 threads and spent
48 % of its CPU in the kernel (docs/scaling.md). On the event loop a presence stream
is a coroutine and a long poll awaits a future of the board (``Board.
wait_instruction_async``); neither holds a thread while it waits.

Everything else the service does is synchronous (SQLite, locks, secure aggregation
under a job lock), so it runs on worker threads, never on the loop:

* ``calls`` — the unary handlers and uploads (an upload holds its thread while it
  streams: the service consumes a blocking iterator, fed from the loop by
  :class:`RequestBridge`). Threads are created on demand up to ``[server]
  max_workers`` (0: ``participants + 16``, one upload per participant at once);
* ``polls`` — a few threads that evaluate a woken long poll's instruction (which may
  wait for a secure job's lock while the driver closes a stage: the loop must not).

:class:`CoordinatorServer` gives the loop-bound server the blocking API its callers
used with ``grpc.server`` — ``start()``, ``stop(grace).wait()``,
``wait_for_termination()`` — from any thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import grpc

from spherecal.coordinator.errors import ServiceError

__all__ = ["CoordinatorServer", "RequestBridge"]

_DRAIN_S = 5.0
"""How long a stopped server's cancelled calls get to finish their handlers."""

T = TypeVar("T")


class CoordinatorServer:
    """A ``grpc.aio.Server`` built and served on a dedicated event-loop thread."""

    def __init__(
        self, calls: concurrent.futures.Executor, polls: concurrent.futures.Executor
    ) -> None:
        self.calls = calls
        self.polls = polls
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self.server: grpc.aio.Server | None = None
        self._stopped = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="grpc-aio", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            try:
                tasks = asyncio.all_tasks(self.loop)
                for task in tasks:
                    task.cancel()
                if tasks:
                    self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            finally:
                self.loop.close()
                # Queued work (a presence stream's close) still runs; nothing waits.
                self.calls.shutdown(wait=False)
                self.polls.shutdown(wait=False)
                self._stopped.set()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coroutine`` on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def build(
        self, make: Callable[[], grpc.aio.Server], bind: Callable[[grpc.aio.Server], int]
    ) -> None:
        """Create the server on its loop (gRPC binds an aio server to the loop it is
        created on) and bind its port; on failure the loop thread ends."""

        async def create() -> None:
            server = make()
            self.server = server
            self.port = bind(server)

        try:
            self.run(create())
        except BaseException:
            self.stop(None).wait()
            raise

    def start(self) -> None:
        assert self.server is not None
        self.run(self.server.start())

    def stop(self, grace: float | None) -> threading.Event:
        """Stop serving (calls still running get ``grace`` seconds, then are
        cancelled) and end the loop thread; the event is set once it has ended."""
        if self._stopping or self._stopped.is_set():
            return self._stopped
        self._stopping = True

        async def shutdown() -> None:
            try:
                if self.server is not None:
                    await self.server.stop(grace)
                # The calls the stop cancelled end their handlers (a presence
                # stream's close) before the loop stops.
                rest = asyncio.all_tasks() - {asyncio.current_task()}
                if rest:
                    await asyncio.wait(rest, timeout=_DRAIN_S)
            finally:
                self.loop.stop()

        with contextlib.suppress(RuntimeError):  # the loop already ended
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop)
        return self._stopped

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        """Block until stopped; True if ``timeout`` passed first (like ``grpc.Server``)."""
        return not self._stopped.wait(timeout)


_END = object()
_CANCEL_TURNS = 8
"""Loop turns an upload's EOF waits for a cancellation that arrived with it (3 were
enough in tests/unit/coordinator/test_aio_server.py)."""


class RequestBridge:
    """A client-streamed request as the blocking iterator the service consumes on a
    worker thread: each ``next`` reads one message on the loop (``context.read``).

    :meth:`close` (the handler was cancelled: the client went away, or the server
    stops) makes a waiting ``next`` raise CANCELLED at once, so the worker thread
    ends and the service's cleanup (abandoning a partial upload) runs."""

    def __init__(
        self, context: grpc.aio.ServicerContext[Any, Any], loop: asyncio.AbstractEventLoop
    ) -> None:
        self._context = context
        self._loop = loop
        self._closed = threading.Event()
        self._pending: concurrent.futures.Future[Any] | None = None

    async def _read(self) -> Any:
        message = await self._context.read()
        if message is not grpc.aio.EOF:
            return message
        # A client that cancels mid-stream also reads as EOF here; gRPC cancels the
        # handler a few loop turns later, and then close() cancels this read, so the
        # service sees CANCELLED (as with the synchronous server), not a short
        # stream. Should a cancellation come later still, the service refuses the
        # upload as incomplete: a partial upload is never accepted either way.
        for _ in range(_CANCEL_TURNS):
            await asyncio.sleep(0)
        return _END

    def __iter__(self) -> Iterator[Any]:
        while True:
            if self._closed.is_set():
                raise ServiceError(grpc.StatusCode.CANCELLED, "the upload was cancelled")
            pending = asyncio.run_coroutine_threadsafe(self._read(), self._loop)
            self._pending = pending
            if self._closed.is_set():
                pending.cancel()
            try:
                message = pending.result()
            except concurrent.futures.CancelledError:
                raise ServiceError(grpc.StatusCode.CANCELLED, "the upload was cancelled") from None
            if message is _END:
                return
            yield message

    @property
    def cancelled(self) -> bool:
        """The call was cancelled (:meth:`close`): a handler waiting without reading
        (an upload waiting for a slot) looks here."""
        return self._closed.is_set()

    def close(self) -> None:
        self._closed.set()
        pending = self._pending
        if pending is not None:
            pending.cancel()
