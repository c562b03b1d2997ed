"""The one training loop: epochs and steps for every runtime.

:func:`run_loop` runs epochs of batches and does, once for all runtimes,
what is not the runtime's own business: step timing, the per-step log and
progress lines, the count of steps and of skipped (non-finite) steps,
per-epoch evaluation and history, checkpoint and resume (SIGUSR1, sent by
SLURM before the time limit, writes a checkpoint and ends the job with exit
code 0), and at the end the runtime's result.  ``--max-skipped-steps``
skipped steps in a row end the run (:class:`NoProgress`); a resume whose
configuration differs from the checkpoint's in more than
:data:`mpisparse.config.RESUME_FREE_FIELDS` is refused before any step; what
a killed save left in the checkpoint directory is removed at the start.

A runtime hands it a step object (:class:`TrainStep`): what one batch does,
how an epoch's train loss is reduced, how to evaluate, what to checkpoint
(or that it cannot), and how its result is built.  The data-parallel loop
(:mod:`mpisparse.train.loop`), the parameter-server worker
(:mod:`mpisparse.ps.train`; servers run their own loop and never enter this
one) and the pipeline stages (:mod:`mpisparse.mp.runtime`) are such steps.

Determinism: data order depends on ``(seed, epoch)`` only and the loop
position is checkpointed, so a resumed run at the same world size continues
exactly as an uninterrupted one on the CPU.
"""

from __future__ import annotations

import signal
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..results.build import current_rss_bytes
from ..mpi.signals import early_usr1

__all__ = ["LoopState", "NoProgress", "Opened", "Preempted", "StepOutcome", "TrainStep", "epoch_line", "mean_over_ranks",
           "open_checkpoint", "run_loop"]

Progress = Callable[[str | None], None]


@dataclass
class StepOutcome:
    """What one batch did on this rank.

    ``loss``: the batch's loss (None: this rank does not know it, e.g. a
    pipeline stage before the last); ``stepped``: False when the step was
    skipped for a non-finite gradient; ``density``: the fraction of
    elements the step sent, or None where none counts (a skipped step);
    ``selected``: elements selected, counted into the result's density;
    ``bytes``: bytes sent (None: what the step object's ``bytes_sent``
    counter moved); ``log``: extra keys of the per-step log record.
    ``loss`` must be known on every rank once :meth:`TrainStep.after_batch`
    has run (the progress line shows it).
    """

    loss: float | None
    stepped: bool = True
    density: float | None = None
    selected: float | None = None
    bytes: int | None = None
    log: dict[str, Any] = field(default_factory=dict)


