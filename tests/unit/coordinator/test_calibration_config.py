"""[calibration]: every calibrator, its grids, and which statistics job serves it."""

from __future__ import annotations

import tomllib

import pytest

from spherecal.config import ConfigError, parse_coordinator_config
from spherecal.coordinator.driver.discriminant_heads import candidate_name
from spherecal.coordinator.settings import CalibrationSettings
from spherecal.spherefed.calibration_suite import DEFAULT_RIDGE_GRID, DEFAULT_SHRINKAGE_GRID

BASE = """
[federation]
name = "f"
participants = ["a", "b", "c"]

[model]
dataset = "digits"
extractor = "mlp"
"""


def _parse(calibration: str) -> CalibrationSettings:
    document = tomllib.loads(BASE + "[calibration]\n" + calibration)
    settings, _ = parse_coordinator_config(document, source="c.toml")
    return settings.calibration


@pytest.mark.parametrize(
    ("methods", "jobs"),
    [
        (("ffc",), ("ffc",)),
        (("ccvr",), ("ccvr",)),
        (("ffc", "ccvr"), ("ccvr",)),
        (("lda",), ("ccvr",)),  # LDA needs N_c, S_c: the CCVR sums, not FFC's
        (("ffc", "ffc_bias"), ("ccvr",)),  # FFC derived from the same sums
        (("ffc", "qda"), ("ccvr",)),
    ],
)
def test_closed_forms_request_the_ccvr_statistics(
    methods: tuple[str, ...], jobs: tuple[str, ...]
) -> None:
    assert CalibrationSettings(methods=methods).jobs == jobs
    separate = CalibrationSettings(methods=methods, ffc_from_ccvr=False)
    if "ffc" in methods and jobs == ("ccvr",):
        assert separate.jobs == ("ffc", "ccvr")


def test_grids_read_from_toml_with_defaults() -> None:
    cal = _parse('methods = ["ffc", "ccvr", "ffc_bias", "lda", "qda"]\n')
    assert cal.closed_forms == ("ffc_bias", "lda", "qda")
    assert cal.grid("ffc_bias") == DEFAULT_RIDGE_GRID
    assert cal.grid("qda") == DEFAULT_SHRINKAGE_GRID
    cal = _parse('methods = ["lda"]\nridge_grid = [0, 2]\nshrinkage_grid = [0.5]\n')
    assert cal.ridge_grid == (0.0, 2.0) and cal.shrinkage_grid == (0.5,)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('methods = ["lda", "qdaa"]\n', "unknown calibration"),
        ('methods = ["lda"]\nshrinkage_grid = [1.5]\n', "shrinkage_grid"),
        ('methods = ["lda"]\nshrinkage_grid = []\n', "shrinkage_grid"),
        ('methods = ["ffc_bias"]\nridge_grid = [-1]\n', "ridge_grid"),
        ('methods = ["ffc_bias"]\nridge_grid = ["a"]\n', "list of numbers"),
    ],
)
def test_bad_calibration_values_are_config_errors(text: str, message: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=message):
        _parse(text)


def test_candidate_names_are_distinct_per_value() -> None:
    names = {candidate_name(n, v) for n in ("lda", "qda") for v in DEFAULT_SHRINKAGE_GRID}
    assert len(names) == 2 * len(DEFAULT_SHRINKAGE_GRID)
    assert "none" not in names
