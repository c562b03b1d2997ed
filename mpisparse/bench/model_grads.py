"""Gradients from real backward passes, for ``bench step --gradients model``.

Synthetic gradients (:mod:`mpisparse.bench.gradgen`) draw how far ranks' top-k
sets overlap; here each rank trains the trainable net of the same name
(:func:`mpisparse.models.nets.build_model`: ``resnet18`` is the CIFAR-style
ResNet-18) on its own batches of the bundled digits data (1 x 8 x 8 images,
10 classes; the shards of :func:`mpisparse.data.shard_indices`), so the
overlap between ranks' selections is what backward passes produce.

Every rank builds the model from the same seed (the same parameters), and
after each step applies the aggregated update the scheme returned (plain
SGD, ``lr``): the ranks stay identical and the gradients follow a training
run, as in ``train``.  BatchNorm running statistics are per rank (they do
not enter the gradients' shapes).
"""

from __future__ import annotations

import numpy as np

from ..config import MODEL_GRADIENT_MODELS

#: shape names of ``bench step --model`` that have a trainable net of the same name


class ModelGradients:
    """``fill(out, it)`` writes this rank's gradient of step ``it``; ``apply(update)`` takes the SGD step."""

    def __init__(self, model: str, rank: int, world: int, *, seed: int = 0, batch_size: int = 32,
                 lr: float = 0.05):
        import torch

        from ..data import load_dataset, shard_indices
        from ..backend.fusion import FusionLayout
        from ..models.nets import build_model, needs_image

        if model not in MODEL_GRADIENT_MODELS:
            raise ValueError(f"--gradients model: --model {model!r} has no trainable net; allowed: "
                             f"{', '.join(MODEL_GRADIENT_MODELS)}")
        self._torch = torch
        self.rank, self.world, self.seed, self.batch_size, self.lr = rank, world, seed, batch_size, lr
        self.data = load_dataset("digits", seed=seed, image=needs_image(model))
        torch.manual_seed(seed)
        self.net = build_model(model, input_shape=self.data.input_shape, num_classes=self.data.num_classes)
        self.params = [(n, p) for n, p in self.net.named_parameters() if p.requires_grad]
        self.layout = FusionLayout([(n, tuple(p.shape)) for n, p in self.params])
        self._shard = lambda epoch: shard_indices(len(self.data.train_y), rank, world, seed=seed, epoch=epoch)
        self._per_epoch = max(1, len(self._shard(0)) // batch_size)
        self.loss = torch.nn.CrossEntropyLoss()

    def _batch(self, it: int):
        epoch, b = divmod(it, self._per_epoch)
        idx = self._shard(epoch)[b * self.batch_size:(b + 1) * self.batch_size]
        t = self._torch.as_tensor(idx)
        return self.data.train_x[t], self.data.train_y[t]

    def fill(self, out: np.ndarray, it: int) -> np.ndarray:
        """One forward/backward pass on this rank's batch ``it``; the gradients into ``out`` (layout order)."""
        x, y = self._batch(it)
        self.net.train()
        self.net.zero_grad(set_to_none=False)
        self.loss(self.net(x), y).backward()
        for (_, p), s in zip(self.params, self.layout.layers):
            out[s.offset:s.end] = p.grad.detach().reshape(-1).numpy()
        return out

    def apply(self, update) -> None:
        """``p -= lr * update`` (the scheme's aggregated update, on the host)."""
        flat = self._torch.from_numpy(np.asarray(update))
        with self._torch.no_grad():
            for (_, p), s in zip(self.params, self.layout.layers):
                p -= self.lr * flat[s.offset:s.end].view(p.shape)
