"""What a participant keeps of a job once its masked input has left, so that a
restarted process can still answer the job's consistency and unmask rounds.

Why this and nothing more: after round 2 (MaskedInputCollection, Bonawitz et al.
2017) a participant's remaining duties are to sign the survivor set (round 3) and
to reveal, for each dealer whose shares it holds, the seed share of a survivor or the
mask-key share of a dropout (round 4). Those need the shares it *holds* (dealt to it
by its neighbours), the sets ``U1``/``U2`` the checks compare against, the survivor
set it already signed (never sign two) and the unmask request it already answered
(never reveal twice). Its own job keys (``s_sk``, ``b_u``, the channel key) and its
input are *not* needed: the masks protect only the masked input, which is never
computed again — so they are not part of this state, and a restored participant
cannot produce a second masked input even if asked (:class:`HeldStage`).

The encoding is canonical JSON (hex for bytes); :meth:`HeldState.from_bytes`
refuses anything else with :class:`~spherecal.crypto._exceptions.MalformedMessage`.
Where it is stored, and sealed, is the site's business
(``spherecal.participant.held_jobs``).

Before the masked input leaves (issue #20, version 2): a site killed at the
advertise or share stage, or while it computes its input, must come back to the
*same* job with the *same* keys — the advertisement the coordinator holds and the
shares its neighbours were dealt are of those keys, and a new key pair would not
match them. So from the moment the keys are made until the masked input is stored,
the state also carries the job keys (:attr:`HeldState.keys`: ``c_sk``, ``s_sk``,
``b_u``), the signed advertisement it sent and, once it dealt its shares, the
neighbours' advertisements of the roster (what its channel keys and pairwise masks
are agreed with). Stages :attr:`HeldStage.ADVERTISED` and :attr:`HeldStage.SHARED`
hold them; :attr:`HeldStage.MASKED` and later never do: the keys together with the
stored masked input would be the input in the clear, so they are dropped from the
state in the same write that names the stored masked input. Version 1 documents
(the later stages alone) are still read.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from spherecal.crypto._exceptions import MalformedMessage
from spherecal.crypto.keys import SEED_BYTES

__all__ = ["HeldStage", "HeldState"]

VERSION = 2
VERSIONS = (1, 2)


class HeldStage(enum.Enum):
    """Where the job stood for this participant when the state was taken."""

    ADVERTISED = "advertised"  # keys made, advertisement signed; the roster to come
    SHARED = "shared"  # shares dealt; the share bundle (and the masked stage) to come
    MASKED = "masked"  # masked input sent (or about to be); consistency/unmask to come
    SIGNED = "signed"  # signed the survivor set; unmask to come
    DONE = "done"  # answered unmask; only an identical repeat is answered again


@dataclass(frozen=True)
class HeldState:
    job_id: bytes
    participant_id: str
    stage: HeldStage
    members1: tuple[str, ...]
    members2: tuple[str, ...]
    held: tuple[tuple[str, int, bytes], ...]
    """(dealer, x, ``SharePlaintext`` bytes) of every share this participant holds;
    empty once it answered unmask (the secrets are then forgotten)."""
    signed_survivors: tuple[str, ...] | None = None
    answered: tuple[bytes, bytes] | None = None
    """(``UnmaskRequest`` bytes, ``UnmaskResponse`` bytes) once answered."""
    keys: tuple[bytes, bytes, bytes] | None = None
    """(``c_sk``, ``s_sk``, ``b_u``) raw: at :attr:`HeldStage.ADVERTISED` and
    :attr:`HeldStage.SHARED` only (see the module docstring)."""
    own_advert: bytes | None = None
    """The ``AdvertiseKeys`` this participant signed and sent (with the keys)."""
    adverts: tuple[bytes, ...] = ()
    """The roster's ``AdvertiseKeys`` (its neighbours' and its own), at
    :attr:`HeldStage.SHARED`."""

    def to_bytes(self) -> bytes:
        document = {
            "version": VERSION,
            "job_id": self.job_id.hex(),
            "participant": self.participant_id,
            "stage": self.stage.value,
            "members1": list(self.members1),
            "members2": list(self.members2),
            "held": [[d, x, p.hex()] for d, x, p in self.held],
            "signed_survivors": (
                None if self.signed_survivors is None else list(self.signed_survivors)
            ),
            "answered": None if self.answered is None else [a.hex() for a in self.answered],
            "keys": None if self.keys is None else [k.hex() for k in self.keys],
            "own_advert": None if self.own_advert is None else self.own_advert.hex(),
            "adverts": [a.hex() for a in self.adverts],
        }
        return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> HeldState:
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("version") not in VERSIONS:
                raise MalformedMessage("held job state: unknown version")
            signed = doc["signed_survivors"]
            answered = doc["answered"]
            keys = doc.get("keys")
            own = doc.get("own_advert")
            state = cls(
                job_id=bytes.fromhex(_str(doc["job_id"])),
                participant_id=_str(doc["participant"]),
                stage=HeldStage(doc["stage"]),
                members1=_names(doc["members1"]),
                members2=_names(doc["members2"]),
                held=tuple(_held(item) for item in _list(doc["held"])),
                signed_survivors=None if signed is None else _names(signed),
                answered=None
                if answered is None
                else (bytes.fromhex(_str(answered[0])), bytes.fromhex(_str(answered[1]))),
                keys=None if keys is None else _keys(keys),
                own_advert=None if own is None else bytes.fromhex(_str(own)),
                adverts=tuple(bytes.fromhex(_str(a)) for a in _list(doc.get("adverts", []))),
            )
        except MalformedMessage:
            raise
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise MalformedMessage(f"held job state is malformed: {exc}") from None
        state.check()
        return state

    def check(self) -> None:
        """Structural consistency (the participant checks it against the spec)."""
        m1, m2 = set(self.members1), set(self.members2)
        early = self.stage in (HeldStage.ADVERTISED, HeldStage.SHARED)
        if early != (self.keys is not None) or early != (self.own_advert is not None):
            raise MalformedMessage(
                "held job state: job keys and the own advertisement belong to the "
                "advertised and shared stages alone"
            )
        if (self.stage is HeldStage.SHARED) != bool(self.adverts):
            raise MalformedMessage("held job state: the roster belongs to the shared stage")
        if early:
            if m2 or self.held or self.signed_survivors is not None:
                raise MalformedMessage(
                    "held job state: no share bundle, shares or signature before the masked stage"
                )
            if self.stage is HeldStage.ADVERTISED and m1:
                raise MalformedMessage("held job state: no roster before the share stage")
            if self.stage is HeldStage.SHARED and self.participant_id not in m1:
                raise MalformedMessage("held job state: U1 must include its owner")
            return
        if not m2 <= m1 or self.participant_id not in m2:
            raise MalformedMessage("held job state: U2 must be within U1 and include its owner")
        dealers = [d for d, _, _ in self.held]
        if len(set(dealers)) != len(dealers) or not set(dealers) <= m1:
            raise MalformedMessage("held job state: shares from unknown or repeated dealers")
        if (self.stage is HeldStage.DONE) != (self.answered is not None):
            raise MalformedMessage("held job state: an answer belongs to the done stage alone")
        if self.stage is HeldStage.DONE and self.held:
            raise MalformedMessage("held job state: a done job holds no shares")


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("expected a string")
    return value


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError("expected a list")
    return value


def _names(value: Any) -> tuple[str, ...]:
    return tuple(_str(v) for v in _list(value))


def _keys(value: Any) -> tuple[bytes, bytes, bytes]:
    channel, masking, seed = (bytes.fromhex(_str(v)) for v in _list(value))
    if len(channel) != 32 or len(masking) != 32 or len(seed) != SEED_BYTES:
        raise TypeError("job keys must be two 32-byte X25519 keys and a seed")
    return channel, masking, seed


def _held(item: Any) -> tuple[str, int, bytes]:
    dealer, x, plaintext = _list(item)
    if not isinstance(x, int) or isinstance(x, bool) or x < 1:
        raise TypeError("share position must be a positive integer")
    return _str(dealer), x, bytes.fromhex(_str(plaintext))
