"""Every setting of a participant process, as frozen dataclasses (TOML parsing lives
in ``spherecal.config``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from spherecal.participant.faults import HaltPoint
from spherecal.participant.policy import PolicySettings
from spherecal.spherefed.privacy.settings import PrivacySettings

__all__ = ["ClientTLS", "DataSettings", "ParticipantSettings"]


@dataclass(frozen=True)
class DataSettings:
    """Where the local data comes from.

    *Slice mode* (``slice_index`` set — simulation and benchmarks): load ``dataset``,
    split and partition it exactly like ``spherecal.spherefed.reference.prepare_data`` with these
    settings, and keep partition ``slice_index`` of ``slice_of`` as the training data;
    the test split is partitioned the same way with seed
    ``derive_seed(seed, "partition", "test")`` and slice ``slice_index`` is the local
    test split. *Whole mode* (``slice_index`` unset — a real site): the dataset's whole
    train split trains, its whole test split evaluates.
    """

    dataset: str = "digits"
    """``digits``, ``cifar10``/``cifar100`` (directory), ``npz`` (file)."""
    root: str | None = None
    """Where the dataset lives (directory or file)."""
    slice_index: int | None = None
    """*Slice mode*: take partition ``slice_index`` of ``slice_of``; unset: the whole
    dataset is this site's own."""
    slice_of: int | None = None
    """Number of partitions in slice mode."""
    partition: str = "dirichlet"
    """Slice mode: ``dirichlet``, ``iid`` or ``shards``, as the reference runner."""
    alpha: float = 0.1
    """Slice mode: Dirichlet α."""
    shards_per_client: int = 2
    """Slice mode: shards per participant."""
    seed: int = 0
    """Slice mode: the federation seed the partition derives from."""
    samples: int | None = None
    """Dataset size for ``mnist1d`` (default 12,000); must be unset for other datasets."""
    validation_fraction: float = 0.1
    """Share of the local train split held out for validation (the calibrators'
    ridge / shrinkage grid is scored there, never on test). Slice mode: the reference
    runner's split, in ``(0, 1)``. Whole mode: a seeded stratified split of this
    site's own train split (seed ``derive_seed(seed, "validation")``); ``0`` holds
    nothing out — the coordinator then falls back to default hyper-parameters and
    says so in the results (docs/data.md)."""
    test_fraction: float = 0.25
    """Whole mode, ``npz``/``digits`` with ``x``, ``y`` only: the stratified share held
    out as the local test split (docs/data.md)."""
    num_classes: int | None = None
    """Whole mode: this site's number of classes when its labels do not reach the
    highest one (default: ``max(label) + 1``). Checked here against the federation's
    model at join (labels beyond the model's classes refuse the plan); never sent —
    the join says nothing of the site's label range, so it is not needed to take
    part without the highest classes."""
    test_root: str | None = None
    """Whole mode, ``npz``: a separate test file (its ``x``, ``y``); then all of
    ``root`` trains and ``test_fraction`` is unused."""

    def __post_init__(self) -> None:
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {self.test_fraction}")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ValueError(
                f"validation_fraction must be in [0, 1), got {self.validation_fraction}"
            )
        if self.slice_index is not None and self.validation_fraction == 0.0:
            raise ValueError(
                "validation_fraction = 0 is for whole mode; slice mode reproduces the "
                "reference runner's split, which needs a share in (0, 1)"
            )
        if self.test_root is not None and self.dataset != "npz":
            raise ValueError("test_root is only for dataset 'npz'")
        if self.test_root is not None and self.slice_index is not None:
            raise ValueError("test_root is for whole mode (no slice_index)")
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
    """CA that signs the coordinator's certificate; required unless ``insecure``."""
    cert: Path | None = None
    """This participant's client certificate (PEM)."""
    key: Path | None = None
    """This participant's client key (PEM)."""
    server_name: str | None = None
    """Override the name checked against the server certificate (default: the host)."""
    peer_keys: Path | None = None
    """The federation's members and their Ed25519 identity keys, one ``NAME HEX`` per
    line (``spherecal certs pin``), exchanged among the sites outside the coordinator.
    Set: every peer whose signatures this site checks must be listed with exactly its
    key. Required under TLS: unset, the site does not start unless ``[policy]
    trust_ca_for_members`` (a logged weakening) lets the CA alone decide — whoever
    holds the CA key could then add members to a job, or replace one, and read this
    site's input from the sum."""


