"""``bench tta``: time to target, one model trained with each scheme until a target or a step budget.

Every run trains the same model from the same seed through the training
runtime (:class:`mpisparse.train.loop.CollectiveStep`, the loop of
:mod:`mpisparse.train.core`, :class:`mpisparse.torch.DistributedOptimizer`);
:class:`TTAStep` only adds, outside the timed step, an evaluation on the
whole test set every ``eval_every`` steps and the stop at the target (or at
``max_steps``).  The target (:class:`Target`) is a test accuracy for a
classifier, a held-out loss or perplexity for a language model (``lstm``,
``gpt``; a classifier may take a test loss too).  The runs, in order:

* ``dense-opt``: the optimized dense baseline, ``dense`` with a 16-bit wire
  (``wire_dtype``, float16 unless asked otherwise) and ``overlap`` (buckets
  exchanged from gradient hooks while backward runs);
* every other name: that registered data-parallel scheme as ``train`` runs
  it (``dense`` is plain float32 dense, no overlap).

What a row holds (the JSON keys; docs/performance.md#time-to-accuracy):

* ``target``: ``{"metric": "accuracy" | "loss" | "perplexity", "value": ...}``,
  the target this row ran to;
* ``steps_to_target`` / ``seconds_to_target``: the first evaluation that
  meets the target (an accuracy at or above it, a loss or perplexity at or
  below it; evaluations every ``eval_every`` steps, at each epoch's end and
  at the last step), and
  the training wall-clock up to it, evaluations excluded (the slowest
  rank's clock); the string ``"not reached"`` when the budget ran out first;
* ``final_loss`` and ``final_accuracy`` (a classifier) or
  ``final_perplexity`` (a language model): the last evaluation's;
* ``density``: the sparse schemes' ``--density`` (1 for dense); for
  ``localsgd`` the fraction of steps that synchronized (``1/H``, measured);
* ``bytes_per_step``: bytes each rank sent per step (mean over steps, the
  busiest rank), the buckets' own communicator included (``localsgd``: its
  parameter Allreduce every ``H`` steps, averaged over the steps);
* ``step_split``: the mean step (first step excluded: warm-up) in seconds,
  mean over ranks: ``exposed_exchange`` is the time the step spent in the
  scheme's phases (compensate, select, exchange, the finite-check
  agreement ``wait``; with overlap what was left of the buckets' exchange
  after backward, :meth:`~mpisparse.torch.overlap.BucketExchange.finish`),
  ``compute`` the rest of the step (forward, backward, the optimizer's
  update and the library's copies), ``hidden_exchange`` the exchange time
  that ran beside backward: the communication thread's time in the
  buckets' scheme steps minus the step's wait for them (never below 0;
  0 without overlap).  ``compute + exposed_exchange`` is the step.

The compute is this machine's CPU (one thread per rank; on an emulated
cluster every host shares the same cores), so the compute/exchange balance
is not a GPU cluster's: with faster compute the exchange weighs more.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

__all__ = ["BASELINE", "DEFAULT_SCHEMES", "EXCHANGE_PHASES", "NOT_REACHED", "QUICK", "Run", "Target", "check_target",
           "format_tta", "pick_target", "plan_runs", "plot_tta", "run_tta", "tta_result"]

#: the label of the optimized dense baseline (dense, a 16-bit wire, overlap)
BASELINE = "dense-opt"
DEFAULT_SCHEMES = (BASELINE, "dense", "topk", "cltk", "deft", "powersgd")
#: what ``steps_to_target`` and ``seconds_to_target`` hold when the budget ran out first
NOT_REACHED = "not reached"
#: the timer phases counted as the scheme's exchange (the rest of the step is compute)
EXCHANGE_PHASES = ("compensate", "select", "exchange_indices", "exchange_values", "wait", "push", "pull",
                   "server_apply")
#: ``--quick`` (CI, a few seconds on two cores): options the command line did not set (``target_loss``: the
#: target of a language model); ``tiny`` (``MPISPARSE_QUICK=1``) smaller still
QUICK = {"quick": {"model": "mlp", "target": 0.8, "target_loss": 3.5, "max_steps": 40, "eval_every": 5},
         "tiny": {"model": "mlp", "target": 0.5, "target_loss": 4.5, "max_steps": 12, "eval_every": 4}}
#: the targets when none is given: a classifier's test accuracy, a language model's held-out loss (nats per
#: token: for the gpt on pydoc's bytes, a perplexity of about 12), dlrm's held-out AUC and ncf's hit rate @10 on
#: the generated clicks and ratings (the teachers' own: AUC 0.86, HR@10 0.92; chance: 0.5 and 0.1)
DEFAULT_TARGET = {"accuracy": 0.9, "loss": 2.5, "auc": 0.75, "hit_rate": 0.35}
#: the metrics a run reaches from below (the others, loss and perplexity, from above)
RISING = ("accuracy", "auc", "hit_rate")
CPU_NOTE = ("compute is this machine's CPU (one thread per rank; on an emulated cluster all hosts share its "
            "cores): a GPU's compute is far shorter, so there the exchange weighs more")
GPU_NOTE = ("compute is each rank's GPU (ranks of a host share its GPUs by local rank; with more ranks than GPUs "
            "they share a GPU's time), the exchange staged through host memory unless the MPI is CUDA-aware")


def compute_note(device: str) -> str:
    """What the compute column measures on ``device`` (the table's closing note)."""
    return GPU_NOTE if device == "cuda" else CPU_NOTE


def check_target(target: float) -> float:
    if not (isinstance(target, (int, float)) and 0 < target <= 1):
        raise ValueError(f"--target is {target!r}; allowed: a test accuracy in (0, 1]")
    return float(target)


@dataclass(frozen=True)
class Target:
    """What a run trains to: ``metric`` (``accuracy``, at or above ``value``; ``loss`` or ``perplexity`` of the
    test / held-out set, at or below it)."""

    metric: str
    value: float

    def met(self, metrics: dict[str, float]) -> bool:
        v = metrics[self.metric]
        return v >= self.value if self.metric in RISING else v <= self.value

    def describe(self) -> str:
        if self.metric == "accuracy":
            return f"{100 * self.value:.1f}% test accuracy"
        if self.metric == "hit_rate":
            return f"held-out hit rate @10 {100 * self.value:.1f}%"
        return f"held-out {'AUC' if self.metric == 'auc' else self.metric} {self.value:g}"

    def as_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "value": self.value}


