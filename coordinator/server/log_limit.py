"""Rate limiting of repeated identical log lines.

Why: a misbehaving or hostile client can make the coordinator refuse the same thing
thousands of times a minute; one line per refusal would bury the log (issue #10
measured 1.1 MB from a fuzz run). The first occurrence of a line is written at once;
identical lines within ``window_s`` are counted, and the count is written when the
line next appears after the window — or, for a line that stopped repeating, with the
next line of any kind once its window is over, or when :meth:`RepeatLimiter.expired`
is asked (a periodic flush: ``spherecal.coordinator.server.native_log`` asks every
window). Nothing is dropped without a count.

The same limiter serves gRPC core's own lines (written by C to fd 2, e.g. one TLS
"Handshake failed" per garbage connection): :mod:`~spherecal.coordinator.server.native_log`
reads them through a pipe and passes each through :meth:`RepeatLimiter.check`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["RepeatFilter", "RepeatLimiter", "rate_limited"]


@dataclass
class _Seen:
    since: float
    suppressed: int = 0


class RepeatLimiter:
    """Decides which lines to write (thread-safe)."""

    def __init__(
        self,
        *,
        window_s: float = 30.0,
        max_lines: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self.max_lines = max_lines
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, _Seen] = OrderedDict()

    def expired(self) -> list[str]:
        """Summaries of the lines whose window is over with repeats still uncounted
        (forgetting them): what a periodic flush writes when no new line comes."""
        now = self._clock()
        summaries: list[str] = []
        with self._lock:
            for key in list(self._seen):
                seen = self._seen[key]
                if now - seen.since < self.window_s:
                    break
                del self._seen[key]
                if seen.suppressed:
                    summaries.append(_summary(key, seen.suppressed, now - seen.since))
        return summaries

    def expired_all(self) -> list[str]:
        """Summaries of every line with uncounted repeats, window over or not (at
        the end, so nothing is dropped without a count)."""
        now = self._clock()
        with self._lock:
            seen, self._seen = self._seen, OrderedDict()
        return [_summary(k, v.suppressed, now - v.since) for k, v in seen.items() if v.suppressed]

    def check(self, line: str) -> tuple[list[str], str | None]:
        """What to write now for ``line``: summaries of other lines' finished repeats,
        and ``line`` itself (with its own suppressed count, if any) or None when it
        repeats one written within the window."""
        now = self._clock()
        summaries: list[str] = []
        written: str | None = line
        with self._lock:
            for key in list(self._seen):
                seen = self._seen[key]
                if now - seen.since < self.window_s:
                    break  # ordered by first write: the rest are younger
                del self._seen[key]
                if not seen.suppressed:
                    continue
                if key == line:
                    written = f"{line} (+{seen.suppressed} identical in {now - seen.since:.0f}s)"
                else:
                    summaries.append(_summary(key, seen.suppressed, now - seen.since))
            current = self._seen.get(line)
            if current is not None:
                current.suppressed += 1
                return summaries, None
            self._seen[line] = _Seen(since=now)
            while len(self._seen) > self.max_lines:
                old, seen = self._seen.popitem(last=False)
                if seen.suppressed:
                    summaries.append(_summary(old, seen.suppressed, now - seen.since))
        return summaries, written


def _summary(line: str, count: int, seconds: float) -> str:
    return f"{line} (+{count} identical in {seconds:.0f}s, then stopped)"


def rate_limited(
    say: Callable[[str], None], limiter: RepeatLimiter | None = None
) -> Callable[[str], None]:
    """``say`` that writes repeated identical lines once per window, with counts."""
    chosen = limiter or RepeatLimiter()

    def limited(message: str) -> None:
        summaries, line = chosen.check(message)
        for summary in summaries:
            say(summary)
        if line is not None:
            say(line)

    return limited


class RepeatFilter(logging.Filter):
    """A handler filter: identical records (level, logger, message, exception type)
    pass once per window; the next one that passes carries the suppressed count.
    (Summaries of *other* records that stopped repeating are appended to the record
    that passes, since a filter cannot write records of its own.)"""

    def __init__(self, limiter: RepeatLimiter | None = None) -> None:
        super().__init__()
        self.limiter = limiter or RepeatLimiter()

    def filter(self, record: logging.LogRecord) -> bool:
        kind = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else ""
        key = f"{record.levelname} {record.name} {record.getMessage()} {kind}"
        summaries, line = self.limiter.check(key)
        if line is None:
            return False
        if line != key or summaries:
            extra = "".join(f"\n  earlier: {s}" for s in summaries)
            record.msg = f"{record.getMessage()}{line[len(key) :]}{extra}"
            record.args = None
        return True