@dataclass(frozen=True)
class ParticipantSettings:
    participant_id: str
    """Must be on the coordinator's roster and equal the certificate's CN."""
    coordinator: str = "127.0.0.1:50051"
    """The coordinator's ``host:port``."""
    insecure: bool = False
    """Plaintext gRPC, loopback only."""
    tls: ClientTLS = field(default_factory=ClientTLS)
    data: DataSettings = field(default_factory=DataSettings)
    state_dir: Path = Path("participant-state")
    """Job ledger (refuses to run a job id twice), privacy ledger, the algorithm's own
    state (SCAFFOLD's ``c_k``, in ``algorithm/``); default ``participant-<id>``."""
    out_dir: Path | None = None
    """Where the final models land when the federation completes (``spherecal.spherefed.saved``
    layout: ``model_spec.json``, ``model_<calibration>.pt``, ``models.json``). The TOML
    loader always sets one (default ``participant-ID-out`` next to the config); None
    (programmatic use, in-process tests) saves nothing."""
    extractors: tuple[str, ...] = ()
    """User extractors (``"package.module:factory"``) this participant agrees to import
    when the coordinator's plan names one. Built-in extractors need no entry; any
    other name in a plan is refused, so a coordinator cannot make a site import code."""
    identity_key: Path | None = None
    """Ed25519 identity (PKCS#8 PEM); default ``state_dir/identity.key``. ``spherecal
    certs request`` writes ``NAME.identity.key`` at the site (``certs issue`` without a
    request, at the CA: for trials); ``spherecal participant --config F --init``
    creates one at this path if there is none. A configured path that does not
    exist is an error naming it (a typo never makes a new identity); the default key is
    created by itself only on a site's first start, never beside an existing history in
    ``state_dir``."""
    threads: int = 1
    """Torch threads."""
    allow_plaintext: bool = False
    """Whether to upload updates/statistics in the clear when the coordinator asks
    (secure aggregation off). Off by default: a deployment only sends masked data.
    On: logged at start as a weakening (``WARNING: policy weakened``)."""
    max_message_bytes: int = 8 << 20
    """gRPC message limit."""
    long_poll_ms: int = 2000
    """How long one NextInstruction call may be held."""
    reconnect_max_s: float = 10.0
    """Longest wait between two reconnection attempts, jitter included (positive): the
    waits double from 0.2 s up to it, each drawn between half its nominal length and at
    most 1.5 times it, never above this (``spherecal.participant.backoff``)."""
    give_up_s: float = 600.0
    """Give up after the coordinator was unreachable this long."""
    rpc_timeout_s: float = 60.0
    """Deadline of one RPC."""
    log_format: str = "text"
    """``text`` or ``json``: stderr log lines with an ISO-8601 UTC timestamp and a level
    (``--log-format`` overrides; ``spherecal.logs``)."""
    halt_before: tuple[HaltPoint, ...] = ()
    """Fault injection for tests and ``spherecal simulate --drop``: stop (and wait to be
    killed) right before the named step."""
    corrupt_shares: bool = False
    """TEST ONLY: deal shares that fail authentication in every job (the
    malicious-participant fault of ``spherecal simulate --corrupt-shares``). Refused
    at start unless the environment sets ``SPHERECAL_TEST_FAULTS=1``."""
    adversary: str | None = None
    """TEST ONLY: replace this participant's local computation by an attack
    (``ATTACK[:AMOUNT]``, ``spherecal.participant.adversary``; ``spherecal simulate
    --adversary``). Refused at start unless the environment sets
    ``SPHERECAL_TEST_FAULTS=1``."""
    privacy: PrivacySettings = field(default_factory=PrivacySettings)
    """This participant's own privacy policy: with ``enabled`` it refuses calibration
    statistics without DP noise, and every noisy release is charged to its local
    ledger (``state_dir/privacy.db``) and refused beyond its budget."""
    policy: PolicySettings = field(default_factory=PolicySettings)
    """What this participant refuses whatever the coordinator asks (``[policy]``):
    the secure-aggregation rules, one release per statistic and model, evaluation
    heads (``spherecal.participant.policy``)."""

    def __post_init__(self) -> None:
        if self.log_format not in ("text", "json"):
            raise ValueError(f"log_format must be text or json, got {self.log_format!r}")
        if not self.reconnect_max_s > 0:
            raise ValueError(f"reconnect_max_s must be positive, got {self.reconnect_max_s!r}")

    @property
    def identity_path(self) -> Path:
        return self.identity_key or (self.state_dir / "identity.key")