def pick_target(lm: bool, *, accuracy: float | None = None, loss: float | None = None, ppl: float | None = None,
                defaults: dict[str, float] | None = None, metric: str = "accuracy") -> Target:
    """The run's target from ``--target`` (``accuracy``; a recommendation model's ``metric``: ``auc`` or
    ``hit_rate``), ``--target-loss``, ``--target-ppl`` (at most one given), else ``defaults`` (``metric`` for a
    classifier, ``loss`` for a language model: :data:`DEFAULT_TARGET`).
    ValueError (one line) for a value out of range or a target the model has not."""
    defaults = {**DEFAULT_TARGET, **(defaults or {})}
    given = [n for n, v in (("--target", accuracy), ("--target-loss", loss), ("--target-ppl", ppl)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)}: give one target")
    if loss is not None:
        if not (isinstance(loss, (int, float)) and math.isfinite(loss) and loss > 0):
            raise ValueError(f"--target-loss is {loss!r}; allowed: a held-out loss > 0")
        return Target("loss", float(loss))
    if ppl is not None:
        if not lm:
            raise ValueError("--target-ppl is a language model's target (--model lstm or gpt); a classifier's: "
                             "--target (accuracy) or --target-loss")
        if not (isinstance(ppl, (int, float)) and math.isfinite(ppl) and ppl > 1):
            raise ValueError(f"--target-ppl is {ppl!r}; allowed: a held-out perplexity > 1")
        return Target("perplexity", float(ppl))
    if accuracy is not None and lm:
        raise ValueError(f"--target {accuracy!r} is a test accuracy; a language model's target is --target-loss or "
                         "--target-ppl")
    if lm:
        return Target("loss", float(defaults["loss"]))
    if metric != "accuracy":  # dlrm's AUC, ncf's hit rate: in (0, 1] as an accuracy
        value = defaults[metric] if accuracy is None else accuracy
        if not (isinstance(value, (int, float)) and 0 < value <= 1):
            raise ValueError(f"--target is {value!r}; allowed: a held-out {metric.replace('_', ' ')} in (0, 1]")
        return Target(metric, float(value))
    return Target("accuracy", check_target(defaults["accuracy"] if accuracy is None else accuracy))


