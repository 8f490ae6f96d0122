"""Feature extractors ``f(x)`` in plain ``torch.nn`` (no torchvision).

SphereFed (and FFC / CCVR on top of it) only ever sees the *features* ``f(x)`` of
a sample: the head normalises them to ``z = f(x)/‖f(x)‖`` and multiplies by a fixed
classifier (``spherecal.spherefed.heads``). So everything here returns **raw, un-normalised
features** of shape ``(N, feature_dim)``; ``feature_dim`` is the paper's ``l``
(the width of the classifier ``W ∈ R^{C×l}`` and of the statistics ``V``, ``U``).

Architectures
-------------
- ``mlp`` and ``digits_cnn``: small models for the embedded 8×8 digits data (and
  flat tabular ``.npz`` data, see ``spherecal.spherefed.data.load_npz``).
- ``convnet``, ``vgg13``, ``senet18``, ``mobilenetv2``, ``resnet18``: the five models
  of appendix F.1 of the SphereFed paper (Tables 11–15), in their CIFAR variants.
  Deviations from a literal reading of those tables are deliberate and documented
  on each class (the tables contain a few transcription slips).

Normalisation layer
-------------------
Appendix F.1: "For the 'NormLayer' after each convolution layer, two kinds of
normalization layers are experimented" — BatchNorm for MobileNetV2/CIFAR-100, and
GroupNorm otherwise, "following prior arts". We expose both as ``norm="batch"`` or
``norm="group"``; the default is ``"group"`` because GroupNorm uses no batch
statistics: a sample's features do not depend on which other samples share its
batch, and there are no running buffers that FedAvg would have to average across
clients with different label mixes (a known failure mode of BatchNorm under
non-IID data, Hsieh et al. 2020). The group count is :func:`group_count`.

Determinism: parameters are initialised from torch's *global* RNG, in a fixed
module order. The caller seeds (``torch.manual_seed``) — every participant that
seeds identically gets byte-identical parameters. Nothing here seeds.

Seven short architectures with one contract (raw features of shape ``(N, l)``) and
the registry that builds them, side by side.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

__all__ = [
    "EXTRACTOR_NAMES",
    "NORM_NAMES",
    "ConvNet",
    "DigitsCNN",
    "FeatureExtractor",
    "MLPExtractor",
    "MobileNetV2",
    "ResNet18",
    "SENet18",
    "VGG13",
    "build_extractor",
    "group_count",
]

EXTRACTOR_NAMES: tuple[str, ...] = (
    "mlp",
    "digits_cnn",
    "convnet",
    "resnet18",
    "mobilenetv2",
    "vgg13",
    "senet18",
)
"""Every name :func:`build_extractor` accepts."""

NORM_NAMES: tuple[str, ...] = ("batch", "group")
"""Every ``norm`` :func:`build_extractor` accepts."""

_FLEXIBLE_DIM = ("mlp", "digits_cnn")
_MAX_GROUPS = 32


# ----------------------------------------------------------------------------- helpers


def group_count(channels: int, max_groups: int = _MAX_GROUPS) -> int:
    """Number of GroupNorm groups for ``channels`` channels.

    ``min(32, channels)`` — the default of Wu & He (2018) — and, when that does not
    divide ``channels`` (GroupNorm requires it), the largest divisor of ``channels``
    below it. E.g. 64 → 32, 16 → 16, 24 → 24, 144 → 24 (MobileNetV2's expanded
    width), 1 → 1.
    """
    if channels < 1:
        raise ValueError(f"channels must be >= 1, got {channels}")
    g = min(max_groups, channels)
    while channels % g:
        g -= 1
    return g


def _make_norm(norm: str, channels: int) -> nn.Module:
    if norm == "batch":
        return nn.BatchNorm2d(channels)
    if norm == "group":
        return nn.GroupNorm(group_count(channels), channels)
    raise ValueError(f"unknown norm {norm!r}; valid norms: {', '.join(NORM_NAMES)}")


def _conv_norm(
    in_ch: int,
    out_ch: int,
    norm: str,
    *,
    kernel: int = 3,
    stride: int = 1,
    groups: int = 1,
    relu: bool = True,
) -> nn.Sequential:
    """Conv → NormLayer (→ ReLU), the unit every table of appendix F.1 is built from.

    Padding is ``kernel // 2`` ("same" for stride 1). The conv has no bias: the norm
    layer that follows has its own affine shift, so a bias would be redundant.
    """
    layers: list[nn.Module] = [
        nn.Conv2d(
            in_ch,
            out_ch,
            kernel_size=kernel,
            stride=stride,
            padding=kernel // 2,
            groups=groups,
            bias=False,
        ),
        _make_norm(norm, out_ch),
    ]
    if relu:
        layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


def _conv_out(size: int, stride: int, kernel: int = 3) -> int:
    """Spatial output size of a conv with padding ``kernel // 2``."""
    pad = kernel // 2
    return (size + 2 * pad - kernel) // stride + 1


