"""The training loop behind ``mpisparse train``.

Every rank builds the same model from the same seed (rank 0's parameters
are broadcast anyway), reads its own shard of the training set, and steps a
:class:`mpisparse.torch.DistributedOptimizer`.  Per step it logs loss,
bytes, density and time; per epoch it evaluates on the test set (sharded,
sums reduced over ranks) and optionally writes a checkpoint.

Determinism: data order depends on ``(seed, epoch)`` only, models have no
dropout and the loop position is checkpointed, so a resumed run at the same
world size continues exactly as an uninterrupted one on the CPU.
"""

from __future__ import annotations

import math
import signal
import time
from dataclasses import asdict
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..data import iterate_batches, lm_batches, load_dataset, shard_indices
from ..models.nets import build_model, is_lm, needs_image
from ..schemes import SCHEMES
from ..config import TrainConfig
from ..timing import PhaseTimer, reduce_over_ranks
from ..torch import DistributedOptimizer
from . import checkpoint


class _Signals:
    """SIGUSR1 (sent by SLURM before the time limit) asks for a checkpoint."""

    def __init__(self) -> None:
        self.requested = False
        self._old = None

    def __enter__(self):
        if hasattr(signal, "SIGUSR1"):
            try:
                self._old = signal.signal(signal.SIGUSR1, self._handle)
            except ValueError:  # not the main thread
                self._old = None
        return self

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            signal.signal(signal.SIGUSR1, self._old)


class Preempted(SystemExit):
    """Training stopped after a checkpoint requested by a signal (exit code 0)."""

    def __init__(self) -> None:
        super().__init__(0)


def _agree_flag(comm, flag: bool) -> bool:
    """True on every rank when any rank's flag is set (ranks see a signal at different steps)."""
    return bool(comm.allreduce(np.array([int(flag)], np.int32), op="max")[0])


def _reduce_sums(comm, values: list[float]) -> np.ndarray:
    arr = np.array(values, dtype=np.float64)
    return comm.allreduce(arr)


def evaluate(model, batches, comm, lm: bool) -> dict[str, float]:
    """Loss and accuracy (or perplexity) over every rank's share of a set."""
    model.eval()
    loss_sum = correct = count = 0.0
    with torch.no_grad():
        hidden = None
        for x, y in batches:
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


def seeded_setup(cfg: TrainConfig):
    """Seed every RNG, load the data and build the model: ``(is_lm, dataset, model)``.

    Shared by the data-parallel, parameter-server and pipeline loops so all
    start from the same parameters for the same seed.
    """
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.set_num_threads(1)
    lm = is_lm(cfg.model)
    ds = load_dataset(cfg.data, data_dir=cfg.data_dir, seed=cfg.seed, image=needs_image(cfg.model))
    if lm != (ds.kind == "lm"):
        raise ValueError(f"model {cfg.model!r} does not fit data {cfg.data!r}: the lstm model needs "
                         "--data text, the classifiers need image or vector data")
    model = build_model(cfg.model, input_shape=ds.input_shape, num_classes=ds.num_classes)
    return lm, ds, model


