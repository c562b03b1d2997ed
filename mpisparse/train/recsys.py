"""The recommendation models in the runtimes: their data and model options, and their held-out metrics.

``dlrm`` on click data and ``ncf`` on ratings (:mod:`mpisparse.data.recsys`)
are evaluated by what their papers report, not by a classifier's accuracy
alone:

* clicks (``model.recsys == "clicks"``): ``loss`` (binary cross-entropy),
  ``accuracy`` (the click predicted when its logit is positive) and ``auc``,
  the area under the ROC curve of every rank's held-out samples together
  (chance: 0.5);
* ranking (``"ranking"``, NCF): ``loss`` (binary cross-entropy of every
  candidate: the held-out item 1, the others 0), ``hit_rate`` (HR@10: the
  held-out item among the 10 best-scored of its candidates; chance
  ``10 / candidates``) and ``ndcg`` (NDCG@10), He et al.'s protocol.

A collective over ``comm``: every rank evaluates its share of the test set;
the AUC needs every score (one ``allgather_obj`` of the scores and labels),
the rest are sums (one Allreduce).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..data.recsys import auc, hit_rate

__all__ = ["data_options", "evaluate_recsys", "is_recsys", "model_options", "recsys_metrics"]

#: the number of top-scored candidates a hit counts in (He et al.'s HR@10 and NDCG@10)
TOP = 10


def is_recsys(model) -> bool:
    """Whether ``model`` is a recommendation model with tables (it has a ``recsys`` kind)."""
    return getattr(model, "recsys", None) is not None


def data_options(cfg) -> dict[str, Any]:
    """``load_dataset``'s keywords for the recommendation data (``--emb-tables``, ``--emb-rows``)."""
    if cfg.data in ("clicks", "ratings", "criteo", "movielens"):
        return {"tables": cfg.emb_tables, "rows": cfg.emb_rows}
    return {}


def model_options(cfg, ds, *, sparse: bool) -> dict[str, Any]:
    """``build_model``'s keywords for a dataset with tables (``ds.meta["tables"]``): the tables, ``--emb-dim``, and
    ``sparse`` (``nn.Embedding(sparse=True)``, exchanged row-sparse); none for other data."""
    tables = ds.meta.get("tables")
    if not tables:
        return {}
    return {"tables": list(tables), "dim": cfg.emb_dim, "sparse": bool(sparse)}


def _scores(model, x: torch.Tensor) -> torch.Tensor:
    if model.recsys == "ranking":
        return model.score_candidates(x)
    out = model(x)
    return out[:, 1] - out[:, 0]


def evaluate_recsys(model, batches, comm, *, dev=None) -> dict[str, float]:
    """The held-out metrics of module docstring over every rank's share of ``batches`` (a collective)."""
    model.eval()
    scores, labels = [], []
    with torch.no_grad():
        for x, y in batches:
            if dev is not None:
                x = x.to(dev)
            scores.append(_scores(model, x).float().cpu().numpy())
            labels.append(y.numpy())
    model.train()
    ranking = model.recsys == "ranking"
    s = np.concatenate(scores) if scores else np.zeros((0, 1) if ranking else 0, np.float32)
    y = np.concatenate(labels) if labels else np.zeros(0, np.int64)
    return recsys_metrics(comm, s, y, ranking)


def recsys_metrics(comm, s: np.ndarray, y: np.ndarray, ranking: bool) -> dict[str, float]:
    """The metrics from this rank's scores ``s`` (clicks: ``(n,)`` logits; ranking: ``(users, candidates)``,
    candidate 0 the held-out item) and labels ``y`` (clicks), every rank's together (a collective)."""
    st = torch.from_numpy(np.asarray(s, np.float32))
    if ranking:
        target = torch.zeros_like(st)
        target[:, :1] = 1.0
        hit, ndcg = hit_rate(s, TOP) if len(s) else (np.zeros(0), np.zeros(0))
        loss = F.binary_cross_entropy_with_logits(st, target, reduction="sum").item() if len(s) else 0.0
        loss, hits, gain, users, cells = comm.allreduce(np.array([loss, hit.sum(), ndcg.sum(), len(s), st.numel()],
                                                                 dtype=np.float64))
        return {"loss": loss / max(cells, 1.0), "hit_rate": hits / max(users, 1.0), "ndcg": gain / max(users, 1.0)}
    loss = F.binary_cross_entropy_with_logits(st, torch.from_numpy(y.astype(np.float32)), reduction="sum").item() \
        if len(s) else 0.0
    correct = float(((s > 0) == (y == 1)).sum())
    everyone = comm.allgather_obj((np.asarray(s, np.float32), np.asarray(y, np.int64)))
    loss, correct, count = comm.allreduce(np.array([loss, correct, len(s)], dtype=np.float64))
    return {"loss": loss / max(count, 1.0), "accuracy": correct / max(count, 1.0),
            "auc": auc(np.concatenate([e[0] for e in everyone]), np.concatenate([e[1] for e in everyone]))}
