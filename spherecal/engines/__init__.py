"""Simulation engines beyond one OS process per participant.

``spherecal simulate --engine processes`` (the default, ``spherecal.simulate``)
starts every participant as its own process. ``--engine threads``
(:mod:`spherecal.engines.threads`) hosts every participant as a *virtual participant*
(:mod:`spherecal.engines.virtual`) in the simulate process itself; ``--engine ray``
(:mod:`spherecal.engines.ray`) hosts many per Ray actor, on one machine or a Ray
cluster.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["choose_ray_auth_mode"]


def choose_ray_auth_mode() -> None:
    """Joining a Ray cluster by address, Ray sends its authentication token only
    under ``RAY_AUTH_MODE=token`` (``address="auto"`` discovers the mode, an explicit
    address does not), and Ray reads the mode when it is first imported. So, with a
    token at hand (``RAY_AUTH_TOKEN`` or ``~/.ray/auth_token``, which ``ray start``
    writes) and no mode chosen, choose token mode — unless Ray is imported already:
    a mode changed after that import would start local Ray servers (which inherit
    the environment) in another mode than this process speaks. A local instance
    started in token mode uses the same token."""
    if os.environ.get("RAY_AUTH_MODE") or "ray" in sys.modules:
        return
    if os.environ.get("RAY_AUTH_TOKEN") or (Path.home() / ".ray" / "auth_token").exists():
        os.environ["RAY_AUTH_MODE"] = "token"


choose_ray_auth_mode()
