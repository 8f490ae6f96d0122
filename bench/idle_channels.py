"""What N idle participants in one process cost: sync gRPC channels vs one asyncio loop.

Each simulated participant holds what a waiting virtual participant holds: its own
channel (own TCP connection), an open server stream (its presence) and a long poll
(a unary call the server answers after 2 s, asked again at once). A server in a
child process answers them over loopback. Measured in this process over a window,
after a warm-up: Python threads, CPU seconds per second (user, system) and context
switches per second (``getrusage``), plus the work rate of one computing thread —
what the waiting participants leave to the one that computes.

``sync``: ``grpc`` channels, a thread per presence stream and per long poll (what
``spherecal.participant.grpc_transport`` does). ``loop``: ``grpc.aio`` channels on one event
loop thread, the long-polling threads waiting on futures (what
``spherecal.participant.loop_transport`` does for the Ray engine's virtual participants).

    python bench/idle_channels.py --participants 500 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import resource
import socket
import sys
import threading
import time
from concurrent import futures
from typing import Any

import grpc
import grpc.aio
import numpy as np

SERVICE = "bench.Idle"
POLL_S = 2.0


def _serve(port: int, workers: int) -> None:
    def presence(_request: bytes, context: grpc.ServicerContext) -> Any:
        while context.is_active():
            time.sleep(2.5)
            yield b"alive"

    def poll(_request: bytes, _context: grpc.ServicerContext) -> bytes:
        time.sleep(POLL_S)
        return b"wait"

    handlers = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Presence": grpc.unary_stream_rpc_method_handler(presence),
            "Poll": grpc.unary_unary_rpc_method_handler(poll),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    server.add_generic_rpc_handlers((handlers,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


OPTIONS = [("grpc.use_local_subchannel_pool", 1)]


def _sync_participants(target: str, n: int) -> list[Any]:
    channels = [grpc.insecure_channel(target, options=OPTIONS) for _ in range(n)]

    def presence(channel: grpc.Channel) -> None:
        for _ in channel.unary_stream(f"/{SERVICE}/Presence")(b""):
            pass

    def poll(channel: grpc.Channel) -> None:
        call = channel.unary_unary(f"/{SERVICE}/Poll")
        while True:
            call(b"", timeout=30)

    for channel in channels:
        threading.Thread(target=presence, args=(channel,), daemon=True).start()
        threading.Thread(target=poll, args=(channel,), daemon=True).start()
    return channels


def _loop_participants(target: str, n: int) -> list[Any]:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def open_all() -> list[grpc.aio.Channel]:
        return [grpc.aio.insecure_channel(target, options=OPTIONS) for _ in range(n)]

    channels = asyncio.run_coroutine_threadsafe(open_all(), loop).result()

    async def presence(channel: grpc.aio.Channel) -> None:
        async for _ in channel.unary_stream(f"/{SERVICE}/Presence")(b""):
            pass

    def poll(channel: grpc.aio.Channel) -> None:
        call = channel.unary_unary(f"/{SERVICE}/Poll")

        async def once() -> Any:
            return await call(b"", timeout=30)

        while True:
            asyncio.run_coroutine_threadsafe(once(), loop).result()

    for channel in channels:
        asyncio.run_coroutine_threadsafe(presence(channel), loop)
        threading.Thread(target=poll, args=(channel,), daemon=True).start()
    return channels


def _work_rate(seconds: float) -> float:
    """Iterations per second of a small numpy loop (it holds the GIL throughout)."""
    a = np.random.default_rng(0).standard_normal(64)
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(200):
            a = np.tanh(a) + 0.1
        count += 200
    return count / (time.perf_counter() - t0)


def measure(mode: str, n: int, window_s: float, warmup_s: float) -> dict[str, Any]:
    """One measurement in a fresh child process (threads from one mode never
    linger into the other)."""
    ctx = multiprocessing.get_context("spawn")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ctx.Process(target=_serve, args=(port, 2 * n + 16), daemon=True)
    server.start()
    try:
        with ctx.Pool(1) as pool:
            return pool.apply(_measure_here, (mode, f"127.0.0.1:{port}", n, window_s, warmup_s))
    finally:
        server.terminate()
        server.join()


def _measure_here(
    mode: str, target: str, n: int, window_s: float, warmup_s: float
) -> dict[str, Any]:
    time.sleep(1.0)  # the server binds
    start = _sync_participants if mode == "sync" else _loop_participants
    _keep = start(target, n)
    time.sleep(warmup_s)
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    rate = _work_rate(window_s)
    r1, dt = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - t0
    del _keep
    return {
        "mode": mode,
        "participants": n,
        "threads": threading.active_count(),
        "user_cpu_per_s": round((r1.ru_utime - r0.ru_utime) / dt, 3),
        "system_cpu_per_s": round((r1.ru_stime - r0.ru_stime) / dt, 3),
        "voluntary_switches_per_s": round((r1.ru_nvcsw - r0.ru_nvcsw) / dt),
        "involuntary_switches_per_s": round((r1.ru_nivcsw - r0.ru_nivcsw) / dt),
        "computing_thread_rate_per_s": round(rate),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--participants", type=int, default=500)
    parser.add_argument("--modes", default="sync,loop")
    parser.add_argument("--window", type=float, default=10.0, help="seconds measured")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    runs = [
        measure(mode.strip(), args.participants, args.window, args.warmup)
        for mode in args.modes.split(",")
    ]
    alone = _work_rate(args.window)
    document = {
        "benchmark": "idle_channels",
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "grpc": grpc.__version__,
            "load_average": os.getloadavg(),
        },
        "computing_thread_rate_alone_per_s": round(alone),
        "runs": runs,
    }
    text = json.dumps(document, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
