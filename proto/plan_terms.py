"""A plan's terms: the whole federation plan but for what only places or paces a site.

Both ends fix a federation's plan by these bytes (a site in its release ledger,
``spherecal.participant.fixed_plan``; the coordinator in its state database, checked
when it resumes a federation), so the two agree on what "the same plan" is: the
terms a site's checks against its own data read — the model, the local training, the
rounds, the secure and calibration settings, the sum scales and the example-count
noise — and not the site's position in the roster (fixed by its id), the heartbeat
interval or the chunk size, which a restarted coordinator may change without asking
anything of the data.
"""

from __future__ import annotations

from spherecal.proto import spherecal_pb2 as pb

__all__ = ["PACING_FIELDS", "changed_fields", "plan_terms"]

PACING_FIELDS = ("participant_index", "heartbeat_interval_ms", "max_chunk_bytes")
"""Plan fields outside its terms."""


def plan_terms(plan: pb.Plan) -> bytes:
    """The plan's terms as bytes (deterministic serialisation: ``sum_scales`` is a map)."""
    terms = pb.Plan()
    terms.CopyFrom(plan)
    for name in PACING_FIELDS:
        terms.ClearField(name)
    return terms.SerializeToString(deterministic=True)


def changed_fields(before: bytes, now: bytes) -> list[str]:
    """The names of the top-level plan fields that differ between two terms."""
    a, b = pb.Plan.FromString(before), pb.Plan.FromString(now)
    return [
        field.name
        for field in pb.Plan.DESCRIPTOR.fields
        if field.name not in PACING_FIELDS and getattr(a, field.name) != getattr(b, field.name)
    ]
