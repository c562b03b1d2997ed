"""An asynchronous parameter-server scheme replayed in one process with a fixed staleness.

Under MPI the staleness of a push depends on timing: the same command can
see staleness 0 on one run and 3 on the next, so a divergence that depends
on it comes and goes.  :func:`replay` drives a scheme's real worker and
server sides (the classes in this package, no MPI) through a deterministic
schedule, so the effect of staleness is reproducible and testable:

* ``K`` workers take turns (0, 1, ..., K-1), each pushing once per turn,
  so ``K - 1`` other pushes land between a worker's pull and its next push
  (the staleness a server measures with ``K`` equally fast workers);
* ``delay = d`` injects ``d`` more steps of lag: worker ``k`` computes its
  gradient on the model it held ``d`` of its own replies ago (the push is
  then stale by ``(d + 1) K - 1`` server updates).

One server holds the whole vector.  Each worker trains on its own shard of
the data (:func:`mpisparse.data.shard_indices`, as ``train`` does), and the
server's model is evaluated on the test set after every epoch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..data import iterate_batches, load_dataset, shard_indices
from ..models.nets import build_model, needs_image
from .algorithm import ServerContext, WorkerContext
from .roles import Shard
from .train import bind_flat


@dataclass
class ReplayResult:
    """Per epoch: the workers' mean train loss and the server model's test accuracy."""

    staleness: int
    train_loss: list[float] = field(default_factory=list)
    test_accuracy: list[float] = field(default_factory=list)

    @property
    def final_accuracy(self) -> float:
        return self.test_accuracy[-1]


def replay(scheme: str, *, workers: int = 2, delay: int = 0, epochs: int = 10, model: str = "mlp",
           data: str = "digits", density: float = 0.01, lr: float = 0.1, momentum: float = 0.9,
           batch_size: int = 32, seed: int = 7, **opts: Any) -> ReplayResult:
    """Train ``scheme`` (``asgd`` or ``dgs``) with ``workers`` workers at a fixed staleness (module doc)."""
    from ..registry import scheme_class

    cls = scheme_class(scheme)
    if getattr(cls, "mode", None) != "async":
        raise ValueError(f"replay needs an asynchronous parameter-server scheme (asgd, dgs), got {scheme!r}")
    if workers < 1 or delay < 0 or epochs < 1:
        raise ValueError(f"need workers >= 1, delay >= 0, epochs >= 1; got {workers}, {delay}, {epochs}")
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    ds = load_dataset(data, seed=seed, image=needs_image(model))
    net = build_model(model, input_shape=ds.input_shape, num_classes=ds.num_classes)
    layout, params, flat = bind_flat(net)
    w0 = flat.numpy().copy()
    opts = {o.name: o.default for o in cls.options} | opts
    shard = Shard(0, 0, 0, layout.n, tuple((j, s.offset, s.end) for j, s in enumerate(layout.layers)))
    server = cls.server_class(ServerContext(layout, shard, workers, density, dict(opts), seed=seed), w0)
    algos, models = [], []
    for k in range(workers):
        ctx = WorkerContext(layout, [shard], k, workers, density, dict(opts), lr=lr, momentum=momentum, seed=seed)
        algo = cls.worker_class(ctx)
        w = w0.copy()
        algo.on_init(w, [server.init_parts(k)])
        algos.append(algo)
        models.append(deque([w.copy() for _ in range(delay + 1)], maxlen=delay + 1))
    loss_fn = torch.nn.CrossEntropyLoss()
    out = ReplayResult(staleness=(delay + 1) * workers - 1)
    w_net = flat.numpy()
    for epoch in range(epochs):
        shards = [list(iterate_batches(ds.train_x, ds.train_y,
                                       shard_indices(len(ds.train_y), k, workers, seed=seed, epoch=epoch),
                                       batch_size)) for k in range(workers)]
        losses = []
        for b in range(min(len(s) for s in shards)):
            for k in range(workers):
                x, y = shards[k][b]
                w_net[...] = models[k][0]  # the model `delay` replies ago
                for p in params:
                    p.grad = None
                loss = loss_fn(net(x), y)
                loss.backward()
                g = np.concatenate([p.grad.detach().numpy().ravel() for p in params]).astype(np.float32)
                losses.append(float(loss.item()))
                w = models[k][-1].copy()
                bundle = algos[k].make_push(w, g)[0]
                server.apply([(k, server.receive(k, bundle))])
                algos[k].on_reply(w, [server.reply(k)])
                models[k].append(w)
        w_net[...] = server.model()
        with torch.no_grad():
            acc = float((net(ds.test_x).argmax(1) == ds.test_y).float().mean())
        out.train_loss.append(float(np.mean(losses)))
        out.test_accuracy.append(acc)
    return out
