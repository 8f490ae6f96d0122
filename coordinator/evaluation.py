"""Central evaluation on held-out test data the coordinator was given (optional).

A real coordinator usually holds no data; then only federated evaluation (the sum of
participants' correct/total counts) is reported. When it is given test data — the
simulation harness gives it the reference runner's test split — it also evaluates
centrally, exactly as the reference runner does (same batches, same head swap).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from spherefed.data import load_dataset
from spherefed.fl import evaluate
from spherefed.network import classifier_swapped

from .model import GlobalModel
from .settings import CoordinatorSettings

__all__ = ["CentralEvaluator"]


class CentralEvaluator:
    def __init__(self, model: GlobalModel, x: torch.Tensor, y: torch.Tensor) -> None:
        self.model = model
        self.x = x
        self.y = y

    @classmethod
    def from_settings(
        cls, settings: CoordinatorSettings, model: GlobalModel
    ) -> CentralEvaluator | None:
        name = settings.evaluation.test_dataset
        if not name:
            return None
        splits = load_dataset(
            name,
            root=settings.evaluation.test_data_root,
            seed=settings.seed,
            samples=settings.evaluation.test_samples,
        )
        test = splits.test
        if test.num_classes != model.num_classes:
            raise ValueError(
                f"test data has {test.num_classes} classes, the model {model.num_classes}"
            )
        return cls(model, torch.from_numpy(test.x), torch.from_numpy(test.y))

    @property
    def size(self) -> int:
        return int(self.y.shape[0])

    def accuracy(
        self, vector: npt.NDArray[np.float64], head: npt.NDArray[np.float64] | None = None
    ) -> float:
        net = self.model.load(vector)
        with classifier_swapped(net, head):
            return evaluate(net, self.x, self.y)
