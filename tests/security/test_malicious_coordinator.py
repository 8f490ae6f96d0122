"""A malicious coordinator, at the crypto level, against real ``SecAggParticipant``s.

Each attack of issue #9 that lives in the protocol is played by a coordinator test
double that sends real participants whatever messages suit it. Every attack is a
function ``attack(policy) -> Outcome``: either the coordinator ends with the target's
*exact* input (recovered) or a participant refused with a typed
:class:`PolicyViolation` (refusal). The tests show

* with the rule relaxed the attack really works (the check is not vacuous);
* with the default :class:`SecAggPolicy` it ends in the typed refusal;
* **mutation check**: with exactly one policy check function of :mod:`spherecal.crypto.policy`
  replaced by a no-op, the matching attack test fails — for the five checks that
  are the only barrier, the attack then recovers the input. Two checks have a
  second line of defence in the state machine (``DoubleReveal``: secrets are wiped
  after the first answer; both share kinds: the reveal loop and the one-share-per-
  owner wire format); removing those checks loses the typed refusal (so a test
  fails) but still recovers nothing, which is asserted too.

Where a rule has a back-stop in another policy rule (e.g. a 2-party job is refused
both for too few participants and too few inputs), the attack's ``baseline`` policy
relaxes the back-stop explicitly, so that the rule under test is the only barrier.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

import spherecal.crypto.policy as policy_module
from spherecal.crypto import (
    AdvertiseKeys,
    JobSpec,
    KeyRoster,
    MemoryJobLedger,
    PolicyViolation,
    RoutedShare,
    SecAggParticipant,
    SecAggPolicy,
    SecAggServer,
    ShareBundle,
    ShareKind,
    UnmaskRequest,
    UnmaskResponse,
    generate_identity,
    identity_public_bytes,
    run_protocol,
    shamir,
)
from spherecal.crypto.dealing import deal_shares, open_dealt_share
from spherecal.crypto.kdf import channel_key, pairwise_mask_seed, self_mask_seed
from spherecal.crypto.keys import JobKeys, advert_payload, agree, seed_commitment, sign
from spherecal.crypto.messages import ShareKeys
from spherecal.crypto.prg import keystream_words
from spherecal.crypto.ring import decode

LENGTH = 6
RELAXED = SecAggPolicy(
    require_consistency_round=False,
    require_majority_threshold=False,
    min_participants=2,
    min_inputs=2,
)


@dataclass
class Outcome:
    target: npt.NDArray[np.float64]
    recovered: npt.NDArray[np.float64] | None = None
    refusal: PolicyViolation | None = None
    scale_bits: int = 40

    def succeeded(self) -> bool:
        """The coordinator learned the target's input exactly (fixed-point rounding)."""
        if self.recovered is None:
            return False
        return bool(np.all(np.abs(self.recovered - self.target) <= 4 * 2.0**-self.scale_bits))


# ----------------------------------------------------------------- the double
class Job:
    """Real participants of one job; the test plays the coordinator."""

    def __init__(self, spec: JobSpec, policy: SecAggPolicy, seed: int = 0) -> None:
        self.spec = spec
        self.ids = list(spec.participants)
        self.identities = {p: generate_identity() for p in self.ids}
        self.directory = {p: identity_public_bytes(k) for p, k in self.identities.items()}
        ledger = MemoryJobLedger()
        self.clients = {
            p: SecAggParticipant(
                spec, p, self.identities[p], self.directory, ledger=ledger, policy=policy
            )
            for p in self.ids
        }
        rng = np.random.default_rng(seed)
        self.inputs = {p: rng.uniform(-1, 1, spec.length) for p in self.ids}
        self.server = SecAggServer(spec, self.directory)  # used for honest routing only
        self.adverts: dict[str, AdvertiseKeys] = {}

    def honest_until_masked(self) -> None:
        for p in self.ids:
            self.adverts[p] = self.clients[p].advertise_keys()
            self.server.receive(self.adverts[p], sender=p)
        self.server.close_stage()
        for p in self.ids:
            self.server.receive(self.clients[p].share_keys(self.server.roster_for(p)), sender=p)
        self.server.close_stage()

    def masked_input(self, p: str) -> npt.NDArray[np.uint64]:
        client = self.clients[p]
        client.set_input(self.inputs[p])
        return np.concatenate(
            [np.frombuffer(c.payload, dtype=np.uint64) for c in client.masked_chunks()]
        )


