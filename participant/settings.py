"""Every setting of a participant process, as frozen dataclasses (TOML parsing lives
in ``spherecal.config``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from spherefed.privacy.settings import PrivacySettings

from .faults import HaltPoint

__all__ = ["ClientTLS", "DataSettings", "ParticipantSettings"]


@dataclass(frozen=True)
class DataSettings:
    """Where the local data comes from.

    *Slice mode* (``slice_index`` set — simulation and benchmarks): load ``dataset``,
    split and partition it exactly like ``spherefed.runner.prepare_data`` with these
    settings, and keep partition ``slice_index`` of ``slice_of`` as the training data;
    the test split is partitioned the same way with seed
    ``derive_seed(seed, "partition", "test")`` and slice ``slice_index`` is the local
    test split. *Whole mode* (``slice_index`` unset — a real site): the dataset's whole
    train split trains, its whole test split evaluates.
    """

    dataset: str = "digits"
    root: str | None = None
    slice_index: int | None = None
    slice_of: int | None = None
    partition: str = "dirichlet"
    alpha: float = 0.1
    shards_per_client: int = 2
    seed: int = 0
    samples: int | None = None
    """Dataset size for ``mnist1d`` (default 12,000); must be unset for other datasets."""
    validation_fraction: float = 0.1

    def __post_init__(self) -> None:
        if self.samples is not None and self.dataset != "mnist1d":
            raise ValueError(f"data.samples is only read for mnist1d, not {self.dataset!r}")
        if (self.slice_index is None) != (self.slice_of is None):
            raise ValueError("data.slice_index and data.slice_of go together")
        if (
            self.slice_index is not None
            and self.slice_of is not None
            and not 0 <= self.slice_index < self.slice_of
        ):
            raise ValueError(
                f"slice_index must be in 0..{self.slice_of - 1}, got {self.slice_index}"
            )


@dataclass(frozen=True)
class ClientTLS:
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None
    """Override the name checked against the server certificate (default: the host)."""


@dataclass(frozen=True)
class ParticipantSettings:
    participant_id: str
    coordinator: str = "127.0.0.1:50051"
    insecure: bool = False
    tls: ClientTLS = field(default_factory=ClientTLS)
    data: DataSettings = field(default_factory=DataSettings)
    state_dir: Path = Path("participant-state")
    identity_key: Path | None = None
    """Ed25519 identity (PKCS#8 PEM); default ``state_dir/identity.key``, created once."""
    threads: int = 1
    allow_plaintext: bool = False
    """Whether to upload updates/statistics in the clear when the coordinator asks
    (secure aggregation off). Off by default: a deployment only sends masked data."""
    max_message_bytes: int = 8 << 20
    long_poll_ms: int = 2000
    reconnect_max_s: float = 10.0
    give_up_s: float = 600.0
    rpc_timeout_s: float = 60.0
    halt_before: tuple[HaltPoint, ...] = ()
    """Fault injection for tests and ``spherecal simulate --drop``: stop (and wait to be
    killed) right before the named step."""
    privacy: PrivacySettings = field(default_factory=PrivacySettings)
    """This participant's own privacy policy: with ``enabled`` it refuses calibration
    statistics without DP noise, and every noisy release is charged to its local
    ledger (``state_dir/privacy.db``) and refused beyond its budget."""

    @property
    def identity_path(self) -> Path:
        return self.identity_key or (self.state_dir / "identity.key")
