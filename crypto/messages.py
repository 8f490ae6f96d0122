"""Every protocol message, with a canonical byte encoding.

Why canonical bytes: the service carries these bytes inside protobuf ``bytes``
fields and records their SHA-256 in the audit log. A decoder that accepts exactly
one encoding per message (fixed-width integers, length-prefixed fields, sets in
sorted order, no trailing bytes — see :mod:`spherecal.crypto._codec`) means the hash in the
audit log identifies the message, and ``from_bytes(to_bytes(m)) == m`` always.
pickle is never used. The whole wire contract is in this one file.

Structural rules (sizes, sorted unique lists, valid kinds) are enforced when a
message object is constructed, so a malformed message cannot even be built.
Semantic rules (is this sender in the job, is this the right stage) belong to the
state machines.

Flow (the rounds of Bonawitz et al. 2017's protocol; ``P`` = participant, ``S`` =
coordinator)::

    P -> S  AdvertiseKeys          round 0
    S -> P  KeyRoster              (per recipient: neighbours' signed keys, U1)
    P -> S  ShareKeys              round 1 (encrypted shares, one per holder)
    S -> P  ShareBundle            (per recipient: shares addressed to it, U2)
    P -> S  MaskedChunk x chunks   round 2 (streamed)
    S -> P  ConsistencyRequest     round 3, optional (U3)
    P -> S  ConsistencySignature
    S -> P  UnmaskRequest          round 4 (survivors, dropouts, signatures)
    P -> S  UnmaskResponse
    P -> S  ShareComplaint         any time after round 1: a share from a dealer
                                   failed authentication (signed, names the dealer)
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TypeAlias

from spherecal.crypto._codec import Reader, Writer
from spherecal.crypto._exceptions import MalformedMessage
from spherecal.crypto._fields import fixed as _fixed
from spherecal.crypto._fields import header as _header
from spherecal.crypto._fields import job as _job
from spherecal.crypto._fields import need as _need
from spherecal.crypto._fields import open_message as _open
from spherecal.crypto._fields import pid as _pid
from spherecal.crypto._fields import sorted_unique as _sorted_unique
from spherecal.crypto.channel import (
    CIPHERTEXT_BYTES,
    COMMITMENT_BYTES,
    NONCE_BYTES,
    SALT_BYTES,
    ShareKind,
    share_length,
)
from spherecal.crypto.keys import KEY_BYTES, SIGNATURE_BYTES
from spherecal.crypto.spec import MAGIC, MAX_JOB_ID_BYTES

TYPE_ADVERTISE_KEYS = 0x10
TYPE_KEY_ROSTER = 0x11
TYPE_SHARE_KEYS = 0x12
TYPE_SHARE_BUNDLE = 0x13
TYPE_MASKED_CHUNK = 0x14
TYPE_CONSISTENCY_REQUEST = 0x15
TYPE_CONSISTENCY_SIGNATURE = 0x16
TYPE_UNMASK_REQUEST = 0x17
TYPE_UNMASK_RESPONSE = 0x18
TYPE_SHARE_COMPLAINT = 0x19

__all__ = [
    "AdvertiseKeys",
    "ConsistencyRequest",
    "ConsistencySignature",
    "EncryptedShare",
    "KeyRoster",
    "MaskedChunk",
    "Message",
    "RevealedShare",
    "RoutedShare",
    "ShareBundle",
    "ShareComplaint",
    "ComplaintReason",
    "ShareKeys",
    "SurvivorSignature",
    "UnmaskRequest",
    "UnmaskResponse",
    "decode_message",
]


# ------------------------------------------------------------------- round 0
@dataclass(frozen=True)
class AdvertiseKeys:
    """``P -> S``: the participant's two job public keys, the commitment to its
    self-mask seed, all signed with its long-term identity key."""

    job_id: bytes
    sender: str
    channel_public: bytes
    masking_public: bytes
    seed_commitment: bytes
    signature: bytes

    def __post_init__(self) -> None:
        _job(self.job_id)
        _pid(self.sender, "sender")
        _fixed(self.channel_public, KEY_BYTES, "channel public key")
        _fixed(self.masking_public, KEY_BYTES, "masking public key")
        _fixed(self.seed_commitment, COMMITMENT_BYTES, "seed commitment")
        _fixed(self.signature, SIGNATURE_BYTES, "signature")

    def _write(self, w: Writer) -> Writer:
        return (
            w.blob(self.job_id)
            .text(self.sender)
            .raw(self.channel_public)
            .raw(self.masking_public)
            .raw(self.seed_commitment)
            .raw(self.signature)
        )

    @classmethod
    def _read(cls, r: Reader) -> AdvertiseKeys:
        return cls(
            job_id=r.blob(max_len=MAX_JOB_ID_BYTES),
            sender=r.text(),
            channel_public=r.raw(KEY_BYTES),
            masking_public=r.raw(KEY_BYTES),
            seed_commitment=r.raw(COMMITMENT_BYTES),
            signature=r.raw(SIGNATURE_BYTES),
        )

    def to_bytes(self) -> bytes:
        return self._write(_header(TYPE_ADVERTISE_KEYS)).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> AdvertiseKeys:
        r = _open(data, TYPE_ADVERTISE_KEYS, "AdvertiseKeys")
        msg = cls._read(r)
        r.finish()
        return msg


@dataclass(frozen=True)
class KeyRoster:
    """``S -> P``: who advertised keys (``U1``) and the signed advertisements of the
    recipient's neighbours (and its own), sorted by sender."""

    job_id: bytes
    recipient: str
    members: tuple[str, ...]
    adverts: tuple[AdvertiseKeys, ...]

    def __post_init__(self) -> None:
        _job(self.job_id)
        _pid(self.recipient, "recipient")
        _sorted_unique(self.members, "members")
        _need(isinstance(self.adverts, tuple), "adverts must be a tuple")
        _sorted_unique(tuple(a.sender for a in self.adverts), "advert senders")

    def to_bytes(self) -> bytes:
        w = _header(TYPE_KEY_ROSTER).blob(self.job_id).text(self.recipient).texts(self.members)
        w.u32(len(self.adverts))
        for advert in self.adverts:
            advert._write(w)
        return w.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> KeyRoster:
        r = _open(data, TYPE_KEY_ROSTER, "KeyRoster")
        job_id, recipient, members = r.blob(max_len=MAX_JOB_ID_BYTES), r.text(), r.texts()
        adverts = tuple(AdvertiseKeys._read(r) for _ in range(r.count()))
        r.finish()
        return cls(job_id=job_id, recipient=recipient, members=members, adverts=adverts)


