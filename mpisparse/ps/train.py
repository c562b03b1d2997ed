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

Checkpoints (``--checkpoint``, ``--resume``, SIGUSR1): the files of
:mod:`mpisparse.train.checkpoint`, one per rank: a worker's holds its model
(parameters and buffers), local optimizer, scheme state (residuals,
momentum, Slim-DP's core and sampler), RNG and losses; a server's its shard
and the scheme's server state (DGS's ``M`` and ``v``, Slim-DP's core and
significance sums) and where its loop is (version, round-robin turn).  The
save protocol makes the state consistent: with ``--checkpoint`` the
workers agree after every step (on a communicator of their own) whether a
signal asks for a checkpoint, so at a save point every worker has finished
the same step and had every push answered; each then sends ``SAVE`` to
every server and stops pushing; a server that has ``SAVE`` from every
active worker has nothing in flight, and all ranks write their files
together (one collective save: atomic, ENOSPC undone); then the workers go
on (or, after a signal's checkpoint, every rank ends with exit code 0).
A resume needs the same ranks and ``--servers`` (the ranks have roles).
The loop itself (epochs, logging, evaluation, history) is
:mod:`mpisparse.train.core`.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable

import numpy as np
import torch

from ..data import iterate_batches, lm_batches
from ..backend.fusion import FusionLayout
from ..registry import create
from ..torch.sgd import SGD
from ..results.timing import PhaseTimer
from ..train.core import LoopState, Preempted, StepOutcome, open_checkpoint, run_loop
from ..train.loop import ModelStep, evaluate, seeded_setup
from .protocol import SAVE, Part, send_bundle
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
    opened = open_checkpoint(comm, cfg, reshard=False) if cfg.checkpoint else None  # every rank
    # with checkpoints the workers agree on signals among themselves (the servers hear by message)
    workers = comm.split(0 if comm.rank < comm.size - cfg.servers else 1) if cfg.checkpoint else None
    lm, ds, model = seeded_setup(cfg)
    layout, params, flat = bind_flat(model)
    w = flat.numpy()
    scheme = create(cfg.scheme, comm, layout, cfg.density, memory=cfg.memory, seed=cfg.seed,
                    servers=cfg.servers, **dict(cfg.scheme_options))
    timer = PhaseTimer()
    try:
        if scheme.is_server():
            server = scheme.make_server(w, timer=timer)
            if opened is not None:
                server.on_save = _server_save(comm, cfg, server)
                if opened.mine is not None:
                    server.load_state_dict(opened.mine["server"])
            return ps_train_result(comm, cfg, scheme, server.run().summary(timer), [])
        step = WorkerStep(comm, cfg, scheme, lm, ds, model, params, layout, w, timer)
        step.agree_comm = workers
        return run_loop(comm, cfg, step, progress=progress, step_log=step_log, opened=opened)
    finally:
        if workers is not None and hasattr(workers, "comm"):
            workers.comm.Free()


def _server_save(comm, cfg, server):
    """A server's part of a checkpoint (the workers asked for it with ``SAVE``; a collective with them)."""
    from ..train import checkpoint

    def save(tag: int, stop: bool) -> None:
        checkpoint.save(cfg.checkpoint, comm, tag, {}, {"server": server.state_dict()})
        if stop:  # a signal's checkpoint: the workers stop after it, so does this server
            raise Preempted()

    return save


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
    checkpointable = True
    epoch_note = "  (worker 0's train loss)"
    final_note = "  (the servers' final model)"

    def __init__(self, comm, cfg, scheme, lm, ds, model, params, layout, w, timer):
        K, k = scheme.roles.workers, comm.rank
        super().__init__(cfg, lm, ds, model, shard=k, shards=K, timer=timer, unit="workers")
        self.comm, self.scheme, self.params, self.layout, self.w = comm, scheme, params, layout, w
        self.worker = scheme.make_worker(lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                                         timer=timer)
        self.opt = (SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
                    if scheme.local_optimizer else None)
        self.g = layout.zeros()
        self.g_views = layout.unflatten(self.g)
        if k != 0:
            self.test_batches = []
        elif lm:
            self.test_batches = lm_batches(ds.test_x, cfg.batch_size, cfg.seq_len)
        else:
            self.test_batches = list(iterate_batches(ds.test_x, ds.test_y, np.arange(len(ds.test_y)), 512))
        self.epoch_losses: list[float] = []
        self.iteration = 0
        self.worker.start(w)  # w_k^0 <- Pull(w^0)

    def after_batch(self, outcome: StepOutcome, iteration: int) -> StepOutcome:
        self.iteration = iteration
        return outcome

    def before_save(self, tag: int, stopping: bool) -> None:
        """The save protocol: every push is answered (the step is over); ask every server to join the save."""
        keys = np.array([tag, int(stopping)], dtype=np.int32)
        pending: list = []
        for sh in self.scheme.shards:
            send_bundle(self.comm, [Part(SAVE, keys=keys)], sh.rank, pending)
        self.comm.waitall(pending)

    def state(self):
        mine = {"model": self.model.state_dict(), "worker": self.worker.algo.state_dict(),
                "epoch_losses": list(self.epoch_losses), "torch_rng": torch.get_rng_state()}
        if self.opt is not None:
            mine["optimizer"] = self.opt.state_dict()
        return {"runtime": "ps"}, mine

    def load_state(self, common, mine) -> None:
        self.model.load_state_dict(mine["model"])  # copies into the views of w
        self.worker.algo.load_state_dict(mine["worker"])
        if self.opt is not None:
            self.opt.load_state_dict(mine["optimizer"])
        self.epoch_losses = [float(v) for v in mine["epoch_losses"]]
        torch.set_rng_state(mine["torch_rng"])
        self.iteration = int(common["loop"]["iteration"])

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
        # the last epoch's metrics come from finish(); with checkpoints they are also taken now, so that a
        # checkpoint's history holds them for a resume with more epochs (the same servers' model)
        if self.comm.rank != 0 or (epoch + 1 >= self.cfg.epochs and not self.cfg.checkpoint):
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
