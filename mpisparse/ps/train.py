"""``mpisparse train`` with a parameter-server scheme (``Scheme.family == "ps"``).

Every rank builds the same model from the seed and the same fusion layout.
The model's parameters are re-bound as views of one flat float32 tensor,
so the worker algorithm's vector ``w`` *is* the model (a pull writes the
parameters in place, the optimizer's in-place step moves ``w``).

Servers (the last ``--servers`` ranks) take their shard of that initial
model and run :class:`~.server.ServerLoop` until every worker is done.

Workers (ranks ``0 .. K-1``) read their shard of the training set (the
data-parallel sharding over ``K`` workers) and per minibatch run forward,
backward (the gradient is copied into a flat buffer; a non-finite gradient
is replaced by zeros and counted in ``skipped_steps``), the local
optimizer's step when the scheme trains locally (Plump-DP, Slim-DP: SGD
with ``--momentum`` and ``--weight-decay``), then
:meth:`~.worker.PSWorker.step` (push and pull when due).

Evaluation: at the end of each epoch but the last, worker 0 asks the
servers for the model as they hold it (``GET``) and evaluates it on the
whole test set (the other workers go on: nothing waits for it in
asynchronous mode).  After the last epoch every worker sends ``DONE``;
when all have, the servers send each its final bundle (DGS: the pending
difference, then the model), every worker ends with the servers' final
model, and worker 0 evaluates it: the last epoch's test metrics (and
``metrics.final``) are the model the servers hold at the end.  Train loss
per epoch is the mean over workers.  Batch-norm running statistics are
not parameters: each worker keeps its own, worker 0's are used.

Checkpoint / resume are not supported for this family.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..data import iterate_batches, lm_batches, shard_indices
from ..fusion import FusionLayout
from ..registry import create
from ..timing import PhaseTimer
from .results import gather_ps_result


class LocalComm:
    """A one-rank stand-in for the communicator in :func:`mpisparse.train.loop.evaluate`."""

    size = 1
    rank = 0

    def allreduce(self, x, out=None, *, op: str = "sum"):
        if out is None:
            return np.array(x, copy=True)
        out[...] = x
        return out


def bind_flat(model: torch.nn.Module) -> tuple[FusionLayout, list[torch.nn.Parameter], torch.Tensor]:
    """Re-bind the trainable parameters as views of one flat float32 tensor (returned)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise ValueError("the model has no trainable parameters")
    layout = FusionLayout([(n, tuple(p.shape)) for n, p in named])
    flat = torch.zeros(layout.n, dtype=torch.float32)
    params = [p for _, p in named]
    with torch.no_grad():
        for p, slot in zip(params, layout.layers):
            view = flat[slot.offset:slot.end].view(slot.shape)
            view.copy_(p.detach().to(torch.float32))
            p.data = view
    return layout, params, flat