# ------------------------------------------------------------------- round 1
@dataclass(frozen=True)
class EncryptedShare:
    """One dealer's shares for one holder: AES-GCM ciphertext plus the public
    x-coordinate and the two share commitments (also bound as associated data)."""

    receiver: str
    x: int
    mask_key_commitment: bytes
    seed_commitment: bytes
    nonce: bytes
    ciphertext: bytes = field(repr=False)

    def __post_init__(self) -> None:
        _pid(self.receiver, "receiver")
        _need(isinstance(self.x, int) and 1 <= self.x < 1 << 32, "share x-coordinate out of range")
        _fixed(self.mask_key_commitment, COMMITMENT_BYTES, "mask-key share commitment")
        _fixed(self.seed_commitment, COMMITMENT_BYTES, "seed share commitment")
        _fixed(self.nonce, NONCE_BYTES, "nonce")
        _fixed(self.ciphertext, CIPHERTEXT_BYTES, "share ciphertext")

    def _write(self, w: Writer) -> Writer:
        return (
            w.text(self.receiver)
            .u32(self.x)
            .raw(self.mask_key_commitment)
            .raw(self.seed_commitment)
            .raw(self.nonce)
            .raw(self.ciphertext)
        )

    @classmethod
    def _read(cls, r: Reader) -> EncryptedShare:
        return cls(
            receiver=r.text(),
            x=r.u32(),
            mask_key_commitment=r.raw(COMMITMENT_BYTES),
            seed_commitment=r.raw(COMMITMENT_BYTES),
            nonce=r.raw(NONCE_BYTES),
            ciphertext=r.raw(CIPHERTEXT_BYTES),
        )


