"""Secure aggregation: pure, no I/O, no torch.

Bonawitz et al. 2017 ("Practical Secure Aggregation for Privacy-Preserving Machine
Learning") with the SecAgg+ neighbour graph of Bell et al. 2020. The coordinator
learns the sum of the participants' vectors and nothing else; participants may drop
out at any stage. See ``docs/threat_model.md`` for what is and is not protected.

Modules, one idea each:

``ring``         fixed-point encoding into Z_{2^32} or Z_{2^64} (per job) with overflow refusal
``heap``         a participant process keeps freed heap memory (glibc ``mallopt``): no fresh
                 pages per masked chunk
``prg``          the v2 mask keystream (the AES-GCM keystream; CTR or GCM engine), seekable
``native``       the optional C kernel (``_maskkernel.c``, its own VAES/AES-NI CTR in
                 ``_aesctr.c``): masking and encoding, same bytes
``kdf``          HKDF-SHA256 with (job, purpose, parties) domain separation
``keys``         per-job X25519 key bundles, Ed25519 signatures, commitments
``shamir``       t-of-n sharing over GF(2^31 - 1), vectorised in numpy
``channel``      AES-GCM share encryption and share commitments
``graph``        complete and Harary k-regular masking graphs
``spec``         ``JobSpec``: the parameters every party validates
``messages``     every protocol message with canonical ``to_bytes``/``from_bytes``
``_fields``      framing and structural checks shared by the messages
``replay``       job-id replay protection
``policy``       ``SecAggPolicy``: what a participant refuses, whatever it is asked
``dealing``      round 1: dealing and opening encrypted Shamir shares
``complaints``   signed complaints naming a dealer whose share failed
``consistency``  checking a consistency-signed survivor view before unmasking
``participant``  ``SecAggParticipant`` state machine
``held_state``   what a participant keeps of a job after its masked input left (restarts)
``routing``      rounds 0–1 on the server: key adverts, share routing, commitments
``staging``      the streaming masked sum with staging slots (O(vector) memory)
``unmask``       round 4 on the server: checking reveals, rebuilding secrets, stripping
``server``       ``SecAggServer`` state machine (the stages; calls the three above)
``simulation``   ``simulate_secure_sum`` and ``run_protocol``: the whole protocol in-process
``dp``           distributed DP noise in the ring (sizing, exact sampling)
``exact``        exact integer samplers: Bernoulli(exp(-γ)), discrete Laplace and Gaussian
``poisson``      exact Poisson and symmetric Skellam samplers
``entropy``      cryptographically secure random integers for noise (AES-CTR from the OS)
"""

from spherecal.crypto._exceptions import (
    AggregateOutOfRange,
    BadComplaint,
    BadKey,
    BadSignature,
    ConsistencyRoundRequired,
    DoubleReveal,
    DuplicateMessage,
    EncodingOverflow,
    Excluded,
    ForgedShare,
    InconsistentSurvivors,
    InvalidSpec,
    JobAborted,
    JobReplayed,
    KeySubstitution,
    MalformedMessage,
    NoiseTooLarge,
    OutOfStage,
    OverlappingReveal,
    PolicyViolation,
    RingOverflowRisk,
    SecAggError,
    SenderMismatch,
    ThresholdTooLow,
    TooFewInputs,
    TooFewParticipants,
    TooFewSurvivors,
    UnexpectedShare,
    UnknownParticipant,
    UploadSlotsBusy,
    WrongJob,
    WrongLength,
    WrongRecipient,
)
from spherecal.crypto.channel import ShareKind
from spherecal.crypto.held_state import HeldStage, HeldState
from spherecal.crypto.keys import generate_identity, identity_public_bytes
from spherecal.crypto.messages import (
    AdvertiseKeys,
    ComplaintReason,
    ConsistencyRequest,
    ConsistencySignature,
    EncryptedShare,
    KeyRoster,
    MaskedChunk,
    Message,
    RevealedShare,
    RoutedShare,
    ShareBundle,
    ShareComplaint,
    ShareKeys,
    SurvivorSignature,
    UnmaskRequest,
    UnmaskResponse,
    decode_message,
)
from spherecal.crypto.participant import ParticipantStage, SecAggParticipant
from spherecal.crypto.policy import SecAggPolicy
from spherecal.crypto.replay import JobLedger, MemoryJobLedger
from spherecal.crypto.ring import choose_scale_bits, decode, encode
from spherecal.crypto.server import AggregateResult, SecAggServer, Stage
from spherecal.crypto.simulation import SimulationReport, run_protocol, simulate_secure_sum
from spherecal.crypto.spec import JobSpec, keys_needed

__all__ = [
    "AdvertiseKeys",
    "AggregateOutOfRange",
    "AggregateResult",
    "BadComplaint",
    "BadKey",
    "BadSignature",
    "ComplaintReason",
    "ConsistencyRequest",
    "ConsistencyRoundRequired",
    "ConsistencySignature",
    "DoubleReveal",
    "DuplicateMessage",
    "EncodingOverflow",
    "EncryptedShare",
    "Excluded",
    "ForgedShare",
    "HeldStage",
    "HeldState",
    "InconsistentSurvivors",
    "InvalidSpec",
    "JobAborted",
    "JobLedger",
    "JobReplayed",
    "JobSpec",
    "KeyRoster",
    "KeySubstitution",
    "MalformedMessage",
    "MaskedChunk",
    "MemoryJobLedger",
    "Message",
    "NoiseTooLarge",
    "OutOfStage",
    "OverlappingReveal",
    "ParticipantStage",
    "PolicyViolation",
    "RevealedShare",
    "RingOverflowRisk",
    "RoutedShare",
    "SecAggError",
    "SecAggParticipant",
    "SecAggPolicy",
    "SecAggServer",
    "SenderMismatch",
    "ShareBundle",
    "ShareComplaint",
    "ShareKeys",
    "ShareKind",
    "SimulationReport",
    "Stage",
    "SurvivorSignature",
    "ThresholdTooLow",
    "TooFewInputs",
    "TooFewParticipants",
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
    "keys_needed",
    "run_protocol",
    "simulate_secure_sum",
]
