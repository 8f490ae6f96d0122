"""``host:port`` addresses, parsed once for both sides.

Both the coordinator (may it listen in plaintext?) and the participant (may it
connect in plaintext?) ask the same question — *is this address loopback?* — and
must answer it identically, without a DNS lookup (a name that resolves to 127.0.0.1
today may not tomorrow): only ``localhost`` and literal loopback IPs count.
"""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback", "is_loopback_address", "split_host_port"]


def split_host_port(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → (host, port); a clear ``ValueError`` otherwise."""
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        port_text = rest.lstrip(":")
    else:
        host, sep, port_text = address.rpartition(":")
        if not sep:
            raise ValueError(f"address {address!r} needs a port (host:port)")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"address {address!r} has an invalid port") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} out of range")
    return host, port


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback name or address (no DNS lookup)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback_address(address: str) -> bool:
    """Whether the host of ``host:port`` (or of a bare host) is loopback."""
    try:
        host, _ = split_host_port(address)
    except ValueError:
        host = address.strip("[]")
    return is_loopback(host)
