"""The cheaper per-neighbour paths of a SecAgg+ participant check what they checked before.

Issue #24 (per-participant cost at n = 500 vs n = 10) moved Ed25519 verification to
libsodium, stopped verifying a participant's *own* advertisement and consistency
signature (they must equal what it signed, byte for byte). Each is tested here against
the attack the check stops or the behaviour it replaced, with a mutation check where a
rule changed.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from spherecal.crypto import BadSignature, KeySubstitution, generate_identity
from spherecal.crypto import keys as keys_module
from spherecal.crypto import policy as policy_module
from spherecal.crypto.channel import SharePlaintext
from spherecal.crypto.consistency import verify_signed_view
from spherecal.crypto.dealing import open_dealt_share
from spherecal.crypto.kdf import channel_key
from spherecal.crypto.keys import (
    advert_payload,
    agree,
    load_identity_public,
    sign,
    verify,
    verify_openssl,
)
from spherecal.crypto.messages import AdvertiseKeys
from spherecal.crypto.policy import check_roster_keys

from .helpers import Net, flip

# The identity point of edwards25519 (y = 1): a small-order public key. With R the
# identity too and S = 0, the verification equation [S]B = R + [h]A holds for every
# message — a "signature" on anything, which RFC 8032's equation alone accepts.
IDENTITY_POINT = b"\x01" + bytes(31)
UNIVERSAL_SIGNATURE = IDENTITY_POINT + bytes(32)
ORDER_L = 2**252 + 27742317777372353535851937790883648493


# ---------------------------------------------------------------- Ed25519 on libsodium
def test_libsodium_and_openssl_agree_on_honest_and_tampered_signatures() -> None:
    for _ in range(20):
        identity = generate_identity()
        public = identity.public_key()
        other = generate_identity().public_key()
        message = os.urandom(int.from_bytes(os.urandom(1), "big") + 1)
        signature = sign(identity, message)
        cases = [
            (public, signature, message, True),
            (public, flip(signature, 3), message, False),  # R changed
            (public, flip(signature, 40), message, False),  # S changed
            (public, signature, flip(message), False),
            (other, signature, message, False),
        ]
        for key, sig, msg, valid in cases:
            for check in (verify, verify_openssl):
                if valid:
                    check(key, sig, msg, what="t")
                else:
                    with pytest.raises(BadSignature, match="does not verify"):
                        check(key, sig, msg, what="t")


def test_a_non_canonical_s_and_a_short_signature_are_refused() -> None:
    identity = generate_identity()
    message = b"survivors"
    signature = sign(identity, message)
    s = int.from_bytes(signature[32:], "little") + ORDER_L  # same point equation, S >= L
    malleated = signature[:32] + s.to_bytes(32, "little")
    for check in (verify, verify_openssl):
        with pytest.raises(BadSignature, match="does not verify"):
            check(identity.public_key(), malleated, message, what="t")
        with pytest.raises(BadSignature, match="63 bytes"):
            check(identity.public_key(), signature[:63], message, what="t")


def test_libsodium_refuses_the_small_order_key_signature_that_openssl_accepts() -> None:
    """The reason the libsodium path is no weaker: it refuses everything OpenSSL
    refuses (above) and also this universal forgery under a small-order key."""
    key = Ed25519PublicKey.from_public_bytes(IDENTITY_POINT)
    verify_openssl(key, UNIVERSAL_SIGNATURE, b"any message at all", what="t")  # accepted
    with pytest.raises(BadSignature):
        verify(key, UNIVERSAL_SIGNATURE, b"any message at all", what="t")


def _roster_net() -> Net:
    net = Net(5, threshold=3)
    net.advertise()
    return net


def test_a_roster_advert_under_a_small_order_pinned_key_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A site whose pinned key is small-order (a misissued directory entry) would let
    anyone, the coordinator included, advertise keys in its name. Mutation: with
    OpenSSL's verification (the previous rule) the forged advertisement passes."""
    net = _roster_net()
    me, victim = "p00", "p01"
    roster = net.server.roster_for(me)
    forged = replace(
        next(a for a in roster.adverts if a.sender == victim),
        channel_public=os.urandom(32),
        signature=UNIVERSAL_SIGNATURE,
    )
    adverts = tuple(forged if a.sender == victim else a for a in roster.adverts)
    directory = {p: load_identity_public(net.directory[p]) for p in net.ids}
    directory[victim] = Ed25519PublicKey.from_public_bytes(IDENTITY_POINT)
    own = next(a for a in roster.adverts if a.sender == me)
    with pytest.raises(KeySubstitution, match=f"keys listed for {victim!r}"):
        check_roster_keys(net.spec, adverts, directory, me=me, own=own)
    monkeypatch.setattr(policy_module, "verify", keys_module.verify_openssl)
    check_roster_keys(net.spec, adverts, directory, me=me, own=own)  # the attack passes


