"""The data-parallel (collective) step of ``mpisparse train``, and what the runtimes share.

Every rank builds the same model from the same seed (rank 0's parameters
are broadcast anyway), reads its own shard of the training set, and steps a
:class:`mpisparse.torch.DistributedOptimizer`.  :class:`CollectiveStep` is
what one batch does; the loop itself (epochs, logging, evaluation per
epoch on the sharded test set, checkpoints) is :mod:`mpisparse.train.core`.

Device: with ``--device cuda`` the model and every batch live on this
rank's GPU (:func:`mpisparse.mpi.device.torch_device`) and the optimizer's
step stays there (see :mod:`mpisparse.torch`); the communicator's staging
copies per step are reported (``staging_copies_per_step``); the phase
timer synchronises the device at every boundary, so a phase's time holds
its kernels.

Determinism: models have no dropout and the scheme's state, the optimizer
and the RNG are checkpointed, so a resumed run at the same world size
continues exactly as an uninterrupted one on the CPU.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..mpi import device
from ..data import iterate_batches, lm_batches, load_dataset, shard_indices
from ..models.nets import build_model, is_lm, needs_image
from ..schemes import SCHEMES
from ..config import TrainConfig
from ..results.build import collective_result
from ..results.timing import PhaseTimer
from ..torch import DistributedOptimizer
from ..torch.sgd import SGD
from .core import LoopState, Preempted, StepOutcome, TrainStep, mean_over_ranks, run_loop
from .recsys import data_options, evaluate_recsys, is_recsys, model_options

__all__ = ["CollectiveStep", "ModelStep", "Preempted", "evaluate", "run_training", "seeded_setup"]


def _reduce_sums(comm, values: list[float]) -> np.ndarray:
    arr = np.array(values, dtype=np.float64)
    return comm.allreduce(arr)


def evaluate(model, batches, comm, lm: bool, *, dev=None) -> dict[str, float]:
    """Loss and accuracy (or perplexity) over every rank's share of a set (batches moved to ``dev``); a
    recommendation model's own metrics (AUC, hit rate: :mod:`mpisparse.train.recsys`)."""
    if is_recsys(model):
        return evaluate_recsys(model, batches, comm, dev=dev)
    model.eval()
    loss_sum = correct = count = 0.0
    with torch.no_grad():
        hidden = None
        for x, y in batches:
            if dev is not None:
                x, y = x.to(dev), y.to(dev)
            if lm:
                out, hidden = model(x, hidden)
                loss_sum += F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), reduction="sum").item()
                count += y.numel()
            else:
                out = model(x)
                loss_sum += F.cross_entropy(out, y, reduction="sum").item()
                correct += (out.argmax(1) == y).sum().item()
                count += y.numel()
    model.train()
    loss_sum, correct, count = _reduce_sums(comm, [loss_sum, correct, count])
    loss = loss_sum / max(count, 1)
    if lm:
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}
    return {"loss": loss, "accuracy": correct / max(count, 1)}


def seeded_setup(cfg: TrainConfig, *, sparse: bool = False):
    """Seed every RNG, load the data and build the model: ``(is_lm, dataset, model)``.

    Shared by the data-parallel, parameter-server and pipeline loops so all
    start from the same parameters for the same seed.  ``sparse``: embedding
    tables as ``nn.Embedding(sparse=True)`` (the data-parallel step's ``--row-sparse``).
    """
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.set_num_threads(1)
    lm = is_lm(cfg.model)
    ds = load_dataset(cfg.data, data_dir=cfg.data_dir, seed=cfg.seed, image=needs_image(cfg.model),
                      **data_options(cfg))
    if lm != (ds.kind == "lm"):
        raise ValueError(f"model {cfg.model!r} does not fit data {cfg.data!r}: the language models need "
                         "--data pydoc or text, the classifiers need image or vector data")
    size = ({"layers": cfg.gpt_layers, "width": cfg.gpt_width, "heads": cfg.gpt_heads, "context": cfg.gpt_context}
            if cfg.model == "gpt" else model_options(cfg, ds, sparse=sparse))
    model = build_model(cfg.model, input_shape=ds.input_shape, num_classes=ds.num_classes, **size)
    return lm, ds, model


