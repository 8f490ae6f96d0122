"""Who may take part, who has joined, who is alive — and authentication of every call.

Identity model (see ``proto/identity.py``):

* The **roster** (coordinator settings) lists every participant id, in partition
  order. An id not on it is refused with PERMISSION_DENIED.
* **Join** proves possession of the participant's Ed25519 identity key (a signature
  over id, key, timestamp and nonce; replays within the clock-skew window are
  refused). The first key seen for an id is *pinned* in SQLite; a later join with a
  different key is refused — so a restart or reconnect cannot be hijacked.
* Under **mTLS** the certificate's identity must equal the id named in every request,
  and the key in the certificate's spherecal extension must equal the joining key.
* A **session** token (random, per join) ties later calls to the current join; a
  restarted coordinator has none, so participants simply join again.
* A member whose certificate — the one it last joined with, its serial kept in the
  store — is on the CA's revocation list cannot come back under it: it *left*
  (:meth:`Registry.revoked`), as a member that refused the plan, and nothing waits for
  it; a join with a new certificate lets it back in.

Liveness: a participant is alive while it keeps a ``Presence`` stream open — when
that connection drops (process killed, host gone) it is dead *at once*, and a busy
participant whose connection stays up is never mistaken for a dead one. Without an
open stream, any authenticated call refreshes ``last_seen`` and a participant silent
for longer than the heartbeat timeout is dead. The driver never waits for the dead
(it drops them from the stage they are in, with the reason logged).
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, field, replace

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from spherecal.coordinator.errors import ServiceError
from spherecal.coordinator.state.store import Store
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.identity import (
    CertificateError,
    certificate_identity,
    identity_key_from_certificate,
    join_payload,
)

__all__ = ["Peer", "Registry"]


@dataclass(frozen=True)
class Peer:
    """What the transport authenticated about a caller.

    ``identity`` is the participant id from the verified client certificate (mTLS),
    or None on a transport without client certificates (loopback ``--insecure``, or
    the in-process transport of unit tests).
    """

    identity: str | None = None
    certificate_pem: bytes | None = None
    address: str = ""


@dataclass
class Member:
    participant_id: str
    index: int
    identity_key: bytes | None = None
    certificate_pem: bytes | None = None
    session: str | None = None
    last_seen: float = 0.0
    joins: int = 0
    presence: int = 0
    data_shape: tuple[int, int, int, int] | None = None
    last_contact: float = 0.0
    """Wall-clock time of the last call or disconnect (0: never); for the status view."""
    presence_address: str = ""
    """The transport address of the latest open presence stream: a join from another
    address while one is open is a second live process with this identity."""
    session_address: str = ""
    """The transport address the current session was issued to: until its holder opens a
    presence stream, the session is live (heard from within the heartbeat timeout) and a
    join from another address is a second process too."""
    left: str = ""
    """Why it left the federation ("" unless it did): it refused the plan, with its
    reason (:meth:`Registry.leave`), or its certificate was revoked
    (:meth:`Registry.revoked`). Cleared when it joins again. A join window no longer
    waits for a member that left (``Federation._await_participants``), nor does a
    job's stage (``Stages.drive_job``). Kept in the store with the member's row
    (``Store.record_left``; until 2026-11-27 in memory only), so a coordinator
    restarted during its join window does not wait for it again."""
    certificate_serial: int | None = None
    """The serial number of the client certificate it last joined with (None without
    mutual TLS, or before it joined under one), kept in the store
    (``Store.certificate_serials``): a CRL listing it means the member cannot come
    back under that certificate (:meth:`Registry.revoked`)."""


@dataclass
class _NonceCache:
    window_s: float
    seen: OrderedDict[bytes, float] = field(default_factory=OrderedDict)

    def claim(self, nonce: bytes, now: float) -> bool:
        while self.seen:
            oldest, ts = next(iter(self.seen.items()))
            if now - ts <= 2 * self.window_s:
                break
            self.seen.pop(oldest)
        if nonce in self.seen:
            return False
        self.seen[nonce] = now
        return True


class Registry:
    """Roster, pinned identity keys, sessions and liveness (thread-safe)."""

    def __init__(
        self,
        roster: tuple[str, ...],
        store: Store,
        *,
        require_certificates: bool,
        heartbeat_timeout_s: float,
        clock_skew_s: float,
    ) -> None:
        self.roster = roster
        self._store = store
        self._require_certs = require_certificates
        self._timeout = heartbeat_timeout_s
        self._skew = clock_skew_s
        self._lock = threading.Lock()
        self._members = {pid: Member(pid, k) for k, pid in enumerate(roster)}
        for pid, key in store.pinned_keys().items():
            if pid in self._members:
                self._members[pid].identity_key = key
        for pid, why in store.left_members().items():
            if pid in self._members:
                self._members[pid].left = why
        for pid, serial in store.certificate_serials().items():
            if pid in self._members:
                self._members[pid].certificate_serial = serial
        self._nonces = _NonceCache(clock_skew_s)

    # ---------------------------------------------------------------- lookups
    def index_of(self, participant_id: str) -> int:
        return self._members[participant_id].index

    def member(self, participant_id: str) -> Member:
        return self._members[participant_id]

    def alive(self, now: float | None = None) -> frozenset[str]:
        """Joined participants heard from within the heartbeat timeout."""
        t = time.monotonic() if now is None else now
        with self._lock:
            return frozenset(m.participant_id for m in self._members.values() if self._live(m, t))

    def _live(self, member: Member, now: float) -> bool:
        """Joined, and connected (a presence stream open) or heard from within the
        heartbeat timeout. Called with the lock held."""
        return member.session is not None and (
            member.presence > 0 or now - member.last_seen <= self._timeout
        )

    def presence_opened(self, member: Member, address: str = "") -> None:
        with self._lock:
            member.presence += 1
            member.presence_address = address
            member.last_seen = time.monotonic()
            member.last_contact = time.time()

    def presence_closed(self, member: Member) -> None:
        """A presence stream ended; with none left the participant is gone *now*
        (its next call, if it is in fact alive, revives it)."""
        with self._lock:
            member.presence = max(0, member.presence - 1)
            member.last_contact = time.time()
            if member.presence == 0:
                member.last_seen = float("-inf")

    def leave(self, member: Member, why: str) -> None:
        """``member`` left the federation (it refused the plan, or its certificate was
        revoked: :meth:`revoked`): its session ends now, so
        it is neither joined nor connected — not for the heartbeat timeout after its
        last call, as for a site that simply went away — and ``why`` is kept for the
        status view. A later join (the site's operator fixed what it refused) makes it
        a member like any other again."""
        with self._lock:
            self._end_membership(member, why)
        self._store.record_left(member.participant_id, why)

    def _end_membership(self, member: Member, why: str) -> None:
        """:meth:`leave`'s change, with the lock held."""
        member.session = None
        member.session_address = ""
        member.last_seen = float("-inf")
        member.last_contact = time.time()
        member.left = why

    def revoked(self, serials: Collection[int]) -> dict[str, str]:
        """The members whose certificate — the one each last joined with — has its
        serial in ``serials`` (the CA's revocation list), each made to leave
        (:meth:`leave`) with why; returns them (not those that had left already).

        Why: a revoked member cannot come back under that certificate — every call it
        makes is refused — yet until 2026-11-27 it stayed an absent member, and the
        coordinator waited for it as for one restarting: the whole join window
        (``join_s``) and the stage grace of every job it was in (``rejoin_grace_s``),
        for nothing. Only the member's *own* last certificate counts (its serial is
        kept in the store, so a certificate revoked while the coordinator was down
        counts at its start): an old certificate revoked after the site joined with a
        new one does not push the site out. A join with a new certificate clears ``left``, as
        for a member that refused the plan and came back."""
        gone: dict[str, str] = {}
        with self._lock:  # found and marked at once: each revocation is told once
            for member in self._members.values():
                serial = member.certificate_serial
                if serial is not None and serial in serials and not member.left:
                    why = (
                        f"has a revoked certificate (serial {serial:x}) and can join "
                        "again only with a new one"
                    )
                    self._end_membership(member, why)
                    gone[member.participant_id] = why
        for pid, why in gone.items():
            self._store.record_left(pid, why)
        return gone

    def left(self) -> dict[str, str]:
        """The members that left (refused the plan, or have a revoked certificate) and
        have not joined again, with why."""
        with self._lock:
            return {m.participant_id: m.left for m in self._members.values() if m.left}

    def members(self) -> list[Member]:
        """Copies of every roster member, in roster order (for the status view)."""
        with self._lock:
            return [replace(m) for m in sorted(self._members.values(), key=lambda m: m.index)]

    def joined(self) -> frozenset[str]:
        with self._lock:
            return frozenset(m.participant_id for m in self._members.values() if m.session)

    def joined_and_left(self) -> tuple[frozenset[str], dict[str, str]]:
        """The members with a session, and those that left (refused the plan, and have
        not joined again) with why — one snapshot, for the join window: a site's
        rejoin or refusal between two separate reads would count it in both or
        neither."""
        with self._lock:
            joined = frozenset(m.participant_id for m in self._members.values() if m.session)
            left = {m.participant_id: m.left for m in self._members.values() if m.left}
        return joined, left

    def directory(self, participants: list[str]) -> list[pb.DirectoryEntry]:
        with self._lock:
            out = []
            for pid in participants:
                m = self._members[pid]
                if m.identity_key is None:
                    raise ServiceError(
                        grpc.StatusCode.INTERNAL, f"no identity key pinned for {pid!r}"
                    )
                out.append(
                    pb.DirectoryEntry(
                        participant_id=pid,
                        identity_public_key=m.identity_key,
                        certificate_pem=m.certificate_pem or b"",
                    )
                )
            return out

    def identity_keys(self, participants: list[str]) -> dict[str, bytes]:
        with self._lock:
            keys = {p: self._members[p].identity_key for p in participants}
        missing = [p for p, k in keys.items() if k is None]
        if missing:
            raise ServiceError(grpc.StatusCode.INTERNAL, f"no identity key pinned for {missing}")
        return {p: k for p, k in keys.items() if k is not None}

    # ---------------------------------------------------------------- auth
    def _known(self, participant_id: str) -> Member:
        member = self._members.get(participant_id)
        if member is None:
            raise ServiceError(
                grpc.StatusCode.PERMISSION_DENIED,
                f"participant {participant_id[:64]!r} is not on this federation's roster",
            )
        return member

    def _check_peer(self, participant_id: str, peer: Peer) -> None:
        if peer.identity is None:
            if self._require_certs:
                raise ServiceError(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "a client certificate is required (mutual TLS)",
                )
            return
        if peer.identity != participant_id:
            raise ServiceError(
                grpc.StatusCode.UNAUTHENTICATED,
                f"certificate identity {peer.identity[:64]!r} does not match participant id "
                f"{participant_id[:64]!r}",
            )

    def authenticate(self, caller: pb.Caller, peer: Peer) -> Member:
        """Check a request's caller against the transport identity and its session."""
        if not caller.participant_id:
            raise ServiceError(grpc.StatusCode.UNAUTHENTICATED, "request names no caller")
        self._check_peer(caller.participant_id, peer)
        member = self._known(caller.participant_id)
        with self._lock:
            if member.session is None or not secrets.compare_digest(member.session, caller.session):
                raise ServiceError(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "unknown or expired session: join again",
                    reason=pb.SESSION_EXPIRED,
                )
            member.last_seen = time.monotonic()
            member.last_contact = time.time()
        return member

    def check_member(self, participant_id: str, peer: Peer) -> None:
        """Raise unless ``peer`` may speak for ``participant_id`` (its certificate,
        under mutual TLS) and that participant is on the roster: the first check of a
        join, before anything about the federation is answered."""
        self._check_peer(participant_id, peer)
        self._known(participant_id)

    def authenticate_any(self, caller: pb.Caller, peer: Peer) -> str:
        """For read-only status calls: a roster member's certificate (mTLS), with or
        without a session, or a valid session. (Until 2026-11-27 any certificate the
        CA issued was answered: a site of another federation under the same CA, or one
        that left the roster.)"""
        if peer.identity is not None:
            pid = caller.participant_id or peer.identity
            self.check_member(pid, peer)
            return pid
        return self.authenticate(caller, peer).participant_id

    def join(self, request: pb.JoinRequest, peer: Peer) -> Member:
        """Verify a join and open a new session (invalidating any previous one)."""
        pid = request.participant_id
        if not pid:
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, "participant_id is required")
        self._check_peer(pid, peer)
        member = self._known(pid)
        key = bytes(request.identity_public_key)
        if len(key) != 32 or len(request.nonce) != 16 or len(request.signature) != 64:
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "join needs a 32-byte Ed25519 key, a 16-byte nonce and a 64-byte signature",
            )
        now_ms = time.time() * 1000.0
        if abs(now_ms - request.timestamp_ms) > self._skew * 1000.0:
            raise ServiceError(
                grpc.StatusCode.UNAUTHENTICATED,
                f"join timestamp is more than {self._skew:.0f}s away from the coordinator's clock",
            )
        try:
            Ed25519PublicKey.from_public_bytes(key).verify(
                bytes(request.signature),
                join_payload(pid, key, request.timestamp_ms, bytes(request.nonce)),
            )
        except (InvalidSignature, ValueError):
            raise ServiceError(
                grpc.StatusCode.UNAUTHENTICATED, "join signature does not verify"
            ) from None
        cert_sha: str | None = None
        cert_serial: int | None = None
        if peer.certificate_pem is not None:
            cert_sha = hashlib.sha256(peer.certificate_pem).hexdigest()
            try:
                cert = x509.load_pem_x509_certificate(peer.certificate_pem)
                cert_serial = cert.serial_number
                bound = identity_key_from_certificate(cert)
                certificate_identity(cert)
            except (CertificateError, ValueError) as exc:
                raise ServiceError(grpc.StatusCode.UNAUTHENTICATED, str(exc)) from None
            if bound is None:
                raise ServiceError(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "client certificate carries no spherecal identity key "
                    "(issue it with `spherecal certs issue`)",
                )
            if bound != key:
                raise ServiceError(
                    grpc.StatusCode.PERMISSION_DENIED,
                    "identity key differs from the one bound in the client certificate",
                )
        with self._lock:
            if member.identity_key is not None and member.identity_key != key:
                raise ServiceError(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"{pid!r} joined before with a different identity key",
                )
            now = time.monotonic()
            # The holder of a live session (as alive() counts it): the connection of its
            # open presence stream, or, before the holder opened one (the moments right
            # after its join), the connection the session was issued to.
            holder = member.presence_address if member.presence > 0 else member.session_address
            if self._live(member, now) and holder != peer.address:
                # One live session per identity: a second process with the same
                # certificate would replace the first's session, and the two would knock
                # each other off at every call. The live one keeps it; a restarted
                # process gets in once the dead one's connection is gone (retryable).
                # Until 2026-11-26 only an open presence stream counted, so a twin that
                # joined in the ~0.1 s between the first's join and its presence stream
                # took the session, and the two fought for it for the whole federation.
                raise ServiceError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"{pid!r} is already connected from {holder or '?'}: "
                    f"a second process with this identity ({peer.address or '?'}) is "
                    "refused while the first is live",
                    reason=pb.IDENTITY_IN_USE,
                )
            if not self._nonces.claim(bytes(request.nonce), time.monotonic()):
                raise ServiceError(grpc.StatusCode.ALREADY_EXISTS, "replayed join request")
            first = member.identity_key is None
            member.identity_key = key
            member.certificate_pem = peer.certificate_pem
            member.certificate_serial = cert_serial
            member.session = secrets.token_urlsafe(24)
            member.session_address = peer.address
            member.left = ""
            member.last_seen = now
            member.last_contact = time.time()
            member.joins += 1
            shape = request.data
            member.data_shape = (
                shape.num_classes,
                shape.in_channels,
                shape.image_height,
                shape.image_width,
            )
        self._store.record_join(pid, member.index, key, cert_sha, cert_serial)
        if first:
            self._store.event("info", f"pinned identity key of {pid}")
        return member
