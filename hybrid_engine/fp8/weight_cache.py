"""The fp8 forms of a stage's weights, quantized once a step instead of once a micro-batch: a weight does not change
between the micro-batches of a step, and at a few thousand tokens a micro-batch quantizing a large weight (its
maximum and two casts, both layouts) costs about what its fp8 forward GEMM does.

One cache belongs to one Engine (engine/engine.py hands it to its stages' Fp8Linear layers) and holds, per weight
and recipe, both layouts Quantizer.both gives: the forward's (contracted along the input features) and the input
gradient's (along the output features), each with its scale, 1 byte an element each: 2 bytes a cached parameter.

The engine empties it wherever the weights may change: at each training step's entry (the previous step's optimizer
update, ZeRO-1's parameter all-gathers landing) and wherever the whole model is handed out (`wait_for_parameters`:
evaluation, checkpoint save and load, the Hugging Face import, the user's `engine.stages`). An entry also keeps the
weight's version and storage, so a forward after an in-place write that the engine did not see quantizes afresh;
the all-gathers write through views without bumping versions, which is why the engine's emptying is the rule and
the stamp only a second guard.
"""
from __future__ import annotations

from typing import Callable

import torch

from .quantize import Forms


class Fp8WeightCache:
    """{(weight, rowwise): Forms}, valid until `clear`."""

    def __init__(self):
        self._entries: dict[tuple[int, bool], tuple[tuple[int, int], torch.Tensor, Forms]] = {}

    def forms(self, weight: torch.Tensor, rowwise: bool, quantize: Callable[[], Forms]) -> Forms:
        """The cached forms of `weight`, made by `quantize()` on the first call since `clear` (or since the weight
        was written in place)."""
        key, stamp = (id(weight), rowwise), self.stamp(weight)
        entry = self._entries.get(key)
        if entry is not None and entry[0] == stamp and entry[1] is weight:
            return entry[2]
        forms = quantize()
        self._entries[key] = (stamp, weight, forms)
        return forms

    @staticmethod
    def stamp(weight: torch.Tensor) -> tuple[int, int]:
        """What an in-place write the engine did not announce changes: the version and the storage."""
        return weight._version, weight.data_ptr()

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def nbytes(self) -> int:
        """What the cached forms hold now."""
        return sum(t.numel() * t.element_size() for _, _, forms in self._entries.values() for t in forms)
