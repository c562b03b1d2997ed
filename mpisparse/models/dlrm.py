"""``dlrm``: the dense part of a DLRM (Naumov et al., 2019) as the DCT paper (Gupta et al.) trains it (Sec. 3.1).

The DCT paper's DLRM processes the dense features with a bottom MLP of four
fully connected layers, each followed by a ReLU, with 512, 256, 64 and 16
outputs; the result interacts with the sparse features' embeddings, and a
top MLP of four FC layers (512, 256, 128 and 1 outputs, ReLU between them,
a sigmoid at the end) gives the click probability.

Here there are no sparse features, hence no embedding tables: the
interaction of the bottom MLP's output with nothing else is that output
itself (DLRM's dot-product interaction takes pairs of distinct feature
vectors), so the top MLP reads the 16 bottom features directly.  The last
layer has ``num_classes`` outputs and no sigmoid: the training loop's
softmax cross-entropy replaces the sigmoid's binary cross-entropy (with
``num_classes=1`` it would be the paper's single logit).

The forward pass is a chain of leaf layers (:meth:`DLRM.pipeline_layers`),
so it can be cut into pipeline stages; the paper's two splits come after the
second layer of each MLP: ``--split-after bottom.4,top.3`` (after the ReLUs).
"""

from __future__ import annotations

from typing import Sequence

from torch import nn

__all__ = ["DLRM", "BOTTOM", "TOP"]

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


class DLRM(nn.Module):
    """Bottom MLP (FC + ReLU x 4) -> top MLP (FC + ReLU x 3, FC): see the module docstring."""

    def __init__(self, in_features: int, num_classes: int, bottom: Sequence[int] = BOTTOM,
                 top: Sequence[int] = TOP):
        super().__init__()
        if not bottom:
            raise ValueError("the bottom MLP needs at least one layer")
        self.bottom = nn.Sequential(nn.Flatten(), *_mlp(bottom, in_features, relu_last=True))
        self.top = nn.Sequential(*_mlp([*top, num_classes], bottom[-1], relu_last=False))

    def pipeline_layers(self) -> list[tuple[str, nn.Module]]:
        """The chain of leaf layers: ``bottom.0`` (flatten) .. ``bottom.8``, ``top.0`` .. ``top.6``."""
        return ([(f"bottom.{n}", m) for n, m in self.bottom.named_children()]
                + [(f"top.{n}", m) for n, m in self.top.named_children()])

    def forward(self, x):
        return self.top(self.bottom(x))
