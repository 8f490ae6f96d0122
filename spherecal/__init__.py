"""spherecal: privacy-hardened federated calibration — one import namespace.

The components (``spherecal.proto``, ``spherecal.crypto``, ``spherecal.spherefed``,
``spherecal.participant``, ``spherecal.coordinator``) and the composition root (the
CLI, configs, simulate, certs, experiment, audit, logs) all live under this one name.
Importing ``spherecal`` loads nothing else: every process imports only what it runs.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("spherecal")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
