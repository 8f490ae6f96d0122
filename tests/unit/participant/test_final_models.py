"""A site's ``out_dir`` holds exactly one result (issue #23, item 1): a later result
with fewer heads removes the model files of the earlier one, so ``predict``'s default
never loads a classifier that ``models.json`` no longer lists; other files stay."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from spherecal.participant.results import FinalModels, write_final_models
from spherecal.spherefed.fl import state_vector
from spherecal.spherefed.saved import available_calibrations, load_model
from tests.unit.participant.helpers import digits_trainer


def test_a_later_result_with_fewer_heads_leaves_no_stale_model(tmp_path: Path) -> None:
    trainer = digits_trainer()
    vector = state_vector(trainer.model, trainer.keys).astype(np.float64)
    weight = trainer.model.head.weight.detach().numpy().astype(np.float64)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("the site's own file")
    full = FinalModels(vector, "aa", heads={"ffc": weight * 2, "ccvr": weight * 3})
    write_final_models(out, trainer, full, federation_id="f")
    assert available_calibrations(out)[:1] == ["ffc"]
    # the same federation again, degraded to the uncalibrated model only
    write_final_models(out, trainer, FinalModels(vector, "aa"), federation_id="f")
    manifest = json.loads((out / "models.json").read_text())
    assert set(manifest["models"]) == {"none"}
    assert sorted(p.name for p in out.glob("*.pt")) == ["model_none.pt"]
    assert available_calibrations(out) == ["none"]  # predict's default is what is listed
    assert load_model(out) is not None
    assert (out / "notes.txt").read_text() == "the site's own file"