def _as_hw(image_size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(image_size, int):
        h = w = image_size
    else:
        sizes = tuple(image_size)
        if len(sizes) != 2:
            raise ValueError(f"image_size must be an int or (H, W), got {image_size!r}")
        h, w = int(sizes[0]), int(sizes[1])
    if h < 1 or w < 1:
        raise ValueError(f"image_size must be positive, got {image_size!r}")
    return h, w


# ----------------------------------------------------------------------------- base


class FeatureExtractor(nn.Module):
    """Base class: maps a batch of images ``(N, C, H, W)`` to raw features ``(N, l)``.

    ``feature_dim`` is ``l``, the dimension of the hypersphere SphereFed normalises
    onto and the side of the FFC matrix ``V`` (SphereFed Eq. 9–10).
    """

    feature_dim: int

    def __init__(self, feature_dim: int) -> None:
        super().__init__()
        self.feature_dim = int(feature_dim)

    def forward(self, x: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


# ----------------------------------------------------------------------------- digits


class MLPExtractor(FeatureExtractor):
    """Flatten → Linear(D, hidden) → ReLU → Linear(hidden, l).

    For the 8×8 digits (``D = 64``) and flat tabular data (``(N, D)`` is stored as
    ``(N, D, 1, 1)`` by ``load_npz``, so ``D = C·H·W`` covers both).

    The last layer is linear, not followed by a ReLU: the features are normalised
    onto the sphere by the head, and non-negative features could only reach the
    positive orthant, i.e. never align with a fixed classifier row that has negative
    entries (the SphereFed MSE target ``z = w_y``). There are no convolutions, so
    ``norm`` does not apply to this model.
    """

    def __init__(self, in_features: int, *, hidden: int = 256, feature_dim: int = 128) -> None:
        super().__init__(feature_dim)
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_features, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, feature_dim),
        )

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.net(x)
        return out