# ---------------------------------------------------------------- own advert, own signature
def test_own_advert_is_compared_not_verified_and_any_change_is_refused() -> None:
    net = _roster_net()
    me = "p00"
    roster = net.server.roster_for(me)
    own = next(a for a in roster.adverts if a.sender == me)
    directory = {p: load_identity_public(net.directory[p]) for p in net.ids}
    calls: list[str] = []

    def counting(*args: object, what: str, **kwargs: object) -> None:
        calls.append(what)
        keys_module.verify(*args, what=what, **kwargs)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(policy_module, "verify", counting)
        check_roster_keys(net.spec, roster.adverts, directory, me=me, own=own)
    assert len(calls) == len(roster.adverts) - 1
    assert not any(repr(me) in what for what in calls)
    # Substituted keys (signature then invalid), or this participant's advert of the
    # same keys re-signed over another payload: refused either way.
    changed = replace(own, masking_public=os.urandom(32))
    resigned = replace(
        own,
        signature=sign(
            net.identities[me],
            advert_payload(
                spec_digest=net.spec.digest,
                job_id=net.spec.job_id,
                sender=me,
                channel_public=own.channel_public,
                masking_public=own.masking_public,
                commitment=flip(own.seed_commitment),
            ),
        ),
    )
    for bad in (changed, resigned, replace(own, signature=flip(own.signature))):
        adverts = tuple(bad if a.sender == me else a for a in roster.adverts)
        with pytest.raises(KeySubstitution, match="different keys for this participant"):
            check_roster_keys(net.spec, adverts, directory, me=me, own=own)
    # Without its own advert at hand (own=None) the participant verifies it as any other.
    forged = tuple(changed if a.sender == me else a for a in roster.adverts)
    with pytest.raises(KeySubstitution, match="not signed by its pinned"):
        check_roster_keys(net.spec, forged, directory, me=me, own=None)


def _signed_net() -> Net:
    net = Net(7, threshold=4, consistency=True)
    net.advertise()
    net.share()
    net.masked()
    net.consistency()
    return net


def test_own_consistency_signature_must_be_byte_equal_and_others_are_verified() -> None:
    net = _signed_net()
    me = "p00"
    request = net.server.unmask_request_for(me)
    own = net.signatures[me].signature
    assert any(s.signer == me for s in request.signatures)
    directory = {p: load_identity_public(net.directory[p]) for p in net.ids}
    common = dict(
        signed=request.survivors,
        owners=frozenset(net.ids),
        members1=frozenset(net.server.advertised),
        me=me,
        own_signature=own,
    )
    graph = net.spec.masking_graph
    verify_signed_view(net.spec, graph, directory, request, **common)  # type: ignore[arg-type]
    for who in (me, next(s.signer for s in request.signatures if s.signer != me)):
        bad = tuple(
            replace(s, signature=flip(s.signature)) if s.signer == who else s
            for s in request.signatures
        )
        with pytest.raises(BadSignature, match=repr(who)):
            verify_signed_view(
                net.spec,
                graph,
                directory,
                replace(request, signatures=bad),
                **common,  # type: ignore[arg-type]
            )
    # The participant itself refuses a request whose copy of its signature was altered.
    bad = tuple(
        replace(s, signature=flip(s.signature)) if s.signer == me else s for s in request.signatures
    )
    with pytest.raises(BadSignature):
        net.clients[me].unmask(replace(request, signatures=bad))


def test_a_job_with_every_check_on_the_new_paths_sums_exactly() -> None:
    net = Net(9, threshold=5, graph="harary", degree=6, consistency=True)
    result = net.run(drop={"p03": "masked"})
    assert "p03" not in result.contributors
    expected = net.expected(result.contributors)
    assert float(abs(result.values - expected).max()) <= net.tolerance()


def test_a_substituted_own_advert_would_hand_the_coordinator_its_own_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Why the own advertisement must equal what the participant signed: a roster with
    the coordinator's channel key in place of the participant's own makes it seal the
    share it deals to itself under a key the coordinator can compute. Refused by
    default; mutation — the equality check gone (every advertisement compares equal) —
    and the coordinator opens that share."""
    net = _roster_net()
    me = "p00"
    roster = net.server.roster_for(me)
    own = next(a for a in roster.adverts if a.sender == me)
    coordinator = X25519PrivateKey.generate()
    fake = replace(own, channel_public=coordinator.public_key().public_bytes_raw())
    substituted = replace(
        roster, adverts=tuple(fake if a.sender == me else a for a in roster.adverts)
    )
    with pytest.raises(KeySubstitution, match="different keys for this participant"):
        net.clients[me].share_keys(substituted)

    mutated = _roster_net()
    roster = mutated.server.roster_for(me)
    own = next(a for a in roster.adverts if a.sender == me)
    fake = replace(own, channel_public=coordinator.public_key().public_bytes_raw())
    substituted = replace(
        roster, adverts=tuple(fake if a.sender == me else a for a in roster.adverts)
    )
    monkeypatch.setattr(AdvertiseKeys, "__eq__", lambda self, other: True)
    dealt = mutated.clients[me].share_keys(substituted)
    to_self = next(s for s in dealt.shares if s.receiver == me)
    key = channel_key(
        agree(coordinator, own.channel_public),
        spec_digest=mutated.spec.digest,
        job_id=mutated.spec.job_id,
        a=me,
        b=me,
    )
    opened = open_dealt_share(mutated.spec, to_self, dealer=me, holder=me, x=to_self.x, key=key)
    assert isinstance(opened, SharePlaintext)  # the coordinator reads the share
