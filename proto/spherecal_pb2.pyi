from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    FLOAT32: _ClassVar[DType]
    FLOAT64: _ClassVar[DType]
    INT64: _ClassVar[DType]
    UINT64: _ClassVar[DType]

class StatisticsKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATISTICS_UNSPECIFIED: _ClassVar[StatisticsKind]
    FFC: _ClassVar[StatisticsKind]
    CCVR: _ClassVar[StatisticsKind]

class EvaluationSplit(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPLIT_TEST: _ClassVar[EvaluationSplit]
    SPLIT_VALIDATION: _ClassVar[EvaluationSplit]

class HeadKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HEAD_LINEAR: _ClassVar[HeadKind]
    HEAD_AFFINE: _ClassVar[HeadKind]
    HEAD_QUADRATIC: _ClassVar[HeadKind]

class SecAggStage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SECAGG_STAGE_UNSPECIFIED: _ClassVar[SecAggStage]
    ADVERTISE: _ClassVar[SecAggStage]
    SHARE: _ClassVar[SecAggStage]
    MASKED: _ClassVar[SecAggStage]
    CONSISTENCY: _ClassVar[SecAggStage]
    UNMASK: _ClassVar[SecAggStage]
    COMPLAINT: _ClassVar[SecAggStage]

class FailureKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAILURE_KIND_UNSPECIFIED: _ClassVar[FailureKind]
    POLICY_REFUSAL: _ClassVar[FailureKind]
    BUDGET_EXCEEDED: _ClassVar[FailureKind]
    TOO_FEW_SURVIVORS: _ClassVar[FailureKind]
    BAD_INPUT: _ClassVar[FailureKind]
    SHARE_AUTHENTICATION: _ClassVar[FailureKind]
    UNTRUSTED_DIRECTORY: _ClassVar[FailureKind]
    JOB_ABORTED: _ClassVar[FailureKind]
    PROTOCOL_VIOLATION: _ClassVar[FailureKind]
    INTERNAL_ERROR: _ClassVar[FailureKind]

class PolicyRule(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RULE_UNSPECIFIED: _ClassVar[PolicyRule]
    RULE_CONSISTENCY_ROUND_REQUIRED: _ClassVar[PolicyRule]
    RULE_THRESHOLD_TOO_LOW: _ClassVar[PolicyRule]
    RULE_TOO_FEW_PARTICIPANTS: _ClassVar[PolicyRule]
    RULE_TOO_FEW_INPUTS: _ClassVar[PolicyRule]
    RULE_DOUBLE_REVEAL: _ClassVar[PolicyRule]
    RULE_BOTH_SHARE_KINDS: _ClassVar[PolicyRule]
    RULE_KEY_SUBSTITUTION: _ClassVar[PolicyRule]
    RULE_RELEASE_REPEATED: _ClassVar[PolicyRule]
    RULE_EVALUATION_HEADS: _ClassVar[PolicyRule]
    RULE_PLAINTEXT_REFUSED: _ClassVar[PolicyRule]
    RULE_DP_REQUIRED: _ClassVar[PolicyRule]
    RULE_DP_PLAN: _ClassVar[PolicyRule]
    RULE_ROUND_OUTSIDE_PLAN: _ClassVar[PolicyRule]
    RULE_EVALUATIONS_EXHAUSTED: _ClassVar[PolicyRule]
    RULE_TASK_NOT_BOUND: _ClassVar[PolicyRule]
    RULE_EXAMPLE_COUNT_NOISE: _ClassVar[PolicyRule]
    RULE_EXTRACTOR_NOT_ALLOWED: _ClassVar[PolicyRule]
    RULE_ATTEMPTS_EXHAUSTED: _ClassVar[PolicyRule]

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_REASON_UNSPECIFIED: _ClassVar[ErrorReason]
    SESSION_EXPIRED: _ClassVar[ErrorReason]
    UPLOAD_SLOTS_BUSY: _ClassVar[ErrorReason]
    IDENTITY_IN_USE: _ClassVar[ErrorReason]
DTYPE_UNSPECIFIED: DType
FLOAT32: DType
FLOAT64: DType
INT64: DType
UINT64: DType
STATISTICS_UNSPECIFIED: StatisticsKind
FFC: StatisticsKind
CCVR: StatisticsKind
SPLIT_TEST: EvaluationSplit
SPLIT_VALIDATION: EvaluationSplit
HEAD_LINEAR: HeadKind
HEAD_AFFINE: HeadKind
HEAD_QUADRATIC: HeadKind
SECAGG_STAGE_UNSPECIFIED: SecAggStage
ADVERTISE: SecAggStage
SHARE: SecAggStage
MASKED: SecAggStage
CONSISTENCY: SecAggStage
UNMASK: SecAggStage
COMPLAINT: SecAggStage
FAILURE_KIND_UNSPECIFIED: FailureKind
POLICY_REFUSAL: FailureKind
BUDGET_EXCEEDED: FailureKind
TOO_FEW_SURVIVORS: FailureKind
BAD_INPUT: FailureKind
SHARE_AUTHENTICATION: FailureKind
UNTRUSTED_DIRECTORY: FailureKind
JOB_ABORTED: FailureKind
PROTOCOL_VIOLATION: FailureKind
INTERNAL_ERROR: FailureKind
RULE_UNSPECIFIED: PolicyRule
RULE_CONSISTENCY_ROUND_REQUIRED: PolicyRule
RULE_THRESHOLD_TOO_LOW: PolicyRule
RULE_TOO_FEW_PARTICIPANTS: PolicyRule
RULE_TOO_FEW_INPUTS: PolicyRule
RULE_DOUBLE_REVEAL: PolicyRule
RULE_BOTH_SHARE_KINDS: PolicyRule
RULE_KEY_SUBSTITUTION: PolicyRule
RULE_RELEASE_REPEATED: PolicyRule
RULE_EVALUATION_HEADS: PolicyRule
RULE_PLAINTEXT_REFUSED: PolicyRule
RULE_DP_REQUIRED: PolicyRule
RULE_DP_PLAN: PolicyRule
RULE_ROUND_OUTSIDE_PLAN: PolicyRule
RULE_EVALUATIONS_EXHAUSTED: PolicyRule
RULE_TASK_NOT_BOUND: PolicyRule
RULE_EXAMPLE_COUNT_NOISE: PolicyRule
RULE_EXTRACTOR_NOT_ALLOWED: PolicyRule
RULE_ATTEMPTS_EXHAUSTED: PolicyRule
ERROR_REASON_UNSPECIFIED: ErrorReason
SESSION_EXPIRED: ErrorReason
UPLOAD_SLOTS_BUSY: ErrorReason
IDENTITY_IN_USE: ErrorReason

class TensorHeader(_message.Message):
    __slots__ = ("dtype", "shape", "sha256")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    sha256: bytes
    def __init__(self, dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., sha256: _Optional[bytes] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: TensorHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[TensorHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class TensorChunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: TensorHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[TensorHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class DownloadRequest(_message.Message):
    __slots__ = ("caller", "name")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    name: str
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., name: _Optional[str] = ...) -> None: ...

class TensorRef(_message.Message):
    __slots__ = ("name", "header")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    name: str
    header: TensorHeader
    def __init__(self, name: _Optional[str] = ..., header: _Optional[_Union[TensorHeader, _Mapping]] = ...) -> None: ...

class Caller(_message.Message):
    __slots__ = ("participant_id", "session")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    session: str
    def __init__(self, participant_id: _Optional[str] = ..., session: _Optional[str] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("participant_id", "identity_public_key", "timestamp_ms", "nonce", "signature", "software_version", "data")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    identity_public_key: bytes
    timestamp_ms: int
    nonce: bytes
    signature: bytes
    software_version: str
    data: DataShape
    def __init__(self, participant_id: _Optional[str] = ..., identity_public_key: _Optional[bytes] = ..., timestamp_ms: _Optional[int] = ..., nonce: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., software_version: _Optional[str] = ..., data: _Optional[_Union[DataShape, _Mapping]] = ...) -> None: ...

class DataShape(_message.Message):
    __slots__ = ("num_classes", "in_channels", "image_height", "image_width")
    NUM_CLASSES_FIELD_NUMBER: _ClassVar[int]
    IN_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    num_classes: int
    in_channels: int
    image_height: int
    image_width: int
    def __init__(self, num_classes: _Optional[int] = ..., in_channels: _Optional[int] = ..., image_height: _Optional[int] = ..., image_width: _Optional[int] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("session", "plan")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    session: str
    plan: Plan
    def __init__(self, session: _Optional[str] = ..., plan: _Optional[_Union[Plan, _Mapping]] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("federation_id", "model", "training", "rounds", "heartbeat_interval_ms", "secure_updates", "secure_statistics", "calibration", "participant_index", "num_participants", "max_chunk_bytes", "sum_scales", "example_count_noise_sd")
    class SumScalesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    FEDERATION_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    SECURE_UPDATES_FIELD_NUMBER: _ClassVar[int]
    SECURE_STATISTICS_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    SUM_SCALES_FIELD_NUMBER: _ClassVar[int]
    EXAMPLE_COUNT_NOISE_SD_FIELD_NUMBER: _ClassVar[int]
    federation_id: str
    model: ModelSpec
    training: LocalTraining
    rounds: int
    heartbeat_interval_ms: int
    secure_updates: bool
    secure_statistics: bool
    calibration: _containers.RepeatedScalarFieldContainer[str]
    participant_index: int
    num_participants: int
    max_chunk_bytes: int
    sum_scales: _containers.ScalarMap[str, float]
    example_count_noise_sd: int
    def __init__(self, federation_id: _Optional[str] = ..., model: _Optional[_Union[ModelSpec, _Mapping]] = ..., training: _Optional[_Union[LocalTraining, _Mapping]] = ..., rounds: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ..., secure_updates: _Optional[bool] = ..., secure_statistics: _Optional[bool] = ..., calibration: _Optional[_Iterable[str]] = ..., participant_index: _Optional[int] = ..., num_participants: _Optional[int] = ..., max_chunk_bytes: _Optional[int] = ..., sum_scales: _Optional[_Mapping[str, float]] = ..., example_count_noise_sd: _Optional[int] = ...) -> None: ...

class ModelSpec(_message.Message):
    __slots__ = ("extractor", "head", "norm", "classifier", "classifier_seed", "init_seed", "num_classes", "in_channels", "image_height", "image_width", "feature_dim")
    EXTRACTOR_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    NORM_FIELD_NUMBER: _ClassVar[int]
    CLASSIFIER_FIELD_NUMBER: _ClassVar[int]
    CLASSIFIER_SEED_FIELD_NUMBER: _ClassVar[int]
    INIT_SEED_FIELD_NUMBER: _ClassVar[int]
    NUM_CLASSES_FIELD_NUMBER: _ClassVar[int]
    IN_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    FEATURE_DIM_FIELD_NUMBER: _ClassVar[int]
    extractor: str
    head: str
    norm: str
    classifier: str
    classifier_seed: int
    init_seed: int
    num_classes: int
    in_channels: int
    image_height: int
    image_width: int
    feature_dim: int
    def __init__(self, extractor: _Optional[str] = ..., head: _Optional[str] = ..., norm: _Optional[str] = ..., classifier: _Optional[str] = ..., classifier_seed: _Optional[int] = ..., init_seed: _Optional[int] = ..., num_classes: _Optional[int] = ..., in_channels: _Optional[int] = ..., image_height: _Optional[int] = ..., image_width: _Optional[int] = ..., feature_dim: _Optional[int] = ...) -> None: ...

class LocalTraining(_message.Message):
    __slots__ = ("epochs", "batch_size", "lr", "momentum", "weight_decay", "loss", "prox_mu", "algorithm")
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    PROX_MU_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    loss: str
    prox_mu: float
    algorithm: str
    def __init__(self, epochs: _Optional[int] = ..., batch_size: _Optional[int] = ..., lr: _Optional[float] = ..., momentum: _Optional[float] = ..., weight_decay: _Optional[float] = ..., loss: _Optional[str] = ..., prox_mu: _Optional[float] = ..., algorithm: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("caller",)
    CALLER_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("phase", "interval_ms")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    phase: str
    interval_ms: int
    def __init__(self, phase: _Optional[str] = ..., interval_ms: _Optional[int] = ...) -> None: ...

class InstructionRequest(_message.Message):
    __slots__ = ("caller", "wait_ms")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    wait_ms: int
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class Instruction(_message.Message):
    __slots__ = ("task_id", "wait", "train", "statistics", "secagg", "evaluate", "done")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    TRAIN_FIELD_NUMBER: _ClassVar[int]
    STATISTICS_FIELD_NUMBER: _ClassVar[int]
    SECAGG_FIELD_NUMBER: _ClassVar[int]
    EVALUATE_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    wait: Wait
    train: TrainTask
    statistics: StatisticsTask
    secagg: SecAggStep
    evaluate: EvaluateTask
    done: Done
    def __init__(self, task_id: _Optional[str] = ..., wait: _Optional[_Union[Wait, _Mapping]] = ..., train: _Optional[_Union[TrainTask, _Mapping]] = ..., statistics: _Optional[_Union[StatisticsTask, _Mapping]] = ..., secagg: _Optional[_Union[SecAggStep, _Mapping]] = ..., evaluate: _Optional[_Union[EvaluateTask, _Mapping]] = ..., done: _Optional[_Union[Done, _Mapping]] = ...) -> None: ...

class Wait(_message.Message):
    __slots__ = ("retry_after_ms", "reason")
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    retry_after_ms: int
    reason: str
    def __init__(self, retry_after_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class TrainTask(_message.Message):
    __slots__ = ("round", "model", "seed", "secure", "broadcast", "dpsgd")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SECURE_FIELD_NUMBER: _ClassVar[int]
    BROADCAST_FIELD_NUMBER: _ClassVar[int]
    DPSGD_FIELD_NUMBER: _ClassVar[int]
    round: int
    model: TensorRef
    seed: int
    secure: SecAggJob
    broadcast: _containers.RepeatedCompositeFieldContainer[NamedTensorRef]
    dpsgd: DPSGDStep
    def __init__(self, round: _Optional[int] = ..., model: _Optional[_Union[TensorRef, _Mapping]] = ..., seed: _Optional[int] = ..., secure: _Optional[_Union[SecAggJob, _Mapping]] = ..., broadcast: _Optional[_Iterable[_Union[NamedTensorRef, _Mapping]]] = ..., dpsgd: _Optional[_Union[DPSGDStep, _Mapping]] = ...) -> None: ...

class DPSGDStep(_message.Message):
    __slots__ = ("noise_multiplier", "sample_rate", "max_grad_norm", "min_contributors", "colluders", "delta", "mechanism", "scale_bits", "max_examples")
    NOISE_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    MAX_GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    MIN_CONTRIBUTORS_FIELD_NUMBER: _ClassVar[int]
    COLLUDERS_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    SCALE_BITS_FIELD_NUMBER: _ClassVar[int]
    MAX_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    noise_multiplier: float
    sample_rate: float
    max_grad_norm: float
    min_contributors: int
    colluders: int
    delta: float
    mechanism: str
    scale_bits: int
    max_examples: int
    def __init__(self, noise_multiplier: _Optional[float] = ..., sample_rate: _Optional[float] = ..., max_grad_norm: _Optional[float] = ..., min_contributors: _Optional[int] = ..., colluders: _Optional[int] = ..., delta: _Optional[float] = ..., mechanism: _Optional[str] = ..., scale_bits: _Optional[int] = ..., max_examples: _Optional[int] = ...) -> None: ...

class StatisticsTask(_message.Message):
    __slots__ = ("kind", "model", "secure", "privacy")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SECURE_FIELD_NUMBER: _ClassVar[int]
    PRIVACY_FIELD_NUMBER: _ClassVar[int]
    kind: StatisticsKind
    model: TensorRef
    secure: SecAggJob
    privacy: DPRelease
    def __init__(self, kind: _Optional[_Union[StatisticsKind, str]] = ..., model: _Optional[_Union[TensorRef, _Mapping]] = ..., secure: _Optional[_Union[SecAggJob, _Mapping]] = ..., privacy: _Optional[_Union[DPRelease, _Mapping]] = ...) -> None: ...

class DPRelease(_message.Message):
    __slots__ = ("kind", "dim", "num_classes", "participants", "min_contributors", "max_examples", "epsilon", "delta", "mechanism", "quant_bits", "colluders")
    KIND_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    NUM_CLASSES_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    MIN_CONTRIBUTORS_FIELD_NUMBER: _ClassVar[int]
    MAX_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    QUANT_BITS_FIELD_NUMBER: _ClassVar[int]
    COLLUDERS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    dim: int
    num_classes: int
    participants: int
    min_contributors: int
    max_examples: int
    epsilon: float
    delta: float
    mechanism: str
    quant_bits: int
    colluders: int
    def __init__(self, kind: _Optional[str] = ..., dim: _Optional[int] = ..., num_classes: _Optional[int] = ..., participants: _Optional[int] = ..., min_contributors: _Optional[int] = ..., max_examples: _Optional[int] = ..., epsilon: _Optional[float] = ..., delta: _Optional[float] = ..., mechanism: _Optional[str] = ..., quant_bits: _Optional[int] = ..., colluders: _Optional[int] = ...) -> None: ...

class EvaluateTask(_message.Message):
    __slots__ = ("model", "heads", "round", "secure", "split")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    HEADS_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SECURE_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    model: TensorRef
    heads: _containers.RepeatedCompositeFieldContainer[NamedTensorRef]
    round: int
    secure: SecAggJob
    split: EvaluationSplit
    def __init__(self, model: _Optional[_Union[TensorRef, _Mapping]] = ..., heads: _Optional[_Iterable[_Union[NamedTensorRef, _Mapping]]] = ..., round: _Optional[int] = ..., secure: _Optional[_Union[SecAggJob, _Mapping]] = ..., split: _Optional[_Union[EvaluationSplit, str]] = ...) -> None: ...

class NamedTensorRef(_message.Message):
    __slots__ = ("name", "tensor", "kind", "bias", "quadratic")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    QUADRATIC_FIELD_NUMBER: _ClassVar[int]
    name: str
    tensor: TensorRef
    kind: HeadKind
    bias: TensorRef
    quadratic: TensorRef
    def __init__(self, name: _Optional[str] = ..., tensor: _Optional[_Union[TensorRef, _Mapping]] = ..., kind: _Optional[_Union[HeadKind, str]] = ..., bias: _Optional[_Union[TensorRef, _Mapping]] = ..., quadratic: _Optional[_Union[TensorRef, _Mapping]] = ...) -> None: ...

class Done(_message.Message):
    __slots__ = ("status", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: str
    message: str
    def __init__(self, status: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class DirectoryEntry(_message.Message):
    __slots__ = ("participant_id", "identity_public_key", "certificate_pem")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    identity_public_key: bytes
    certificate_pem: bytes
    def __init__(self, participant_id: _Optional[str] = ..., identity_public_key: _Optional[bytes] = ..., certificate_pem: _Optional[bytes] = ...) -> None: ...

class SecAggJob(_message.Message):
    __slots__ = ("spec", "directory", "purpose")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    spec: bytes
    directory: _containers.RepeatedCompositeFieldContainer[DirectoryEntry]
    purpose: str
    def __init__(self, spec: _Optional[bytes] = ..., directory: _Optional[_Iterable[_Union[DirectoryEntry, _Mapping]]] = ..., purpose: _Optional[str] = ...) -> None: ...

class SecAggStep(_message.Message):
    __slots__ = ("job_id", "stage", "message")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    job_id: bytes
    stage: SecAggStage
    message: bytes
    def __init__(self, job_id: _Optional[bytes] = ..., stage: _Optional[_Union[SecAggStage, str]] = ..., message: _Optional[bytes] = ...) -> None: ...

class SecAggSubmission(_message.Message):
    __slots__ = ("caller", "job_id", "stage", "message")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    job_id: bytes
    stage: SecAggStage
    message: bytes
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., job_id: _Optional[bytes] = ..., stage: _Optional[_Union[SecAggStage, str]] = ..., message: _Optional[bytes] = ...) -> None: ...

class MaskedUpload(_message.Message):
    __slots__ = ("caller", "job_id", "chunk")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    job_id: bytes
    chunk: bytes
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., job_id: _Optional[bytes] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class UpdateMeta(_message.Message):
    __slots__ = ("num_samples", "mean_loss", "num_steps")
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MEAN_LOSS_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    num_samples: int
    mean_loss: float
    num_steps: int
    def __init__(self, num_samples: _Optional[int] = ..., mean_loss: _Optional[float] = ..., num_steps: _Optional[int] = ...) -> None: ...

class UploadHeader(_message.Message):
    __slots__ = ("caller", "task_id", "tensor", "update")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    task_id: str
    tensor: TensorHeader
    update: UpdateMeta
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., task_id: _Optional[str] = ..., tensor: _Optional[_Union[TensorHeader, _Mapping]] = ..., update: _Optional[_Union[UpdateMeta, _Mapping]] = ...) -> None: ...

class TensorUpload(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: UploadHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[UploadHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class UploadReceipt(_message.Message):
    __slots__ = ("num_bytes", "chunks", "sha256")
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    num_bytes: int
    chunks: int
    sha256: bytes
    def __init__(self, num_bytes: _Optional[int] = ..., chunks: _Optional[int] = ..., sha256: _Optional[bytes] = ...) -> None: ...

class Receipt(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class HeadCount(_message.Message):
    __slots__ = ("head", "correct")
    HEAD_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    head: str
    correct: int
    def __init__(self, head: _Optional[str] = ..., correct: _Optional[int] = ...) -> None: ...

class EvaluationReport(_message.Message):
    __slots__ = ("caller", "task_id", "total", "counts")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    task_id: str
    total: int
    counts: _containers.RepeatedCompositeFieldContainer[HeadCount]
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., task_id: _Optional[str] = ..., total: _Optional[int] = ..., counts: _Optional[_Iterable[_Union[HeadCount, _Mapping]]] = ...) -> None: ...

class FailureReport(_message.Message):
    __slots__ = ("caller", "task_id", "reason", "kind", "rule")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    task_id: str
    reason: str
    kind: FailureKind
    rule: PolicyRule
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., task_id: _Optional[str] = ..., reason: _Optional[str] = ..., kind: _Optional[_Union[FailureKind, str]] = ..., rule: _Optional[_Union[PolicyRule, str]] = ...) -> None: ...

class ErrorDetail(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: ErrorReason
    def __init__(self, reason: _Optional[_Union[ErrorReason, str]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("caller",)
    CALLER_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ...) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("job_id", "purpose", "round", "state", "stage", "contributors", "error")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTORS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    purpose: str
    round: int
    state: str
    stage: str
    contributors: _containers.RepeatedScalarFieldContainer[str]
    error: str
    def __init__(self, job_id: _Optional[str] = ..., purpose: _Optional[str] = ..., round: _Optional[int] = ..., state: _Optional[str] = ..., stage: _Optional[str] = ..., contributors: _Optional[_Iterable[str]] = ..., error: _Optional[str] = ...) -> None: ...

class ParticipantStatus(_message.Message):
    __slots__ = ("participant_id", "joined", "alive")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    JOINED_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    joined: bool
    alive: bool
    def __init__(self, participant_id: _Optional[str] = ..., joined: _Optional[bool] = ..., alive: _Optional[bool] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("federation_id", "phase", "completed_rounds", "rounds", "jobs", "participants", "error")
    FEDERATION_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    federation_id: str
    phase: str
    completed_rounds: int
    rounds: int
    jobs: _containers.RepeatedCompositeFieldContainer[JobStatus]
    participants: _containers.RepeatedCompositeFieldContainer[ParticipantStatus]
    error: str
    def __init__(self, federation_id: _Optional[str] = ..., phase: _Optional[str] = ..., completed_rounds: _Optional[int] = ..., rounds: _Optional[int] = ..., jobs: _Optional[_Iterable[_Union[JobStatus, _Mapping]]] = ..., participants: _Optional[_Iterable[_Union[ParticipantStatus, _Mapping]]] = ..., error: _Optional[str] = ...) -> None: ...

class FederationStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RosterEntry(_message.Message):
    __slots__ = ("participant_id", "index", "joined", "connected", "seconds_since_seen", "joins", "told_done", "left")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    JOINED_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SINCE_SEEN_FIELD_NUMBER: _ClassVar[int]
    JOINS_FIELD_NUMBER: _ClassVar[int]
    TOLD_DONE_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    index: int
    joined: bool
    connected: bool
    seconds_since_seen: float
    joins: int
    told_done: bool
    left: str
    def __init__(self, participant_id: _Optional[str] = ..., index: _Optional[int] = ..., joined: _Optional[bool] = ..., connected: _Optional[bool] = ..., seconds_since_seen: _Optional[float] = ..., joins: _Optional[int] = ..., told_done: _Optional[bool] = ..., left: _Optional[str] = ...) -> None: ...

class RoundSummary(_message.Message):
    __slots__ = ("round", "selected", "contributors", "train_loss", "test_accuracy", "federated_accuracy", "seconds", "dropped")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SELECTED_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTORS_FIELD_NUMBER: _ClassVar[int]
    TRAIN_LOSS_FIELD_NUMBER: _ClassVar[int]
    TEST_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    FEDERATED_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    round: int
    selected: int
    contributors: int
    train_loss: float
    test_accuracy: float
    federated_accuracy: float
    seconds: float
    dropped: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, round: _Optional[int] = ..., selected: _Optional[int] = ..., contributors: _Optional[int] = ..., train_loss: _Optional[float] = ..., test_accuracy: _Optional[float] = ..., federated_accuracy: _Optional[float] = ..., seconds: _Optional[float] = ..., dropped: _Optional[_Iterable[str]] = ...) -> None: ...

class EpsilonSpent(_message.Message):
    __slots__ = ("subject", "epsilon")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    subject: str
    epsilon: float
    def __init__(self, subject: _Optional[str] = ..., epsilon: _Optional[float] = ...) -> None: ...

class MethodAccuracy(_message.Message):
    __slots__ = ("method", "accuracy")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    method: str
    accuracy: float
    def __init__(self, method: _Optional[str] = ..., accuracy: _Optional[float] = ...) -> None: ...

class FederationStatus(_message.Message):
    __slots__ = ("federation_id", "name", "status", "phase", "rounds", "completed_rounds", "current_round", "task", "stage", "job_id", "roster", "completed", "jobs", "privacy_enabled", "epsilon", "refusals", "warnings", "errors", "uptime_s", "accuracy", "status_reasons")
    FEDERATION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ROUND_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ROSTER_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    PRIVACY_ENABLED_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    REFUSALS_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    STATUS_REASONS_FIELD_NUMBER: _ClassVar[int]
    federation_id: str
    name: str
    status: str
    phase: str
    rounds: int
    completed_rounds: int
    current_round: int
    task: str
    stage: str
    job_id: str
    roster: _containers.RepeatedCompositeFieldContainer[RosterEntry]
    completed: _containers.RepeatedCompositeFieldContainer[RoundSummary]
    jobs: _containers.RepeatedCompositeFieldContainer[JobStatus]
    privacy_enabled: bool
    epsilon: _containers.RepeatedCompositeFieldContainer[EpsilonSpent]
    refusals: int
    warnings: _containers.RepeatedScalarFieldContainer[str]
    errors: _containers.RepeatedScalarFieldContainer[str]
    uptime_s: float
    accuracy: _containers.RepeatedCompositeFieldContainer[MethodAccuracy]
    status_reasons: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, federation_id: _Optional[str] = ..., name: _Optional[str] = ..., status: _Optional[str] = ..., phase: _Optional[str] = ..., rounds: _Optional[int] = ..., completed_rounds: _Optional[int] = ..., current_round: _Optional[int] = ..., task: _Optional[str] = ..., stage: _Optional[str] = ..., job_id: _Optional[str] = ..., roster: _Optional[_Iterable[_Union[RosterEntry, _Mapping]]] = ..., completed: _Optional[_Iterable[_Union[RoundSummary, _Mapping]]] = ..., jobs: _Optional[_Iterable[_Union[JobStatus, _Mapping]]] = ..., privacy_enabled: _Optional[bool] = ..., epsilon: _Optional[_Iterable[_Union[EpsilonSpent, _Mapping]]] = ..., refusals: _Optional[int] = ..., warnings: _Optional[_Iterable[str]] = ..., errors: _Optional[_Iterable[str]] = ..., uptime_s: _Optional[float] = ..., accuracy: _Optional[_Iterable[_Union[MethodAccuracy, _Mapping]]] = ..., status_reasons: _Optional[_Iterable[str]] = ...) -> None: ...