class TrainStep:
    """What a runtime supplies to :func:`run_loop` (subclass it; defaults are noted per method)."""

    #: the phase timer every step is timed with
    timer: Any
    #: False: the runtime cannot write checkpoints (``--checkpoint`` and ``--resume`` are refused)
    checkpointable: bool = False
    #: what the refusal of a checkpoint names, e.g. "the parameter-server scheme 'dgs'"
    description: str = "this runtime"
    #: the ranks that agree after every step whether a signal asks for a checkpoint (None: all of the
    #: loop's ``comm``; the parameter-server workers, whose servers are told by message)
    agree_comm: Any = None
    #: appended to the printed line of an epoch with a test evaluation / of the final evaluation
    epoch_note: str = ""
    final_note: str = ""

    def batches(self, epoch: int) -> Sequence[Any]:
        """This rank's batches of ``epoch``."""
        raise NotImplementedError

    def bytes_sent(self) -> int:
        """A counter of the bytes this rank has sent (read before and after each step)."""
        raise NotImplementedError

    def train_batch(self, b: int, batch: Any) -> StepOutcome:
        """One batch: forward, backward, exchange, optimizer step (timed as the step)."""
        raise NotImplementedError

    def after_batch(self, outcome: StepOutcome, iteration: int) -> StepOutcome:
        """After the timed step (untimed): agreement on the loss, diagnostics.  Default: nothing."""
        return outcome

    def epoch_loss(self, losses: list[float]) -> float:
        """The epoch's train loss from this rank's batch losses (a reduction over ranks, or local)."""
        raise NotImplementedError

    def evaluate(self, epoch: int) -> dict[str, float] | None:
        """Test metrics after ``epoch`` (keys without ``test_``); None: this rank evaluates nothing now."""
        raise NotImplementedError

    def stop_requested(self) -> bool:
        """After a step and its :meth:`after_batch` (untimed): True ends the run there, the epoch's evaluation
        and the result still done (e.g. ``bench tta`` at its target accuracy); every rank must agree.
        Default: never."""
        return False

    def keeps_history(self) -> bool:
        """Whether this rank records the per-epoch history.  Default: every rank."""
        return True

    def finish(self) -> dict[str, float] | None:
        """After the last epoch: test metrics that replace the last epoch's, or None.  Default: None."""
        return None

    def before_save(self, tag: int, stopping: bool) -> None:
        """Just before a checkpoint named ``tag`` is written (``stopping``: the run ends after it, a signal's
        checkpoint).  Default: nothing."""

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(common, this rank's)`` parts of a checkpoint (only when :attr:`checkpointable`)."""
        raise NotImplementedError

    def load_state(self, common: dict[str, Any], mine: dict[str, Any] | None) -> None:
        """Restore :meth:`state`'s parts; at another world size ``mine`` is the redistributed share
        (:mod:`mpisparse.train.reshard`: a ``"scheme"`` state without ``torch_rng``, or no ``"scheme"``
        where it was reset)."""
        raise NotImplementedError

    def result(self, loop: "LoopState"):
        """The run's :class:`~mpisparse.results.RunResult` (a collective)."""
        raise NotImplementedError


@dataclass
class LoopState:
    """Where the loop is, and what it measured on this rank (handed to :meth:`TrainStep.result`)."""

    epoch: int = 0
    batch: int = 0
    #: steps done (skipped ones included), over the whole run (a resumed run counts on)
    iteration: int = 0
    skipped: int = 0
    #: skipped steps in a row up to now (``--max-skipped-steps`` of them stop the run)
    consecutive_skipped: int = 0
    #: this rank's batch losses of the current epoch so far (checkpointed mid-epoch)
    losses: list[float] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    wall_offset: float = 0.0
    #: this run's (not a resumed run's earlier) bytes per step and selected elements per counted step
    step_bytes: list[int] = field(default_factory=list)
    selected: list[float] = field(default_factory=list)
    #: this rank's resident memory after each epoch of this run, by iteration (``str`` keys, as in JSON)
    rss: dict[str, int] = field(default_factory=dict)

    def metrics(self) -> dict[str, Any]:
        """The result's ``metrics``: the last epoch's record and all of them."""
        return {"final": dict(self.history[-1]) if self.history else {}, "per_epoch": self.history}


class NoProgress(RuntimeError):
    """``--max-skipped-steps`` steps in a row were skipped: the run would go on without learning."""


class Preempted(SystemExit):
    """Training stopped after a checkpoint requested by a signal (exit code 0)."""

    def __init__(self) -> None:
        super().__init__(0)


class _Signals:
    """SIGUSR1 (sent by SLURM before the time limit) asks for a checkpoint."""

    def __init__(self) -> None:
        self.requested = early_usr1()  # a SIGUSR1 that came before training started
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


def _agree_flag(comm, flag: bool) -> bool:
    """True on every rank when any rank's flag is set (ranks see a signal at different steps)."""
    return bool(comm.allreduce(np.array([int(flag)], np.int32), op="max")[0])


def mean_over_ranks(comm, values: Sequence[float]) -> float:
    """The mean of every rank's ``values`` together (a collective; 0 when no rank has any)."""
    total, count = comm.allreduce(np.array([sum(values), len(values)], dtype=np.float64))
    return float(total / max(count, 1.0))


def epoch_line(r: dict[str, Any], epochs: int) -> str:
    """The line printed after an epoch."""
    test = (f"test HR@10 {100 * r['test_hit_rate']:.2f}%" if "test_hit_rate" in r
            else f"test acc {100 * r['test_accuracy']:.2f}%" if "test_accuracy" in r
            else f"test ppl {r['test_perplexity']:.2f}")
    test += f"  test AUC {r['test_auc']:.4f}" if "test_auc" in r else ""
    return (f"epoch {r['epoch']}/{epochs}  train loss {r['train_loss']:.4f}  test loss {r['test_loss']:.4f}  "
            f"{test}  ({r['wall_seconds']:.1f}s)")


@dataclass
class Opened:
    """A checkpoint directory made ready (:func:`open_checkpoint`): what to resume from, if anything."""

    common: dict[str, Any] | None = None
    mine: dict[str, Any] | None = None


def open_checkpoint(comm, cfg, *, reshard: bool = True) -> Opened:
    """Collective over ``comm``: remove what a killed save left in ``cfg.checkpoint``; with ``cfg.resume``
    read this rank's part and refuse (ValueError) a checkpoint written by another configuration.

    ``reshard`` False: a checkpoint of another world size is refused too (a runtime whose ranks have
    roles, e.g. the parameter servers).  :func:`run_loop` calls it unless handed the result.
    """
    from ..config import RESUME_FREE_FIELDS, config_differences, flat_fields
    from . import checkpoint

    checkpoint.clean(cfg.checkpoint, comm)  # what a save killed half-way left
    if not cfg.resume:
        return Opened()
    common, mine = checkpoint.load(cfg.checkpoint, comm, reshard=reshard)
    saved = common.get("config")
    if not isinstance(saved, dict):
        raise checkpoint.CheckpointError(f"checkpoint in {cfg.checkpoint} holds no configuration to compare "
                                         "this run with")
    now = asdict(cfg)
    diffs = config_differences(saved, now, ignore=RESUME_FREE_FIELDS)
    if diffs:
        flat_saved, flat_now = flat_fields(saved), flat_fields(now)
        named = "; ".join(f"{k}: checkpoint has {flat_saved.get(k)!r}, this run has {flat_now.get(k)!r}"
                          for k in diffs[:6])
        raise ValueError(f"checkpoint in {cfg.checkpoint} was written by a different run ({named}); --resume "
                         "continues the same run: only --epochs and output options may change")
    return Opened(common, mine)


def _resume(opened: Opened, step: TrainStep, loop: LoopState) -> None:
    common, mine = opened.common, opened.mine
    step.load_state(common, mine)
    pos = common["loop"]
    loop.epoch, loop.batch, loop.iteration, loop.skipped = pos["epoch"], pos["batch"], pos["iteration"], pos["skipped"]
    loop.consecutive_skipped = int(pos.get("consecutive_skipped", 0))
    loop.losses = list(mine["loop_losses"]) if mine is not None else []  # another world size: all on rank 0
    loop.history = common["history"]
    loop.wall_offset = common["wall_seconds"]


def _save(comm, cfg, step: TrainStep, loop: LoopState, epoch: int, batch: int, wall: float, *,
          stopping: bool = False) -> None:
    from . import checkpoint

    step.before_save(loop.iteration, stopping)
    common, mine = step.state()
    common = {**common, "loop": {"epoch": epoch, "batch": batch, "iteration": loop.iteration,
                                 "skipped": loop.skipped, "consecutive_skipped": loop.consecutive_skipped},
              "history": loop.history, "wall_seconds": wall, "config": asdict(cfg)}
    mine = {**mine, "loop_losses": loop.losses if batch else []}
    checkpoint.save(cfg.checkpoint, comm, loop.iteration, common, mine)


def _count_skip(cfg, loop: LoopState, stepped: bool, epoch: int, batch: int) -> None:
    """Count a skipped step; ``cfg.max_skipped_steps`` in a row end the run with :class:`NoProgress`."""
    if stepped:
        loop.consecutive_skipped = 0
        return
    loop.skipped += 1
    loop.consecutive_skipped += 1
    limit = getattr(cfg, "max_skipped_steps", 0)
    if limit and loop.consecutive_skipped >= limit:
        raise NoProgress(
            f"{loop.consecutive_skipped} steps in a row were skipped (a non-finite gradient, exchanged update "
            f"or updated parameter), the last at epoch {epoch + 1} batch {batch + 1} (iteration "
            f"{loop.iteration}); the run makes no progress: lower --lr, set --clip, or raise "
            f"--max-skipped-steps (now {limit})")


def run_loop(comm, cfg, step: TrainStep, *, progress: Progress | None = None,
             step_log: Callable[[dict[str, Any]], None] | None = None, opened: Opened | None = None):
    """Train ``cfg.epochs`` epochs of ``step`` on this rank; returns ``step.result(loop)``.

    ``cfg`` is the run's :class:`~mpisparse.config.TrainConfig` (``epochs``,
    ``checkpoint`` and ``resume`` are read here; the step reads the rest).  ``opened``: the
    checkpoint directory already opened on every rank of ``comm`` (:func:`open_checkpoint`), where a
    runtime needs that before its step object exists.
    """
    if (cfg.checkpoint or cfg.resume) and not step.checkpointable:
        raise ValueError(f"--checkpoint/--resume are not supported for {step.description}")
    loop = LoopState()
    if cfg.resume and not cfg.checkpoint:
        raise ValueError("--resume needs --checkpoint DIR")
    if cfg.checkpoint and opened is None:
        opened = open_checkpoint(comm, cfg)
    if opened is not None and opened.common is not None:
        _resume(opened, step, loop)
    agree = step.agree_comm if step.agree_comm is not None else comm
    start_epoch, start_batch = loop.epoch, loop.batch
    timer = step.timer
    t_start = time.perf_counter() - loop.wall_offset

    def say(line: str) -> None:
        if progress is not None:
            progress(None)
            progress(line)

    with _Signals() as signals:
        for epoch in range(start_epoch, cfg.epochs):
            if epoch != start_epoch:
                loop.losses = []
            losses = loop.losses
            batches = step.batches(epoch)
            for b, batch in enumerate(batches):
                if epoch == start_epoch and b < start_batch:
                    continue
                before = step.bytes_sent()
                with timer.step():
                    out = step.train_batch(b, batch)
                nbytes = step.bytes_sent() - before if out.bytes is None else out.bytes
                loop.iteration += 1
                _count_skip(cfg, loop, out.stepped, epoch, b)
                out = step.after_batch(out, loop.iteration)
                loop.step_bytes.append(nbytes)
                if out.selected is not None:
                    loop.selected.append(out.selected)
                if out.loss is not None:
                    losses.append(out.loss)
                if step_log is not None:
                    step_log({"epoch": epoch, "batch": b, "iteration": loop.iteration, "loss": out.loss,
                              "step_seconds": timer.records[-1]["step"],
                              "wall_seconds": time.perf_counter() - t_start, "bytes": nbytes,
                              "density": out.density if out.density is not None else 0.0,
                              "skipped": not out.stepped, **out.log})
                if progress is not None:
                    progress(f"epoch {epoch + 1}/{cfg.epochs} batch {b + 1}/{len(batches)} loss {out.loss:.4f}",
                             done=epoch * len(batches) + b + 1, total=cfg.epochs * len(batches))
                if cfg.checkpoint and _agree_flag(agree, signals.requested):
                    # a scheduler's warning (SLURM --signal=B:USR1@T): checkpoint, then stop cleanly
                    _save(comm, cfg, step, loop, epoch, b + 1, time.perf_counter() - t_start, stopping=True)
                    say(f"signal received: checkpoint written to {cfg.checkpoint}; stopping (continue with --resume)")
                    raise Preempted()
                if step.stop_requested():
                    break
            loop.rss[str(loop.iteration)] = current_rss_bytes()
            train_loss = step.epoch_loss(losses)
            test = step.evaluate(epoch)
            if step.keeps_history():
                record = {"epoch": epoch + 1, "iteration": loop.iteration,
                          "wall_seconds": time.perf_counter() - t_start, "train_loss": train_loss,
                          **{f"test_{k}": v for k, v in (test or {}).items()}}
                loop.history.append(record)
                if test is not None:
                    say(epoch_line(record, cfg.epochs) + step.epoch_note)
            if cfg.checkpoint:
                _save(comm, cfg, step, loop, epoch + 1, 0, time.perf_counter() - t_start)
            if step.stop_requested():
                break
    if getattr(cfg, "trace", None) is not None and getattr(timer, "spans", None) is not None:
        from ..results.trace import write_trace

        write_trace(cfg.trace, comm, timer)  # collective: every rank's spans, written by rank 0
    final = step.finish()
    if final is not None and loop.history:
        loop.history[-1].update({f"test_{k}": v for k, v in final.items()})
        loop.history[-1]["wall_seconds"] = time.perf_counter() - t_start
        say(epoch_line(loop.history[-1], cfg.epochs) + step.final_note)
    return step.result(loop)