class ModelStep(TrainStep):
    """A whole model on this rank, data sharded over ``shards`` ranks: batches, forward, train loss.

    Shared by the data-parallel step and the parameter-server worker;
    ``test_batches`` is what :meth:`evaluate` reads.
    """

    def __init__(self, cfg: TrainConfig, lm: bool, ds, model, *, shard: int, shards: int, timer: PhaseTimer,
                 unit: str = "ranks"):
        self.cfg, self.lm, self.ds, self.model, self.timer = cfg, lm, ds, model, timer
        self.shard, self.shards = shard, shards
        self._hidden = None
        if lm:
            self._train_lm = lm_batches(ds.train_x, cfg.batch_size, cfg.seq_len, rank=shard, world=shards)
            self.per_epoch = len(self._train_lm)
        else:
            n_train = len(ds.train_y)
            self.per_rank = n_train // shards
            if self.per_rank == 0:
                raise ValueError(f"{n_train} training samples cannot be shared by {shards} {unit}")

    def batches(self, epoch: int):
        """This rank's batches of ``epoch``; the first ``--steps-per-epoch`` of them where it is set (a language
        model: the same first windows of the stream every epoch)."""
        cap = self.cfg.steps_per_epoch or None
        if self.lm:
            return self._train_lm[:self.per_epoch][:cap]
        idx = shard_indices(len(self.ds.train_y), self.shard, self.shards, seed=self.cfg.seed,
                            epoch=epoch)[:self.per_rank]
        return list(iterate_batches(self.ds.train_x, self.ds.train_y, idx, self.cfg.batch_size))[:cap]

    def forward(self, b: int, x, y):
        """The batch's loss (phase ``forward``)."""
        with self.timer.phase("forward"):
            if self.lm:
                self._hidden = None if (b == 0 or self._hidden is None) else self.model.detach_hidden(self._hidden)
                out, self._hidden = self.model(x, self._hidden)
                return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
            return F.cross_entropy(self.model(x), y)


