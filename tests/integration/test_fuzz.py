"""Hostile bytes against a real coordinator process (issue #10 item 4, #13 item 1).

One coordinator on loopback takes at least 2,000 hostile requests across every RPC:
random bytes through a raw channel (identity serializers), truncated encodings of
valid messages, typed messages with absurd field values (with and without a valid
session), replays of valid requests, and request streams that are truncated,
garbled midway or cancelled by the client. Then:

* the status-code histogram holds no INTERNAL and no UNKNOWN;
* the coordinator process is still up and its log holds no "Traceback";
* a second coordinator started on the same port exits 2 with one line naming it;
* a legitimate federation (plaintext, 3 participants, 1 round, digits) completes
  afterwards on the *same* coordinator.
"""

from __future__ import annotations

import math
import random
import sqlite3
import subprocess
import sys
import threading
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from spherecal.config import dump_toml
from spherecal.crypto import generate_identity
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.identity import save_identity_key
from spherecal.proto.services import grpc_services
from spherecal.simulate import Simulation, SimulationSettings
from spherecal.spherefed.reference import ReferenceConfig
from tests.joins import DIGITS, signed_join

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVICE = "spherecal.v1.Coordinator"
METHODS = {  # name -> (request streams, response streams)
    "Join": (False, False),
    "Heartbeat": (False, False),
    "Presence": (False, True),
    "NextInstruction": (False, False),
    "DownloadTensor": (False, True),
    "UploadTensor": (True, False),
    "SubmitSecAgg": (False, False),
    "UploadMasked": (True, False),
    "ReportEvaluation": (False, False),
    "ReportFailure": (False, False),
    "GetStatus": (False, False),
    "GetFederationStatus": (False, False),
}
REQUESTS = 2_400
ODD_TEXT = [
    "",
    " ",
    " p0",
    "p0 ",
    "P0",
    "p0\x00",
    "../../etc/passwd",
    "💥" * 40,
    "x" * 70_000,
    " 00ff",
    "00FF",
    "'; DROP TABLE jobs; --",
]
U32 = [0, 1, 10, 2**31, 2**32 - 1]
U64 = [0, 1, 2**40, 2**63, 2**64 - 1]
ODD_FLOATS = [0.0, -0.0, math.nan, math.inf, -math.inf, 1e308, -1e-308]