@dataclass(frozen=True)
class ShareKeys:
    """``P -> S``: the sender's encrypted shares, one per holder (itself included),
    sorted by receiver."""

    job_id: bytes
    sender: str
    shares: tuple[EncryptedShare, ...]

    def __post_init__(self) -> None:
        _job(self.job_id)
        _pid(self.sender, "sender")
        _need(isinstance(self.shares, tuple), "shares must be a tuple")
        _sorted_unique(tuple(s.receiver for s in self.shares), "share receivers")

    def to_bytes(self) -> bytes:
        w = _header(TYPE_SHARE_KEYS).blob(self.job_id).text(self.sender).u32(len(self.shares))
        for share in self.shares:
            share._write(w)
        return w.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> ShareKeys:
        r = _open(data, TYPE_SHARE_KEYS, "ShareKeys")
        job_id, sender = r.blob(max_len=MAX_JOB_ID_BYTES), r.text()
        shares = tuple(EncryptedShare._read(r) for _ in range(r.count()))
        r.finish()
        return cls(job_id=job_id, sender=sender, shares=shares)


@dataclass(frozen=True)
class RoutedShare:
    """An :class:`EncryptedShare` with the dealer that sent it."""

    sender: str
    share: EncryptedShare

    def __post_init__(self) -> None:
        _pid(self.sender, "sender")


@dataclass(frozen=True)
class ShareBundle:
    """``S -> P``: who completed key sharing (``U2``) and every share addressed to
    the recipient, sorted by dealer."""

    job_id: bytes
    recipient: str
    members: tuple[str, ...]
    items: tuple[RoutedShare, ...]

    def __post_init__(self) -> None:
        _job(self.job_id)
        _pid(self.recipient, "recipient")
        _sorted_unique(self.members, "members")
        _need(isinstance(self.items, tuple), "items must be a tuple")
        _sorted_unique(tuple(i.sender for i in self.items), "share senders")

    def to_bytes(self) -> bytes:
        w = _header(TYPE_SHARE_BUNDLE).blob(self.job_id).text(self.recipient).texts(self.members)
        w.u32(len(self.items))
        for item in self.items:
            item.share._write(w.text(item.sender))
        return w.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> ShareBundle:
        r = _open(data, TYPE_SHARE_BUNDLE, "ShareBundle")
        job_id, recipient, members = r.blob(max_len=MAX_JOB_ID_BYTES), r.text(), r.texts()
        items = []
        for _ in range(r.count()):
            sender = r.text()
            items.append(RoutedShare(sender=sender, share=EncryptedShare._read(r)))
        r.finish()
        return cls(job_id=job_id, recipient=recipient, members=members, items=tuple(items))


