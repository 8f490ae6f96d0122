"""Secure aggregation: pure, no I/O, no torch.

Bonawitz et al. 2017 ("Practical Secure Aggregation for Privacy-Preserving Machine
Learning") with the SecAgg+ neighbour graph of Bell et al. 2020. The coordinator
learns the sum of the participants' vectors and nothing else; participants may drop
out at any stage. See ``docs/threat_model.md`` for what is and is not protected.

Modules, one idea each:

``ring``         fixed-point encoding into Z_{2^64} with overflow refusal
``prg``          AES-128-CTR mask expansion, seekable by chunk
``kdf``          HKDF-SHA256 with (job, purpose, parties) domain separation
``keys``         per-job X25519 key bundles, Ed25519 signatures, commitments
``shamir``       t-of-n sharing of 16/32-byte secrets (pycryptodome)
``channel``      AES-GCM share encryption and share commitments
``graph``        complete and Harary k-regular masking graphs
``spec``         ``JobSpec``: the parameters every party validates
``messages``     every protocol message with canonical ``to_bytes``/``from_bytes``
``ledger``       job-id replay protection
``participant``  ``SecAggParticipant`` state machine
``server``       ``SecAggServer`` state machine (streaming, O(vector) memory)
``simulate``     ``simulate_secure_sum`` and ``run_protocol`` (in-process)
"""

from ._exceptions import (
    BadKey,
    BadSignature,
    DuplicateMessage,
    EncodingOverflow,
    Excluded,
    ForgedShare,
    InconsistentSurvivors,
    InvalidSpec,
    JobAborted,
    JobReplayed,
    MalformedMessage,
    OutOfStage,
    OverlappingReveal,
    SecAggError,
    SenderMismatch,
    TooFewSurvivors,
    UnexpectedShare,
    UnknownParticipant,
    UploadSlotsBusy,
    WrongJob,
    WrongLength,
    WrongRecipient,
)
from .channel import ShareKind
from .keys import generate_identity, identity_public_bytes
from .ledger import JobLedger, MemoryJobLedger
from .messages import (
    AdvertiseKeys,
    ConsistencyRequest,
    ConsistencySignature,
    EncryptedShare,
    KeyRoster,
    MaskedChunk,
    Message,
    RevealedShare,
    RoutedShare,
    ShareBundle,
    ShareKeys,
    SurvivorSignature,
    UnmaskRequest,
    UnmaskResponse,
    decode_message,
)
from .participant import ParticipantStage, SecAggParticipant
from .ring import choose_scale_bits, decode, encode
from .server import AggregateResult, SecAggServer, Stage
from .simulate import SimulationReport, run_protocol, simulate_secure_sum
from .spec import JobSpec

__all__ = [
    "AdvertiseKeys",
    "AggregateResult",
    "BadKey",
    "BadSignature",
    "ConsistencyRequest",
    "ConsistencySignature",
    "DuplicateMessage",
    "EncodingOverflow",
    "EncryptedShare",
    "Excluded",
    "ForgedShare",
    "InconsistentSurvivors",
    "InvalidSpec",
    "JobAborted",
    "JobLedger",
    "JobReplayed",
    "JobSpec",
    "KeyRoster",
    "MalformedMessage",
    "MaskedChunk",
    "MemoryJobLedger",
    "Message",
    "OutOfStage",
    "OverlappingReveal",
    "ParticipantStage",
    "RevealedShare",
    "RoutedShare",
    "SecAggError",
    "SecAggParticipant",
    "SecAggServer",
    "SenderMismatch",
    "ShareBundle",
    "ShareKeys",
    "ShareKind",
    "SimulationReport",
    "Stage",
    "SurvivorSignature",
    "TooFewSurvivors",
    "UnexpectedShare",
    "UnknownParticipant",
    "UnmaskRequest",
    "UnmaskResponse",
    "UploadSlotsBusy",
    "WrongJob",
    "WrongLength",
    "WrongRecipient",
    "choose_scale_bits",
    "decode",
    "decode_message",
    "encode",
    "generate_identity",
    "identity_public_bytes",
    "run_protocol",
    "simulate_secure_sum",
]
