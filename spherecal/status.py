"""``spherecal status``: a one-screen live view of a running federation.

Calls the coordinator's read-only ``GetFederationStatus`` RPC
(``spherecal.coordinator.server.status``)
with the operator's certificate — the coordinator allows only identities on its
``[admin] allow`` list, or loopback callers in plaintext mode — and prints the roster
with liveness, the current round and secure-aggregation stage, the completed rounds,
the jobs and the ε spent per subject. ``--watch`` refreshes until the federation ends.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from spherecal.cli.exit_codes import ExitCode

__all__ = ["fetch_status", "render_status", "show_status"]


def _target(args: argparse.Namespace) -> tuple[str, bool, Path | None]:
    """(address, insecure, CA) from the flags and/or the coordinator's config."""
    address, insecure, ca = args.address, bool(args.insecure), args.ca
    if args.config is not None:
        from spherecal.config import load_coordinator_config

        settings, _ = load_coordinator_config(args.config)
        if address is None:
            host, _, port = settings.server.listen.rpartition(":")
            port_file = settings.server.port_file
            if port == "0" and port_file is not None and port_file.is_file():
                port = port_file.read_text().strip()
            if host in ("0.0.0.0", "[::]", ""):
                host = "127.0.0.1"
            address = f"{host}:{port}"
        insecure = insecure or settings.server.insecure
        ca = ca or settings.tls.client_ca
    if address is None:
        raise ValueError("give --config (the coordinator's TOML) or --address HOST:PORT")
    return address, insecure, ca


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
        code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
        details = " ".join((exc.details() if hasattr(exc, "details") else "").split())
        raise ValueError(f"coordinator at {address}: {code}: {details[:300]}") from None
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


def render_status(st: Any) -> str:
    """The one-screen text view of a ``FederationStatus``."""
    lines = [
        f"federation {st.federation_id or '?'} ({st.name}) — {st.status} — {st.phase}",
        f"round {st.current_round or '-'} of {st.rounds} (completed {st.completed_rounds})"
        + (f" · task {st.task}" if st.task else "")
        + (f" · secure aggregation: {st.stage} (job {st.job_id[:12]})" if st.stage else ""),
    ]
    connected = sum(1 for r in st.roster if r.connected)
    lines.append(f"participants: {connected}/{len(st.roster)} connected")
    for r in st.roster:
        state = "connected" if r.connected else ("joined" if r.joined else "absent")
        lines.append(
            f"  {r.participant_id:<16} {state:<10} seen {_ago(r.seconds_since_seen):<9} "
            f"joins {r.joins}"
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


def show_status(args: argparse.Namespace) -> int:
    """``spherecal status`` (its parser: :mod:`spherecal.cli.status`)."""
    from google.protobuf.json_format import MessageToDict

    address, insecure, ca = _target(args)

    def once() -> Any:
        return fetch_status(
            address,
            insecure=insecure,
            ca=ca,
            cert=args.cert,
            key=args.key,
            server_name=args.server_name,
            timeout=args.timeout,
        )

    seen = False
    while True:
        try:
            st = once()
        except ValueError as exc:
            if not seen:
                raise
            raise ValueError(
                f"the coordinator no longer answers (the federation ended or it stopped; "
                f"last status above): {exc}"
            ) from None
        seen = True
        if args.json:
            print(json.dumps(MessageToDict(st, preserving_proto_field_name=True), indent=2))
        else:
            if args.watch is not None and sys.stdout.isatty():
                print("\x1b[H\x1b[2J", end="")
            print(render_status(st), flush=True)
        if args.watch is None or st.status != "running":
            return ExitCode.OK
        time.sleep(max(0.2, args.watch))
        if not args.json and not sys.stdout.isatty():
            print("---", flush=True)
