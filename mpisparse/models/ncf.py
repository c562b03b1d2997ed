"""``ncf``: neural collaborative filtering, NeuMF (He et al., 2017, Sec. 3.4), as DEFT's evaluation trains it.

Two towers over a user and an item, each with its own embedding tables:

* GMF: user and item embeddings of ``dim`` (the predictive factors), their
  element-wise product;
* MLP: user and item embeddings of ``2 dim``, concatenated (``4 dim``), then
  FC + ReLU layers halving the width down to ``dim`` (the tower pattern:
  ``4 dim -> 2 dim -> dim``);

the two towers' outputs concatenated (``2 dim``) go through one FC layer to
the interaction logit ``z``.  Embeddings start as N(0, 0.01^2) (He et al.'s
Gaussian initialisation), the FC layers as torch's default.

Input rows are ``(user, item)`` ids as floats (:mod:`mpisparse.data.recsys`);
``forward`` returns the two-class logits ``(0, z)`` (softmax cross-entropy of
them is the binary cross-entropy of implicit feedback, log loss in He et
al.), :meth:`NCF.score` the logit ``z`` of user-item pairs and
:meth:`NCF.score_candidates` a test row's ``(user, candidates...)`` scores
for the hit rate (:mod:`mpisparse.train.recsys`).  ``sparse=True`` makes the
four tables ``nn.Embedding(sparse=True)``.
"""

from __future__ import annotations

import torch
from torch import nn

from .dlrm import check_tables

__all__ = ["NCF"]


class NCF(nn.Module):
    """NeuMF over ``users`` x ``items``: see the module docstring."""

    #: implicit-feedback ranking: held-out hit rate (:mod:`mpisparse.train.recsys`)
    recsys = "ranking"

    def __init__(self, users: int, items: int, dim: int = 16, sparse: bool = False):
        super().__init__()
        check_tables([users, items], dim)
        self.gmf_user = nn.Embedding(users, dim, sparse=sparse)
        self.gmf_item = nn.Embedding(items, dim, sparse=sparse)
        self.mlp_user = nn.Embedding(users, 2 * dim, sparse=sparse)
        self.mlp_item = nn.Embedding(items, 2 * dim, sparse=sparse)
        for e in (self.gmf_user, self.gmf_item, self.mlp_user, self.mlp_item):
            nn.init.normal_(e.weight, std=0.01)
        self.mlp = nn.Sequential(nn.Linear(4 * dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim), nn.ReLU())
        self.out = nn.Linear(2 * dim, 1)

    def score(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """The logit ``z`` of each (user, item) pair (int64 ids of any matching shape)."""
        gmf = self.gmf_user(users) * self.gmf_item(items)
        mlp = self.mlp(torch.cat([self.mlp_user(users), self.mlp_item(items)], dim=-1))
        return self.out(torch.cat([gmf, mlp], dim=-1)).squeeze(-1)

    def score_candidates(self, x: torch.Tensor) -> torch.Tensor:
        """Rows ``(user, item_0, .., item_C-1)`` -> scores ``(rows, C)``."""
        ids = x.long()
        return self.score(ids[:, :1].expand(-1, ids.shape[1] - 1), ids[:, 1:])

    def forward(self, x):
        ids = x.long()
        z = self.score(ids[:, 0], ids[:, 1]).unsqueeze(1)
        return torch.cat([torch.zeros_like(z), z], dim=1)
