"""Test-wide settings.

The models under test are tiny; on a 2-core machine torch's intra-op threads only add
contention (and the test processes share the cores), so every test runs torch
single-threaded. This changes speed, not results.
"""

from __future__ import annotations

import torch

torch.set_num_threads(1)
