"""``dlrm``: DLRM (Naumov et al., 2019) as the DCT paper (Gupta et al.) trains it (Sec. 3.1).

The DCT paper's DLRM processes the dense features with a bottom MLP of four
fully connected layers, each followed by a ReLU, with 512, 256, 64 and 16
outputs; the sparse features are looked up in embedding tables (dimension
16); the dot-product interaction of the bottom MLP's output with the
embeddings feeds a top MLP of four FC layers (512, 256, 128 and 1 outputs,
ReLU between them, a sigmoid at the end) that gives the click probability.

With ``tables`` (the rows of each embedding table; the click data of
:mod:`mpisparse.data.recsys`) the model is that DLRM.  An input row holds
the ``dense`` features, then one id per table (as floats, see
:mod:`mpisparse.data.recsys`); the bottom MLP's last width is the
embedding dimension; the interaction (Naumov et al.'s ``dot``) takes the
``T + 1`` vectors of a sample (the bottom MLP's output and its ``T``
embeddings), their ``T (T + 1) / 2`` pairwise dot products, and
concatenates them to the bottom MLP's output, the top MLP's input.  The
click logit ``z`` is returned as the two-class logits ``(0, z)``: softmax
cross-entropy of those is binary cross-entropy of ``z`` (the sigmoid's
loss), and the runtimes' classification loss, accuracy and pipeline apply
unchanged.  ``sparse=True`` makes the tables ``nn.Embedding(sparse=True)``:
their gradient is the rows a batch touched (exchanged row-sparse by
:mod:`mpisparse.torch.rows`).

Without tables (vector data such as ``digits``) it is the dense part alone:
the interaction of the bottom MLP's output with nothing else is that output
itself, so the top MLP reads the bottom features directly and its last
layer has ``num_classes`` outputs.

The forward pass is a chain of leaf layers (:meth:`DLRM.pipeline_layers`),
so it can be cut into pipeline stages; the paper's two splits come after the
second layer of each MLP: ``--split-after bottom.4,top.3`` (after the ReLUs).
With tables the chain is ``bottom.0`` (the dense columns; it also binds the
batch's ids), ``bottom.1`` .. ``bottom.8``, ``interact`` (which holds the
tables and reads the bound ids), ``top.0`` .. ``top.7`` (``top.7``: the
two-class logits).  A pipeline stage that holds ``interact`` but not
``bottom.0`` binds the ids itself (:meth:`DLRM.bind_input`) before its forward.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

__all__ = ["DLRM", "BOTTOM", "TOP", "BinaryLogits", "DenseInput", "DotInteraction", "IdHolder"]

#: output widths of the bottom MLP's FC layers (DCT paper, Sec. 3.1)
BOTTOM = (512, 256, 64, 16)
#: output widths of the top MLP's FC layers before the last one
TOP = (512, 256, 128)


def _mlp(widths: Sequence[int], in_features: int, relu_last: bool) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for i, w in enumerate(widths):
        layers.append(nn.Linear(in_features, w))
        if relu_last or i < len(widths) - 1:
            layers.append(nn.ReLU())
        in_features = w
    return layers


def check_tables(tables: Sequence[int], dim: int) -> None:
    """ValueError (one line) for a table size or a dimension that is not a positive integer."""
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"the embedding dimension is {dim!r}; allowed: an integer >= 1")
    for t, rows in enumerate(tables):
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"embedding table {t} has {rows!r} rows; allowed: an integer >= 1")


class IdHolder:
    """The ids of the batch being run (``(N, T)`` int64), shared by :class:`DenseInput` and :class:`DotInteraction`."""

    ids: torch.Tensor | None = None


class DenseInput(nn.Module):
    """``x -> x[:, :dense]``, binding ``x[:, dense:]`` as the batch's ids."""

    def __init__(self, dense: int, holder: IdHolder):
        super().__init__()
        self.dense, self.holder = dense, holder

    def forward(self, x):
        self.holder.ids = x[:, self.dense:].long()
        return x[:, :self.dense]


