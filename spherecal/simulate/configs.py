"""The coordinator and participant configs of a simulated federation.

One TOML file per process (``DIR/coordinator.toml``, ``DIR/participants/pK.toml``),
written so that the run can be repeated by hand. Every participant reads its slice
of the dataset exactly as the reference runner partitions it (``participant.data``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spherecal.config import DATASET_SHAPES, dump_toml

from .settings import SimulationSettings

__all__ = ["DataShape", "coordinator_document", "participant_document", "write_toml"]

DataShape = tuple[int, int, tuple[int, int]]
"""(classes, channels, (height, width)) of the dataset."""


def write_toml(path: Path, document: dict[str, dict[str, Any]]) -> Path:
    """Write ``document`` as TOML to ``path``; return ``path``."""
    path.write_text(dump_toml(document))
    return path


def coordinator_document(
    settings: SimulationSettings, shape: DataShape, out: Path, listen: str
) -> dict[str, dict[str, Any]]:
    """The coordinator's TOML document for this simulation (listening on ``listen``)."""
    s, ref = settings, settings.reference
    classes, channels, size = shape
    certs = out / "certs"
    document: dict[str, dict[str, Any]] = {
        "federation": {
            "name": "simulate",
            "participants": list(s.participant_ids),
            "seed": ref.seed,
            "state_dir": "coordinator/state",
            "out_dir": "coordinator/out",
            "threads": s.threads,
        },
        "model": {
            "dataset": ref.dataset if ref.dataset in DATASET_SHAPES else None,
            "extractor": ref.model,
            "head": ref.head,
            "norm": ref.norm,
            "classifier": ref.classifier,
            "num_classes": classes,
            "in_channels": channels,
            "image_size": list(size),
            "feature_dim": s.feature_dim,
        },
        "training": {
            "rounds": ref.rounds,
            "local_epochs": ref.local_epochs,
            "batch_size": ref.batch_size,
            "lr": ref.lr,
            "momentum": ref.momentum,
            "weight_decay": ref.weight_decay,
            "loss": ref.loss,
            "algorithm": ref.algorithm,
            "prox_mu": ref.prox_mu,
            "fedopt_lr": ref.fedopt_lr,
            "sample_fraction": ref.sample_fraction,
            "min_participants": 2 if s.secure_updates else 1,
        },
        "calibration": {
            "methods": list(s.calibration),
            "ffc_ridge": ref.ffc_ridge,
            "ffc_from_ccvr": s.ffc_from_ccvr,
            "save_statistics": s.save_statistics,
            "ccvr_virtual_per_class": ref.ccvr.virtual_per_class,
            "ccvr_tukey": ref.ccvr.tukey,
            "ccvr_lr": ref.ccvr.lr,
            "ccvr_epochs": ref.ccvr.epochs,
            "ccvr_batch_size": ref.ccvr.batch_size,
            "ccvr_seed": ref.ccvr.seed,
        },
        "secure_aggregation": {
            "updates": s.secure_updates,
            "statistics": s.secure_statistics,
            "threshold": s.threshold,
            "chunk_entries": s.chunk_entries,
            "update_bound": s.update_bound,
            "statistics_bound": s.statistics_bound,
        },
        "server": {
            "listen": listen,
            "insecure": not s.tls,
            "port_file": "coordinator/port",
        },
        "tls": {
            "cert": str(certs / "server.pem") if s.tls else None,
            "key": str(certs / "server.key") if s.tls else None,
            "client_ca": str(certs / "ca.pem") if s.tls else None,
        },
        "timeouts": {
            "join_s": 300.0,
            "round_s": s.round_s,
            "stage_s": s.stage_s,
            "evaluation_s": s.stage_s,
            "heartbeat_interval_s": s.heartbeat_interval_s,
            "heartbeat_timeout_s": s.heartbeat_timeout_s,
            "linger_s": 20.0,
            "long_poll_s": 2.0,
        },
        "evaluation": {
            "test_dataset": ref.dataset,
            "test_data_root": ref.data_root,
            "federated_every": s.federated_every,
        },
        "privacy": {
            "enabled": True,
            "mechanism": s.dp_mechanism,
            "epsilon": s.epsilon,
            "delta": s.delta,
        }
        if s.privacy
        else {},
    }
    return document


def participant_document(
    settings: SimulationSettings, k: int, port: int, out: Path
) -> dict[str, dict[str, Any]]:
    """Participant ``k``'s TOML document (its slice of the data, its drop points)."""
    s, ref = settings, settings.reference
    pid = s.participant_ids[k]
    halts = [str(d.point) for d in s.drops if d.participant == pid]
    certs = out / "certs"
    participant: dict[str, Any] = {
        "id": pid,
        "coordinator": f"127.0.0.1:{port}",
        "insecure": not s.tls,
        "state_dir": f"../state/{pid}",
        "threads": s.threads,
        "allow_plaintext": not (s.secure_updates and s.secure_statistics),
        "long_poll_ms": 2000,
        "reconnect_max_s": 2.0,
        "give_up_s": 300.0,
        "halt_before": halts or None,
    }
    participant.update(s.extra_participant)
    if s.tls:
        participant["identity_key"] = str(certs / f"{pid}.identity.key")
    document: dict[str, dict[str, Any]] = {
        "participant": participant,
        "tls": {
            "ca": str(certs / "ca.pem") if s.tls else None,
            "cert": str(certs / f"{pid}.pem") if s.tls else None,
            "key": str(certs / f"{pid}.key") if s.tls else None,
        },
        "privacy": (
            {
                "enabled": True,
                "epsilon": s.epsilon,
                "total_epsilon": s.dp_budget,
                "delta": s.delta,
                **s.participant_privacy.get(pid, {}),
            }
            if s.privacy
            else {}
        ),
        "data": {
            "dataset": ref.dataset,
            "root": ref.data_root,
            "slice_index": k,
            "slice_of": ref.participants,
            "partition": ref.partition,
            "alpha": ref.alpha,
            "shards_per_client": ref.shards_per_client,
            "seed": ref.seed,
            "validation_fraction": ref.validation_fraction,
        },
    }
    return document
