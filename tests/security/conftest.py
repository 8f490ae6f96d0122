"""Fixtures the hostile-coordinator suites share: the model a hostile coordinator
serves and the target site's local data (the first fifth of the digits data)."""

from __future__ import annotations

import pytest
import torch

from spherecal.coordinator.driver.model import GlobalModel
from spherecal.coordinator.settings import ModelSettings
from spherecal.participant.data import LocalData, load_local_data
from spherecal.participant.settings import DataSettings


@pytest.fixture(scope="module")
def model() -> GlobalModel:
    torch.set_num_threads(1)
    return GlobalModel(ModelSettings(extractor="mlp").spec(0))


@pytest.fixture(scope="module")
def data() -> LocalData:
    return load_local_data(DataSettings(slice_index=0, slice_of=5))