@dataclass
class Run:
    """One training run: its label, the registered scheme, the scheme's options, overlap or not."""

    label: str
    scheme: str
    options: dict[str, Any] = field(default_factory=dict)
    overlap: bool = False


def plan_runs(names: tuple[str, ...], per_scheme: dict[str, dict[str, Any]], baseline_wire: str) -> list[Run]:
    """The runs for ``names`` (``dense-opt`` or registered schemes), each name once, in order."""
    runs = []
    for name in dict.fromkeys(names):
        if name == BASELINE:
            runs.append(Run(BASELINE, "dense", {**per_scheme.get("dense", {}), "wire_dtype": baseline_wire}, True))
        else:
            runs.append(Run(name, name, dict(per_scheme.get(name, {}))))
    return runs


def _import_step():
    from ..train.loop import CollectiveStep, evaluate

    class TTAStep(CollectiveStep):
        """A data-parallel step that evaluates every ``eval_every`` steps and stops at the target."""

        def __init__(self, comm, cfg, *, target: Target, max_steps: int, eval_every: int):
            super().__init__(comm, cfg)
            self.target, self.max_steps, self.eval_every = target, max_steps, eval_every
            self.curve: list[dict[str, float]] = []
            self.reached: tuple[int, float] | None = None
            self.split: list[tuple[float, float, float]] = []
            self._stop = False
            self._iteration = 0
            self._t0: float | None = None
            self._eval_seconds = 0.0
            self._thread = 0.0
            over = self.dopt.overlap
            if over is not None:  # time each bucket's scheme step on the communication thread
                for bucket in over.buckets:
                    bucket.scheme.step = self._timed(bucket.scheme.step)

        def _timed(self, fn: Callable) -> Callable:
            def run(*args, **kw):
                t0 = time.perf_counter()
                try:
                    return fn(*args, **kw)
                finally:
                    self._thread += time.perf_counter() - t0  # one thread; read after finish() joined it
            return run

        def train_batch(self, b, batch):
            if self._t0 is None:
                self._t0 = time.perf_counter()
            self._thread = 0.0
            return super().train_batch(b, batch)

        def after_batch(self, out, iteration):
            out = super().after_batch(out, iteration)
            self._iteration = iteration
            rec = self.timer.records[-1]
            exposed = sum(rec.get(k, 0.0) for k in EXCHANGE_PHASES)
            hidden = max(0.0, self._thread - rec.get("exchange_values", 0.0)) if self.dopt.overlap else 0.0
            self.split.append((rec["step"] - exposed, exposed, hidden))
            if iteration % self.eval_every == 0 or iteration >= self.max_steps:
                self._evaluate_now()
            if iteration >= self.max_steps:
                self._stop = True
            return out

        def _evaluate_now(self) -> dict[str, float]:
            t = time.perf_counter()
            wall = t - self._t0 - self._eval_seconds
            m = evaluate(self.model, self.test_batches, self.comm, self.lm, dev=self.dev)
            wall = float(self.comm.allreduce(np.array([wall]), op="max")[0])  # the slowest rank's clock
            self._eval_seconds += time.perf_counter() - t
            self.curve.append({"step": self._iteration, "seconds": wall, **m})
            if self.reached is None and self.target.met(m):
                self.reached = (self._iteration, wall)
                self._stop = True
            return m

        def evaluate(self, epoch: int) -> dict[str, float]:
            """The epoch's evaluation: the one just done at this step, else one more point of the curve."""
            if self.curve and self.curve[-1]["step"] == self._iteration:
                return {k: v for k, v in self.curve[-1].items() if k not in ("step", "seconds")}
            return self._evaluate_now()

        def stop_requested(self) -> bool:
            return self._stop

        def close(self) -> None:
            if self.dopt.overlap is not None:
                self.dopt.overlap.close()

    return TTAStep