# ------------------------------------------------------------------- round 2
@dataclass(frozen=True)
class MaskedChunk:
    """``P -> S``: entries ``[i*chunk, (i+1)*chunk)`` of the masked input ``y_u`` as
    little-endian words of the job's ring (uint32 or uint64; the server checks the
    length against the spec). Framing is ~``40 + len(ids)`` bytes per chunk."""

    job_id: bytes
    sender: str
    index: int
    payload: bytes | memoryview = field(repr=False)
    """The ring words; :meth:`from_bytes` leaves them a read-only view of the
    received message (zero-copy: the server adds them into its sum in one pass)."""
    _wire: bytes | None = field(default=None, init=False, repr=False, compare=False)
    """The encoding, when :meth:`framed` built the chunk around it (its payload is a view
    into it, so :meth:`to_bytes` copies nothing)."""

    @classmethod
    def framed(
        cls,
        job_id: bytes,
        sender: str,
        index: int,
        nbytes: int,
        write: Callable[[bytes], bytes],
    ) -> MaskedChunk:
        """A chunk of ``nbytes`` payload bytes whose encoding is written once: ``write``
        gets the encoding's prefix (every field before the payload) and returns the whole
        encoding, prefix and payload, as one ``bytes`` (issue #24: the participant's
        masking kernel writes the masked words straight into it)."""
        if type(job_id) is bytes and type(sender) is str:
            head = _chunk_head(job_id, sender)
        else:  # not hashable, or a subclass: built afresh (and refused below if invalid)
            head = _header(TYPE_MASKED_CHUNK).blob(job_id).text(sender).getvalue()
        prefix = head + _INDEX_AND_LENGTH.pack(index, nbytes)
        wire = write(prefix)
        _need(
            isinstance(wire, bytes)
            and len(wire) == len(prefix) + nbytes
            and wire.startswith(prefix),
            "a framed chunk must be its prefix and nbytes of payload",
        )
        chunk = cls(
            job_id=job_id, sender=sender, index=index, payload=memoryview(wire)[len(prefix) :]
        )
        object.__setattr__(chunk, "_wire", wire)
        return chunk

    def __post_init__(self) -> None:
        _job(self.job_id)
        _pid(self.sender, "sender")
        _need(isinstance(self.index, int) and 0 <= self.index < 1 << 32, "chunk index out of range")
        _need(
            (
                isinstance(self.payload, bytes)
                or (isinstance(self.payload, memoryview) and self.payload.readonly)
            )
            and len(self.payload) % 4 == 0,
            "chunk payload must be whole ring words",
        )

    def to_bytes(self) -> bytes:
        if self._wire is not None:
            return self._wire
        w = _header(TYPE_MASKED_CHUNK).blob(self.job_id).text(self.sender).u32(self.index)
        return w.blob(self.payload).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> MaskedChunk:
        r = _open(data, TYPE_MASKED_CHUNK, "MaskedChunk")
        job_id, sender, index = r.blob(max_len=MAX_JOB_ID_BYTES), r.text(), r.u32()
        payload = r.blob_view()
        if not payload.readonly:  # a mutable buffer: the caller may reuse it, so copy
            payload = memoryview(bytes(payload))
        r.finish()
        return cls(job_id=job_id, sender=sender, index=index, payload=payload)


_INDEX_AND_LENGTH = struct.Struct(">II")


@lru_cache(maxsize=64)
def _chunk_head(job_id: bytes, sender: str) -> bytes:
    """The fields of a :class:`MaskedChunk` encoding before its index — the same for every
    chunk of one sender's job, so built once, not per chunk (issue #24: the per-chunk
    Python work sits between two calls of the masking kernel)."""
    return _header(TYPE_MASKED_CHUNK).blob(job_id).text(sender).getvalue()


# ------------------------------------------------------------------- round 3
@dataclass(frozen=True)
class ConsistencyRequest:
    """``S -> P``: the survivor set ``U3`` (participants whose masked input is in the
    sum), to be signed."""

    job_id: bytes
    survivors: tuple[str, ...]

    def __post_init__(self) -> None:
        _job(self.job_id)
        _sorted_unique(self.survivors, "survivors")

    def to_bytes(self) -> bytes:
        return _header(TYPE_CONSISTENCY_REQUEST).blob(self.job_id).texts(self.survivors).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> ConsistencyRequest:
        r = _open(data, TYPE_CONSISTENCY_REQUEST, "ConsistencyRequest")
        job_id, survivors = r.blob(max_len=MAX_JOB_ID_BYTES), r.texts()
        r.finish()
        return cls(job_id=job_id, survivors=survivors)


@dataclass(frozen=True)
class ConsistencySignature:
    """``P -> S``: the sender's signature over (job, ``U3``)."""

    job_id: bytes
    sender: str
    signature: bytes

    def __post_init__(self) -> None:
        _job(self.job_id)
        _pid(self.sender, "sender")
        _fixed(self.signature, SIGNATURE_BYTES, "signature")

    def to_bytes(self) -> bytes:
        w = _header(TYPE_CONSISTENCY_SIGNATURE).blob(self.job_id).text(self.sender)
        return w.raw(self.signature).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> ConsistencySignature:
        r = _open(data, TYPE_CONSISTENCY_SIGNATURE, "ConsistencySignature")
        msg = cls(
            job_id=r.blob(max_len=MAX_JOB_ID_BYTES),
            sender=r.text(),
            signature=r.raw(SIGNATURE_BYTES),
        )
        r.finish()
        return msg


