"""Log lines an operator can ship (issue #26): ISO-8601 UTC timestamps and a level on
every line, ``text`` or ``json``, gRPC core's own chatter off by default, and a
closing line with the exit status."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from spherecal.certs import init_ca
from spherecal.logs import (
    LineFormatter,
    check_log_format,
    format_line,
    level_of,
    line_writer,
    timestamp,
)

REPO = Path(__file__).resolve().parents[3]
TEXT = re.compile(
    r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) (DEBUG|INFO|WARNING|ERROR|CRITICAL) ([^\s:]+)"
    r"( [^\s:]+)?: (.*)$"
)


def _utc(ts: str) -> dt.datetime:
    parsed = dt.datetime.fromisoformat(ts)
    assert parsed.utcoffset() == dt.timedelta(0)
    return parsed


def test_timestamp_is_iso_8601_utc_with_milliseconds() -> None:
    assert timestamp(0.0) == "1970-01-01T00:00:00.000Z"
    assert timestamp(1764061442.1239) == "2025-11-25T09:04:02.123Z"
    now = _utc(timestamp())
    assert abs((dt.datetime.now(dt.UTC) - now).total_seconds()) < 3600


def test_levels_come_from_the_message_prefix() -> None:
    assert level_of("listening on 127.0.0.1:5") == "INFO"
    assert level_of("WARNING: join window expired") == "WARNING"
    assert level_of("DEGRADED: ccvr missing") == "WARNING"
    assert level_of("FAILED: too few participants") == "ERROR"
    assert level_of("a WARNING: inside") == "INFO"


def test_text_and_json_lines() -> None:
    line = format_line("hospital-b", "WARNING: slow", seconds=0.0)
    assert line == "1970-01-01T00:00:00.000Z WARNING hospital-b: WARNING: slow"
    assert TEXT.match(line)
    two = format_line("c", "first\nsecond", seconds=0.0)
    assert two == "1970-01-01T00:00:00.000Z INFO c: first\n    second"
    record = json.loads(format_line("c", 'say "hi"\nthere', fmt="json", seconds=0.0))
    assert record == {
        "ts": "1970-01-01T00:00:00.000Z",
        "level": "INFO",
        "component": "c",
        "msg": 'say "hi"\nthere',
    }
    with pytest.raises(ValueError, match="text, json"):
        check_log_format("xml")
    with pytest.raises(ValueError):
        line_writer("c", "yaml")


def test_logging_records_in_the_same_format(capsys: pytest.CaptureFixture[str]) -> None:
    logger = logging.getLogger("spherecal.test_logs")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LineFormatter("coordinator", "json"))
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logger.exception("unexpected error in %s", "Join")
    finally:
        logger.removeHandler(handler)
    (line,) = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert record["level"] == "ERROR" and record["logger"] == "spherecal.test_logs"
    assert record["msg"].startswith("unexpected error in Join\nTraceback")
    _utc(record["ts"])


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.integration
@pytest.mark.long
@pytest.mark.parametrize("fmt", ["json", "text"])
def test_every_participant_line_has_time_and_level_then_a_closing_line(
    tmp_path: Path, fmt: str
) -> None:
    """A real ``spherecal participant`` that cannot reach its coordinator: every stderr
    line parses, and the last says how it ended (exit status 3)."""
    config = tmp_path / "p0.toml"
    config.write_text(
        "[participant]\n"
        'id = "p0"\n'
        f'coordinator = "127.0.0.1:{_closed_port()}"\n'
        "insecure = true\n"
        "reconnect_max_s = 0.2\n"
        "give_up_s = 1.0\n"
        "rpc_timeout_s = 2.0\n" + ("" if fmt == "text" else 'log_format = "json"\n')
    )
    args = ["--log-format", "text"] if fmt == "text" else []
    done = subprocess.run(
        [sys.executable, "-m", "spherecal.cli", "participant", "--config", str(config), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=180,
    )
    assert done.returncode == 3, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) >= 3
    for line in lines:
        if fmt == "json":
            record = json.loads(line)
            assert record["component"] == "p0" and record["level"] in ("INFO", "ERROR")
            _utc(record["ts"])
            message = record["msg"]
        else:
            match = TEXT.match(line)
            assert match, line
            _utc(match.group(1))
            message = match.group(5)
    assert message == "exiting: gave up reconnecting (exit status 3)"


_HANDSHAKE = """
import sys
from spherecal.logs import quiet_grpc_core
quiet_grpc_core()
import grpc
from concurrent import futures
d = sys.argv[1]
read = lambda n: open(f"{d}/{n}", "rb").read()
server = grpc.server(futures.ThreadPoolExecutor(1))
creds = grpc.ssl_server_credentials(
    [(read("server.key"), read("server.pem"))], read("ca.pem"), require_client_auth=True
)
port = server.add_secure_port("127.0.0.1:0", creds)
server.start()
channel = grpc.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(read("ca.pem")))
try:
    grpc.channel_ready_future(channel).result(timeout=2)
except grpc.FutureTimeoutError:
    print("refused", file=sys.stderr)
server.stop(0)
"""


@pytest.mark.integration
def test_grpc_core_handshake_chatter_is_off_by_default(tmp_path: Path) -> None:
    """A client without a certificate at a mutual-TLS server: gRPC core logs each
    failed handshake at INFO (``ssl_transport_security.cc``) unless quietened."""
    init_ca(tmp_path)
    base = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    base["PYTHONPATH"] = str(REPO)

    def run(env: dict[str, str]) -> str:
        done = subprocess.run(
            [sys.executable, "-c", _HANDSHAKE, str(tmp_path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert "refused" in done.stderr, done.stderr
        return done.stderr

    assert "ssl_transport_security" not in run(base)
    # the operator can ask for it back; and this shows the check can fail
    assert "ssl_transport_security" in run({**base, "GRPC_VERBOSITY": "INFO"})


def test_grpc_core_level_is_errors_but_info_for_the_coordinator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The coordinator asks gRPC core for INFO (its refused handshakes are INFO lines;
    its capture keeps only those); every other command ERROR. A level the operator set
    is kept; one the CLI set for an earlier command in the process is not the
    operator's."""
    from spherecal.logs import GRPC_VERBOSITY_SET_BY_US, grpc_info_is_ours, quiet_grpc_core

    monkeypatch.delenv("GRPC_VERBOSITY", raising=False)
    monkeypatch.delenv(GRPC_VERBOSITY_SET_BY_US, raising=False)
    quiet_grpc_core("coordinator")
    assert os.environ["GRPC_VERBOSITY"] == "INFO" and grpc_info_is_ours()
    quiet_grpc_core("participant")  # the same process, another command
    assert os.environ["GRPC_VERBOSITY"] == "ERROR" and not grpc_info_is_ours()
    quiet_grpc_core("coordinator")
    assert os.environ["GRPC_VERBOSITY"] == "INFO"
    monkeypatch.setenv("GRPC_VERBOSITY", "INFO")  # the operator's, from now on
    monkeypatch.delenv(GRPC_VERBOSITY_SET_BY_US)
    for command in ("coordinator", "participant", None):
        quiet_grpc_core(command)
        assert os.environ["GRPC_VERBOSITY"] == "INFO" and not grpc_info_is_ours()
