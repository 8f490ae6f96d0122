"""Federated algorithms and rival fixes, as pure local steps + server steps on sums.

- :mod:`~spherecal.spherefed.algorithms.base`: payloads (what secure aggregation sums) and the
  :class:`ServerStrategy` interface (``state_dict`` / ``load_state_dict`` to resume).
- :mod:`~spherecal.spherefed.algorithms.strategies`: FedAvg, FedProx, FedNova, FedOpt (Adam,
  Yogi, Adagrad); :mod:`~spherecal.spherefed.algorithms.scaffold`: SCAFFOLD.
- :mod:`~spherecal.spherefed.algorithms.registry`: THE registry of algorithm names.
- :mod:`~spherecal.spherefed.algorithms.objectives`: CE with a temperature, FedUV's regularisers.
- :mod:`~spherecal.spherefed.algorithms.methods`: every method of the papers as a recipe
  (BABU, FedFN, FedUV, SphereFed-CE, SphereFed, the SphereFed Tab. 3 ablation).
"""

from spherecal.spherefed.algorithms.base import (
    LOSS_SUM,
    AlgorithmSettings,
    ClientResult,
    NamedSum,
    Payload,
    ServerStrategy,
    SumLayout,
    UpdateLimits,
    add_payloads,
    as_payload,
    parameter_mask,
    sum_payloads,
)
from spherecal.spherefed.algorithms.methods import (
    ABLATION,
    BASES,
    DEFAULT_LR_GRID,
    METHODS,
    RIVALS,
    MethodSpec,
    get_method,
    sphere_variant,
)
from spherecal.spherefed.algorithms.objectives import (
    FedUVConfig,
    feduv_objective,
    feduv_uniformity_loss,
    feduv_variance_constant,
    feduv_variance_loss,
    temperature_objective,
)
from spherecal.spherefed.algorithms.registry import (
    ALGORITHM_NAMES,
    STRATEGIES,
    configured_strategy,
    make_strategy,
)
from spherecal.spherefed.algorithms.scaffold import (
    Scaffold,
    scaffold_control_update,
    scaffold_local_step,
    scaffold_server_step,
)
from spherecal.spherefed.algorithms.strategies import (
    FEDOPT_VARIANTS,
    FedAdam,
    FedAvg,
    FedNova,
    FedOpt,
    FedProx,
    FedYogi,
    fedavg_local_step,
    fedavg_server_step,
    fednova_local_step,
    fednova_norm,
    fednova_server_step,
    fedopt_update,
)

__all__ = [
    "ABLATION",
    "ALGORITHM_NAMES",
    "AlgorithmSettings",
    "BASES",
    "DEFAULT_LR_GRID",
    "FEDOPT_VARIANTS",
    "LOSS_SUM",
    "METHODS",
    "RIVALS",
    "STRATEGIES",
    "ClientResult",
    "FedAdam",
    "FedAvg",
    "FedNova",
    "FedOpt",
    "FedProx",
    "FedUVConfig",
    "FedYogi",
    "MethodSpec",
    "NamedSum",
    "Payload",
    "Scaffold",
    "ServerStrategy",
    "SumLayout",
    "UpdateLimits",
    "add_payloads",
    "as_payload",
    "configured_strategy",
    "fedavg_local_step",
    "fedavg_server_step",
    "feduv_objective",
    "feduv_uniformity_loss",
    "feduv_variance_constant",
    "feduv_variance_loss",
    "fednova_local_step",
    "fednova_norm",
    "fednova_server_step",
    "fedopt_update",
    "get_method",
    "make_strategy",
    "parameter_mask",
    "scaffold_control_update",
    "scaffold_local_step",
    "scaffold_server_step",
    "sphere_variant",
    "sum_payloads",
    "temperature_objective",
]