class Fuzzer:
    """Sends hostile requests; records the status code of each."""

    def __init__(self, port: int, key: Ed25519PrivateKey, seed: int = 0) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = grpc_services().CoordinatorStub(self.channel)
        self.key = key
        self.rng = random.Random(seed)
        self.codes: Counter[str] = Counter()
        self.per_method: dict[str, Counter[str]] = {m: Counter() for m in METHODS}
        self.session = ""
        self._lock = threading.Lock()

    def close(self) -> None:
        self.channel.close()

    def record(self, method: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
            code = "OK"
        except grpc.RpcError as exc:
            code = exc.code().name
        except grpc.FutureCancelledError:
            code = "CANCELLED"
        with self._lock:
            self.codes[code] += 1
            self.per_method[method][code] += 1

    @property
    def total(self) -> int:
        return sum(self.codes.values())

    # ------------------------------------------------------------ helpers
    def join_request(
        self,
        *,
        pid: str = "p0",
        ts: int | None = None,
        public: bytes | None = None,
        nonce: bytes | None = None,
        data: pb.DataShape = DIGITS,
    ) -> pb.JoinRequest:
        """A join signed with p0's key over whatever the fields say (seeded nonce)."""
        nonce = self.rng.randbytes(16) if nonce is None else nonce
        return signed_join(pid, self.key, ts=ts, public=public, nonce=nonce, data=data)

    def caller(self) -> pb.Caller:
        if self.rng.random() < 0.5:
            return pb.Caller(participant_id="p0", session=self.session)
        return pb.Caller(
            participant_id=self.rng.choice(ODD_TEXT[:8] + ["p1", "p0"]),
            session=self.rng.choice([self.session, "", " " + self.session, "x" * 64]),
        )

    def text(self) -> str:
        return self.rng.choice(ODD_TEXT + [self.rng.randbytes(8).hex()])

    def raw(self, method: str, payload: bytes | list[bytes]) -> None:
        streams_in, streams_out = METHODS[method]
        path = f"/{SERVICE}/{method}"
        if streams_in:
            chunks = payload if isinstance(payload, list) else [payload]
            self.record(method, lambda: self.channel.stream_unary(path)(iter(chunks), timeout=10))
        elif streams_out:
            assert isinstance(payload, bytes)
            self.record(method, lambda: list(self.channel.unary_stream(path)(payload, timeout=0.5)))
        else:
            assert isinstance(payload, bytes)
            self.record(method, lambda: self.channel.unary_unary(path)(payload, timeout=10))

    # ------------------------------------------------------------ categories
    def random_bytes(self) -> None:
        method = self.rng.choice(list(METHODS))
        size = self.rng.choice([0, 1, 2, 7, 64, 300, 4096])
        payload = self.rng.randbytes(size)
        if METHODS[method][0] and self.rng.random() < 0.5:
            self.raw(method, [self.rng.randbytes(size) for _ in range(self.rng.randint(1, 4))])
        else:
            self.raw(method, payload)

    def truncated(self) -> None:
        method, message = self.valid_message()
        data = message.SerializeToString()
        cut = data[: self.rng.randrange(max(1, len(data)))] if data else b"\x0a"
        self.raw(method, cut)

    def valid_message(self) -> tuple[str, Any]:
        """A well-formed message of some RPC with odd contents."""
        r, caller = self.rng, self.caller()
        choice = r.randrange(10)
        if choice == 0:
            shape = pb.DataShape(
                num_classes=r.choice(U32),
                in_channels=r.choice(U32[:3]),
                image_height=r.choice([8, *U32]),
                image_width=8,
            )
            return "Join", self.join_request(
                pid=r.choice(ODD_TEXT[:8] + ["p0", "p5"]),
                ts=r.choice([int(time.time() * 1000), *U64]),
                public=r.choice([None, r.randbytes(r.choice([0, 31, 32, 33]))]),
                nonce=r.randbytes(r.choice([0, 15, 16])),
                data=shape,
            )
        if choice == 1:
            return "Heartbeat", pb.HeartbeatRequest(caller=caller)
        if choice == 2:
            return "NextInstruction", pb.InstructionRequest(
                caller=caller, wait_ms=r.choice([0, 1, 50])
            )
        if choice == 3:
            return "DownloadTensor", pb.DownloadRequest(caller=caller, name=self.text())
        if choice == 4:
            return "SubmitSecAgg", pb.SecAggSubmission(
                caller=caller,
                job_id=r.randbytes(r.choice([0, 1, 16, 300])),
                stage=r.choice([0, 1, 2, 3, 4, 99, -5, 2**31 - 1]),  # type: ignore[arg-type]
                message=r.randbytes(r.choice([0, 10, 2000])),
            )
        if choice == 5:
            counts = [
                pb.HeadCount(head=self.text()[:20], correct=r.choice(U64))
                for _ in range(r.randint(0, 3))
            ]
            return "ReportEvaluation", pb.EvaluationReport(
                caller=caller, task_id=self.text(), total=r.choice(U64), counts=counts
            )
        if choice == 6:
            return "ReportFailure", pb.FailureReport(
                caller=caller,
                task_id=self.text(),
                kind=r.choice([0, 1, 4, 9, 99, -3, 2**31 - 1]),  # type: ignore[arg-type]  # unknown values too
                rule=r.choice([0, 3, 8, 99]),  # type: ignore[arg-type]
                reason=self.text(),
            )
        if choice == 7:
            return "GetStatus", pb.StatusRequest(caller=caller)
        if choice == 8:
            return "Presence", pb.HeartbeatRequest(caller=caller)
        return "UploadTensor", pb.TensorUpload(header=self.upload_header(caller))

    def upload_header(self, caller: pb.Caller) -> pb.UploadHeader:
        r = self.rng
        tensor = pb.TensorHeader(
            dtype=r.choice([0, 1, 2, 3, 4, 99, -1]),  # type: ignore[arg-type]
            shape=[r.choice([3, *U64]) for _ in range(r.randint(0, 3))],
            sha256=r.randbytes(r.choice([0, 32, 33])),
        )
        return pb.UploadHeader(
            caller=caller,
            task_id=self.text(),
            tensor=tensor,
            update=pb.UpdateMeta(
                num_samples=r.choice(U64), mean_loss=r.choice(ODD_FLOATS), num_steps=r.choice(U64)
            ),
        )

    def absurd(self) -> None:
        method, message = self.valid_message()
        rpc = getattr(self.stub, method)
        streams_in, streams_out = METHODS[method]
        if streams_in:
            self.record(method, lambda: rpc(iter([message]), timeout=10))
        elif streams_out:
            self.record(method, lambda: list(rpc(message, timeout=0.5)))
        else:
            self.record(method, lambda: rpc(message, timeout=10))

    def replay(self) -> None:
        """A valid join sent three times: the first opens a new session (which later
        requests then use), the replays are refused."""
        request = self.join_request()

        def join() -> None:
            self.session = self.stub.Join(request, timeout=10).session

        for _ in range(3):
            self.record("Join", join)

    def streams(self) -> None:
        """Uploads that go wrong midway: garbage after a header, a second header,
        chunks of absurd size, and uploads the client cancels."""
        r, caller = self.rng, pb.Caller(participant_id="p0", session=self.session)
        kind = r.randrange(4)
        if kind == 0:  # a valid header, then bytes that do not parse
            head = pb.TensorUpload(header=self.upload_header(caller)).SerializeToString()
            path = f"/{SERVICE}/UploadTensor"
            chunks = [head, r.randbytes(50)]
            self.record(
                "UploadTensor", lambda: self.channel.stream_unary(path)(iter(chunks), timeout=10)
            )
        elif kind == 1:  # masked upload: random chunks under a random job id
            job = r.randbytes(16)
            parts = [
                pb.MaskedUpload(
                    caller=caller, job_id=job, chunk=r.randbytes(r.choice([0, 9, 70_000]))
                )
                for _ in range(r.randint(0, 3))
            ]
            self.record("UploadMasked", lambda: self.stub.UploadMasked(iter(parts), timeout=10))
        else:  # cancelled by the client while the server reads or streams
            method = r.choice(["UploadTensor", "UploadMasked", "Presence"])
            self.record(method, lambda: self.cancelled(method, caller))

    def cancelled(self, method: str, caller: pb.Caller) -> None:
        gate = threading.Event()

        def slow() -> Iterator[Any]:
            if method == "UploadTensor":
                yield pb.TensorUpload(header=self.upload_header(caller))
            else:
                yield pb.MaskedUpload(caller=caller, job_id=b"\x01" * 16, chunk=b"\x00" * 10)
            gate.wait(2)

        if method == "Presence":
            call = self.stub.Presence(pb.HeartbeatRequest(caller=caller), timeout=5)
            time.sleep(self.rng.random() * 0.05)
            call.cancel()
            list(call)
            return
        future = getattr(self.stub, method).future(slow(), timeout=5)
        time.sleep(self.rng.random() * 0.05)
        future.cancel()
        gate.set()
        future.result()


def _joins(db: Path, pid: str) -> int:
    try:
        with sqlite3.connect(db, timeout=1) as conn:
            row = conn.execute("SELECT joins FROM participants WHERE participant_id=?", (pid,))
            found = row.fetchone()
        return int(found[0]) if found else 0
    except sqlite3.Error:
        return 0


def _second_coordinator(out: Path, port: int) -> subprocess.CompletedProcess[str]:
    """The same federation config with its own state dir, on the busy port."""
    document = tomllib.loads((out / "coordinator.toml").read_text())
    document["federation"]["state_dir"] = str(out / "second" / "state")
    document["federation"]["out_dir"] = str(out / "second" / "out")
    document["server"]["listen"] = f"127.0.0.1:{port}"
    document["server"].pop("port_file", None)
    config = out / "second.toml"
    config.write_text(dump_toml(document))
    return subprocess.run(
        [sys.executable, "-m", "spherecal.cli", "coordinator", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=out,
    )


def test_hostile_requests_then_a_legitimate_federation(tmp_path: Path) -> None:
    settings = SimulationSettings(
        reference=ReferenceConfig(participants=3, model="mlp", rounds=1),
        out=tmp_path,
        calibration=("ffc",),
        secure_updates=False,
        secure_statistics=False,
        timeout_s=240,
    )
    key = generate_identity()
    key_path = tmp_path / "state" / "p0" / "identity.key"
    key_path.parent.mkdir(parents=True)
    save_identity_key(key, key_path)  # the fuzzer speaks as p0, with p0's own key
    t0 = time.monotonic()
    with Simulation(settings) as sim:
        port = sim.start_coordinator()
        second: dict[str, subprocess.CompletedProcess[str]] = {}
        busy = threading.Thread(
            target=lambda: second.update(done=_second_coordinator(tmp_path, port))
        )
        busy.start()
        fuzzer = Fuzzer(port, key)
        try:
            fuzzer.session = fuzzer.stub.Join(fuzzer.join_request(), timeout=10).session
            actions = [fuzzer.random_bytes] * 9 + [fuzzer.truncated] * 3 + [fuzzer.absurd] * 6
            actions += [fuzzer.replay, fuzzer.streams, fuzzer.streams]
            picks = [fuzzer.rng.choice(actions) for _ in range(REQUESTS)]
            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(lambda act: act(), picks))
        finally:
            fuzzer.close()
        busy.join(timeout=330)
        fuzz_s = time.monotonic() - t0
        assert sim.coordinator is not None and sim.coordinator.popen.poll() is None, "died"

        # --- the status codes: every hostile request got a documented answer
        histogram = dict(fuzzer.codes)
        print(f"fuzz: {fuzzer.total} requests in {fuzz_s:.1f}s: {histogram}")
        assert fuzzer.total >= 2_000
        assert "INTERNAL" not in histogram and "UNKNOWN" not in histogram, fuzzer.per_method
        assert histogram.get("INVALID_ARGUMENT", 0) > 100
        assert all(sum(c.values()) > 0 for c in fuzzer.per_method.values()), fuzzer.per_method

        # --- a second coordinator on the busy port: exit 2, one line naming the port
        done = second["done"]
        assert done.returncode == 2, done.stderr[-2000:]
        last = done.stderr.strip().splitlines()[-1]
        assert f"port {port} is already in use" in last and "Traceback" not in done.stderr
        assert "add_port" not in done.stderr, done.stderr  # gRPC never tried to bind
        assert not (tmp_path / "second" / "state" / "state.db").exists()  # refused first

        # --- the legitimate federation, on the same coordinator. p0 first, so the
        # federation cannot start while only the fuzzer's p0 session was ever seen.
        db = tmp_path / "coordinator" / "state" / "state.db"
        before = _joins(db, "p0")
        sim.start_participants(only=["p0"])
        deadline = time.monotonic() + 120
        while _joins(db, "p0") <= before:
            assert time.monotonic() < deadline, "the real p0 never joined"
            time.sleep(0.1)
        sim.start_participants(only=["p1", "p2"])
        assert sim.wait_coordinator(settings.timeout_s) == 0
        results = dict[str, Any](sim.results(sim.wait_participants(), time.monotonic() - t0))
    assert results["status"] == "completed", results["errors"]
    assert results["accuracy"]["ffc"] is not None
    assert set(results["exit_codes"].values()) == {0}
    log = (tmp_path / "logs" / "coordinator.log").read_text(errors="replace")
    assert "Traceback" not in log
    assert len(log) < 200_000, "repeated refusals are rate-limited"
