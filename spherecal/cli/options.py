"""The federation options, defined once: ``reference``, ``simulate`` and
``experiment`` take the same ``--dataset``, ``--participants``, ``--rounds`` … with
the same types, choices and help, each with the defaults of its own config dataclass
(:class:`~spherecal.spherefed.reference.ReferenceConfig`,
:class:`~spherecal.simulate.SimulationSettings`,
:class:`~spherecal.experiment.ExperimentSettings`) — never a default copied into a
help string.

The ``choices`` lists live beside torch code, so they are imported when an option is
added (the chosen command only, :mod:`.app`), not when this module is.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spherecal.argtypes import (
    alpha_or_iid,
    calibration_list,
    positive_float,
    positive_int,
)

__all__ = ["FEDERATION_OPTIONS", "FederationOption", "add_federation_options", "reference_defaults"]


@dataclass(frozen=True)
class FederationOption:
    """One option: its ``dest`` (also its TOML key in ``simulate --config``), help,
    type, and a function returning its ``choices`` (imported when called)."""

    dest: str
    help: str
    type: Callable[[str], Any] | None = None
    choices: Callable[[], Sequence[str]] | None = None
    flag_only: bool = False
    many: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")


def _datasets() -> Sequence[str]:
    from spherecal.spherefed.data import DATASET_NAMES

    return DATASET_NAMES


def _extractors() -> Sequence[str]:
    from spherecal.spherefed.models import EXTRACTOR_NAMES

    return EXTRACTOR_NAMES


def _norms() -> Sequence[str]:
    from spherecal.spherefed.models import NORM_NAMES

    return NORM_NAMES


def _heads() -> Sequence[str]:
    from spherecal.spherefed.heads import HEAD_KINDS

    return HEAD_KINDS


def _classifiers() -> Sequence[str]:
    from spherecal.spherefed.classifier import CLASSIFIER_KINDS

    return CLASSIFIER_KINDS


def _losses() -> Sequence[str]:
    from spherecal.spherefed.losses import LOSS_NAMES

    return LOSS_NAMES


def _algorithms() -> Sequence[str]:
    from spherecal.spherefed.algorithms.registry import ALGORITHM_NAMES

    return ALGORITHM_NAMES


FEDERATION_OPTIONS: tuple[FederationOption, ...] = (
    FederationOption("dataset", "dataset", choices=_datasets),
    FederationOption(
        "data_root", "CIFAR directory, .npz file, or the mnist1d cache directory (not digits)"
    ),
    FederationOption(
        "samples", "mnist1d: samples generated, train + test (default 12000)", positive_int
    ),
    FederationOption("participants", "participants in the federation", positive_int),
    FederationOption(
        "alpha",
        "Dirichlet concentration over classes (smaller = more skewed), or 'iid'",
        alpha_or_iid,
    ),
    FederationOption("shards", "shards per participant (FedFN-style split)", positive_int),
    FederationOption("rounds", "federated rounds", positive_int),
    FederationOption("local_epochs", "local epochs per round", positive_int),
    FederationOption("batch_size", "local SGD batch size", positive_int),
    FederationOption("lr", "local learning rate", positive_float),
    FederationOption("model", "feature extractor", choices=_extractors),
    FederationOption("norm", "normalisation layers", choices=_norms),
    FederationOption("head", "feature head", choices=_heads),
    FederationOption("classifier", "classifier", choices=_classifiers),
    FederationOption(
        "loss",
        "training loss (default: mse for the sphere head, ce otherwise)",
        choices=_losses,
    ),
    FederationOption("algorithm", "federated algorithm", choices=_algorithms),
    FederationOption("prox_mu", "FedProx μ", float),
    FederationOption("fedopt_lr", "FedAdam/FedYogi server learning rate η", positive_float),
    FederationOption("sample_fraction", "fraction of participants sampled per round", float),
    FederationOption("ridge", "FFC ridge λ (appendix C.1)", float),
    FederationOption(
        "calibration",
        "comma list of calibrators: ffc, ccvr, ffc_bias, lda, qda",
        calibration_list,
    ),
    FederationOption(
        "ridge_grid",
        "FFC+bias ridge candidates, chosen on the validation split",
        float,
        many=True,
    ),
    FederationOption(
        "shrinkage_grid",
        "LDA/QDA shrinkage candidates in [0, 1], chosen on validation",
        float,
        many=True,
    ),
    FederationOption("ccvr_virtual", "CCVR: virtual features per class", positive_int),
    FederationOption("tukey", "CCVR: ReLU + Tukey(0.5) on virtual features", flag_only=True),
    FederationOption("seed", "seed of the partition, the model and the sampling", int),
)
_BY_DEST = {option.dest: option for option in FEDERATION_OPTIONS}


def reference_defaults(config: Any) -> dict[str, Any]:
    """Every federation option's default, read from a ``ReferenceConfig``."""
    return {
        "dataset": config.dataset,
        "data_root": config.data_root,
        "samples": config.samples,
        "participants": config.participants,
        "alpha": "iid" if config.partition == "iid" else config.alpha,
        "shards": config.shards_per_client if config.partition == "shards" else None,
        "rounds": config.rounds,
        "local_epochs": config.local_epochs,
        "batch_size": config.batch_size,
        "lr": config.lr,
        "model": config.model,
        "norm": config.norm,
        "head": config.head,
        "classifier": config.classifier,
        "loss": None,  # follows the head unless given
        "algorithm": config.algorithm,
        "prox_mu": config.prox_mu,
        "fedopt_lr": config.fedopt_lr,
        "sample_fraction": config.sample_fraction,
        "ridge": config.ffc_ridge,
        "calibration": ",".join(config.calibrations),
        "ridge_grid": list(config.ridge_grid),
        "shrinkage_grid": list(config.shrinkage_grid),
        "ccvr_virtual": config.ccvr.virtual_per_class,
        "tukey": config.ccvr.tukey,
        "seed": config.seed,
    }


def _shown(value: Any) -> str:
    if isinstance(value, list | tuple):
        return " ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def add_federation_options(
    parser: argparse.ArgumentParser,
    defaults: Mapping[str, Any],
    *,
    layered: bool = False,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Add the federation options named in ``defaults`` (in the canonical order), each
    defaulting to ``defaults[dest]``.

    ``layered``: the parsed namespace holds only what the command line gave (the
    default is ``SUPPRESS``) so that a config file can fill the rest (``simulate
    --config``); the default is then named in the help instead. ``overrides``: extra
    ``add_argument`` keywords per ``dest`` (``reference --lr`` takes several values).
    """
    unknown = set(defaults) - set(_BY_DEST)
    if unknown:
        raise KeyError(f"not federation options: {sorted(unknown)}")
    for option in FEDERATION_OPTIONS:
        if option.dest not in defaults:
            continue
        default = defaults[option.dest]
        text = option.help
        kwargs: dict[str, Any] = {}
        if option.flag_only:
            kwargs["action"] = "store_true"
        else:
            kwargs["type"] = option.type
            if option.choices is not None:
                kwargs["choices"] = option.choices()
            if option.many:
                kwargs["nargs"] = "+"
        kwargs.update((overrides or {}).get(option.dest, {}))
        text = kwargs.pop("help", text)
        if layered:
            if default not in (None, False, [], ()):
                text = f"{text} (default {_shown(default)})"
            default = argparse.SUPPRESS
        parser.add_argument(option.flag, default=default, help=text, **kwargs)
