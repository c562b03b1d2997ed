"""``mpisparse train`` with a parameter-server scheme (the ``ps`` runtime).

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
with ``--momentum`` and ``--weight-decay``; a step that leaves the model
non-finite is undone and counted in ``skipped_steps``), then
:meth:`~.worker.PSWorker.step` (push and pull when due; a pulled model
that is not finite ends the run with an error).  ``--max-skipped-steps``
skipped steps in a row end the run (:mod:`mpisparse.train.core`).

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

Checkpoint / resume are not supported by this runtime.  The loop itself
(epochs, logging, evaluation, history) is :mod:`mpisparse.train.core`.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable

import numpy as np
import torch

from ..data import iterate_batches, lm_batches
from ..backend.fusion import FusionLayout
from ..registry import create
from ..results.timing import PhaseTimer
from ..train.core import LoopState, StepOutcome, run_loop
from ..train.loop import ModelStep, evaluate, seeded_setup
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
                    step_log: Callable[[dict[str, Any]], None] | None = None):
    """Train ``cfg`` (a :class:`mpisparse.config.TrainConfig`) with ``cfg.servers`` parameter servers."""
    if cfg.checkpoint or cfg.resume:
        raise ValueError(f"--checkpoint/--resume are not supported for the parameter-server scheme "
                         f"{cfg.scheme!r}")
    lm, ds, model = seeded_setup(cfg)
    layout, params, flat = bind_flat(model)
    w = flat.numpy()
    scheme = create(cfg.scheme, comm, layout, cfg.density, memory=cfg.memory, seed=cfg.seed,
                    servers=cfg.servers, **dict(cfg.scheme_options))
    timer = PhaseTimer()
    if scheme.is_server():
        return ps_train_result(comm, cfg, scheme, scheme.make_server(w, timer=timer).run().summary(timer), [])
    step = WorkerStep(comm, cfg, scheme, lm, ds, model, params, layout, w, timer)
    return run_loop(comm, cfg, step, progress=progress, step_log=step_log)


def ps_train_result(comm, cfg, scheme, local: dict[str, Any], history: list[dict[str, Any]]):
    """The result of a parameter-server training run (a collective over servers and workers).

    ``history`` is worker 0's; each epoch's ``train_loss`` becomes the mean
    over workers of their epoch's mean loss.
    """
    res = gather_ps_result(comm, scheme, local)
    extras = res.ps.pop("worker_extra")
    losses = [e["epoch_losses"] for e in extras]
    history = comm.bcast_obj(history, 0)
    for e, rec in enumerate(history):
        vals = [l[e] for l in losses if e < len(l)]
        rec["train_loss"] = float(np.mean(vals)) if vals else float("nan")
    res.ps["worker_extra"] = [{k: v for k, v in e.items() if k != "epoch_losses"} for e in extras]
    res.skipped_steps = int(sum(e["skipped"] for e in extras))
    res.config = {**asdict(cfg), "servers": cfg.servers, **{f"scheme.{k}": v for k, v in scheme.opts.items()}}
    res.metrics = {"final": dict(history[-1]) if history else {}, "per_epoch": history}
    return res


class WorkerStep(ModelStep):
    """One minibatch of a parameter-server worker: forward, backward, local step, push and pull when due.

    Worker 0 evaluates the servers' model (``GET``) after every epoch but
    the last, and the servers' final model after the last (:meth:`finish`).
    """

    description = "the parameter-server runtime"
    epoch_note = "  (worker 0's train loss)"
    final_note = "  (the servers' final model)"

    def __init__(self, comm, cfg, scheme, lm, ds, model, params, layout, w, timer):
        K, k = scheme.roles.workers, comm.rank
        super().__init__(cfg, lm, ds, model, shard=k, shards=K, timer=timer, unit="workers")
        self.comm, self.scheme, self.params, self.layout, self.w = comm, scheme, params, layout, w
        self.worker = scheme.make_worker(lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                                         timer=timer)
        self.opt = (torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
                    if scheme.local_optimizer else None)
        self.g = layout.zeros()
        self.g_views = layout.unflatten(self.g)
        if k != 0:
            self.test_batches = []
        elif lm:
            self.test_batches = lm_batches(ds.test_x, cfg.batch_size, cfg.bptt)
        else:
            self.test_batches = list(iterate_batches(ds.test_x, ds.test_y, np.arange(len(ds.test_y)), 512))
        self.epoch_losses: list[float] = []
        self.worker.start(w)  # w_k^0 <- Pull(w^0)

    def bytes_sent(self) -> int:
        return 0  # a step reports what its push sent (StepOutcome.bytes)

    def train_batch(self, b, batch) -> StepOutcome:
        x, y = batch
        loss = self.forward(b, x, y)
        g = self.g
        with self.timer.phase("backward"):
            for p in self.params:
                p.grad = None
            loss.backward()
            if self.cfg.clip > 0:
                torch.nn.utils.clip_grad_norm_(self.params, self.cfg.clip)
            for p, view in zip(self.params, self.g_views):
                if p.grad is None:
                    view[...] = 0
                else:
                    view[...] = p.grad.detach().numpy()
            finite = bool(np.isfinite(g).all())
        if not finite:
            g.fill(0)
            for p in self.params:
                p.grad = None
        if self.opt is not None and finite:
            with self.timer.phase("update"):
                saved = self.w.copy()
                self.opt.step()
                if not np.isfinite(self.w).all():  # the local step overflowed: undo it, count it skipped
                    self.w[...] = saved
                    finite = False
        communicated = self.worker.step(self.w, g)
        if communicated and not np.isfinite(self.w).all():
            raise FloatingPointError(
                f"worker {self.comm.rank}: the model pulled from the servers is not finite (the servers' "
                "sum overflowed); the run cannot go on: lower --lr or set --clip")
        up, down, pushed = self.worker.log[-1] if communicated else (0, 0, 0)
        return StepOutcome(loss.item(), finite, pushed / self.layout.n, bytes=up, log={"bytes_down": down})

    def epoch_loss(self, losses: list[float]) -> float:
        self.epoch_losses.append(float(np.mean(losses)) if losses else float("nan"))
        return self.epoch_losses[-1]

    def _evaluate_vector(self, vec: np.ndarray) -> dict[str, float]:
        w = self.w
        saved = w.copy()
        w[...] = vec
        try:
            return evaluate(self.model, self.test_batches, LocalComm(), self.lm)
        finally:
            w[...] = saved

    def keeps_history(self) -> bool:
        return self.comm.rank == 0

    def evaluate(self, epoch: int) -> dict[str, float] | None:
        if self.comm.rank != 0 or epoch + 1 >= self.cfg.epochs:
            return None
        return self._evaluate_vector(self.worker.fetch_model())

    def finish(self) -> dict[str, float] | None:
        self.extra = self.worker.finish(self.w)  # every worker ends with the servers' final model
        if self.comm.rank != 0:
            return None
        return evaluate(self.model, self.test_batches, LocalComm(), self.lm)

    def result(self, loop: LoopState):
        local = self.worker.stats.summary(self.timer, self.layout.n)
        local["extra"] = {**self.extra, "epoch_losses": self.epoch_losses, "skipped": loop.skipped,
                          "steps": loop.iteration}
        return ps_train_result(self.comm, self.cfg, self.scheme, local, loop.history)
