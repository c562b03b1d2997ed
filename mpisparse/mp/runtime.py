"""The pipeline (model-parallel) and hybrid training runtime behind ``mpisparse train --mp-stages S``.

Every rank builds the whole model from the seed (so the stages start
exactly as a one-process model would), keeps its stage's layers
(:mod:`mpisparse.mp.stages`) and trains them:

1. stage 0 reads the batch; each stage runs its layers and sends the output
   activation to the next stage (:class:`~mpisparse.mp.link.ActivationLink`;
   sparsified by DCT-MP (Algorithm 2 of the DCT paper) when ``--scheme dct-mp``);
2. the last stage computes the loss (it also reads the labels) and
   back-propagates; each stage sends the gradient of its input activation
   to the previous stage (under the forward mask with DCT-MP) and
   back-propagates it through its layers;
3. each stage steps its optimizer; with ``R = W / S > 1`` replicas the
   stage's parameter gradients are first exchanged within the stage's group
   of replicas by the data-parallel scheme (``--dp-scheme``, any collective
   scheme, through :class:`mpisparse.torch.DistributedOptimizer` on the group
   communicator) -- the DCT paper's hybrid setting (its Fig. 1, Table 3).

Micro-batches (``--micro-batches M``) follow GPipe's schedule: the forward
passes of all ``M`` micro-batches, then their backward passes in reverse
order, gradients accumulated, one optimizer step per batch.  The loss of
micro-batch ``m`` is its summed cross-entropy divided by the batch size,
so the accumulated gradient is the batch mean's.

Data: replica ``r`` of ``R`` reads the shard ``shard_indices(n, r, R)``
(the same as rank ``r`` of an ``R``-rank data-parallel run); every stage of a
replica walks the same batches.  The test set is sharded over replicas and
evaluated through the pipeline (with the same sparsification: the mask is
part of the trained network, as in the DCT paper's Sec. 2.2 "Analysis").
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..data import iterate_batches, load_dataset, shard_indices
from ..models.nets import build_model, is_lm, needs_image
from ..results import RunResult
from ..results.build import timing_fields
from ..results.provenance import gather_provenance
from ..schemes import SCHEMES, CollectiveScheme
from ..results.timing import PHASES, PhaseTimer, reduce_over_ranks
from ..torch import DistributedOptimizer
from ..torch.sgd import SGD
from ..train.core import LoopState, StepOutcome, TrainStep, mean_over_ranks, run_loop
from ..train.recsys import data_options, is_recsys, model_options, recsys_metrics
from .config import MPConfig
from .link import ActivationLink
from .scheme import MPScheme
from .stages import pipeline_layers, plan_stages, stage_module
from .topology import split_communicators

__all__ = ["MPTrainer", "run_mp_training", "split_shapes"]


def split_shapes(model: torch.nn.Module, cuts: list[int], sample: torch.Tensor) -> list[tuple[int, ...]]:
    """Per-sample activation shape after each cut (one forward of ``sample``, a batch of one)."""
    shapes = []
    x = sample
    with torch.no_grad():
        for i, (_, layer) in enumerate(pipeline_layers(model)):
            x = layer(x)
            if i in cuts:
                shapes.append(tuple(x.shape[1:]))
    return shapes


class MPTrainer(TrainStep):
    """One rank of a pipeline (and hybrid) training job: its stage, links, optimizer and timer.

    It is the step :func:`mpisparse.train.core.run_loop` runs; :meth:`train_step`
    alone runs one batch through the pipeline.

    Parameters
    ----------
    comm: the world :class:`~mpisparse.mpi.comm.Communicator` (``W`` ranks, a multiple of ``mp.stages``).
    cfg: the :class:`mpisparse.config.TrainConfig` (``scheme`` is ``dense`` or ``dct-mp``).
    mp: the :class:`~mpisparse.mp.config.MPConfig`.
    dataset: an already loaded :class:`mpisparse.data.Dataset` (loaded from ``cfg`` when None).
    """

    description = "the pipeline (model-parallel) runtime"
    #: each rank's file holds its stage's parameters, optimizer (with its group's scheme state), DCT-MP's
    #: threshold and RNG; the configuration check refuses another split, another world size is refused here
    checkpointable = True

    def __init__(self, comm, cfg, mp: MPConfig, *, dataset=None):
        self.comm, self.cfg, self.mp = comm, cfg, mp
        if is_lm(cfg.model):
            raise ValueError(f"--model {cfg.model} cannot be split into pipeline stages")
        self.layout, self.pipe, self.group = split_communicators(comm, mp.stages)
        S = mp.stages
        self.stage = self.pipe.rank
        self.replica = self.layout.replica_of(comm.rank)
        self.first, self.last = self.stage == 0, self.stage == S - 1

        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.set_num_threads(1)
        self.ds = dataset if dataset is not None else load_dataset(
            cfg.data, data_dir=cfg.data_dir, seed=cfg.seed, image=needs_image(cfg.model), **data_options(cfg))
        model = build_model(cfg.model, input_shape=self.ds.input_shape, num_classes=self.ds.num_classes,
                            **model_options(cfg, self.ds, sparse=cfg.row_sparse))
        #: DLRM with tables: every stage binds each batch's ids (the stage holding the tables reads them)
        self._bind = getattr(model, "bind_input", None) if self.ds.meta.get("tables") else None
        self.recsys = is_recsys(model)
        self.n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self.plan = plan_stages(model, S, mp.split_after or None)
        self.shapes = split_shapes(model, self.plan.cuts, self.ds.train_x[:1])
        self.module = stage_module(model, self.plan, self.stage)
        del model

        self.timer = PhaseTimer()
        scheme_cls = SCHEMES[cfg.scheme]
        if issubclass(scheme_cls, MPScheme):
            opts = scheme_cls.validate_options(dict(cfg.scheme_options))
            self.threshold = opts.get("mp_threshold")
            sparsifier = scheme_cls.sparsifier(cfg.density, **opts)
        elif cfg.scheme == "dense":
            self.threshold, sparsifier = None, None
        else:
            raise ValueError(f"--scheme {cfg.scheme} is not a pipeline scheme (dense or dct-mp)")
        self.prev = (None if self.first else
                     ActivationLink(self.pipe, self.stage - 1, self.shapes[self.stage - 1], None, self.timer))
        self.next = (None if self.last else
                     ActivationLink(self.pipe, self.stage + 1, self.shapes[self.stage], sparsifier, self.timer))

        dp_cls = SCHEMES[mp.dp_scheme]
        if not issubclass(dp_cls, CollectiveScheme):
            raise ValueError(f"--dp-scheme {mp.dp_scheme} is not a data-parallel scheme")
        dp_opts = dict(mp.dp_options)
        if dp_cls.provides_momentum:
            dp_opts.setdefault("momentum", cfg.momentum)
        self.sgd = SGD(self.module.parameters(), lr=cfg.lr,
                       momentum=0.0 if dp_cls.provides_momentum else cfg.momentum, weight_decay=cfg.weight_decay)
        self.dp_density = cfg.density if mp.dp_density is None else mp.dp_density
        # one replica with the dense scheme: nothing to exchange, step the optimizer directly
        self.dopt = None
        if self.layout.replicas > 1 or mp.dp_scheme != "dense":
            self.dopt = DistributedOptimizer(self.sgd, self.module, mp.dp_scheme, self.dp_density, comm=self.group,
                                             timer=self.timer, memory=cfg.memory, seed=cfg.seed, overlap=False,
                                             **dp_opts)  # the plain step, as before overlap became the default
        self.skipped_steps = 0
        self.steps = 0
        self._dp_selected: list[float] = []
        self._dp_bytes: list[int] = []
        self._occupancy: list[float] = []
        # data: replica r of R reads shard r; the test set is sharded over replicas
        R = self.layout.replicas
        self.per_rank = len(self.ds.train_y) // R
        if self.per_rank == 0:
            raise ValueError(f"{len(self.ds.train_y)} training samples cannot be shared by {R} replicas")
        test_idx = np.arange(len(self.ds.test_y))[self.replica::R]
        self.test_batches = list(iterate_batches(self.ds.test_x, self.ds.test_y, test_idx, 512))

    # ------------------------------------------------------------ one step
    def bytes_sent(self) -> int:
        """Payload bytes this rank has sent on its pipeline and stage-group communicators."""
        return self.pipe.bytes_sent + self.group.bytes_sent

    def train_step(self, x: torch.Tensor | None, y: torch.Tensor) -> float | None:
        """Forward and backward of one batch through the pipeline, then the optimizer step.

        Every stage passes the batch's labels ``y`` (for its size and the
        micro-batch split); only stage 0 needs ``x`` (and, for DLRM with tables, every stage: each binds the
        batch's ids).  Returns the batch's
        mean loss on the last stage, None elsewhere.
        """
        rows = int(y.shape[0])
        M = min(self.mp.micro_batches, rows)
        ys = torch.tensor_split(y, M) if M > 1 else (y,)
        xs = (torch.tensor_split(x, M) if M > 1 else (x,)) if x is not None else (None,) * M
        saved = []
        # forward passes of all micro-batches (GPipe)
        for m in range(M):
            inp = xs[m] if self.first else self.prev.recv_activations(m)
            if self._bind is not None:
                self._bind(xs[m])
            with self.timer.phase("forward"):
                out = self.module(inp)
                if self.last:
                    out = (F.cross_entropy(out, ys[m]) if M == 1
                           else F.cross_entropy(out, ys[m], reduction="sum") / rows)
            if not self.last:
                self.next.send_activations(out, m)
            saved.append((inp, out))
        # backward passes in reverse order
        loss = 0.0
        for m in reversed(range(M)):
            inp, out = saved[m]
            grad = None if self.last else self.next.recv_gradients(int(ys[m].shape[0]), m)
            with self.timer.phase("backward"):
                if m == M - 1:
                    self.sgd.zero_grad()
                out.backward(grad)
            if self.last:
                loss += out.item()
            if not self.first:
                self.prev.send_gradients(inp.grad, m)
        saved.clear()
        # the optimizer step (after the data-parallel exchange in the stage's group)
        if self.dopt is not None:
            stepped = self.dopt.step()
            if stepped:
                self._dp_selected.append(self.dopt.scheme.selected_global() / self.dopt.layout.n)
            else:
                self.skipped_steps += 1
        else:
            with self.timer.phase("update"):
                if not self._local_step():
                    self.skipped_steps += 1
        self.steps += 1
        return loss if self.last else None

    def _local_step(self) -> bool:
        """The optimizer's step without a data-parallel exchange, skipped (False) when a gradient is not
        finite, undone (False) when it leaves a parameter non-finite."""
        params = [p for p in self.module.parameters() if p.requires_grad]
        grads = [p.grad.coalesce().values() if p.grad.is_sparse else p.grad for p in params if p.grad is not None]
        if grads and not bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()):
            self.sgd.zero_grad()
            return False
        saved = [p.detach().clone() for p in params]
        self.sgd.step()
        if bool(torch.stack([torch.isfinite(p).all() for p in params]).all()):
            return True
        with torch.no_grad():
            for p, v in zip(params, saved):
                p.copy_(v)
        return False

    # ------------------------------------------------------------ evaluation
    def evaluate_batches(self, batches) -> dict[str, float]:
        """Loss and accuracy over every replica's share of a set, through the pipeline (no stats)."""
        self.module.eval()
        loss_sum = correct = count = 0.0
        scores, labels = [], []
        with torch.no_grad():
            for x, y in batches:
                inp = x if self.first else self.prev.recv_activations(training=False)
                if self._bind is not None:
                    self._bind(x)
                out = self.module(inp)
                if self.last and self.recsys:
                    scores.append((out[:, 1] - out[:, 0]).numpy())
                    labels.append(y.numpy())
                elif self.last:
                    loss_sum += F.cross_entropy(out, y, reduction="sum").item()
                    correct += (out.argmax(1) == y).sum().item()
                    count += y.numel()
                else:
                    self.next.send_activations(out, training=False)
        self.module.train()
        if self.recsys:  # the click model's held-out loss, accuracy and AUC (every stage takes part)
            return recsys_metrics(self.comm, np.concatenate(scores) if scores else np.zeros(0, np.float32),
                                  np.concatenate(labels) if labels else np.zeros(0, np.int64), False)
        loss_sum, correct, count = self.comm.allreduce(np.array([loss_sum, correct, count], dtype=np.float64))
        return {"loss": loss_sum / max(count, 1.0), "accuracy": correct / max(count, 1.0)}

    # ------------------------------------------------------------ the loop's step
    def batches(self, epoch: int):
        idx = shard_indices(len(self.ds.train_y), self.replica, self.layout.replicas, seed=self.cfg.seed,
                            epoch=epoch)[:self.per_rank]
        return list(iterate_batches(self.ds.train_x, self.ds.train_y, idx, self.cfg.batch_size))

    def train_batch(self, b, batch) -> StepOutcome:
        x, y = batch
        before_dp, skipped = self.group.bytes_sent, self.skipped_steps
        kept0 = (self.next.stats.kept, self.next.stats.entries) if self.next else (0, 0)
        loss = self.train_step(x if self.first or self._bind is not None else None, y)
        self._dp_bytes.append(self.group.bytes_sent - before_dp)
        if self.next is not None:
            k, e = self.next.stats.kept - kept0[0], self.next.stats.entries - kept0[1]
            self._occupancy.append(k / e if e else 0.0)
        return StepOutcome(loss, self.skipped_steps == skipped, self._occupancy[-1] if self._occupancy else 1.0)

    def after_batch(self, out: StepOutcome, iteration: int) -> StepOutcome:
        # every stage learns the batch's loss from the last (control plane, not counted)
        return replace(out, loss=self.pipe.bcast_obj(out.loss, root=self.mp.stages - 1))

    def epoch_loss(self, losses: list[float]) -> float:
        # the last stage of each replica counts its batches, once
        return mean_over_ranks(self.comm, losses if self.last else [])

    def evaluate(self, epoch: int) -> dict[str, float]:
        return self.evaluate_batches(self.test_batches)

    # ------------------------------------------------------------ checkpoints
    def state(self):
        sparsifier = self.next.sparsifier if self.next is not None else None
        opt = self.dopt.state_dict() if self.dopt is not None else self.sgd.state_dict()
        mine = {"stage": self.stage, "replica": self.replica, "module": self.module.state_dict(),
                "optimizer": opt, "sparsifier": None if sparsifier is None else sparsifier.state_dict(),
                "skipped_steps": self.skipped_steps, "steps": self.steps, "torch_rng": torch.get_rng_state()}
        return {"stages": self.mp.stages}, mine

    def load_state(self, common, mine) -> None:
        if mine is None or "module" not in mine:
            raise ValueError(f"this pipeline checkpoint was written by {common.get('world_size')} ranks, this job "
                             f"has {self.comm.size}: a pipeline resumes on the same number of ranks (each rank's "
                             "file holds its stage)")
        if (mine["stage"], mine["replica"]) != (self.stage, self.replica):
            raise ValueError(f"checkpoint rank file of stage {mine['stage']} replica {mine['replica']} loaded by "
                             f"stage {self.stage} replica {self.replica}")
        self.module.load_state_dict(mine["module"])
        if self.dopt is not None:
            self.dopt.load_state_dict(mine["optimizer"])
        else:
            self.sgd.load_state_dict(mine["optimizer"])
        if mine["sparsifier"] is not None:
            self.next.sparsifier.load_state_dict(mine["sparsifier"])
        self.skipped_steps, self.steps = int(mine["skipped_steps"]), int(mine["steps"])
        torch.set_rng_state(mine["torch_rng"])

    # ------------------------------------------------------------ the result object
    def _split_report(self) -> dict[str, Any]:
        """What this rank knows about its splits (gathered by :meth:`result`)."""
        mine: dict[str, Any] = {"stage": self.stage, "replica": self.replica, "steps": max(self.steps, 1)}
        if self.next is not None:
            mine["next"] = self.next.stats.to_dict()
            sp = self.next.sparsifier
            mine["tau"] = None if sp is None else sp.tau
        if self.prev is not None:
            mine["prev"] = self.prev.stats.to_dict()
        return mine

    def result(self, loop: LoopState) -> RunResult:
        """The run's result from the loop's history and per-step byte counts (collective over ``comm``)."""
        cfg, mp, S = self.cfg, self.mp, self.mp.stages
        step_bytes, dp_bytes = loop.step_bytes, self._dp_bytes
        means = self.timer.means()
        phases = reduce_over_ranks(self.comm, means)
        everyone = self.comm.allgather_obj({**self._split_report(), "phases": means,
                                            "bytes": float(np.mean(step_bytes)) if step_bytes else 0.0,
                                            "dp_bytes": float(np.mean(dp_bytes)) if dp_bytes else 0.0,
                                            "dp_selected": self._dp_selected, "dp_n": (
                                                self.dopt.layout.n if self.dopt else 0),
                                            "skipped": self.skipped_steps})
        splits = []
        for j in range(S - 1):
            senders = [e for e in everyone if e["stage"] == j]
            receivers = [e for e in everyone if e["stage"] == j + 1]
            fwd = [e["next"]["bytes_forward"] / e["steps"] for e in senders]
            dense_f = [e["next"]["dense_bytes_forward"] / e["steps"] for e in senders]
            bwd = [e["prev"]["bytes_backward"] / e["steps"] for e in receivers]
            dense_b = [e["prev"]["dense_bytes_backward"] / e["steps"] for e in receivers]
            kept = sum(e["next"]["kept"] for e in senders)
            entries = sum(e["next"]["entries"] for e in senders)
            enc: dict[str, int] = {}
            for e in senders:
                for k, v in e["next"]["encodings"].items():
                    enc[k] = enc.get(k, 0) + v
            taus = [e["tau"] for e in senders if e.get("tau") is not None]
            splits.append({
                "after": self.plan.split_after[j], "activation_shape": list(self.shapes[j]),
                "bytes_forward": max(fwd), "bytes_backward": max(bwd),
                "dense_bytes_forward": max(dense_f), "dense_bytes_backward": max(dense_b),
                "compression_forward": max(dense_f) / max(fwd) if max(fwd) else 0.0,
                "compression_backward": max(dense_b) / max(bwd) if max(bwd) else 0.0,
                "occupancy": kept / entries if entries else 0.0,
                "mask_encodings": enc,
                **({"tau_last": float(np.mean(taus))} if taus else {}),
            })
        sent = sum(s["bytes_forward"] + s["bytes_backward"] for s in splits)
        dense = sum(s["dense_bytes_forward"] + s["dense_bytes_backward"] for s in splits)
        per_stage = []
        for s in range(S):
            rows = [e["phases"] for e in everyone if e["stage"] == s]
            names = [p for p in [*PHASES, "step"] if any(p in r for r in rows)]
            per_stage.append({p: max(r.get(p, 0.0) for r in rows) for p in names})
        dp_sel = sum(sum(e["dp_selected"]) / max(len(e["dp_selected"]), 1) * e["dp_n"] for e in everyone
                     if e["dp_selected"])
        dp_n = sum(e["dp_n"] for e in everyone if e["dp_selected"])
        # DCT-MP's achieved density: kept activation entries / entries, over all splits and steps
        kept_all = sum(e["next"]["kept"] for e in everyone if "next" in e)
        entries_all = sum(e["next"]["entries"] for e in everyone if "next" in e)
        return RunResult(
            scheme=cfg.scheme, runtime="mp", world_size=self.comm.size, density_target=cfg.density,
            density_actual=kept_all / entries_all if entries_all else 0.0,
            bytes_sent_per_rank=max(e["bytes"] for e in everyone), **timing_fields(phases),
            skipped_steps=max(e["skipped"] for e in everyone), n=self.n_params,
            config={**asdict(cfg), "mp": asdict(mp), **{f"scheme.{k}": v for k, v in cfg.scheme_options.items()}},
            metrics=loop.metrics(), provenance=gather_provenance(self.comm),
            mp={
                "stages": S, "replicas": self.layout.replicas, "micro_batches": mp.micro_batches,
                "threshold": self.threshold, **self.plan.to_dict(), "splits": splits,
                "bytes_forward": sum(s["bytes_forward"] for s in splits),
                "bytes_backward": sum(s["bytes_backward"] for s in splits),
                "dense_bytes": dense,
                "compression_factor": dense / sent if sent else 0.0,
                "phases_per_stage": per_stage,
                "dp_scheme": mp.dp_scheme, "dp_density": self.dp_density,
                "dp_density_actual": dp_sel / dp_n if dp_n else None,
                "dp_bytes_sent_per_rank": max(e["dp_bytes"] for e in everyone),
            })


def run_mp_training(comm, cfg, *, progress: Callable[[str | None], None] | None = None,
                    step_log: Callable[[dict[str, Any]], None] | None = None) -> RunResult:
    """Train ``cfg`` as ``W / S`` replicas of an ``S``-stage pipeline on ``comm``; returns its result.

    The result has the fields of :func:`mpisparse.train.loop.run_training`
    plus the ``mp`` block: stages, replicas, the split, per split the bytes
    sent forward and backward per step (max over replicas), what a dense
    pipeline would send, the compression factors and the achieved
    occupancy, and per-stage phase times.
    """
    return run_loop(comm, cfg, MPTrainer(comm, cfg, cfg.mp), progress=progress, step_log=step_log)
