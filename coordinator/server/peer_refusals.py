"""Calls refused for their transport identity, before any handler ran: made visible.

A revoked or unreadable client certificate is refused by the gRPC adapter itself
(``grpc_server``), so no RPC handler logs or counts it — an operator saw ``refused
requests: 0`` while a revoked site knocked every few seconds. Each such refusal is
counted (status, metrics), and logged with the certificate's identity and serial and
recorded in ``events`` at most once per window per reason (the shared
:class:`~spherecal.coordinator.server.log_limit.RepeatLimiter`, so the next line says
how many more there were): a site retrying cannot grow the log.
"""

from __future__ import annotations

from collections.abc import Callable

from spherecal.coordinator.errors import ServiceError
from spherecal.coordinator.server.log_limit import RepeatLimiter
from spherecal.coordinator.server.status import RefusalCounter
from spherecal.coordinator.state.store import Store

__all__ = ["PeerRefusals"]

#: A refused transport identity is logged at most once per this many seconds.
LOG_WINDOW_S = 60.0


class PeerRefusals:
    """Counts, logs (rate-limited) and records refusals of a call's client certificate."""

    def __init__(
        self,
        refusals: RefusalCounter,
        say: Callable[[str], None],
        store: Store,
        *,
        window_s: float = LOG_WINDOW_S,
    ) -> None:
        self._refusals = refusals
        self._say = say
        self._store = store
        self._limiter = RepeatLimiter(window_s=window_s)

    def refuse(self, address: str, error: ServiceError) -> None:
        self._refusals.add(error.code)
        # keyed by the reason, not the address: every retry comes from a new port
        summaries, written = self._limiter.check(f"{error.code.name}: {error.message}")
        lines = [f"refused calls: {s}" for s in summaries]
        if written is not None:
            lines.append(f"refused a call from {address or '?'}: {written}")
        for line in lines:
            self._say(line)
            self._store.event("warning", line)
