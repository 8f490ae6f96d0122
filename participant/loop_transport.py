"""The participant's gRPC transport on a shared asyncio loop, for hosts of many
participants (the Ray engine's virtual participants).

Why not :class:`~spherecal.participant.grpc_transport.GrpcTransport` there: a synchronous gRPC
channel costs every participant a *channel spin thread* while its presence stream is
open, and every blocked synchronous call wakes up several times a second to check
for signals (the spin thread and a blocking unary call every 200 ms, a streaming
iterator every 100 ms), each time taking the GIL. Measured on this machine with 500
idle participants in one process (an open server stream and a 2 s long poll each)
next to one computing thread (``bench/idle_channels.py``): 1,501 threads, ~37,000
context switches and 0.38 s of kernel CPU a second with sync channels; 503 threads,
~4,600 and 0.06 s with this transport, and the computing thread did 1.5× the work.
Under load the wake-ups are worse than their CPU: hundreds of threads queueing for
the GIL each force the computing thread off it every switch interval.

Here every participant still has **its own** channel, TCP connection (local
subchannel pool), TLS credentials and calls — only the event loop that drives the
channels is shared, one thread per host (:class:`EventLoopThread`). The participant's
own thread waits for a call on a ``concurrent.futures.Future`` (an untimed futex
wait: no wake-ups while the coordinator long-polls), and its presence stream is an
asyncio task; the caller's thread waiting on :meth:`_LoopPresence.__iter__` blocks
without waking until the stream ends or is cancelled.

Same semantics as the synchronous transport: every gRPC failure becomes a
:class:`~spherecal.participant.transport.TransportError`; a call on a closed channel raises
``ValueError``; :meth:`LoopTransport.close` cancels every call in flight (a
streaming upload breaks off mid-stream); and a channel whose connection attempt
failed is replaced before the next call, by the same rule
(:class:`~spherecal.participant.grpc_transport.ChannelKeeper`), so a virtual
participant too joins at its first attempt after the coordinator is back — until
2026-11-27 only the synchronous transport did, and a virtual participant's attempts
could fail inside gRPC's own back-off after the coordinator was listening.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import grpc
import grpc.aio

from spherecal.participant.grpc_transport import (
    ChannelKeeper,
    channel_options,
    credentials_for,
    to_transport_error,
)
from spherecal.participant.settings import ParticipantSettings
from spherecal.participant.transport import StubCalls
from spherecal.proto import spherecal_pb2 as pb

__all__ = ["EventLoopThread", "LoopTransport"]

T = TypeVar("T")

_END = object()
"""Marks the end of a streamed request."""


class EventLoopThread:
    """One asyncio loop in a daemon thread, shared by the transports of a host."""

    def __init__(self, *, name: str = "grpc-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop; block this thread (without waking) until done."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("EventLoopThread.run called from its own loop")
        return self.submit(coroutine).result()

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self.loop.close()


async def _await(fn: Callable[..., Awaitable[T]], request: object, timeout: float) -> T:
    return await fn(request, timeout=timeout)


async def _collect(fn: Callable[..., Any], request: object, timeout: float) -> list[Any]:
    return [item async for item in fn(request, timeout=timeout)]


class LoopTransport(StubCalls):
    """:class:`~spherecal.participant.transport.Transport` over a ``grpc.aio`` channel driven by
    a shared :class:`EventLoopThread`."""

    def __init__(
        self,
        settings: ParticipantSettings,
        loop: EventLoopThread,
        *,
        while_waiting: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> None:
        """``while_waiting``: entered around every wait for the coordinator (a host
        gives back its participant's compute slot there)."""
        self._waiting = while_waiting or contextlib.nullcontext
        credentials = credentials_for(settings)
        options = channel_options(settings)
        target = settings.coordinator

        async def open_channel() -> grpc.aio.Channel:
            if credentials is None:
                return grpc.aio.insecure_channel(target, options=options)
            return grpc.aio.secure_channel(target, credentials, options=options)

        def state(channel: grpc.aio.Channel) -> grpc.ChannelConnectivity:
            # Public and synchronous on an aio channel; asked from the calling thread
            # (gRPC core's check is thread-safe, and the keeper's lock keeps the
            # channel open meanwhile), so a call costs no extra trip through the loop.
            return channel.get_state(try_to_connect=False)

        def close_channel(channel: grpc.aio.Channel) -> None:
            if loop.loop.is_closed():
                return
            with contextlib.suppress(concurrent.futures.TimeoutError):
                loop.submit(channel.close()).result(timeout=10.0)

        self._loop = loop
        self._channels: ChannelKeeper[grpc.aio.Channel] = ChannelKeeper(
            lambda: loop.run(open_channel()), state, close_channel
        )
        self._timeout = settings.rpc_timeout_s
        self._long_poll_s = settings.long_poll_ms / 1000.0

    @property
    def channels_opened(self) -> int:
        """How many channels this transport made (the first, then one per replacement)."""
        return self._channels.opened

    @property
    def _stub(self) -> Any:
        """The current channel's stub, replacing a failed channel first
        (:class:`~spherecal.participant.grpc_transport.ChannelKeeper`)."""
        return self._channels.stub()

    @property
    def _closed(self) -> bool:
        return self._channels.closed

    # ------------------------------------------------------------ plumbing
    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coroutine.close()
            raise ValueError("Cannot invoke RPC on closed channel!")
        try:
            with self._waiting():
                return self._loop.run(coroutine)
        except grpc.RpcError as exc:
            raise to_transport_error(exc) from None
        except (grpc.aio.UsageError, asyncio.CancelledError, concurrent.futures.CancelledError):
            raise ValueError("the channel was closed during the call") from None

    def _unary(self, fn: Callable[..., Any], request: object, timeout: float | None = None) -> Any:
        wait = timeout or self._timeout
        if isinstance(request, Iterator):
            return self._stream_request(fn, request, wait)
        return self._run(_await(fn, request, wait))

    def _stream_request(
        self, fn: Callable[..., Any], messages: Iterator[Any], timeout: float
    ) -> Any:
        """A client-streaming call whose messages are produced by *this* thread (a
        masked upload masks chunk by chunk here, and its fault point may cut the
        stream between chunks), handed to the loop as they come."""
        if self._closed:
            raise ValueError("Cannot invoke RPC on closed channel!")
        queue: asyncio.Queue[Any] = asyncio.Queue()
        loop = self._loop.loop

        async def requests() -> Any:
            while (item := await queue.get()) is not _END:
                yield item

        async def call() -> Any:
            return await fn(requests(), timeout=timeout)

        future = self._loop.submit(call())
        try:
            for message in messages:
                if future.done():  # the call already ended (refused, cut): stop producing
                    break
                loop.call_soon_threadsafe(queue.put_nowait, message)
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, _END)
        try:
            with self._waiting():
                return future.result()
        except grpc.RpcError as exc:
            raise to_transport_error(exc) from None
        except (grpc.aio.UsageError, asyncio.CancelledError, concurrent.futures.CancelledError):
            raise ValueError("the channel was closed during the call") from None

    # ------------------------------------------------------------ the protocol

    def presence(self, request: pb.HeartbeatRequest) -> _LoopPresence:
        if self._closed:
            raise ValueError("Cannot invoke RPC on closed channel!")
        return _LoopPresence(self._loop, self._stub.Presence, request)

    def next_instruction(self, request: pb.InstructionRequest) -> pb.Instruction:
        return self._unary(
            self._stub.NextInstruction, request, timeout=self._long_poll_s + self._timeout
        )

    def download_tensor(self, request: pb.DownloadRequest) -> Iterator[pb.TensorChunk]:
        # A tensor is a model or a broadcast vector: collected on the loop and handed
        # over whole (the caller assembles it whole anyway).
        yield from self._run(_collect(self._stub.DownloadTensor, request, self._timeout * 10))

    def close(self) -> None:
        """Close the channel: every call in flight is cancelled, later ones fail."""
        self._channels.close()


class _LoopPresence:
    """A presence stream read by a task on the loop. Iterating it blocks the caller
    (without waking) until the stream ends; it yields no replies, which only
    tell the participant the stream is alive."""

    def __init__(
        self, loop: EventLoopThread, method: Callable[..., Any], request: pb.HeartbeatRequest
    ) -> None:
        self._loop = loop
        self._call: Any = None

        async def read() -> None:
            self._call = method(request)
            try:
                async for _reply in self._call:
                    pass
            finally:
                self._call.cancel()

        self._future = loop.submit(read())

    def __iter__(self) -> Iterator[pb.HeartbeatReply]:
        try:
            self._future.result()
        except grpc.RpcError as exc:
            raise to_transport_error(exc) from None
        except (grpc.aio.UsageError, asyncio.CancelledError, concurrent.futures.CancelledError):
            return
        return
        yield  # a generator that yields nothing

    def cancel(self) -> None:
        self._future.cancel()