# ------------------------------------------------------------------- round 4
@dataclass(frozen=True)
class SurvivorSignature:
    """One participant's consistency signature, as forwarded by the coordinator."""

    signer: str
    signature: bytes

    def __post_init__(self) -> None:
        _pid(self.signer, "signer")
        _fixed(self.signature, SIGNATURE_BYTES, "signature")


@dataclass(frozen=True)
class UnmaskRequest:
    """``S -> P``: reveal seed shares of ``survivors`` and mask-key shares of
    ``dropouts``; with the consistency check, the survivors' signatures over
    ``survivors`` (sorted by signer)."""

    job_id: bytes
    recipient: str
    survivors: tuple[str, ...]
    dropouts: tuple[str, ...]
    signatures: tuple[SurvivorSignature, ...] = ()

    def __post_init__(self) -> None:
        _job(self.job_id)
        _pid(self.recipient, "recipient")
        _sorted_unique(self.survivors, "survivors")
        _sorted_unique(self.dropouts, "dropouts")
        _need(isinstance(self.signatures, tuple), "signatures must be a tuple")
        _sorted_unique(tuple(s.signer for s in self.signatures), "signers")

    def to_bytes(self) -> bytes:
        w = _header(TYPE_UNMASK_REQUEST).blob(self.job_id).text(self.recipient)
        w.texts(self.survivors).texts(self.dropouts).u32(len(self.signatures))
        for sig in self.signatures:
            w.text(sig.signer).raw(sig.signature)
        return w.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> UnmaskRequest:
        r = _open(data, TYPE_UNMASK_REQUEST, "UnmaskRequest")
        job_id, recipient = r.blob(max_len=MAX_JOB_ID_BYTES), r.text()
        survivors, dropouts = r.texts(), r.texts()
        sigs = tuple(
            SurvivorSignature(signer=r.text(), signature=r.raw(SIGNATURE_BYTES))
            for _ in range(r.count())
        )
        r.finish()
        return cls(
            job_id=job_id,
            recipient=recipient,
            survivors=survivors,
            dropouts=dropouts,
            signatures=sigs,
        )


@dataclass(frozen=True)
class RevealedShare:
    """A holder's share of one secret of ``owner``: ``kind`` SEED for a survivor,
    MASK_KEY for a dropout — never both for one owner."""

    owner: str
    kind: ShareKind
    x: int
    share: bytes = field(repr=False)
    salt: bytes = field(repr=False)

    def __post_init__(self) -> None:
        _pid(self.owner, "owner")
        _need(isinstance(self.kind, ShareKind), "unknown share kind")
        _need(isinstance(self.x, int) and 1 <= self.x < 1 << 32, "share x-coordinate out of range")
        _fixed(self.share, share_length(self.kind), "revealed share")
        _fixed(self.salt, SALT_BYTES, "share salt")


@dataclass(frozen=True)
class UnmaskResponse:
    """``P -> S``: the revealed shares, sorted by owner (one kind per owner)."""

    job_id: bytes
    sender: str
    shares: tuple[RevealedShare, ...]

    def __post_init__(self) -> None:
        _job(self.job_id)
        _pid(self.sender, "sender")
        _need(isinstance(self.shares, tuple), "shares must be a tuple")
        _sorted_unique(tuple(s.owner for s in self.shares), "revealed owners")

    def to_bytes(self) -> bytes:
        w = _header(TYPE_UNMASK_RESPONSE).blob(self.job_id).text(self.sender)
        w.u32(len(self.shares))
        for s in self.shares:
            w.text(s.owner).u8(int(s.kind)).u32(s.x).blob(s.share).raw(s.salt)
        return w.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> UnmaskResponse:
        r = _open(data, TYPE_UNMASK_RESPONSE, "UnmaskResponse")
        job_id, sender = r.blob(max_len=MAX_JOB_ID_BYTES), r.text()
        shares = []
        for _ in range(r.count()):
            owner, kind_code, x = r.text(), r.u8(), r.u32()
            try:
                kind = ShareKind(kind_code)
            except ValueError as exc:
                raise MalformedMessage(f"unknown share kind {kind_code}") from exc
            shares.append(
                RevealedShare(
                    owner=owner,
                    kind=kind,
                    x=x,
                    share=r.blob(exact=share_length(kind)),
                    salt=r.raw(SALT_BYTES),
                )
            )
        r.finish()
        return cls(job_id=job_id, sender=sender, shares=tuple(shares))