def run_ps_training(comm, cfg, *, progress: Callable[[str | None], None] | None = None,
                    step_log: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train ``cfg`` (a :class:`mpisparse.config.TrainConfig`) with ``cfg.servers`` parameter servers."""
    servers = cfg.servers
    if cfg.checkpoint or cfg.resume:
        raise ValueError(f"--checkpoint/--resume are not supported for the parameter-server scheme "
                         f"{cfg.scheme!r}")
    from ..train.loop import seeded_setup

    lm, ds, model = seeded_setup(cfg)
    layout, params, flat = bind_flat(model)
    w = flat.numpy()
    scheme = create(cfg.scheme, comm, layout, cfg.density, memory=cfg.memory, seed=cfg.seed,
                    servers=servers, **dict(cfg.scheme_options))
    timer = PhaseTimer()
    history: list[dict[str, Any]] = []
    if scheme.is_server():
        local = scheme.make_server(w, timer=timer).run().summary(timer)
    else:
        local, history = _train_worker(comm, cfg, scheme, model, params, layout, w, ds, lm, timer,
                                       progress, step_log)
    res = gather_ps_result(comm, scheme, local)
    extras = res.pop("worker_extra")
    losses = [e["epoch_losses"] for e in extras]
    history = comm.bcast_obj(history, 0)
    for e, rec in enumerate(history):
        vals = [l[e] for l in losses if e < len(l)]
        rec["train_loss"] = float(np.mean(vals)) if vals else float("nan")
    res["worker_extra"] = [{k: v for k, v in e.items() if k != "epoch_losses"} for e in extras]
    res["skipped_steps"] = int(sum(e["skipped"] for e in extras))
    res["config"] = {**asdict(cfg), "servers": servers, **{f"scheme.{k}": v for k, v in scheme.opts.items()}}
    res["metrics"] = {"final": dict(history[-1]) if history else {}, "per_epoch": history}
    return res


def _train_worker(comm, cfg, scheme, model, params, layout, w, ds, lm, timer, progress, step_log):
    from ..train.loop import _epoch_line, evaluate

    K, k = scheme.roles.workers, comm.rank
    worker = scheme.make_worker(lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, timer=timer)
    opt = None
    if scheme.local_optimizer:
        opt = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    g = layout.zeros()
    g_views = layout.unflatten(g)

    if lm:
        train_lm = lm_batches(ds.train_x, cfg.batch_size, cfg.bptt, rank=k, world=K)
        test_batches = lm_batches(ds.test_x, cfg.batch_size, cfg.bptt) if k == 0 else []
    else:
        n_train = len(ds.train_y)
        per_rank = n_train // K
        if per_rank == 0:
            raise ValueError(f"{n_train} training samples cannot be shared by {K} workers")
        test_batches = (list(iterate_batches(ds.test_x, ds.test_y, np.arange(len(ds.test_y)), 512))
                        if k == 0 else [])

    def epoch_batches(epoch: int):
        if lm:
            return train_lm
        idx = shard_indices(n_train, k, K, seed=cfg.seed, epoch=epoch)[:per_rank]
        return list(iterate_batches(ds.train_x, ds.train_y, idx, cfg.batch_size))

    def evaluate_vector(vec: np.ndarray) -> dict[str, float]:
        saved = w.copy()
        w[...] = vec
        try:
            return evaluate(model, test_batches, LocalComm(), lm)
        finally:
            w[...] = saved

    worker.start(w)  # w_k^0 <- Pull(w^0)
    history: list[dict[str, Any]] = []
    epoch_losses: list[float] = []
    skipped = 0
    iteration = 0
    t_start = time.perf_counter()
    hidden = None
    for epoch in range(cfg.epochs):
        losses = []
        batches = epoch_batches(epoch)
        for b, (x, y) in enumerate(batches):
            with timer.step():
                with timer.phase("forward"):
                    if lm:
                        hidden = None if (b == 0 or hidden is None) else model.detach_hidden(hidden)
                        out, hidden = model(x, hidden)
                        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
                    else:
                        loss = F.cross_entropy(model(x), y)
                with timer.phase("backward"):
                    for p in params:
                        p.grad = None
                    loss.backward()
                    if cfg.clip > 0:
                        torch.nn.utils.clip_grad_norm_(params, cfg.clip)
                    for p, view in zip(params, g_views):
                        if p.grad is None:
                            view[...] = 0
                        else:
                            view[...] = p.grad.detach().numpy()
                    finite = bool(np.isfinite(g).all())
                if not finite:
                    g.fill(0)
                    skipped += 1
                    for p in params:
                        p.grad = None
                if opt is not None and finite:
                    with timer.phase("update"):
                        opt.step()
                communicated = worker.step(w, g)
            iteration += 1
            losses.append(loss.item())
            if step_log is not None:
                up, down, pushed = worker.log[-1] if communicated else (0, 0, 0)
                step_log({"epoch": epoch, "batch": b, "iteration": iteration, "loss": loss.item(),
                          "step_seconds": timer.records[-1]["step"],
                          "wall_seconds": time.perf_counter() - t_start, "bytes": up, "bytes_down": down,
                          "density": pushed / layout.n, "skipped": not finite})
            if progress is not None:
                progress(f"epoch {epoch + 1}/{cfg.epochs} batch {b + 1}/{len(batches)} loss {loss.item():.4f}")
        epoch_losses.append(float(np.mean(losses)) if losses else float("nan"))
        if k == 0:
            record = {"epoch": epoch + 1, "iteration": iteration, "wall_seconds": time.perf_counter() - t_start,
                      "train_loss": epoch_losses[-1]}
            if epoch + 1 < cfg.epochs:
                record.update({f"test_{key}": v for key, v in evaluate_vector(worker.fetch_model()).items()})
            history.append(record)
            if progress is not None and epoch + 1 < cfg.epochs:
                progress(None)
                progress(_epoch_line(record, cfg.epochs) + "  (worker 0's train loss)")
    extra = worker.finish(w)  # every worker ends with the servers' final model
    if k == 0 and history:
        history[-1].update({f"test_{key}": v for key, v in evaluate(model, test_batches, LocalComm(), lm).items()})
        history[-1]["wall_seconds"] = time.perf_counter() - t_start
        if progress is not None:
            progress(None)
            progress(_epoch_line(history[-1], cfg.epochs) + "  (the servers' final model)")
    local = worker.stats.summary(timer, layout.n)
    local["extra"] = {**extra, "epoch_losses": epoch_losses, "skipped": skipped, "steps": iteration}
    return local, history
