"""A site's identity key: loaded, or created once — never silently replaced.

Why strict: the coordinator pins each participant's Ed25519 identity key at its first
join, and with mutual TLS the certificate binds it. A key created anew because a
configured path has a typo (or a state directory lost its key) is a *different*
identity: the site is refused later with a message that names neither the path nor
the key. So a key is created only

- by ``spherecal participant --config FILE --init`` (first enrolment, explicit), or
- on the very first start of a site that configured no ``identity_key`` and whose
  ``state_dir`` holds no history yet (the default ``state_dir/identity.key``: what a
  simulation's throwaway sites and a first ``spherecal participant`` run need);

and a configured ``identity_key`` that does not exist, or a missing default key beside
an existing history, is a one-line error naming the path and the config key.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from spherecal.crypto import generate_identity
from spherecal.participant.settings import ParticipantSettings
from spherecal.proto.identity import load_identity_key, save_identity_key

__all__ = ["IdentityMissing", "enrol", "load_or_enrol"]

#: Files a site writes into its state directory once it has taken part in anything.
HISTORY = ("jobs.db", "privacy.db")


class IdentityMissing(ValueError):
    """The identity key a site must already have is not there (exit status 2)."""


def _has_history(state_dir: Path) -> bool:
    return any((state_dir / name).exists() for name in HISTORY)


def enrol(settings: ParticipantSettings) -> tuple[Path, bool]:
    """Create the site's identity key if it has none (``--init``); returns its path and
    whether it was created. An existing key is kept, never overwritten."""
    path = settings.identity_path
    if path.exists():
        load_identity_key(path)  # a damaged file is an error here, not at the first join
        return path, False
    path.parent.mkdir(parents=True, exist_ok=True)
    save_identity_key(generate_identity(), path)
    return path, True


def load_or_enrol(
    settings: ParticipantSettings, say: Callable[[str], None]
) -> Ed25519PrivateKey:
    """The site's identity for a run (see the module docstring for when one is created)."""
    path = settings.identity_path
    if path.exists():
        return load_identity_key(path)
    if settings.identity_key is not None:
        raise IdentityMissing(
            f"identity_key {path} does not exist ([participant] identity_key); correct the "
            "path, or create this site's identity once with "
            "`spherecal participant --config FILE --init`"
        )
    if _has_history(settings.state_dir):
        raise IdentityMissing(
            f"{path} is missing but {settings.state_dir} holds this site's history: the "
            "coordinator has pinned its old key. Restore identity.key from a backup, or "
            "enrol anew with `spherecal participant --config FILE --init` and ask the "
            "coordinator's operator to unpin this participant"
        )
    identity = generate_identity()
    save_identity_key(identity, path)
    say(f"first start: created identity key {path}")
    return identity
