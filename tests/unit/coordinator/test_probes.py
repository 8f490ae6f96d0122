"""The coordinator's HTTP listener (issue #26): ``/metrics`` (GET and HEAD) only at
``/metrics``, ``/healthz`` and ``/readyz`` plain-text probes, 404 elsewhere; metric
names by Prometheus' conventions, checked by ``promtool`` where it is installed."""

from __future__ import annotations

import http.client
import json
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography import x509
from prometheus_client.parser import text_string_to_metric_families

from spherecal.certs import init_ca, issue_participant, revoke_participant
from spherecal.coordinator.server.metrics import EXPORTED, PHASES, phase_of
from spherecal.coordinator.server.probes import ProbeServer, start_metrics
from spherecal.coordinator.server.revocation import RevocationList
from spherecal.coordinator.settings import MetricsSettings

from .service_harness import Harness, settings_for


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Harness, ProbeServer]]:
    settings = replace(
        settings_for(tmp_path, secure=True), metrics=MetricsSettings(listen="127.0.0.1:0")
    )
    h = Harness(settings)
    server = start_metrics(h.service)
    assert server is not None
    try:
        yield h, server
    finally:
        server.close()
        h.store.close()


def _request(port: int, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def test_paths_methods_and_probe_bodies(served: tuple[Harness, ProbeServer]) -> None:
    h, server = served
    code, headers, body = _request(server.port, "GET", "/metrics")
    assert code == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert b"spherecal_participants" in body
    code, headers, head_body = _request(server.port, "HEAD", "/metrics")
    assert code == 200 and head_body == b"" and int(headers["Content-Length"]) > 0
    assert _request(server.port, "GET", "/healthz")[::2] == (200, b"ok\n")
    assert _request(server.port, "HEAD", "/healthz")[::2] == (200, b"")
    assert _request(server.port, "GET", "/readyz")[::2] == (200, b"ready\n")
    for path in ("/", "/metricsx", "/metrics/", "/healthz/x", "/favicon.ico"):
        code, _, body = _request(server.port, "GET", path)
        assert code == 404 and b"spherecal_" not in body, path
    code, headers, _ = _request(server.port, "POST", "/metrics")
    assert code == 405 and headers["Allow"] == "GET, HEAD"
    # the federation ends: still alive, no longer ready
    h.federation.board.finish("completed", "done")
    assert _request(server.port, "GET", "/healthz")[0] == 200
    assert _request(server.port, "GET", "/readyz")[::2] == (
        503,
        b"not ready: federation completed\n",
    )


def test_the_server_header_is_exactly_spherecal(served: tuple[Harness, ProbeServer]) -> None:
    """The raw header line, as sent (a parser may strip what the wire carries): it was
    ``Server: spherecal `` with a trailing space, and names no Python version."""
    _, server = served
    for request in (b"GET /healthz HTTP/1.1\r\n", b"POST /metrics HTTP/1.1\r\n"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
            conn.sendall(request + b"Host: x\r\nConnection: close\r\n\r\n")
            answer = b""
            while b"\r\n\r\n" not in answer:
                data = conn.recv(4096)
                assert data, answer
                answer += data
        head = answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
        servers = [line for line in head if line.lower().startswith(b"server:")]
        assert servers == [b"Server: spherecal"], head


def _families(port: int) -> dict[str, str]:
    text = _request(port, "GET", "/metrics")[2].decode()
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def test_names_types_and_default_collectors(served: tuple[Harness, ProbeServer]) -> None:
    _, server = served
    families = _families(server.port)
    for name in EXPORTED:
        assert name in families, name
    assert families["spherecal_refusals"] == "counter"
    assert families["spherecal_payload_bytes"] == "counter"
    assert families["spherecal_rounds_configured"] == "gauge"
    assert families["spherecal_round_duration_seconds"] == "summary"
    for name, kind in families.items():
        if kind != "counter":
            assert not name.endswith("_total"), name
    assert {"process_cpu_seconds", "process_resident_memory_bytes", "python_info"} <= set(families)


def test_phase_is_a_bounded_state_set(served: tuple[Harness, ProbeServer]) -> None:
    _, server = served
    text = _request(server.port, "GET", "/metrics")[2].decode()
    phase = re.findall(r'^spherecal_phase\{phase="([a-z]+)"\} (\S+)$', text, re.M)
    assert [p for p, _ in phase] == list(PHASES)
    assert sum(float(v) for _, v in phase) == 1.0
    assert "round" not in {p for p, _ in phase}
    assert phase_of("round 41/120: training", "running") == "training"
    assert phase_of("round 41: aggregating", "running") == "aggregating"
    assert phase_of("round 3: failed", "running") == "training"
    assert phase_of("statistics: ffc done", "running") == "calibrating"
    assert phase_of("evaluated", "running") == "evaluating"
    assert phase_of("waiting for participants", "running") == "waiting"
    assert phase_of("anything", "completed") == "ended"
    assert phase_of("something new", "running") == "other"


def _crl_samples(port: int) -> list[float]:
    text = _request(port, "GET", "/metrics")[2].decode()
    (family,) = [
        f
        for f in text_string_to_metric_families(text)
        if f.name == "spherecal_crl_next_update_timestamp_seconds"
    ]
    assert family.type == "gauge"
    return [sample.value for sample in family.samples]


def test_the_revocation_lists_next_update_is_exported(
    served: tuple[Harness, ProbeServer], tmp_path: Path
) -> None:
    """An operator alerts before the ``[tls] crl`` list goes stale, as for a
    certificate's expiry; a list replaced on disk is the one a scrape shows."""
    h, server = served
    assert _crl_samples(server.port) == []  # no [tls] crl: the family, no sample
    ca = tmp_path / "ca"
    init_ca(ca)
    issue_participant(ca, "p0")
    h.service.revocation = RevocationList(
        ca / "crl.pem", (ca / "ca.pem").read_bytes(), check_every_s=0.0
    )

    def next_update() -> float:
        crl = x509.load_pem_x509_crl((ca / "crl.pem").read_bytes())
        assert crl.next_update_utc is not None
        return crl.next_update_utc.timestamp()

    assert _crl_samples(server.port) == [next_update()]
    before = next_update()
    revoke_participant(ca, "p0", days=3)
    assert _crl_samples(server.port) == [next_update()] and next_update() < before


def test_promtool_check_metrics_is_clean(served: tuple[Harness, ProbeServer]) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (`make test` installs Debian's prometheus as root)")
    _, server = served
    text = _request(server.port, "GET", "/metrics")[2]
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout + done.stderr == b"", done


def test_promtool_catches_the_old_names() -> None:
    """Mutation check: the pre-#26 exposition fails ``promtool check metrics``."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (`make test` installs Debian's prometheus as root)")
    old = (
        b"# HELP spherecal_rounds_total Configured training rounds\n"
        b"# TYPE spherecal_rounds_total gauge\nspherecal_rounds_total 5.0\n"
    )
    done = subprocess.run(
        [promtool, "check", "metrics"], input=old, capture_output=True, timeout=60
    )
    assert done.returncode != 0 and b"_total" in done.stdout + done.stderr


REPO = Path(__file__).resolve().parents[3]
PROMQL_WORDS = {
    "rate", "irate", "increase", "sum", "avg", "min", "max", "count", "by", "without",
    "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
    "offset", "label_values", "job", "time",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or ``label_values(...)``) reads."""
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    expr = re.sub(r"\b(by|without)\s*\([^)]*\)", "", expr)  # grouping labels
    expr = re.sub(r'"[^"]*"', "", expr)
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr))
    return {w for w in words if w not in PROMQL_WORDS}


def _exported_sample_names(port: int) -> set[str]:
    text = _request(port, "GET", "/metrics")[2].decode()
    names = set()
    for family in text_string_to_metric_families(text):
        suffixes = {"counter": ("_total",), "summary": ("_sum", "_count", "")}
        names |= {family.name + s for s in suffixes.get(family.type, ("",))}
    return names


def test_grafana_dashboard_queries_only_exported_metrics(
    served: tuple[Harness, ProbeServer],
) -> None:
    _, server = served
    exported = _exported_sample_names(server.port)
    dashboard = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries += [v["query"] for v in dashboard["templating"]["list"]]
    assert len(queries) >= 12
    used: set[str] = set()
    for query in queries:
        names = metric_names(query)
        assert names, query
        assert names <= exported, (query, names - exported)
        used |= names
    # every family the coordinator exports has a panel
    for family in EXPORTED:
        assert any(u in {family, family + "_total", family + "_sum"} for u in used), family
    # the check can fail: the pre-#26 name is not exported
    assert not metric_names("rate(spherecal_bytes_total[5m])") <= exported


def _doc_block(marker: str) -> str:
    text = (REPO / "docs" / "deployment.md").read_text()
    after = text.split(f"<!-- tested: {marker} -->", 1)[1]
    return after.split("```yaml\n", 1)[1].split("```", 1)[0]


def test_documented_kubernetes_probes_answer(served: tuple[Harness, ProbeServer]) -> None:
    import yaml

    _, server = served
    (container,) = yaml.safe_load(_doc_block("k8s-probes"))["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe, body in (("livenessProbe", b"ok\n"), ("readinessProbe", b"ready\n")):
        get = container[probe]["httpGet"]
        assert ports[get["port"]] == 9464  # the metrics listener in the docs
        assert _request(server.port, "GET", get["path"])[::2] == (200, body)


def test_documented_scrape_config_passes_promtool(tmp_path: Path) -> None:
    import yaml

    block = _doc_block("prometheus-scrape")
    (job,) = yaml.safe_load(block)["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (`make test` installs Debian's prometheus as root)")
    config = tmp_path / "prometheus.yml"
    config.write_text(block)
    done = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
