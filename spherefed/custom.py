"""A user's own feature extractor, named ``"package.module:factory"``.

SphereFed's method does not care what computes the features ``f(x)``: the head
normalises them onto the unit sphere and multiplies by the fixed classifier
(SphereFed Eq. 3–4), and FFC/CCVR only see ``z = f(x)/‖f(x)‖``. So an institution may
bring its own ``torch.nn.Module`` as the extractor while the head, the fixed
classifier and the calibration stay ours.

The factory contract (documented in ``docs/models.md``):

- ``factory(*, in_channels: int, image_size: tuple[int, int], feature_dim: int | None)``
  is called with keyword arguments only;
- it returns a ``torch.nn.Module`` mapping a float32 batch ``(N, C, H, W)`` to raw
  features ``(N, l)``;
- the module declares ``l`` as an integer attribute ``feature_dim >= 1``; when the
  factory is given ``feature_dim`` (not ``None``) the module's must equal it;
- it draws parameters only from torch's global RNG (the caller seeds it; every
  process then builds byte-identical weights), and it has no side effects.

Loading is "import by path": ``importlib.import_module("package.module")`` then the
attribute ``factory`` — the module must be importable (installed, or on
``PYTHONPATH``) in *every* process that builds the network (coordinator,
participants, ``spherecal predict``). Nothing is ever imported from a network
message alone: a participant builds a custom extractor only when its own config
allows that name (``[participant] extractors``), see ``spherecal.participant.runner``.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from spherecal.spherefed.models import FeatureExtractor

__all__ = ["CustomExtractor", "CustomExtractorError", "build_custom_extractor", "is_custom"]

# package.module:factory — dotted Python identifiers on both sides of one colon.
_NAME = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


class CustomExtractorError(ValueError):
    """A ``package.module:factory`` extractor that cannot be imported or breaks the contract."""


def is_custom(name: str) -> bool:
    """Whether ``name`` names a user factory (``"package.module:factory"``)."""
    return ":" in name


class CustomExtractor(FeatureExtractor):
    """Wraps the user's module so the rest of the code sees a :class:`FeatureExtractor`.

    The wrapped module lives at ``.net``: its state-dict keys are
    ``extractor.net.*`` in every process, so saved models load anywhere the factory
    can be imported.
    """

    def __init__(self, net: nn.Module, feature_dim: int) -> None:
        super().__init__(feature_dim)
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.net(x)
        return out


def _resolve(name: str) -> Callable[..., Any]:
    if not _NAME.match(name):
        raise CustomExtractorError(
            f"custom extractor {name!r} must look like 'package.module:factory'"
        )
    module_name, _, attribute = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CustomExtractorError(
            f"cannot import {module_name!r} for extractor {name!r} ({exc}); it must be "
            "installed or on PYTHONPATH in every process"
        ) from None
    target: Any = module
    for part in attribute.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise CustomExtractorError(f"{module_name!r} has no attribute {attribute!r}")
    if not callable(target):
        raise CustomExtractorError(f"extractor factory {name!r} is not callable")
    return target


def build_custom_extractor(
    name: str,
    *,
    in_channels: int,
    image_size: tuple[int, int],
    feature_dim: int | None,
) -> CustomExtractor:
    """Import ``name``'s factory, call it and check the contract (module type, declared
    ``feature_dim``, and the output shape of a two-sample probe batch)."""
    factory = _resolve(name)
    try:
        net = factory(in_channels=in_channels, image_size=image_size, feature_dim=feature_dim)
    except (TypeError, ValueError) as exc:
        raise CustomExtractorError(f"extractor factory {name!r} failed: {exc}") from None
    if not isinstance(net, nn.Module):
        raise CustomExtractorError(
            f"extractor factory {name!r} returned {type(net).__name__}, not a torch.nn.Module"
        )
    dim = getattr(net, "feature_dim", None)
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise CustomExtractorError(
            f"the module from {name!r} must declare an integer feature_dim >= 1, got {dim!r}"
        )
    if feature_dim is not None and dim != feature_dim:
        raise CustomExtractorError(
            f"the module from {name!r} declares feature_dim {dim}, but {feature_dim} was asked"
        )
    _probe(net, name, in_channels, image_size, dim)
    return CustomExtractor(net, dim)


def _probe(
    net: nn.Module, name: str, in_channels: int, image_size: tuple[int, int], dim: int
) -> None:
    """Run two zero images through ``net`` in eval mode (no RNG, no running-statistics
    update) and check the output is ``(2, dim)``; restores the module's mode."""
    was_training = net.training
    net.eval()
    try:
        with torch.no_grad():
            out = net(torch.zeros(2, in_channels, *image_size))
    except Exception as exc:  # any failure of user code is a contract breach
        raise CustomExtractorError(
            f"the module from {name!r} fails on a (2, {in_channels}, {image_size[0]}, "
            f"{image_size[1]}) batch: {type(exc).__name__}: {exc}"
        ) from None
    finally:
        net.train(was_training)
    if not isinstance(out, Tensor) or tuple(out.shape) != (2, dim):
        shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise CustomExtractorError(
            f"the module from {name!r} must map (N, C, H, W) to (N, {dim}) features, got {shape}"
        )