def collect(
    responses: list[UnmaskResponse],
) -> dict[tuple[str, ShareKind], list[tuple[int, bytes]]]:
    out: dict[tuple[str, ShareKind], list[tuple[int, bytes]]] = {}
    for response in responses:
        for s in response.shares:
            out.setdefault((s.owner, s.kind), []).append((s.x, s.share))
    return out


def strip(
    spec: JobSpec,
    y: npt.NDArray[np.uint64],
    owner: str,
    seed: bytes,
    pair_secrets: Mapping[str, bytes],
) -> npt.NDArray[np.float64]:
    """``x_owner`` from its masked input, its self-mask seed and the X25519 shared
    secret it has with every peer it masked against (the attacker's computation)."""
    x = y.copy()
    x -= keystream_words(
        self_mask_seed(seed, spec_digest=spec.digest, job_id=spec.job_id, owner=owner),
        0,
        spec.length,
    )
    for peer, shared in pair_secrets.items():
        words = keystream_words(
            pairwise_mask_seed(
                shared, spec_digest=spec.digest, job_id=spec.job_id, a=owner, b=peer
            ),
            0,
            spec.length,
        )
        if owner < peer:
            x -= words
        else:
            x += words
    return decode(x, scale_bits=spec.scale_bits)


def refused(target: npt.NDArray[np.float64], run: Callable[[], Outcome]) -> Outcome:
    try:
        return run()
    except PolicyViolation as exc:
        return Outcome(target=target, refusal=exc)


# ----------------------------------------------------------------- the attacks
def cover_views(ids: list[str], x: str, targets: list[str], t: int) -> dict[str, set[str]]:
    """Dropout sets D_h for every holder h != x so that each target is listed as a
    dropout by t holders, with every |D_h| <= n - t (each holder still sees t
    survivors)."""
    n = len(ids)
    room = {h: n - t for h in ids if h != x}
    views: dict[str, set[str]] = {h: set() for h in room}
    for v in targets:
        eligible = sorted((h for h in room if h != v and room[h] > 0), key=lambda h: -room[h])
        assert len(eligible) >= t, "no consistent-looking cover exists for this n"
        for h in eligible[:t]:
            views[h].add(v)
            room[h] -= 1
    return views


def inconsistent_views(policy: SecAggPolicy, n: int = 5) -> Outcome:
    """Issue #9: show target X a survivor list of X and t-1 peers T (and U2 = X ∪ T,
    so X masks only against T), and tell the other holders, each separately, that
    (some of) T dropped and X survived. Every request passes each holder's own
    checks; together they reveal b_X and the mask keys of all of T."""
    t = n // 2 + 1
    ids = [f"p{i:02d}" for i in range(n)]
    spec = JobSpec.create(ids, threshold=t, length=LENGTH, bound=1.0, consistency_check=False)
    x, peers = ids[0], ids[1:t]
    target = np.random.default_rng(0).uniform(-1, 1, LENGTH)

    def run() -> Outcome:
        job = Job(spec, policy)
        job.inputs[x] = target
        job.honest_until_masked()
        full = job.server.bundle_for(x)
        u2_x = frozenset([x, *peers])
        job.clients[x].receive_shares(
            replace(
                full,
                members=tuple(sorted(u2_x)),
                items=tuple(i for i in full.items if i.sender in u2_x),
            )
        )
        y = job.masked_input(x)
        for p in ids[1:]:
            job.clients[p].receive_shares(job.server.bundle_for(p))
        views: dict[str, tuple[frozenset[str], frozenset[str]]] = {x: (u2_x, frozenset())}
        for h, dropouts in cover_views(ids, x, peers, t).items():
            views[h] = (frozenset(ids) - dropouts, frozenset(dropouts))
        responses = [
            job.clients[h].unmask(
                UnmaskRequest(
                    job_id=spec.job_id,
                    recipient=h,
                    survivors=tuple(sorted(s)),
                    dropouts=tuple(sorted(d)),
                )
            )
            for h, (s, d) in views.items()
        ]
        shares = collect(responses)
        seed = shamir.combine(shares[(x, ShareKind.SEED)], t)
        secrets_ = {}
        for v in peers:
            key = X25519PrivateKey.from_private_bytes(
                shamir.combine(shares[(v, ShareKind.MASK_KEY)], t)
            )
            secrets_[v] = agree(key, job.adverts[x].masking_public)
        return Outcome(target, strip(spec, y, x, seed, secrets_), scale_bits=spec.scale_bits)

    return refused(target, run)


