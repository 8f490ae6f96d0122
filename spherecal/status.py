"""``spherecal status``: a one-screen live view of a running federation.

Calls the coordinator's read-only ``GetFederationStatus`` RPC
(``spherecal.coordinator.server.status``)
with the operator's certificate — the coordinator allows only identities on its
``[admin] allow`` list, or loopback callers in plaintext mode — and prints the roster
with liveness, the current round and secure-aggregation stage, the completed rounds,
the jobs and the ε spent per subject. ``--watch`` refreshes until the federation ends,
shows its final status and accuracies and exits with its outcome (issue #23).

``--json`` prints :func:`status_json`: every field of ``FederationStatus`` under its
``.proto`` name, zero values included (``"refusals": 0``, not a missing key), 64-bit
integers as JSON numbers, an unset ``optional`` field as ``null``. An unreachable
coordinator is :class:`~spherecal.cli.exit_codes.CoordinatorUnreachable` (exit 4).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, cast

from spherecal.cli.exit_codes import ExitCode
from spherecal.coordinator.summary_schema import SummaryDocument, is_complete

__all__ = [
    "fetch_status",
    "final_from_summary",
    "render_status",
    "render_summary_end",
    "show_status",
    "status_json",
]


def _own_name(cert: Path | None) -> str | None:
    """A name the coordinator's own certificate is issued for, to check when dialling
    127.0.0.1 — None when it names 127.0.0.1 itself (or cannot be read)."""
    if cert is None or not cert.is_file():
        return None
    from cryptography import x509

    try:
        certificate = x509.load_pem_x509_certificate(cert.read_bytes())
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return None
    if "127.0.0.1" in {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}:
        return None
    dns = names.get_values_for_type(x509.DNSName)
    return dns[0] if dns else None


def _target(
    args: argparse.Namespace,
) -> tuple[str, bool, Path | None, Path | None, str | None]:
    """(address, insecure, CA, the coordinator's out_dir, server name) from the flags
    and/or the coordinator's config."""
    address, insecure, ca = args.address, bool(args.insecure), args.ca
    server_name: str | None = args.server_name
    out_dir: Path | None = None
    if args.config is not None:
        from spherecal.config import load_coordinator_config

        settings, _ = load_coordinator_config(args.config)
        out_dir = settings.out_dir
        if address is None:
            host, _, port = settings.server.listen.rpartition(":")
            port_file = settings.server.port_file
            if port == "0" and port_file is not None and port_file.is_file():
                port = port_file.read_text().strip()
            if host in ("0.0.0.0", "[::]", ""):
                host = "127.0.0.1"
                # on the coordinator's machine: its certificate may name only the
                # names participants dial (``certs init --host coord.example.org``)
                if server_name is None and not settings.server.insecure:
                    server_name = _own_name(settings.tls.cert)
            address = f"{host}:{port}"
        insecure = insecure or settings.server.insecure
        ca = ca or settings.tls.client_ca
    if address is None:
        raise ValueError("give --config (the coordinator's TOML) or --address HOST:PORT")
    return address, insecure, ca, out_dir, server_name


def fetch_status(
    address: str,
    *,
    insecure: bool,
    ca: Path | None = None,
    cert: Path | None = None,
    key: Path | None = None,
    server_name: str | None = None,
    timeout: float = 10.0,
) -> Any:
    """One ``GetFederationStatus`` call; raises ValueError with a one-line reason."""
    import grpc

    from spherecal.participant.grpc_transport import is_loopback_address
    from spherecal.proto import spherecal_pb2 as pb
    from spherecal.proto.services import grpc_services

    options: list[tuple[str, Any]] = []
    if insecure:
        if not is_loopback_address(address):
            raise ValueError(f"plaintext is only allowed for loopback addresses, not {address!r}")
        channel = grpc.insecure_channel(address)
    else:
        missing = [n for n, v in (("--ca", ca), ("--cert", cert), ("--key", key)) if v is None]
        if missing:
            raise ValueError(f"mutual TLS needs {', '.join(missing)} (the operator's certificate)")
        assert ca is not None and cert is not None and key is not None
        credentials = grpc.ssl_channel_credentials(
            root_certificates=ca.read_bytes(),
            private_key=key.read_bytes(),
            certificate_chain=cert.read_bytes(),
        )
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        channel = grpc.secure_channel(address, credentials, options=options)
    try:
        stub = grpc_services().CoordinatorStub(channel)
        return stub.GetFederationStatus(pb.FederationStatusRequest(), timeout=timeout)
    except grpc.RpcError as exc:
        from spherecal.cli.exit_codes import CoordinatorUnreachable
        from spherecal.participant.grpc_transport import (
            client_certificate_hint,
            tls_failure_hint,
        )

        code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
        details = " ".join((exc.details() if hasattr(exc, "details") else "").split())
        message = f"coordinator at {address}: {code}: {details[:300]}"
        hint = tls_failure_hint(
            details, server_name="--server-name", ca="--ca"
        ) or client_certificate_hint(
            details, cert=cert, ca=ca, cert_name=f"--cert {cert}", ca_name=f"--ca {ca}"
        )
        if hint:  # reached, but its certificate is refused: bad input, not an outage
            raise ValueError(f"{message} — {hint}") from None
        if code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
            raise CoordinatorUnreachable(message) from None
        raise ValueError(message) from None
    finally:
        channel.close()


def _ago(seconds: float) -> str:
    if seconds < 0:
        return "never"
    if seconds < 1:
        return "now"
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    return f"{seconds / 60:.0f}m ago"


def _site_state(r: Any) -> str:
    """What the coordinator knows of a site now: ``connected`` (its presence stream
    is open or it was heard within the heartbeat timeout), ``left`` (it left the
    federation — it refused the plan — and has not joined since: the line ends with
    why), ``disconnected`` (it joined, and is not), ``absent`` (never joined — this
    coordinator process: the view starts afresh at a restart); ``, told done`` once
    the end was delivered to it."""
    if r.connected:
        state = "connected"
    elif r.left:
        state = "left"
    else:
        state = "disconnected" if r.joined else "absent"
    return state + (", told done" if r.told_done else "")


def render_status(st: Any) -> str:
    """The one-screen text view of a ``FederationStatus``."""
    if st.current_round:
        progress = f"round {st.current_round} of {st.rounds} (completed {st.completed_rounds})"
    else:
        progress = f"rounds completed {st.completed_rounds} of {st.rounds}"
    lines = [
        f"federation {st.federation_id or '?'} ({st.name}) — {st.status} — {st.phase}",
        progress
        + (f" · task {st.task}" if st.task else "")
        + (f" · secure aggregation: {st.stage} (job {st.job_id[:12]})" if st.stage else ""),
    ]
    if st.status != "running":
        shown = ", ".join(f"{a.method} {a.accuracy:.4f}" for a in st.accuracy)
        lines.append(f"final: {st.status} · accuracy: {shown or 'none measured'}")
        lines.extend(f"  reason: {reason}" for reason in st.status_reasons)
    connected = sum(1 for r in st.roster if r.connected)
    lines.append(f"participants: {connected}/{len(st.roster)} connected")
    for r in st.roster:
        lines.append(
            f"  {r.participant_id:<16} {_site_state(r):<24} seen "
            f"{_ago(r.seconds_since_seen):<9} joins {r.joins}"
            + (f" · {r.left}" if r.left and not r.connected else "")
        )
    if st.completed:
        lines.append("completed rounds:  round  updates  loss       test acc  fed acc  seconds")
        for c in list(st.completed)[-8:]:
            test = f"{c.test_accuracy:.4f}" if c.HasField("test_accuracy") else "-"
            fed = f"{c.federated_accuracy:.4f}" if c.HasField("federated_accuracy") else "-"
            lines.append(
                f"                   {c.round:<6} {c.contributors}/{c.selected:<6} "
                f"{c.train_loss:<10.4f} {test:<9} {fed:<8} {c.seconds:.1f}"
                + (f"  dropped {list(c.dropped)}" if c.dropped else "")
            )
    if st.jobs:
        lines.append("jobs:")
        for j in list(st.jobs)[-6:]:
            where = f"r{j.round}" if j.round > 0 else "final"
            lines.append(
                f"  {j.job_id[:12]} {j.purpose:<7} {where:<6} {j.state:<8} stage {j.stage}"
                + (f" contributors {len(j.contributors)}" if j.contributors else "")
                + (f" error: {j.error[:80]}" if j.error else "")
            )
    if st.privacy_enabled:
        spent = ", ".join(f"{e.subject} {e.epsilon:.3g}" for e in st.epsilon) or "nothing yet"
        lines.append(f"privacy: ε spent: {spent}")
    else:
        lines.append("privacy: differential privacy off")
    lines.append(f"refused requests: {st.refusals} · uptime {st.uptime_s:.0f}s")
    lines.extend(f"WARNING: {w}" for w in st.warnings)
    lines.extend(f"ERROR: {e}" for e in st.errors)
    return "\n".join(lines)


def status_json(message: Any) -> dict[str, Any]:
    """A message as a JSON object with every field (issue #26).

    Unlike ``MessageToDict``: fields at their zero value are kept, 64-bit integers
    stay numbers (protobuf's JSON mapping writes them as strings), an unset
    ``optional`` field is ``null``; enums by name, bytes as base64, a non-finite
    float as the mapping's ``"NaN"``/``"Infinity"``/``"-Infinity"``."""
    import base64
    import math

    from google.protobuf.descriptor import FieldDescriptor

    def scalar(field: Any, value: Any) -> Any:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            return status_json(value)
        if field.type == FieldDescriptor.TYPE_ENUM:
            named = field.enum_type.values_by_number.get(value)
            return named.name if named is not None else value
        if field.type == FieldDescriptor.TYPE_BYTES:
            return base64.b64encode(value).decode("ascii")
        if isinstance(value, float) and not math.isfinite(value):
            return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        return value

    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.is_repeated:
            out[field.name] = [scalar(field, v) for v in value]
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = scalar(field, value)
    return out


def _end_code(status: str) -> int:
    from spherecal.proto.federation_end import SUCCESSFUL_STATUSES

    return int(ExitCode.OK if status in SUCCESSFUL_STATUSES else ExitCode.FAILED)


def final_from_summary(out_dir: Path | None, federation_id: str) -> SummaryDocument | None:
    """The coordinator's ``summary.json`` of federation ``federation_id`` once it has
    ended (status not ``running``), else None: what a watch reports when the
    coordinator exited between two refreshes."""
    if out_dir is None:
        return None
    try:
        summary = json.loads((out_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or summary.get("federation_id") != federation_id:
        return None
    if summary.get("status") in (None, "running"):
        return None
    return cast(SummaryDocument, summary)  # the file the coordinator wrote for this federation


def render_summary_end(summary: SummaryDocument) -> str:
    """The last screen of a watch, from the coordinator's summary (the stop
    watchdog's few lines name no settings or accuracy: shown as unknown)."""
    full = summary if is_complete(summary) else None
    accuracy = (full.get("accuracy") if full else None) or {}
    shown = ", ".join(f"{k} {v:.4f}" for k, v in accuracy.items() if v is not None)
    name = full["settings"].get("name", "?") if full else "?"
    rounds = full["settings"].get("rounds", "?") if full else "?"
    completed = len(full.get("per_round", [])) if full else 0
    lines = [
        f"federation {summary.get('federation_id')} ({name}) — "
        f"{summary.get('status')} (from its summary.json: the coordinator has exited)",
        f"rounds completed {completed} of {rounds}",
        f"final: {summary.get('status')} · accuracy: {shown or 'none measured'}",
    ]
    lines.extend(f"  reason: {r}" for r in summary.get("status_reasons") or [])
    return "\n".join(lines)


WATCH_TOLD_DONE_S = 10.0
"""After the end, how long a watch keeps refreshing until every connected site was told
done (the coordinator marks the end before the sites' next polls deliver it)."""


def show_status(args: argparse.Namespace) -> int:
    """``spherecal status`` (its parser: :mod:`spherecal.cli.status`).

    With ``--watch`` it follows the run to its end: the last view shows the final
    status and accuracies, and the exit status is the federation's (0 completed or
    degraded, 1 failed), once every connected site was told done (at most
    :data:`WATCH_TOLD_DONE_S` after the end). The coordinator lingers for a watch it has
    seen until it has served that view; if the coordinator is gone anyway, the watch reads its
    ``summary.json`` (``--config`` names the out_dir) before giving up. An operator
    certificate outside its validity window, or a CA file with no certificate inside
    its window, is refused before dialling (exit 2); one that ends soon is a
    ``WARNING:`` line."""
    address, insecure, ca, out_dir, server_name = _target(args)
    if not insecure:  # an expired --cert (or CA) is refused in the handshake, unexplained
        from spherecal.preflight import CLIENT_RENEWAL, ca_window, certificate_window

        soon = certificate_window("--cert", args.cert, CLIENT_RENEWAL)
        ca_name = "--ca" if args.ca is not None else f"{args.config}: [tls] client_ca"
        for warning in ([soon] if soon else []) + ca_window(ca_name, ca):
            print(f"spherecal status: {warning}", file=sys.stderr, flush=True)

    def once() -> Any:
        return fetch_status(
            address,
            insecure=insecure,
            ca=ca,
            cert=args.cert,
            key=args.key,
            server_name=server_name,
            timeout=args.timeout,
        )

    seen: str | None = None
    ended: tuple[str, float] | None = None  # the end's status, when first seen
    while True:
        try:
            st = once()
        except ValueError as exc:
            if seen is None:
                raise
            if ended is not None:  # the end was shown; the coordinator has since exited
                return _end_code(ended[0])
            summary = final_from_summary(out_dir, seen)
            if summary is not None:
                print(json.dumps(summary) if args.json else render_summary_end(summary))
                return _end_code(str(summary.get("status")))
            raise type(exc)(
                f"the coordinator no longer answers (the federation ended or it stopped; "
                f"last status above): {exc}"
            ) from None
        seen = st.federation_id
        if args.json:
            print(json.dumps(status_json(st), indent=2))
        else:
            if args.watch is not None and sys.stdout.isatty():
                print("\x1b[H\x1b[2J", end="")
            print(render_status(st), flush=True)
        if args.watch is None:
            return ExitCode.OK
        if st.status != "running":
            ended = ended or (st.status, time.monotonic())
            waiting = any(r.connected and not r.told_done for r in st.roster)
            if not waiting or time.monotonic() - ended[1] > WATCH_TOLD_DONE_S:
                return _end_code(st.status)
        time.sleep(max(0.2, args.watch))
        if not args.json and not sys.stdout.isatty():
            print("---", flush=True)