def tta_result(comm, step, res, run: Run, density: float) -> dict[str, Any]:
    """The run's row (a collective: every rank's split and clock agreed)."""
    split = np.array(step.split[1:] if len(step.split) > 1 else step.split, dtype=np.float64).reshape(-1, 3)
    local = split.mean(axis=0) if len(split) else np.zeros(3)
    mean = comm.allreduce(local) / comm.size
    reached = step.reached is not None
    nan = float("nan")
    last = step.curve[-1] if step.curve else {"step": 0, "seconds": 0.0, "loss": nan, step.target.metric: nan,
                                              **({"perplexity": nan} if step.lm else {"accuracy": nan})}
    sparse = run.scheme != "dense"
    if step.dopt.scheme.local_update:  # localsgd: the fraction of steps that communicated (each sync sends all n)
        density = float(res.density_actual)
    final = {f"final_{k}": v for k, v in last.items() if k in ("loss", "accuracy", "perplexity", "auc", "hit_rate")}
    emb = res.extra.get("embeddings") if hasattr(res, "extra") else None
    if emb:  # the tables' rows, exchanged row-sparse beside the scheme: their bytes apart
        final.update(embedding_bytes_per_step=emb["bytes_per_step"], dense_bytes_per_step=emb["dense_bytes_per_step"],
                     rows_touched_per_step=emb["rows_touched_per_step"])
    return {"label": run.label, "scheme": run.scheme, "options": dict(run.options),
            "wire_dtype": getattr(res, "wire_dtype", None) or run.options.get("wire_dtype", "float32"),
            "overlap": run.overlap, "density": density if sparse else 1.0,
            "target": step.target.as_dict(), "reached": reached,
            "steps_to_target": step.reached[0] if reached else NOT_REACHED,
            "seconds_to_target": step.reached[1] if reached else NOT_REACHED,
            **final, "steps": last["step"], "seconds": last["seconds"],
            "bytes_per_step": float(res.bytes_sent_per_rank),
            "step_seconds": float(mean[0] + mean[1]),
            "step_split": {"compute": float(mean[0]), "exposed_exchange": float(mean[1]),
                           "hidden_exchange": float(mean[2])},
            "skipped_steps": int(getattr(res, "skipped_steps", 0) or 0),
            "curve": step.curve}


def run_tta(comm, cfg, run: Run, *, target: Target, max_steps: int, eval_every: int,
            progress=None) -> dict[str, Any]:
    """Train ``cfg`` (a validated :class:`~mpisparse.config.TrainConfig` of ``run``) to the target or the
    budget; returns the run's row (the same on every rank)."""
    from ..train.core import run_loop

    step = _import_step()(comm, cfg, target=target, max_steps=max_steps, eval_every=eval_every)
    try:
        per_epoch = len(step.batches(0))
        cfg = replace(cfg, epochs=max(1, math.ceil(max_steps / max(per_epoch, 1))))
        step.cfg = cfg
        res = run_loop(comm, cfg, step, progress=progress)
        return tta_result(comm, step, res, run, cfg.density)
    finally:
        step.close()


# --------------------------------------------------------------------------- output
def _fmt_to_target(row: dict[str, Any], key: str, fmt: str) -> str:
    v = row[key]
    return NOT_REACHED if v == NOT_REACHED else fmt.format(v)