class CollectiveStep(ModelStep):
    """One data-parallel batch: forward, backward, the scheme's exchange, the optimizer step."""

    checkpointable = True

    def __init__(self, comm, cfg: TrainConfig):
        lm, ds, model = seeded_setup(cfg, sparse=cfg.row_sparse)
        self.dev = device.torch_device(cfg.device, comm)
        model = model.to(self.dev)  # the same initial parameters on every device
        super().__init__(cfg, lm, ds, model, shard=comm.rank, shards=comm.size,
                         timer=PhaseTimer(trace=cfg.trace is not None, sync=device.torch_synchronizer(self.dev)))
        self.comm = comm
        #: this rank's communicator staging copies per step (device runs)
        self.staging: list[dict[str, int]] = []
        provides_momentum = SCHEMES[cfg.scheme].provides_momentum
        opts = dict(cfg.scheme_options)
        if provides_momentum:
            opts.setdefault("momentum", cfg.momentum)
        sgd = SGD(model.parameters(), lr=cfg.lr, momentum=0.0 if provides_momentum else cfg.momentum,
                              weight_decay=cfg.weight_decay)
        #: ``--amp``: the autocast dtype of forward (None: float32), and fp16's loss scaler (checkpointed)
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.amp)
        self.scaler = torch.amp.GradScaler(self.dev.type) if cfg.amp == "fp16" else None
        self.dopt = DistributedOptimizer(sgd, model, cfg.scheme, cfg.density, comm=comm, timer=self.timer,
                                         memory=cfg.memory, seed=cfg.seed, overlap=cfg.overlap, scaler=self.scaler,
                                         **opts)
        W, rank = comm.size, comm.rank
        if lm:
            self.test_batches = lm_batches(ds.test_x, cfg.batch_size, cfg.seq_len, rank=rank, world=W)
            self.per_epoch = min(comm.allgather_obj(self.per_epoch))
            if self.per_epoch == 0:
                raise ValueError("the training text is too short for --batch-size x the window (--bptt; gpt: "
                                 "--gpt-context) on this many ranks")
        else:
            test_idx = np.arange(len(ds.test_y))[rank::W]
            self.test_batches = list(iterate_batches(ds.test_x, ds.test_y, test_idx, 512))
        self.diagnostics: list[dict[str, float]] = []

    def bytes_sent(self) -> int:
        """This rank's bytes so far, the buckets' own communicator's included (``--overlap``)."""
        buckets = self.dopt.overlap
        return self.comm.bytes_sent + (buckets.bytes_sent if buckets is not None else 0)

    def train_batch(self, b, batch) -> StepOutcome:
        x, y = batch
        x, y = x.to(self.dev, non_blocking=True), y.to(self.dev, non_blocking=True)
        with torch.autocast(self.dev.type, dtype=self.amp_dtype or torch.float32, enabled=self.amp_dtype is not None):
            loss = self.forward(b, x, y)
        scaler = self.scaler
        staged = dict(self.comm.staging)  # the exchange's staging copies: it runs at the end of backward
        with self.timer.phase("backward"):  # the exchange runs at its end (DDP's contract; timed in its phases)
            self.dopt.zero_grad()
            (loss if scaler is None else scaler.scale(loss)).backward()
            if self.cfg.clip > 0:  # the aggregate's norm, the same on every rank
                if scaler is not None:
                    scaler.unscale_(self.dopt)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip)
        if scaler is None:
            stepped = self.dopt.step()
        else:  # skips a step whose aggregate is not finite (NaN on every rank alike), backs off, grows
            stepped = bool(scaler.step(self.dopt))
            scaler.update()
        self.staging.append({k: self.comm.staging[k] - staged[k] for k in staged})
        selected = self.dopt.selected_global() if stepped else None
        return StepOutcome(loss.item(), stepped, None if selected is None else selected / self.dopt.layout.n,
                           selected)

    def after_batch(self, out: StepOutcome, iteration: int) -> StepOutcome:
        if self.cfg.diagnostics and out.stepped:  # every rank agrees on stepped; outside the timed step
            self.diagnostics.append({"iteration": iteration, **self.dopt.scheme.diagnostics()})
        return out

    def epoch_loss(self, losses: list[float]) -> float:
        return mean_over_ranks(self.comm, losses)

    def evaluate(self, epoch: int) -> dict[str, float]:
        return evaluate(self.model, self.test_batches, self.comm, self.lm, dev=self.dev)

    def state(self):
        dopt = self.dopt
        state = dopt.state_dict()
        common = {"model": self.model.state_dict(),
                  "optimizer": {k: v for k, v in state.items() if k not in ("scheme", "buckets")},
                  "iteration": dopt.scheme.iteration}
        if self.scaler is not None:  # the same on every rank (the ranks skip and back off alike)
            common["scaler"] = self.scaler.state_dict()
        mine = {"scheme": state["scheme"], "torch_rng": torch.get_rng_state()}
        if "buckets" in state:  # --overlap: each bucket's scheme state (its error feedback), this rank's own
            mine["buckets"] = state["buckets"]
        if dopt.scheme.local_update:  # localsgd: between syncs each rank's parameters and optimizer state are its own
            mine["local"] = {"model": self.model.state_dict(), "optimizer": common["optimizer"]}
        return common, mine

    def load_state(self, common, mine) -> None:
        local = (mine or {}).get("local")  # localsgd at the saved world size; at another, old rank 0's (common)
        self.model.load_state_dict((local or common)["model"])
        self.dopt.load_state_dict((local or common)["optimizer"], scheme_state=False)
        if self.scaler is not None and "scaler" in common:
            self.scaler.load_state_dict(common["scaler"])
        if mine is not None and "scheme" in mine:  # this rank's, or redistributed at another world size
            self.dopt.scheme.load_state_dict(mine["scheme"])
        else:  # reset: a scheme state that cannot be redistributed
            self.dopt.scheme.iteration = int(common["iteration"])
        buckets = self.dopt.overlap.buckets if self.dopt.overlap is not None else []
        saved = (mine or {}).get("buckets")
        for i, bucket in enumerate(buckets):  # at another world size the buckets restart (not redistributed)
            if saved is not None and len(saved) == len(buckets):
                bucket.scheme.load_state_dict(saved[i])
            else:
                bucket.scheme.iteration = int(common["iteration"])
        if mine is not None and "torch_rng" in mine:  # at the saved world size
            torch.set_rng_state(mine["torch_rng"])

    def result(self, loop: LoopState):
        cfg, dopt = self.cfg, self.dopt
        res = collective_result(
            self.comm, scheme=cfg.scheme, density_target=cfg.density, timer=self.timer,
            step_bytes=loop.step_bytes, selected=loop.selected, n=dopt.layout.n,
            config={**asdict(cfg), **{f"scheme.{k}": v for k, v in dopt.scheme.opts.items()}},
            diagnostics=self.diagnostics if cfg.diagnostics else None,
            staging=self.staging if cfg.device != "cpu" else None,
            skipped_steps=dopt.skipped_steps, metrics=loop.metrics(),
            rss_bytes_at_step=_max_over_ranks(self.comm, loop.rss))
        if dopt.rows is not None:  # the tables' row-sparse exchange, its bytes apart from the scheme's
            res.extra["embeddings"] = dopt.rows.report(self.comm, float(np.mean(loop.step_bytes or [0])))
        return res


def _max_over_ranks(comm, rss: dict[str, int]) -> dict[str, int] | None:
    """``{iteration: bytes}``, the max over ranks (every rank records the same iterations)."""
    everyone = comm.allgather_obj(rss)
    return {k: max(r.get(k, 0) for r in everyone) for k in rss} or None


def run_training(comm, cfg: TrainConfig, *, progress: Callable[[str | None], None] | None = None,
                 step_log: Callable[[dict[str, Any]], None] | None = None):
    """Train with ``cfg`` on every rank of ``comm``; returns the :class:`~mpisparse.results.RunResult`."""
    return run_loop(comm, cfg, CollectiveStep(comm, cfg), progress=progress, step_log=step_log)