def two_holder_groups(policy: SecAggPolicy) -> Outcome:
    """t = 2 of 5: holders {X, a} are told X survived (seed shares of X), holders
    {b, c} that X dropped (mask-key shares of X): both secrets of X."""
    ids = [f"p{i:02d}" for i in range(5)]
    spec = JobSpec.create(ids, threshold=2, length=LENGTH, bound=1.0)
    x = ids[0]
    target = np.random.default_rng(1).uniform(-1, 1, LENGTH)

    def run() -> Outcome:
        job = Job(spec, policy)
        job.inputs[x] = target
        job.honest_until_masked()
        for p in ids:
            job.clients[p].receive_shares(job.server.bundle_for(p))
        y = job.masked_input(x)
        requests = {
            "p00": (("p00", "p01", "p04"), ()),
            "p01": (("p00", "p01", "p04"), ()),
            "p02": (("p02", "p03", "p04"), ("p00",)),
            "p03": (("p02", "p03", "p04"), ("p00",)),
        }
        shares = collect(
            [
                job.clients[h].unmask(
                    UnmaskRequest(job_id=spec.job_id, recipient=h, survivors=s, dropouts=d)
                )
                for h, (s, d) in requests.items()
            ]
        )
        seed = shamir.combine(shares[(x, ShareKind.SEED)], 2)
        key = X25519PrivateKey.from_private_bytes(
            shamir.combine(shares[(x, ShareKind.MASK_KEY)], 2)
        )
        secrets_ = {v: agree(key, job.adverts[v].masking_public) for v in ids[1:]}
        return Outcome(target, strip(spec, y, x, seed, secrets_), scale_bits=spec.scale_bits)

    return refused(target, run)


def differencing(policy: SecAggPolicy, *, size: int) -> Outcome:
    """Three jobs over the same inputs of A, B, C, each revealing a sum of two:
    A = (A+B + A+C - (B+C)) / 2. ``size`` 2: three 2-party jobs; ``size`` 3: three
    3-party jobs in which the coordinator claims one participant dropped before its
    masked input arrived (exactly what an honest server does for a real dropout)."""
    rng = np.random.default_rng(2)
    inputs = {p: rng.uniform(-1, 1, LENGTH) for p in ("a", "b", "c")}
    sums = {}
    for pair in (("a", "b"), ("b", "c"), ("a", "c")):
        if size == 2:
            spec = JobSpec.create(pair, threshold=2, length=LENGTH, bound=1.0)
            job_inputs, drop = {p: inputs[p] for p in pair}, {}
        else:
            spec = JobSpec.create(inputs, threshold=2, length=LENGTH, bound=1.0, min_participants=2)
            job_inputs = inputs
            drop = {next(p for p in inputs if p not in pair): "masked"}
        try:
            report = run_protocol(spec, job_inputs, drop=drop, policy=policy, rng=random.Random(0))
        except PolicyViolation as exc:
            return Outcome(target=inputs["a"], refusal=exc)
        sums[pair] = report.result.values
    recovered = (sums[("a", "b")] + sums[("a", "c")] - sums[("b", "c")]) / 2
    return Outcome(inputs["a"], recovered, scale_bits=spec.scale_bits)