def format_tta(res: dict[str, Any]) -> str:
    """The table: per run, steps and seconds to target, the final value of the target's metric, bytes and the
    step's split (ms)."""
    from ..results.tables import Column, format_rows

    target = Target(res.get("target_metric", "accuracy"), res["target"])
    final = {"accuracy": ("final acc", lambda r: f"{100 * r['final_accuracy']:.2f}%"),
             "loss": ("final loss", lambda r: f"{r['final_loss']:.4f}"),
             "perplexity": ("final ppl", lambda r: f"{r['final_perplexity']:.2f}"),
             "auc": ("final AUC", lambda r: f"{r['final_auc']:.4f}"),
             "hit_rate": ("final HR@10", lambda r: f"{100 * r['final_hit_rate']:.2f}%")}[target.metric]
    base = next((r for r in res["rows"] if r["label"] == BASELINE and r["reached"]), None)
    rows = []
    for r in res["rows"]:
        sp = r["step_split"]
        vs = (base["seconds_to_target"] / r["seconds_to_target"]) if base and r["reached"] else None
        rows.append({**r, "steps_t": _fmt_to_target(r, "steps_to_target", "{}"),
                     "secs_t": _fmt_to_target(r, "seconds_to_target", "{:.2f}"),
                     "final": final[1](r), "step_ms": 1e3 * r["step_seconds"],
                     "compute_ms": 1e3 * sp["compute"], "exposed_ms": 1e3 * sp["exposed_exchange"],
                     "hidden_ms": 1e3 * sp["hidden_exchange"], "vs": "-" if vs is None else f"{vs:.2f}x"})
    cols = [Column("label", "scheme", "{}", "<"), Column("steps_t", "steps to target", "{}"),
            Column("secs_t", "s to target", "{}"), Column("vs", f"speedup vs {BASELINE}", "{}"),
            Column("final", final[0], "{}"), Column("steps", "steps", "{}"),
            Column("step_ms", "step ms", "{:.1f}"), Column("compute_ms", "compute ms", "{:.1f}"),
            Column("exposed_ms", "exposed exch ms", "{:.1f}"), Column("hidden_ms", "hidden exch ms", "{:.1f}"),
            Column("bytes_per_step", "bytes/rank/step", "{:,.0f}")]
    title = (f"bench tta: {res['model']} on {res['data']} ({res.get('device', 'cpu')}), W={res['world_size']}, target "
             f"{target.describe()}, budget {res['max_steps']} steps, evaluated every {res['eval_every']} steps, batch "
             f"{res['batch_size']}/rank, density {res['density']}; {BASELINE} = dense, "
             f"{res['baseline_wire_dtype']} wire, overlap")
    return format_rows(rows, cols, title=title) + f"\nnote: {compute_note(res.get('device', 'cpu'))}."


def plot_tta(res: dict[str, Any], path: str) -> None:
    """PNG: the target's metric (test accuracy, held-out loss or perplexity) against training wall-clock, a line
    per run, the target dashed."""
    from ..results.plots import Panel, Series, plot_panels

    target = Target(res.get("target_metric", "accuracy"), res["target"])
    series = [Series(r["label"], [0.0] + [p["seconds"] for p in r["curve"]],
                     [float("nan")] + [p[target.metric] for p in r["curve"]], "o-") for r in res["rows"]]
    end = max((p["seconds"] for r in res["rows"] for p in r["curve"]), default=1.0)
    what = "test accuracy" if target.metric == "accuracy" else f"held-out {target.metric}"
    panel = Panel(f"{res['model']} on {res['data']}, W={res['world_size']}", "training wall-clock (s, CPU compute)",
                  what, series,
                  references=[Series(f"target {target.describe()}", [0.0, end], [res["target"]] * 2)])
    plot_panels(path, [panel], title=f"bench tta: time to {'accuracy' if target.metric == 'accuracy' else 'target'}")