def run_training(comm, cfg: TrainConfig, *, progress: Callable[[str], None] | None = None,
                 step_log: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train with ``cfg`` on every rank of ``comm``; returns the result object."""
    lm, ds, model = seeded_setup(cfg)
    provides_momentum = SCHEMES[cfg.scheme].provides_momentum
    opts = dict(cfg.scheme_options)
    if provides_momentum:
        opts.setdefault("momentum", cfg.momentum)
    sgd = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.0 if provides_momentum else cfg.momentum,
                          weight_decay=cfg.weight_decay)
    timer = PhaseTimer()
    dopt = DistributedOptimizer(sgd, model, cfg.scheme, cfg.density, comm=comm, timer=timer,
                                memory=cfg.memory, seed=cfg.seed, **opts)

    # the per-rank training batches of an epoch, and the test batches
    W, rank = comm.size, comm.rank
    if lm:
        test_batches = lm_batches(ds.test_x, cfg.batch_size, cfg.bptt, rank=rank, world=W)
        train_lm = lm_batches(ds.train_x, cfg.batch_size, cfg.bptt, rank=rank, world=W)
        per_epoch = min(comm.allgather_obj(len(train_lm)))
        if per_epoch == 0:
            raise ValueError("the training text is too short for --batch-size x --bptt on this many ranks")
    else:
        n_train = len(ds.train_y)
        per_rank = n_train // W
        if per_rank == 0:
            raise ValueError(f"{n_train} training samples cannot be shared by {W} ranks")
        per_epoch = math.ceil(per_rank / cfg.batch_size)
        test_idx = np.arange(len(ds.test_y))[rank::W]
        test_batches = list(iterate_batches(ds.test_x, ds.test_y, test_idx, 512))

    def epoch_batches(epoch: int):
        if lm:
            return train_lm[:per_epoch]
        idx = shard_indices(n_train, rank, W, seed=cfg.seed, epoch=epoch)[:per_rank]
        return list(iterate_batches(ds.train_x, ds.train_y, idx, cfg.batch_size))

    # resume
    start_epoch = start_batch = 0
    history: list[dict[str, Any]] = []
    wall_offset = 0.0
    if cfg.resume:
        if not cfg.checkpoint:
            raise ValueError("--resume needs --checkpoint DIR")
        common, mine = checkpoint.load(cfg.checkpoint, comm)
        if common["config"]["model"] != cfg.model or common["config"]["scheme"] != cfg.scheme:
            raise ValueError(
                f"checkpoint in {cfg.checkpoint} is for model {common['config']['model']!r} with scheme "
                f"{common['config']['scheme']!r}, not {cfg.model!r} with {cfg.scheme!r}")
        model.load_state_dict(common["model"])
        dopt.load_state_dict(common["optimizer"], scheme_state=False)
        if mine is not None:
            dopt.scheme.load_state_dict(mine["scheme"])
            torch.set_rng_state(mine["torch_rng"])
        else:
            dopt.scheme.iteration = int(common["iteration"])
        start_epoch, start_batch = common["epoch"], common["batch"]
        history = common["history"]
        wall_offset = common["wall_seconds"]

    def save(epoch: int, batch: int, wall: float) -> None:
        common = {"model": model.state_dict(), "optimizer": {k: v for k, v in dopt.state_dict().items()
                                                            if k != "scheme"},
                  "iteration": dopt.scheme.iteration, "epoch": epoch, "batch": batch,
                  "history": history, "wall_seconds": wall, "config": asdict(cfg)}
        checkpoint.save(cfg.checkpoint, comm, dopt.steps + dopt.skipped_steps, common,
                        {"scheme": dopt.scheme.state_dict(), "torch_rng": torch.get_rng_state()})

    step_bytes: list[int] = []
    selected: list[float] = []
    diags: list[dict[str, float]] = []
    t_start = time.perf_counter() - wall_offset
    hidden = None
    with _Signals() as signals:
        for epoch in range(start_epoch, cfg.epochs):
            losses = []
            batches = epoch_batches(epoch)
            for b, (x, y) in enumerate(batches):
                if epoch == start_epoch and b < start_batch:
                    continue
                before = comm.bytes_sent
                with timer.step():
                    with timer.phase("forward"):
                        if lm:
                            hidden = None if (b == 0 or hidden is None) else model.detach_hidden(hidden)
                            out, hidden = model(x, hidden)
                            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
                        else:
                            loss = F.cross_entropy(model(x), y)
                    with timer.phase("backward"):
                        dopt.zero_grad()
                        loss.backward()
                        if cfg.clip > 0:
                            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
                    stepped = dopt.step()
                nbytes = comm.bytes_sent - before
                if cfg.diagnostics and stepped:  # every rank agrees on stepped; outside the timed step
                    diags.append({"iteration": dopt.steps + dopt.skipped_steps, **dopt.scheme.diagnostics()})
                step_bytes.append(nbytes)
                density = dopt.scheme.selected_global() / dopt.layout.n if stepped else 0.0
                if stepped:
                    selected.append(density)
                losses.append(loss.item())
                if step_log is not None:
                    step_log({"epoch": epoch, "batch": b, "iteration": dopt.steps + dopt.skipped_steps,
                              "loss": loss.item(), "step_seconds": timer.records[-1]["step"],
                              "wall_seconds": time.perf_counter() - t_start, "bytes": nbytes,
                              "density": density, "skipped": not stepped})
                if progress is not None:
                    progress(f"epoch {epoch + 1}/{cfg.epochs} batch {b + 1}/{len(batches)} "
                             f"loss {loss.item():.4f}")
                if cfg.checkpoint and _agree_flag(comm, signals.requested):
                    # a scheduler's warning (SLURM --signal=B:USR1@T): checkpoint, then stop cleanly
                    save(epoch, b + 1, time.perf_counter() - t_start)
                    if progress is not None:
                        progress(None)
                        progress(f"signal received: checkpoint written to {cfg.checkpoint}; "
                                 "stopping (continue with --resume)")
                    raise Preempted()
            loss_sum, loss_count = _reduce_sums(comm, [sum(losses), len(losses)])
            train_loss = float(loss_sum / max(loss_count, 1.0))
            test = evaluate(model, test_batches, comm, lm)
            record = {"epoch": epoch + 1, "iteration": dopt.steps + dopt.skipped_steps,
                      "wall_seconds": time.perf_counter() - t_start, "train_loss": train_loss,
                      **{f"test_{k}": v for k, v in test.items()}}
            history.append(record)
            if progress is not None:
                progress(None)
                progress(_epoch_line(record, cfg.epochs))
            if cfg.checkpoint:
                save(epoch + 1, 0, time.perf_counter() - t_start)

    phases = reduce_over_ranks(comm, timer.means())
    per_rank = comm.allgather_obj({"bytes": float(np.mean(step_bytes)) if step_bytes else 0.0})
    step = phases.pop("step", {"mean": 0.0, "max": 0.0})
    final = dict(history[-1]) if history else {}
    result = {
        "scheme": cfg.scheme,
        "world_size": W,
        "density_target": cfg.density,
        "density_actual": float(np.mean(selected)) if selected else 0.0,
        "bytes_sent_per_rank": max(p["bytes"] for p in per_rank),
        "phases": {k: v["max"] for k, v in phases.items()},
        "phases_mean_over_ranks": {k: v["mean"] for k, v in phases.items()},
        "step_seconds": step["max"],
        "step_seconds_mean_over_ranks": step["mean"],
        "skipped_steps": dopt.skipped_steps,
        "n": dopt.layout.n,
        "config": {**asdict(cfg), **{f"scheme.{k}": v for k, v in dopt.scheme.opts.items()}},
        "metrics": {"final": final, "per_epoch": history},
    }
    if cfg.diagnostics:  # the layout of bench step's diagnostics (mpisparse.bench.step)
        keys = sorted({k for d in diags for k in d if k != "iteration"})
        result["diagnostics"] = {"density_per_step": list(selected),
                                 "mean": {k: float(np.mean([d[k] for d in diags if k in d])) for k in keys},
                                 "per_step": diags}
    return result


def _epoch_line(r: dict[str, Any], epochs: int) -> str:
    test = (f"test acc {100 * r['test_accuracy']:.2f}%" if "test_accuracy" in r
            else f"test ppl {r['test_perplexity']:.2f}")
    return (f"epoch {r['epoch']}/{epochs}  train loss {r['train_loss']:.4f}  test loss {r['test_loss']:.4f}  "
            f"{test}  ({r['wall_seconds']:.1f}s)")