# ------------------------------------------------------------------ complaints
class ComplaintReason(enum.IntEnum):
    """Why a holder refused a dealer's share."""

    DECRYPTION_FAILED = 1  # the AES-GCM tag did not verify
    COMMITMENT_MISMATCH = 2  # decrypted share does not match its published commitment
    WRONG_POSITION = 3  # the share's x-coordinate is not the holder's position


@dataclass(frozen=True)
class ShareComplaint:
    """``P -> S``: the complainant's Ed25519 signature (identity key) over
    (spec digest, job, complainant, dealer, reason), naming a dealer whose share to
    it failed authentication. The coordinator verifies it and may exclude the dealer
    when it retries the job (:meth:`crypto.SecAggServer.receive_complaint`)."""

    job_id: bytes
    complainant: str
    dealer: str
    reason: ComplaintReason
    signature: bytes

    def __post_init__(self) -> None:
        _job(self.job_id)
        _pid(self.complainant, "complainant")
        _pid(self.dealer, "dealer")
        _need(isinstance(self.reason, ComplaintReason), "unknown complaint reason")
        _need(self.dealer != self.complainant, "a participant cannot complain about itself")
        _fixed(self.signature, SIGNATURE_BYTES, "signature")

    def to_bytes(self) -> bytes:
        w = _header(TYPE_SHARE_COMPLAINT).blob(self.job_id).text(self.complainant)
        return w.text(self.dealer).u8(int(self.reason)).raw(self.signature).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> ShareComplaint:
        r = _open(data, TYPE_SHARE_COMPLAINT, "ShareComplaint")
        job_id, complainant, dealer, code = (
            r.blob(max_len=MAX_JOB_ID_BYTES),
            r.text(),
            r.text(),
            r.u8(),
        )
        try:
            reason = ComplaintReason(code)
        except ValueError as exc:
            raise MalformedMessage(f"unknown complaint reason {code}") from exc
        msg = cls(
            job_id=job_id,
            complainant=complainant,
            dealer=dealer,
            reason=reason,
            signature=r.raw(SIGNATURE_BYTES),
        )
        r.finish()
        return msg


Message: TypeAlias = (
    AdvertiseKeys
    | KeyRoster
    | ShareKeys
    | ShareBundle
    | MaskedChunk
    | ConsistencyRequest
    | ConsistencySignature
    | UnmaskRequest
    | UnmaskResponse
    | ShareComplaint
)

_DECODERS: dict[int, Callable[[bytes | bytearray | memoryview], Message]] = {
    TYPE_ADVERTISE_KEYS: AdvertiseKeys.from_bytes,
    TYPE_KEY_ROSTER: KeyRoster.from_bytes,
    TYPE_SHARE_KEYS: ShareKeys.from_bytes,
    TYPE_SHARE_BUNDLE: ShareBundle.from_bytes,
    TYPE_MASKED_CHUNK: MaskedChunk.from_bytes,
    TYPE_CONSISTENCY_REQUEST: ConsistencyRequest.from_bytes,
    TYPE_CONSISTENCY_SIGNATURE: ConsistencySignature.from_bytes,
    TYPE_UNMASK_REQUEST: UnmaskRequest.from_bytes,
    TYPE_UNMASK_RESPONSE: UnmaskResponse.from_bytes,
    TYPE_SHARE_COMPLAINT: ShareComplaint.from_bytes,
}


def decode_message(data: bytes | bytearray | memoryview) -> Message:
    """Decode any protocol message by its type byte (raises :class:`MalformedMessage`)."""
    view = memoryview(data).cast("B")
    if len(view) < 6 or bytes(view[:4]) != MAGIC:
        raise MalformedMessage("not a spherecal secagg message")
    decoder = _DECODERS.get(view[5])
    if decoder is None:
        raise MalformedMessage(f"unknown message type 0x{view[5]:02x}")
    return decoder(view)
