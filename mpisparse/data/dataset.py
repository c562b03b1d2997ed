"""The in-memory dataset every loader of :mod:`mpisparse.data` returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["Dataset"]


@dataclass
class Dataset:
    """An in-memory dataset.

    For ``kind == "classification"`` the ``*_x`` tensors are float32 of shape
    ``(N, *input_shape)`` and the ``*_y`` tensors int64 labels of shape ``(N,)``.
    For ``kind == "lm"`` the ``*_x`` tensors are 1-D int64 token streams, the
    ``*_y`` tensors are ``None`` (targets come from :func:`lm_batches`),
    ``num_classes`` is the vocabulary size, ``input_shape`` is ``()`` and
    ``vocab`` lists the words by index (None for the byte-level ``pydoc``).
    """

    name: str
    kind: str
    train_x: torch.Tensor
    train_y: torch.Tensor | None
    test_x: torch.Tensor
    test_y: torch.Tensor | None
    num_classes: int
    input_shape: tuple
    valid_x: torch.Tensor | None = None
    valid_y: torch.Tensor | None = None
    vocab: list[str] | None = None
    meta: dict = field(default_factory=dict)

    @property
    def n_train(self) -> int:
        return int(self.train_x.shape[0])

    @property
    def n_test(self) -> int:
        return int(self.test_x.shape[0])