def substituted_keys(policy: SecAggPolicy) -> Outcome:
    """Man in the middle on key agreement: X's roster lists keys the coordinator made
    for every peer (signed with the coordinator's own key, not the peers' pinned
    identities). X deals its shares to the coordinator and masks with keys it knows."""
    ids = [f"p{i:02d}" for i in range(5)]
    spec = JobSpec.create(ids, threshold=3, length=LENGTH, bound=1.0)
    x = ids[0]
    target = np.random.default_rng(3).uniform(-1, 1, LENGTH)

    def run() -> Outcome:
        job = Job(spec, policy)
        job.inputs[x] = target
        own = job.clients[x].advertise_keys()
        mallory = generate_identity()
        fakes = {p: JobKeys.generate() for p in ids[1:]}
        adverts = [own]
        for p, keys in fakes.items():
            commitment = seed_commitment(spec.digest, p, keys.seed)
            payload = advert_payload(
                spec_digest=spec.digest,
                job_id=spec.job_id,
                sender=p,
                channel_public=keys.channel_public,
                masking_public=keys.masking_public,
                commitment=commitment,
            )
            adverts.append(
                AdvertiseKeys(
                    job_id=spec.job_id,
                    sender=p,
                    channel_public=keys.channel_public,
                    masking_public=keys.masking_public,
                    seed_commitment=commitment,
                    signature=sign(mallory, payload),
                )
            )
        roster = KeyRoster(
            job_id=spec.job_id, recipient=x, members=tuple(ids), adverts=tuple(adverts)
        )
        dealt: ShareKeys = job.clients[x].share_keys(roster)

        def key_with_x(p: str) -> bytes:
            shared = agree(fakes[p].channel, own.channel_public)
            return channel_key(shared, spec_digest=spec.digest, job_id=spec.job_id, a=p, b=x)

        items = []
        for p in ids:
            if p == x:
                share = next(s for s in dealt.shares if s.receiver == x)
            else:
                share = deal_shares(
                    spec,
                    owner=p,
                    holders=ids,
                    mask_key=fakes[p].masking_private_bytes(),
                    seed=fakes[p].seed,
                    channel_key=functools.partial(lambda p, h: key_with_x(p), p),
                )[0]
            items.append(RoutedShare(sender=p, share=share))
        job.clients[x].receive_shares(
            ShareBundle(job_id=spec.job_id, recipient=x, members=tuple(ids), items=tuple(items))
        )
        y = job.masked_input(x)
        seed_shares = []
        for share in dealt.shares:
            if share.receiver == x:
                continue
            opened = open_dealt_share(
                spec,
                share,
                dealer=x,
                holder=share.receiver,
                x=share.x,
                key=key_with_x(share.receiver),
            )
            assert not isinstance(opened, int)
            seed_shares.append((share.x, opened.share(ShareKind.SEED)[0]))
        seed = shamir.combine(seed_shares, spec.threshold)
        secrets_ = {p: agree(fakes[p].masking, own.masking_public) for p in ids[1:]}
        return Outcome(target, strip(spec, y, x, seed, secrets_), scale_bits=spec.scale_bits)

    return refused(target, run)


def _until_unmask(policy: SecAggPolicy) -> tuple[Job, UnmaskRequest]:
    ids = [f"p{i:02d}" for i in range(5)]
    spec = JobSpec.create(ids, threshold=3, length=LENGTH, bound=1.0)
    job = Job(spec, policy)
    job.honest_until_masked()
    for p in ids:
        job.clients[p].receive_shares(job.server.bundle_for(p))
        job.clients[p].set_input(job.inputs[p])
        for chunk in job.clients[p].masked_chunks():
            job.server.receive(chunk, sender=p)
    job.server.close_stage()
    request = job.server.consistency_request()
    for p in ids:
        job.server.receive(job.clients[p].consistency_signature(request), sender=p)
    job.server.close_stage()
    return job, job.server.unmask_request_for("p00")


def double_reveal(policy: SecAggPolicy) -> Outcome:
    """Ask p00 twice: first with p04 a survivor (seed share of p04), then with p04 a
    dropout (mask-key share of p04). Both kinds of p04 from one holder — repeated
    over t holders that is p04's input."""
    job, first = _until_unmask(policy)
    target = job.inputs["p04"]
    job.clients["p00"].unmask(first)
    second = replace(first, dropouts=("p04",))
    try:
        answer = job.clients["p00"].unmask(second)
    except PolicyViolation as exc:
        return Outcome(target=target, refusal=exc)
    kinds = {(s.owner, s.kind) for s in answer.shares}
    assert ("p04", ShareKind.MASK_KEY) not in kinds  # the back-stop: secrets were wiped
    return Outcome(target=target)


def both_kinds(policy: SecAggPolicy) -> Outcome:
    """One request listing p04 both as survivor and as dropout."""
    job, request = _until_unmask(policy)
    target = job.inputs["p04"]
    try:
        answer = job.clients["p00"].unmask(replace(request, dropouts=("p04",)))
    except PolicyViolation as exc:
        return Outcome(target=target, refusal=exc)
    kinds = [s.kind for s in answer.shares if s.owner == "p04"]
    assert kinds == [ShareKind.SEED]  # the back-stop: one kind per owner
    return Outcome(target=target)


