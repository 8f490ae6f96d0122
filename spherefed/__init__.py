"""SphereFed, FFC and CCVR: the method, pure and deterministic.

No network, no I/O beyond reading datasets. Modules:

- ``classifier``: fixed classifier matrices (orthonormal QR, random He, Tammes).
- ``heads``: ``FeatureNorm`` and the ``sphere`` / ``learnable`` / ``fn`` heads.
- ``models``: feature extractors in plain ``torch.nn`` (MLP, digits CNN, ConvNet,
  ResNet18, MobileNetV2, VGG13, SENet18), BatchNorm or GroupNorm.
- ``losses``: MSE on one-hot (SphereFed Eq. 5) and cross-entropy.
- ``stats``: FFC and CCVR sufficient statistics, their flat layouts, pack/unpack.
- ``calibrate``: ``ffc_solve`` (Eq. 10/12) and CCVR (Gaussians, virtual features,
  classifier retraining).
- ``data`` / ``partition``: digits, CIFAR, ``.npz``; IID, Dirichlet(α), shards.
- ``fl``: local training and server aggregation (FedAvg, FedProx).
- ``reference``: the deterministic in-process reference runner;
  ``reference_config``: its validated settings.
- ``network``: a classification network (extractor + head), built deterministically.
- ``calibration_suite``: every calibrator by name, its hyper-parameter chosen on
  validation; ``discriminant``: the closed forms with a bias (FFC+bias, LDA, QDA).
- ``algorithms``: the federated algorithms and rival fixes (local steps + server steps).
- ``privacy``: DP planning, sensitivity, accounting, ledger, DP-SGD.
- ``saved``: ``model_spec.json`` + state dicts; ``load_model(dir)`` (also ``spherefed.load_model``).
- ``custom``: a user's own extractor, ``"package.module:factory"``.
- ``durable``: a rename that survives a power loss (the folder synced) and a record
  appended with one ``fdatasync``, for every file either process must find again after
  a crash.
- ``state_lock``: one process per state directory (an exclusive ``flock`` held for the
  process's life), for the coordinator and every site.
"""

from typing import Any

__all__ = ["load_model"]


def __getattr__(name: str) -> Any:
    """``spherefed.load_model`` without importing torch on ``import spherefed``."""
    if name == "load_model":
        from spherecal.spherefed.saved import load_model

        return load_model
    raise AttributeError(f"module 'spherefed' has no attribute {name!r}")