class DotInteraction(nn.Module):
    """The embedding tables and Naumov et al.'s dot interaction: ``[b, dots of (b, e_1 .. e_T) pairs]``."""

    def __init__(self, tables: Sequence[int], dim: int, holder: IdHolder, sparse: bool):
        super().__init__()
        self.holder = holder
        self.emb = nn.ModuleList(nn.Embedding(rows, dim, sparse=sparse) for rows in tables)
        for e, rows in zip(self.emb, tables):  # DLRM's initialisation: uniform in +-sqrt(1 / rows)
            nn.init.uniform_(e.weight, -rows ** -0.5, rows ** -0.5)
        n = len(tables) + 1
        self.register_buffer("_rows", torch.tril_indices(n, n, -1)[0], persistent=False)
        self.register_buffer("_cols", torch.tril_indices(n, n, -1)[1], persistent=False)

    @property
    def out_features(self) -> int:
        return self.emb[0].embedding_dim + len(self._rows)

    def forward(self, b):
        ids = self.holder.ids
        if ids is None or ids.shape[0] != b.shape[0]:
            raise RuntimeError("DotInteraction: no ids bound for this batch (run bottom.0, or bind_input(x))")
        v = torch.stack([b] + [e(ids[:, t]) for t, e in enumerate(self.emb)], dim=1)  # (N, T + 1, d)
        dots = torch.bmm(v, v.transpose(1, 2))[:, self._rows, self._cols]
        return torch.cat([b, dots], dim=1)


class BinaryLogits(nn.Module):
    """A click logit ``z`` ``(N, 1)`` as the two-class logits ``(0, z)``: softmax cross-entropy = BCE of ``z``."""

    def forward(self, z):
        return torch.cat([torch.zeros_like(z), z], dim=1)


class DLRM(nn.Module):
    """Bottom MLP, embedding tables and dot interaction, top MLP: see the module docstring."""

    def __init__(self, in_features: int, num_classes: int, bottom: Sequence[int] = BOTTOM,
                 top: Sequence[int] = TOP, tables: Sequence[int] | None = None, dim: int = 16,
                 sparse: bool = False):
        super().__init__()
        if not bottom:
            raise ValueError("the bottom MLP needs at least one layer")
        self.tables = list(tables or [])
        if not self.tables:
            self.bottom = nn.Sequential(nn.Flatten(), *_mlp(bottom, in_features, relu_last=True))
            self.interact = None
            self.top = nn.Sequential(*_mlp([*top, num_classes], bottom[-1], relu_last=False))
            return
        check_tables(self.tables, dim)
        dense = in_features - len(self.tables)
        if dense < 1 or num_classes != 2:
            raise ValueError(f"DLRM with {len(self.tables)} tables needs inputs of dense features then one id per "
                             f"table and 2 classes (a click); got {in_features} features and {num_classes} classes")
        #: the click data's models: held-out AUC (:mod:`mpisparse.train.recsys`)
        self.recsys = "clicks"
        self._ids = IdHolder()
        self.bottom = nn.Sequential(DenseInput(dense, self._ids), *_mlp([*bottom[:-1], dim], dense, relu_last=True))
        self.interact = DotInteraction(self.tables, dim, self._ids, sparse)
        self.top = nn.Sequential(*_mlp([*top, 1], self.interact.out_features, relu_last=False), BinaryLogits())

    def bind_input(self, x) -> None:
        """Bind the ids of batch ``x`` (for a pipeline stage that runs ``interact`` without ``bottom.0``)."""
        if self.interact is not None:
            self.bottom[0](x)

    def pipeline_layers(self) -> list[tuple[str, nn.Module]]:
        """The chain of leaf layers: ``bottom.0`` .. ``bottom.8``, (``interact``,) ``top.0`` .. ``top.6`` (``.7``)."""
        middle = [("interact", self.interact)] if self.interact is not None else []
        return ([(f"bottom.{n}", m) for n, m in self.bottom.named_children()] + middle
                + [(f"top.{n}", m) for n, m in self.top.named_children()])

    def forward(self, x):
        b = self.bottom(x)
        return self.top(b if self.interact is None else self.interact(b))