# ----------------------------------------------------------------- the table
@dataclass(frozen=True)
class Attack:
    run: Callable[[SecAggPolicy], Outcome]
    kind: str  # the refusal the default policy gives
    check: str  # the spherecal.crypto.policy function that refuses it
    baseline: SecAggPolicy  # default with any back-stop rule relaxed
    unsafe: SecAggPolicy | None  # a policy under which the attack works (None: none)


ATTACKS = {
    **{
        f"inconsistent_views_n{n}": Attack(
            run=functools.partial(inconsistent_views, n=n),
            kind="consistency_round_required",
            check="check_consistency_round",
            baseline=SecAggPolicy(),
            unsafe=SecAggPolicy(require_consistency_round=False),
        )
        for n in (5, 7, 8, 10)
    },
    "low_threshold": Attack(
        run=two_holder_groups,
        kind="threshold_too_low",
        check="check_threshold",
        baseline=SecAggPolicy(require_consistency_round=False),
        unsafe=SecAggPolicy(require_consistency_round=False, require_majority_threshold=False),
    ),
    "two_party_jobs": Attack(
        run=lambda p: differencing(p, size=2),
        kind="too_few_participants",
        check="check_participants",
        baseline=SecAggPolicy(min_inputs=2),
        unsafe=RELAXED,
    ),
    "two_input_sums": Attack(
        run=lambda p: differencing(p, size=3),
        kind="too_few_inputs",
        check="check_inputs",
        baseline=SecAggPolicy(),
        unsafe=SecAggPolicy(min_inputs=2),
    ),
    "key_substitution": Attack(
        run=substituted_keys,
        kind="key_substitution",
        check="check_roster_keys",
        baseline=SecAggPolicy(),
        unsafe=None,  # not configurable: keys are always checked
    ),
    "double_reveal": Attack(
        run=double_reveal,
        kind="double_reveal",
        check="check_no_double_reveal",
        baseline=SecAggPolicy(),
        unsafe=None,
    ),
    "both_share_kinds": Attack(
        run=both_kinds,
        kind="both_share_kinds",
        check="check_one_kind_per_peer",
        baseline=SecAggPolicy(),
        unsafe=None,
    ),
}
SOLE_BARRIER = {
    "check_consistency_round",
    "check_threshold",
    "check_participants",
    "check_inputs",
    "check_roster_keys",
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_default_policy_refuses_with_a_typed_kind(name: str) -> None:
    attack = ATTACKS[name]
    for policy in (SecAggPolicy(), attack.baseline):
        outcome = attack.run(policy)
        assert outcome.recovered is None
        assert outcome.refusal is not None and outcome.refusal.kind == attack.kind, outcome


@pytest.mark.parametrize("name", sorted(n for n, a in ATTACKS.items() if a.unsafe is not None))
def test_attack_recovers_the_input_when_the_rule_is_relaxed(name: str) -> None:
    attack = ATTACKS[name]
    assert attack.unsafe is not None
    outcome = attack.run(attack.unsafe)
    assert outcome.refusal is None and outcome.succeeded()


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_mutation_removing_one_check_breaks_its_attack_test(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    attack = ATTACKS[name]
    monkeypatch.setattr(policy_module, attack.check, lambda *a, **k: None)
    outcome = attack.run(attack.baseline)
    # The typed refusal is gone, so test_default_policy_refuses_with_a_typed_kind fails ...
    assert outcome.refusal is None or outcome.refusal.kind != attack.kind
    # ... and where the check is the only barrier, the attack now recovers the input.
    assert outcome.succeeded() == (attack.check in SOLE_BARRIER)


def test_every_policy_check_has_an_attack() -> None:
    assert {a.check for a in ATTACKS.values()} == set(policy_module.CHECKS)
    assert set(policy_module.CHECKS) >= SOLE_BARRIER
    for name in policy_module.CHECKS:
        assert callable(getattr(policy_module, name))


def test_views_cover_every_target_t_times() -> None:
    """The cover used by the inconsistent-views attack is what it claims (independent
    count), for every n the issue reproduced."""
    for n in (5, 7, 8, 10, 12, 16):
        t = n // 2 + 1
        ids = [f"p{i:02d}" for i in range(n)]
        views = cover_views(ids, ids[0], ids[1:t], t)
        for v in ids[1:t]:
            assert sum(v in d for d in views.values()) >= t
        assert all(len(d) <= n - t and h not in d for h, d in views.items())