class DigitsCNN(FeatureExtractor):
    """A small CNN for 1×8×8 digits: 3 conv blocks (32, 64, 128 channels) with two
    2×2 max-pools, flatten (128·2·2 = 512 for 8×8), then a linear projection to ``l``.

    Each conv is followed by the selected NormLayer, as in the paper's models. The
    projection is linear (no final ReLU) for the reason given on
    :class:`MLPExtractor`. The flatten size is computed from ``image_size``.
    """

    def __init__(
        self,
        *,
        in_channels: int = 1,
        image_size: tuple[int, int] = (8, 8),
        norm: str = "group",
        feature_dim: int = 128,
    ) -> None:
        super().__init__(feature_dim)
        h, w = image_size
        if h < 4 or w < 4:
            raise ValueError(f"digits_cnn needs images of at least 4×4, got {h}×{w}")
        self.features = nn.Sequential(
            _conv_norm(in_channels, 32, norm),
            _conv_norm(32, 64, norm),
            nn.MaxPool2d(2),
            _conv_norm(64, 128, norm),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.proj = nn.Linear(128 * (h // 4) * (w // 4), feature_dim)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.proj(self.features(x))
        return out


# ----------------------------------------------------------------------------- ConvNet


class ConvNet(FeatureExtractor):
    """ConvNet of Table 11 (SphereFed appendix F.1).

    Seven Conv(k=3)→NormLayer→ReLU layers with channels 32, 64, 64, 64, 128, 128,
    256 and strides 1, 2, 2, 1, 2, 1, 2, then Flatten. Table 11 does not list the
    padding; padding 1 is the only choice consistent with its ``FC(1024, ·)``:
    32 → 32 → 16 → 8 → 8 → 4 → 4 → 2 gives 256·2·2 = 1024 (without padding a
    32×32 input would shrink to nothing). For other input sizes the flatten
    dimension is computed from ``image_size``.
    """

    _SPEC: tuple[tuple[int, int], ...] = (
        (32, 1),
        (64, 2),
        (64, 2),
        (64, 1),
        (128, 2),
        (128, 1),
        (256, 2),
    )

    def __init__(
        self,
        *,
        in_channels: int = 3,
        image_size: tuple[int, int] = (32, 32),
        norm: str = "group",
    ) -> None:
        h, w = image_size
        layers: list[nn.Module] = []
        ch = in_channels
        for out_ch, stride in self._SPEC:
            layers.append(_conv_norm(ch, out_ch, norm, stride=stride))
            ch = out_ch
            h, w = _conv_out(h, stride), _conv_out(w, stride)
        super().__init__(ch * h * w)
        self.features = nn.Sequential(*layers, nn.Flatten())

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.features(x)
        return out


# ----------------------------------------------------------------------------- VGG13


class VGG13(FeatureExtractor):
    """VGG13 of Table 12 (SphereFed appendix F.1), CIFAR variant → 512 features.

    Ten Conv(k=3, p=1)→NormLayer→ReLU layers (64, 64, M, 128, 128, M, 256, 256, M,
    512, 512, M, 512, 512), then a final max-pool over the remaining spatial extent.

    Two slips in Table 12 are corrected: (1) it lists ``NormLayer(256)`` after convs
    with 512 output channels — the norm always matches the conv's output width;
    (2) read literally, its last pool (``MaxPool2d(k=TIN_S)`` with TIN_S = 1 on
    CIFAR) leaves a 2×2×512 map, contradicting its own ``FC(512, ·)``. The standard
    CIFAR VGG13 has a fifth 2×2 max-pool there; for TinyImageNet (64×64) the table's
    extra TIN_S = 2 pool makes the whole thing a 4×4 max. Both equal a max over the
    entire remaining map, which is what we do (``AdaptiveMaxPool2d(1)``), so the
    model gives 512 features for any input of at least 16×16.
    """

    _CFG: tuple[int | str, ...] = (
        64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512
    )  # fmt: skip

    def __init__(
        self,
        *,
        in_channels: int = 3,
        image_size: tuple[int, int] = (32, 32),
        norm: str = "group",
    ) -> None:
        super().__init__(512)
        h, w = image_size
        if h < 16 or w < 16:
            raise ValueError(f"vgg13 has four 2×2 max-pools and needs >= 16×16 inputs, got {h}×{w}")
        layers: list[nn.Module] = []
        ch = in_channels
        for item in self._CFG:
            if item == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                out_ch = int(item)
                layers.append(_conv_norm(ch, out_ch, norm))
                ch = out_ch
        layers += [nn.AdaptiveMaxPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.features(x)
        return out


# ----------------------------------------------------------------------------- ResNet / SENet


class _SqueezeExcitation(nn.Module):
    """Squeeze-and-Excitation (Hu et al. 2018): global average pool → FC(c, c/16) →
    ReLU → FC(c/16, c) → sigmoid, used to rescale channels. The FCs are 1×1 convs
    with bias and, like any FC layer, no NormLayer."""

    def __init__(self, channels: int, reduction: int = 16) -> None:
        super().__init__()
        hidden = max(1, channels // reduction)
        self.gate = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Conv2d(channels, hidden, kernel_size=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(hidden, channels, kernel_size=1),
            nn.Sigmoid(),
        )

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = x * self.gate(x)
        return out


class _BasicBlock(nn.Module):
    """ResNet basic block: Conv-Norm-ReLU, Conv-Norm, (SE), + shortcut, ReLU.

    The shortcut is the identity, or a 1×1 conv + NormLayer when the stride or the
    width changes (He et al. 2016, option B, as in the common CIFAR code).
    """

    def __init__(self, in_ch: int, out_ch: int, stride: int, norm: str, se: bool) -> None:
        super().__init__()
        self.body = nn.Sequential(
            _conv_norm(in_ch, out_ch, norm, stride=stride),
            _conv_norm(out_ch, out_ch, norm, relu=False),
        )
        self.se: nn.Module = _SqueezeExcitation(out_ch) if se else nn.Identity()
        self.shortcut: nn.Module = (
            _conv_norm(in_ch, out_ch, norm, kernel=1, stride=stride, relu=False)
            if stride != 1 or in_ch != out_ch
            else nn.Identity()
        )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.relu(self.se(self.body(x)) + self.shortcut(x))
        return out


class _ResNetLike(FeatureExtractor):
    """ResNet18 topology, CIFAR variant: 3×3 stride-1 stem, no initial max-pool, four
    stages of two basic blocks (64, 128, 256, 512; strides 1, 2, 2, 2), global
    average pool → 512 features. Tables 15 and 13 end in ``AvgPool2d(k=4)`` over the
    4×4 map of a 32×32 input, i.e. a global average; ``AdaptiveAvgPool2d(1)`` is the
    same there and keeps 512 features for other input sizes."""

    def __init__(self, *, in_channels: int, norm: str, se: bool) -> None:
        super().__init__(512)
        blocks: list[nn.Module] = [_conv_norm(in_channels, 64, norm)]
        ch = 64
        for out_ch, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks.append(_BasicBlock(ch, out_ch, stride, norm, se))
            blocks.append(_BasicBlock(out_ch, out_ch, 1, norm, se))
            ch = out_ch
        blocks += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*blocks)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.features(x)
        return out


class ResNet18(_ResNetLike):
    """ResNet18 of Table 15 (SphereFed appendix F.1), CIFAR variant → 512 features.

    Table 15 lists ``NormLayer(256)`` after ``Conv(256, 512)`` in B4 — a slip; the
    norm matches the conv's width. The residual shortcuts are implied by the name.
    """

    def __init__(self, *, in_channels: int = 3, norm: str = "group") -> None:
        super().__init__(in_channels=in_channels, norm=norm, se=False)


class SENet18(_ResNetLike):
    """SENet18 of Table 13 (SphereFed appendix F.1): ResNet18 with a
    Squeeze-and-Excitation module (reduction 16) at the end of every basic block,
    applied to the residual branch before the addition (Hu et al. 2018) → 512
    features."""

    def __init__(self, *, in_channels: int = 3, norm: str = "group") -> None:
        super().__init__(in_channels=in_channels, norm=norm, se=True)


# ----------------------------------------------------------------------------- MobileNetV2


class _InvertedResidual(nn.Module):
    """MobileNetV2 block: 1×1 expand → 3×3 depthwise (stride s) → 1×1 project.

    The projection is *linear* (NormLayer, no ReLU) — the "linear bottleneck" of
    Sandler et al. (2018). Table 14 prints a ReLU after it, which we read as a
    transcription slip: the rectified bottleneck is what MobileNetV2 argues against.
    The identity residual is added when stride is 1 and the width is unchanged
    (Sandler et al.). Like Table 14's B1 (and the common CIFAR code) the expand conv
    is present even for expansion 1.
    """

    def __init__(self, in_ch: int, out_ch: int, expansion: int, stride: int, norm: str) -> None:
        super().__init__()
        hidden = in_ch * expansion
        self.body = nn.Sequential(
            _conv_norm(in_ch, hidden, norm, kernel=1),
            _conv_norm(hidden, hidden, norm, stride=stride, groups=hidden),
            _conv_norm(hidden, out_ch, norm, kernel=1, relu=False),
        )
        self.residual = stride == 1 and in_ch == out_ch

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.body(x)
        return out + x if self.residual else out


class MobileNetV2(FeatureExtractor):
    """MobileNetV2 of Table 14 (SphereFed appendix F.1), CIFAR variant → 1280 features.

    Stem Conv(3, 32, k=3, s=1) (stride 1, unlike ImageNet's 2), then the blocks
    (expansion t, width c, repeats n, first stride s): (1, 16, 1, 1), (6, 24, 2, 1),
    (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1) —
    the second stage's stride is Table 14's TIN_S = 1 on CIFAR — then Conv(320, 1280,
    k=1) → NormLayer → ReLU and a global average pool (Table 14's ``AvgPool2d(k=4)``
    over the 4×4 map of a 32×32 input). The activations are ReLU, as in Table 14
    (not ReLU6).
    """

    _CFG: tuple[tuple[int, int, int, int], ...] = (
        (1, 16, 1, 1),
        (6, 24, 2, 1),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    )

    def __init__(self, *, in_channels: int = 3, norm: str = "group") -> None:
        super().__init__(1280)
        layers: list[nn.Module] = [_conv_norm(in_channels, 32, norm)]
        ch = 32
        for expansion, out_ch, repeats, stride in self._CFG:
            for i in range(repeats):
                first_stride = stride if i == 0 else 1
                layers.append(_InvertedResidual(ch, out_ch, expansion, first_stride, norm))
                ch = out_ch
        layers += [
            _conv_norm(ch, 1280, norm, kernel=1),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        ]
        self.features = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.features(x)
        return out


# ----------------------------------------------------------------------------- factory


def build_extractor(
    name: str,
    *,
    in_channels: int = 3,
    image_size: int | tuple[int, int] = 32,
    norm: str = "group",
    feature_dim: int | None = None,
) -> FeatureExtractor:
    """Build a feature extractor by name (one of :data:`EXTRACTOR_NAMES`; a user's
    ``"package.module:factory"`` is built by :mod:`spherecal.spherefed.custom`, see
    :func:`spherecal.spherefed.network.build_model`).

    Args:
        name: architecture name.
        in_channels: image channels (1 for digits, 3 for CIFAR).
        image_size: input side (or ``(H, W)``). Used where a flatten size depends on
            it (``mlp``, ``digits_cnn``, ``convnet``); the pooled models end in a
            global pool and accept any size (``vgg13`` needs at least 16×16).
        norm: ``"group"`` (default; see the module docstring) or ``"batch"``.
        feature_dim: ``l`` for ``mlp`` / ``digits_cnn`` (default 128). The paper's
            models have a fixed ``l`` (ConvNet 1024 at 32×32, VGG13 / ResNet18 /
            SENet18 512, MobileNetV2 1280), so passing it for them is an error rather
            than silently ignored.

    Parameters are drawn from torch's global RNG; seed before calling for
    reproducible (byte-identical) weights.
    """
    if name not in EXTRACTOR_NAMES:
        raise ValueError(
            f"unknown extractor {name!r}; valid names: {', '.join(EXTRACTOR_NAMES)}, "
            "or 'package.module:factory' for your own network (docs/models.md)"
        )
    if norm not in NORM_NAMES:
        raise ValueError(f"unknown norm {norm!r}; valid norms: {', '.join(NORM_NAMES)}")
    if isinstance(in_channels, bool) or not isinstance(in_channels, int) or in_channels < 1:
        raise ValueError(f"in_channels must be a positive int, got {in_channels!r}")
    hw = _as_hw(image_size)
    if feature_dim is not None:
        if name not in _FLEXIBLE_DIM:
            raise ValueError(
                f"feature_dim can only be set for {', '.join(_FLEXIBLE_DIM)}; "
                f"{name!r} has the fixed feature dimension of the paper's architecture"
            )
        if isinstance(feature_dim, bool) or not isinstance(feature_dim, int) or feature_dim < 1:
            raise ValueError(f"feature_dim must be a positive int, got {feature_dim!r}")
    dim = 128 if feature_dim is None else feature_dim

    if name == "mlp":
        return MLPExtractor(in_channels * hw[0] * hw[1], feature_dim=dim)
    if name == "digits_cnn":
        return DigitsCNN(in_channels=in_channels, image_size=hw, norm=norm, feature_dim=dim)
    if name == "convnet":
        return ConvNet(in_channels=in_channels, image_size=hw, norm=norm)
    if name == "vgg13":
        return VGG13(in_channels=in_channels, image_size=hw, norm=norm)
    if name == "resnet18":
        return ResNet18(in_channels=in_channels, norm=norm)
    if name == "senet18":
        return SENet18(in_channels=in_channels, norm=norm)
    return MobileNetV2(in_channels=in_channels, norm=norm)
