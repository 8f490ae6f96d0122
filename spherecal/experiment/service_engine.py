"""``--engine service``: one cell trained as a real federation.

A coordinator process and the participants talk gRPC on loopback with secure
aggregation of updates *and* statistics on (:mod:`spherecal.simulate`), with
the cell's reference config; the method's server algorithm comes from
:meth:`spherecal.spherefed.algorithms.methods.MethodSpec.service_options`. The record has the
in-process engine's shape, so selection and the report are shared:

- participants: virtual participants in this process by default (``hosting=
  "threads"``, :mod:`spherecal.engines.threads`: each with its own identity key, gRPC
  connection, ledgers and data slice) — one interpreter and torch import instead of
  one per participant — or one OS process each (``hosting="processes"``); the
  numbers are the same either way (tested), so the hosting is recorded in the cell
  but is not part of its identity;
- test accuracy (none / +FFC / +CCVR) and accuracy per round: the coordinator's
  central evaluation on the reference's test split;
- validation accuracy: the harness evaluates the saved models
  (``model_{none,ffc,ccvr}.pt``, loaded ``weights_only``) on the reference's
  validation split — the coordinator never sees it, and selection needs it. Like
  :func:`spherecal.simulate.clear_statistics`, this is a privilege of the harness,
  which can read every participant's data; a real deployment would evaluate
  federatedly.

Its sites weight their updates by their exact example counts (``[policy]
example_count_noise_sd = 0``, logged by each): a cell measures the algorithm, and
reproduces the in-process engine's numbers only with the same weights. Like reading
the validation split, this is a privilege of a harness that holds every
participant's data; a deployment's sites draw their weights with noise
(:mod:`spherecal.participant.example_weight`).

The harness never restarts a participant, so the coordinator is told not to wait
for one to come back before retrying a failed round (``rejoin_grace_s = 0``; the
back-off stays): a participant whose local training diverged has crashed for good,
and the default 60 s grace made every diverging cell wait two minutes for it
before failing the same way. A cell whose rounds all succeed at the first attempt
never waits, so its numbers do not depend on this.

A federation that does not complete is recorded as failed (``diverged`` with an
``error``): it is left out of the means and marked in the table, never hidden.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from spherecal.experiment.grid import HOSTINGS, RunSpec
from spherecal.proto.codec import model_spec_from_json
from spherecal.results_schema import ServiceCell
from spherecal.spherefed.fl import evaluate
from spherecal.spherefed.network import ModelSpec, build_model
from spherecal.spherefed.reference import ReferenceConfig, prepare_data

__all__ = ["service_config", "train_cell_as_service"]

CALIBRATIONS = ("none", "ffc", "ccvr")


def service_config(spec: RunSpec, base: ReferenceConfig) -> ReferenceConfig:
    """The cell's reference config with the method's server algorithm for the service."""
    options = spec.method.service_options()
    if options is None:
        raise ValueError(f"{spec.method.key} cannot run through the service")
    cfg = spec.config(base)
    return replace(
        cfg,
        algorithm=options["algorithm"],
        fedopt_lr=float(options.get("fedopt_lr", cfg.fedopt_lr)),
    )


def _validation_accuracy(cfg: ReferenceConfig, out: Path) -> dict[str, float]:
    data = prepare_data(cfg)
    x, y = torch.from_numpy(data.validation.x), torch.from_numpy(data.validation.y)
    meta = json.loads((out / "model_spec.json").read_text())
    model = build_model(replace(ModelSpec(**model_spec_from_json(meta)), feature_dim=None))
    model.eval()
    accuracy: dict[str, float] = {}
    for name in CALIBRATIONS:
        path = out / f"model_{name}.pt"
        if not path.exists():
            accuracy[name] = math.nan
            continue
        model.load_state_dict(torch.load(path, weights_only=True))
        accuracy[name] = evaluate(model, x, y)
    return accuracy


def _log_tail(logs: Path, lines: int = 5) -> str:
    path = logs / "coordinator.log"
    if not path.exists():
        return ""
    tail = path.read_text(errors="replace").strip().splitlines()[-lines:]
    return " | ".join(tail)


def train_cell_as_service(
    spec: RunSpec, base: ReferenceConfig, *, work_dir: Path | None = None, threads: int = 1
) -> ServiceCell:
    """Train one cell through the service; the record :func:`.cells.execute_run`
    returns (never raises for a federation that fails: it is recorded)."""
    from spherecal.engines.threads import ThreadSimulation
    from spherecal.simulate import Simulation, SimulationError, SimulationSettings, run_simulation

    if spec.hosting not in HOSTINGS:
        raise ValueError(f"unknown hosting {spec.hosting!r}; expected one of {HOSTINGS}")
    factory = ThreadSimulation if spec.hosting == "threads" else Simulation

    cfg = service_config(spec, base)
    parent = work_dir if work_dir is not None else Path(tempfile.mkdtemp(prefix="spherecal-"))
    out = parent / "federation"
    record: ServiceCell = {"engine": "service", "service": {"hosting": spec.hosting}}
    try:
        settings = SimulationSettings(
            reference=cfg,
            out=out,
            calibration=("ffc", "ccvr"),
            secure_updates=True,
            secure_statistics=True,
            threads=threads,
            rejoin_grace_s=0.0,
            example_count_noise_sd=0,
        )
        try:
            results = run_simulation(settings, factory=factory)
        except (SimulationError, ValueError) as exc:
            tail = _log_tail(out / "logs")
            return {**record, "diverged": True, "error": f"{exc}{' — ' + tail if tail else ''}"}
        if results.get("status") != "completed":
            why = results.get("status_reasons") or results.get("errors", [])
            errors = "; ".join(str(e) for e in why)[:400]
            return {
                **record,
                "diverged": True,
                "error": f"federation {results.get('status')}: {errors}",
            }
        central = results.get("central_accuracy") or {}
        found = {name: central.get(name) for name in CALIBRATIONS}
        test = {name: math.nan if v is None else float(v) for name, v in found.items()}
        per_round = results.get("per_round", [])
        record.update(
            {
                "diverged": False,
                "accuracy": test,
                "validation_accuracy": _validation_accuracy(cfg, out / "coordinator" / "out"),
                "per_round": [r.get("test_accuracy") for r in per_round],
                "train_loss": [r.get("train_loss") for r in per_round],
                "service": {
                    "hosting": spec.hosting,
                    "wall_s": results.get("timings", {}).get("wall_s"),
                    "bytes": results.get("bytes", {}),
                    "dropped": results.get("dropped", []),
                },
            }
        )
        return record
    finally:
        if work_dir is None:
            shutil.rmtree(parent, ignore_errors=True)
