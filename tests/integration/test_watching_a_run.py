"""Watching a run (issue #23), on one real federation of three processes over gRPC:

- ``spherecal status --watch`` (a real process, ``--address`` so it has no summary to
  fall back on) follows the run to its end, shows ``completed``, the accuracies and
  each site told done, and exits 0 — the coordinator lingered for it;
- the coordinator's log has ONE INFO line per training round, with its ETA, and the
  secure-aggregation stage lines at DEBUG (not shown);
- ``results.json`` carries the per-round ``history``;
- ``spherecal report`` draws it, and headless Chromium renders the page.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spherecal.cli.app import main as cli_main
from spherecal.simulate import Simulation, SimulationSettings
from spherecal.spherefed.reference import ReferenceConfig
from tests import chromium

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]
ROUNDS = 3


class Run:
    def __init__(self, out: Path, results: dict[str, Any], watch: subprocess.CompletedProcess[str]):
        self.out, self.results, self.watch = out, results, watch


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    out = tmp_path_factory.mktemp("watch")
    settings = SimulationSettings(
        reference=ReferenceConfig(participants=3, model="mlp", rounds=ROUNDS),
        out=out,
        calibration=("ffc", "ccvr"),
        federated_every=1,
        timeout_s=240,
    )
    t0 = time.monotonic()
    with Simulation(settings) as sim:
        port = sim.start_coordinator()
        watch = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "spherecal.cli",
                "status",
                "--address",
                f"127.0.0.1:{port}",
                "--insecure",
                "--watch",
                "0.5",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        try:
            # the watch's first screen before the sites start: on a loaded box its
            # interpreter could otherwise start after a short federation had ended
            first = watch.stdout.readline() if watch.stdout is not None else ""
            assert first.startswith("federation "), (first, watch.poll())
            sim.start_participants()
            assert sim.wait_coordinator(240) == 0
            stdout, stderr = watch.communicate(timeout=120)
            stdout = first + stdout
        finally:
            if watch.poll() is None:
                watch.kill()
        results = dict[str, Any](
            sim.results(sim.wait_participants(timeout=60), time.monotonic() - t0)
        )
    yield Run(
        out, results, subprocess.CompletedProcess(watch.args, watch.returncode, stdout, stderr)
    )


def test_watch_follows_the_run_to_completed_with_accuracies(run: Run) -> None:
    assert run.results["status"] == "completed", run.results["status_reasons"]
    watch = run.watch
    assert watch.returncode == 0, watch.stderr[-2000:]
    screens = watch.stdout.split("\n---\n")
    assert len(screens) >= 2, "the watch never refreshed"
    assert any(" — running — " in s for s in screens[:-1])
    last = screens[-1]
    accuracy = run.results["accuracy"]
    expected = ", ".join(f"{m} {accuracy[m]:.4f}" for m in ("none", "ffc", "ccvr"))
    assert f"final: completed · accuracy: {expected}" in last
    assert f"rounds completed {ROUNDS} of {ROUNDS}" in last
    assert "round -" not in watch.stdout
    for pid in ("p0", "p1", "p2"):
        line = next(x for x in last.splitlines() if x.startswith(f"  {pid} "))
        assert "told done" in line, line  # the end was delivered to it


def test_coordinator_log_has_one_info_line_per_round_with_eta(run: Run) -> None:
    log = (run.out / "logs" / "coordinator.log").read_text()
    info = [line for line in log.splitlines() if " INFO coordinator: " in line]
    rounds = [line for line in info if re.search(r"INFO coordinator: round \d+/\d+: ", line)]
    assert [re.search(r"round (\d+)/", x).group(1) for x in rounds] == ["1", "2", "3"]  # type: ignore[union-attr]
    assert all(" s/round, " in line for line in rounds)
    assert "ETA" in rounds[0] and rounds[-1].endswith("training done")
    assert not [line for line in log.splitlines() if re.search(r"stage \w+ closed", line)]
    assert " DEBUG " not in log  # debug is off by default
    # the whole quiet run: start, listen, joins, rounds, statistics, accuracy, exit
    assert len(info) <= 8 + ROUNDS + 4, "\n".join(info)


def test_results_carry_the_per_round_history(run: Run) -> None:
    history = run.results["history"]
    per_round = run.results["per_round"]
    assert [h["round"] for h in history] == list(range(1, ROUNDS + 1))
    for h, m in zip(history, per_round, strict=True):
        assert h["train_loss"] == m["train_loss"] > 0
        assert h["federated_accuracy"] == m["federated_accuracy"] is not None
        assert h["contributors"] == len(m["contributors"]) == 3
        assert h["seconds"] == m["seconds"] > 0


def test_report_renders_in_headless_chromium(run: Run, tmp_path: Path) -> None:
    from PIL import Image

    assert cli_main(["report", str(run.out)]) == 0
    page = run.out / "report.html"
    dom = chromium.dom(page, tmp_path / "profile")
    assert 'id="status">completed<' in dom
    for figure in ("loss", "accuracy", "calibration", "contributions", "uploads"):
        assert re.search(rf'<figure id="{figure}"><svg[^>]*width="500"', dom), figure
    loss = re.search(r'data-series="training loss" points="([^"]+)"', dom)
    assert loss is not None and len(loss.group(1).split()) == ROUNDS
    federated = re.search(r'data-series="federated accuracy" points="([^"]+)"', dom)
    assert federated is not None and len(federated.group(1).split()) == ROUNDS
    after = re.findall(r'<rect class="bar" data-group="(ffc|ccvr)" data-key="after"', dom)
    assert sorted(after) == ["ccvr", "ffc"]
    sites = re.findall(r'<rect class="bar" data-group="(p\d)" data-key="rounds"', dom)
    assert sites == ["p0", "p1", "p2"]

    shot = chromium.screenshot(page, tmp_path / "profile", tmp_path / "shot.png", (1100, 1700))
    image = Image.open(shot).convert("RGB")
    assert image.size == (1100, 1700)
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # text, charts: not blank
    blue = dict((rgb, n) for n, rgb in colours).get((0x00, 0x72, 0xB2), 0)
    assert blue > 500, "the bars are not visible in the screenshot"


def test_audit_page_of_a_run_without_dp_renders_in_headless_chromium(
    run: Run, tmp_path: Path
) -> None:
    """Item 9 of issue #23 on a real run's database: no bare PASS without DP, N/A for
    what did not apply, the run named, the stages in protocol order."""
    from PIL import Image

    from spherecal.audit import run_audit

    page = tmp_path / "audit.html"
    report = run_audit(run.out, out=tmp_path / "audit.json", html=page)
    assert report["ok"]
    dom = chromium.dom(page, tmp_path / "profile")
    verdict = re.search(r'<section class="verdict partial" id="verdict">(.*?)</section>', dom)
    assert verdict is not None
    assert "<strong>PASS as configured</strong>" in verdict.group(1)
    assert "Calibration statistics carry no differential privacy" in verdict.group(1)
    na = re.findall(r'<tr class="check" data-check="(\w+)" data-na="1">', dom)
    assert set(na) == {"dp_releases", "budgets"}
    identity = dom[dom.index('<section id="run">') : dom.index('<section id="protection">')]
    federation_id = report["federation_id"]
    assert federation_id is not None and federation_id in identity
    assert re.search(r"<td>127\.0\.0\.1:\d+</td>", identity), identity
    assert "p0, p1, p2 (3 of 3 joined)" in identity and "not recorded" not in identity
    stages = re.findall(r'<tr class="stage" data-stage="(\w+)">', dom)
    assert stages == ["join", "advertise", "share", "masked", "consistency", "unmask"]
    assert "Privacy loss ε spent over time" not in dom

    shot = chromium.screenshot(page, tmp_path / "profile", tmp_path / "audit.png", (1100, 2300))
    image = Image.open(shot).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50
    amber = dict((rgb, n) for n, rgb in colours).get((0xEF, 0x6C, 0x00), 0)
    assert amber > 200, "the verdict's amber frame is not on the screenshot"
