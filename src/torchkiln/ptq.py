"""Torch-TensorRT's `torch_tensorrt.ptq` names, so an INT8 script ports: `DataLoaderCalibrator`, `CacheCalibrator`
and `CalibrationAlgo`. Give a calibrator as `compile(..., enabled_precisions={torch.int8}, calibrator=c)`."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from torchkiln.enums import CalibrationAlgo

__all__ = ["CacheCalibrator", "CalibrationAlgo", "DataLoaderCalibrator"]


class DataLoaderCalibrator:
    """Calibration samples from a data loader: each batch, or its first element where a batch is a tuple or list
    (inputs, labels), is one sample. `cache_file` is written after calibrating and, with `use_cache`, read instead
    of calibrating where it has the engine's entry."""

    def __init__(self, dataloader: Iterable[Any], algo_type: CalibrationAlgo | str = CalibrationAlgo.ENTROPY,
                 cache_file: str = "", use_cache: bool = False, device: Any = None,
                 max_batches: int | None = None) -> None:
        self.dataloader = dataloader
        self.algo_type = CalibrationAlgo(algo_type)
        self.cache_file = cache_file or None
        self.use_cache = use_cache
        self.device = device
        self.max_batches = max_batches

    def samples(self) -> list[tuple[Any, ...]]:
        """The method arguments of each batch, on `device` where given."""
        found = []
        for k, batch in enumerate(self.dataloader):
            if self.max_batches is not None and k >= self.max_batches:
                break
            batch = batch[0] if isinstance(batch, (tuple, list)) else batch
            if self.device is not None and isinstance(batch, torch.Tensor):
                batch = batch.to(self.device)
            found.append((batch,))
        if not found:
            raise ValueError("calibrator: the data loader gave no batches")
        return found


class CacheCalibrator:
    """Calibration from a cache file only (written by an earlier build's calibrator or calibration_cache_file)."""

    def __init__(self, cache_file: str, algo_type: CalibrationAlgo | str = CalibrationAlgo.ENTROPY) -> None:
        self.cache_file = cache_file
        self.algo_type = CalibrationAlgo(algo_type)
        self.use_cache = True

    def samples(self) -> list[tuple[Any, ...]]:
        raise ValueError(f"calibrator: the calibration cache {self.cache_file!r} has no entry for this engine, and a "
                         f"CacheCalibrator has no data to calibrate on; use a DataLoaderCalibrator")
