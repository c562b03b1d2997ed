"""The fusion buffer: every gradient in one contiguous float32 vector.

A :class:`FusionLayout` records, for each layer (parameter tensor), its
name, shape and offset in the flat vector, so a scheme can work on the whole
vector or layer by layer (``layout.view(vec, i)``), and the training front
end can copy gradients in and aggregated updates back out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np


@dataclass(frozen=True)
class LayerSlot:
    name: str
    shape: tuple[int, ...]
    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


class FusionLayout:
    """Names, shapes and offsets of the layers packed into one vector."""

    def __init__(self, layers: Iterable[tuple[str, Sequence[int]]]):
        slots: list[LayerSlot] = []
        offset = 0
        seen: set[str] = set()
        for name, shape in layers:
            shape = tuple(int(s) for s in shape)
            if name in seen:
                raise ValueError(f"layer name {name!r} appears twice; layer names must be unique")
            if any(s < 0 for s in shape):
                raise ValueError(f"layer {name!r} has shape {shape}; dimensions must be >= 0")
            seen.add(name)
            size = int(np.prod(shape, dtype=np.int64))
            slots.append(LayerSlot(name, shape, offset, size))
            offset += size
        if not slots:
            raise ValueError("a fusion layout needs at least one layer")
        self.layers: tuple[LayerSlot, ...] = tuple(slots)
        self.n: int = offset

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def sizes(self) -> np.ndarray:
        return np.array([s.size for s in self.layers], dtype=np.int64)

    @property
    def offsets(self) -> np.ndarray:
        return np.array([s.offset for s in self.layers], dtype=np.int64)

    def empty(self, dtype=np.float32, xp=np) -> np.ndarray:
        return xp.empty(self.n, dtype=dtype)

    def zeros(self, dtype=np.float32, xp=np) -> np.ndarray:
        return xp.zeros(self.n, dtype=dtype)

    def view(self, vec, i: int):
        """The flat slice of layer ``i`` in ``vec`` (a view, not a copy)."""
        s = self.layers[i]
        return vec[s.offset:s.end]

    def unflatten(self, vec) -> list:
        """Views of ``vec`` shaped like each layer."""
        return [vec[s.offset:s.end].reshape(s.shape) for s in self.layers]

    def flatten(self, arrays: Sequence, out=None):
        """Copy per-layer arrays into one vector (``out`` reused when given)."""
        if len(arrays) != len(self.layers):
            raise ValueError(f"expected {len(self.layers)} arrays, got {len(arrays)}")
        if out is None:
            out = self.empty()
        for s, a in zip(self.layers, arrays):
            if int(np.prod(a.shape)) != s.size:
                raise ValueError(f"layer {s.name!r} expects {s.size} elements {s.shape}, got shape {tuple(a.shape)}")
            out[s.offset:s.end] = a.reshape(-1)
        return out

    def layer_of(self, index):
        """Layer number of each flat index (vectorised)."""
        return np.searchsorted(self.offsets, index, side="right") - 1
