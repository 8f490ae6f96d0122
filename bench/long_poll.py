"""Cost of the coordinator's long polls while submissions arrive (one secure stage).

``n`` handler threads wait in :meth:`coordinator.board.Board.wait_instruction` (the
``NextInstruction`` long poll of participants that already answered the stage), and
``n`` submissions arrive one per millisecond, each announced the way the service does
it. Counted: how many times a waiting handler woke and re-evaluated its instruction,
and the process CPU seconds spent. ``--wake all`` replays the old behaviour (every
submission woke every long poll, ``Board.notify``); ``--wake driver`` the current
one (``Board.notify_driver``: submissions wake only the driver). Prints JSON::

    python bench/long_poll.py --participants 1000 --wake all
    python bench/long_poll.py --participants 1000 --wake driver
"""

from __future__ import annotations

import argparse
import json
import threading
import time

from coordinator.board import Board
from coordinator.registry import Member
from proto import spherecal_pb2 as pb


class _CountingBoard(Board):
    def __init__(self) -> None:
        super().__init__()
        self.evaluations = 0
        self._count_lock = threading.Lock()

    def instruction_for(self, member: Member) -> pb.Instruction:
        with self._count_lock:
            self.evaluations += 1
        return super().instruction_for(member)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--participants", type=int, default=1000)
    parser.add_argument("--wake", choices=("all", "driver"), default="driver")
    parser.add_argument("--gap-ms", type=float, default=1.0)
    args = parser.parse_args()
    print(json.dumps(measure(args.participants, args.wake, args.gap_ms / 1000.0)))


if __name__ == "__main__":
    main()
