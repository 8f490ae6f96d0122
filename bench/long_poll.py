"""Cost of the coordinator's long polls while submissions arrive (one secure stage).

``n`` handler threads wait in :meth:`spherecal.coordinator.driver.board.Board.wait_instruction` (the
``NextInstruction`` long poll of participants that already answered the stage), and
``n`` submissions arrive one per millisecond, each announced the way the service does
it. Counted: how many times a waiting handler woke and re-evaluated its instruction,
and the process CPU seconds spent. ``--wake all`` replays the old behaviour (every
submission woke every long poll, ``Board.notify``); ``--wake driver`` the current
one (``Board.notify_driver``: submissions wake only the driver). Prints JSON::

    python bench/long_poll.py --participants 1000 --wake all
    python bench/long_poll.py --participants 1000 --wake driver

``--stage-changes K`` measures the other side (issue #14): ``n`` waiting polls, then
``K`` stage changes (``Board.notify``), each waking and re-evaluating all ``n``; the
polls are ``n`` blocked threads (``--waiters threads``, the synchronous gRPC server)
or ``n`` coroutines on one event loop awaiting ``Board.wait_instruction_async`` with
its four evaluating threads (``--waiters async``, the ``grpc.aio`` server). Counted:
CPU seconds (user and system) for the K wake-ups, and the process's threads::

    python bench/long_poll.py --participants 1000 --stage-changes 20 --waiters threads
    python bench/long_poll.py --participants 1000 --stage-changes 20 --waiters async
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from spherecal.coordinator.driver.board import Board
from spherecal.coordinator.state.registry import Member
from spherecal.proto import spherecal_pb2 as pb


class _CountingBoard(Board):
    def __init__(self) -> None:
        super().__init__()
        self.evaluations = 0
        self._count_lock = threading.Lock()

    def instruction_for(self, member: Member, session: str | None = None) -> pb.Instruction:
        with self._count_lock:
            self.evaluations += 1
        return super().instruction_for(member, session)


def measure(n: int, wake: str, gap_s: float) -> dict[str, object]:
    board = _CountingBoard()
    board.set_task(None, "secagg stage")
    members = [Member(f"p{k}", k, session="s") for k in range(n)]
    threads = [
        threading.Thread(target=board.wait_instruction, args=(m, 2.0 + n * gap_s * 2))
        for m in members
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # every handler is waiting
    announce = board.notify if wake == "all" else board.notify_driver
    before = board.evaluations
    cpu0, t0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        announce()
        time.sleep(gap_s)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    evaluations = board.evaluations - before
    board.finish("completed", "bench over")
    for thread in threads:
        thread.join()
    return {
        "participants": n,
        "wake": wake,
        "submissions": n,
        "re_evaluations": evaluations,
        "cpu_s": round(cpu, 3),
        "wall_s": round(wall, 3),
    }


def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        time.sleep(0.001)


def measure_stage_changes(n: int, waiters: str, changes: int) -> dict[str, object]:
    """K stage changes with n waiting polls (threads or coroutines)."""
    board = _CountingBoard()
    board.recheck_s = 3600.0  # only the stage changes wake the polls here
    board.set_task(None, "secagg stage")
    members = [Member(f"p{k}", k, session="s") for k in range(n)]
    timeout = 3600.0
    stop: Callable[[], None]
    if waiters == "threads":
        threads = [
            threading.Thread(target=board.wait_instruction, args=(m, timeout)) for m in members
        ]
        for thread in threads:
            thread.start()

        def stop() -> None:
            for thread in threads:
                thread.join()
    else:
        loop = asyncio.new_event_loop()
        pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="poll")
        runner = threading.Thread(target=loop.run_forever, daemon=True)
        runner.start()
        polls = [
            asyncio.run_coroutine_threadsafe(board.wait_instruction_async(m, timeout, pool), loop)
            for m in members
        ]

        def stop() -> None:
            for poll in polls:
                poll.result()
            loop.call_soon_threadsafe(loop.stop)
            runner.join()
            loop.close()
            pool.shutdown()

    _until(lambda: board.evaluations >= n)  # every poll waits, evaluated once
    time.sleep(0.5)
    thread_count = threading.active_count()
    t0, w0 = os.times(), time.perf_counter()
    for k in range(changes):
        target = n * (k + 2)
        board.notify()
        _until(lambda target=target: board.evaluations >= target)  # type: ignore[misc]
    t1, wall = os.times(), time.perf_counter() - w0
    board.finish("completed", "bench over")
    stop()
    user, system = t1.user - t0.user, t1.system - t0.system
    return {
        "participants": n,
        "waiters": waiters,
        "stage_changes": changes,
        "threads": thread_count,
        "cpu_s": round(user + system, 3),
        "system_s": round(system, 3),
        "cpu_ms_per_wakeup": round((user + system) * 1000 / (n * changes), 4),
        "wall_s": round(wall, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--participants", type=int, default=1000)
    parser.add_argument("--wake", choices=("all", "driver"), default="driver")
    parser.add_argument("--gap-ms", type=float, default=1.0)
    parser.add_argument("--stage-changes", type=int, default=0)
    parser.add_argument("--waiters", choices=("threads", "async"), default="async")
    args = parser.parse_args()
    if args.stage_changes:
        result = measure_stage_changes(args.participants, args.waiters, args.stage_changes)
    else:
        result = measure(args.participants, args.wake, args.gap_ms / 1000.0)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
