"""``mpisparse bench step``: sparsified steps on model-shaped gradients.

Each rank draws synthetic gradients shaped like the real layers of a model
(:mod:`mpisparse.bench.gradgen`), runs ``warmup + iters`` steps of a scheme, and
the per-phase times, bytes and density of the timed steps are reduced over
ranks into a :class:`~mpisparse.results.RunResult`
(:func:`mpisparse.results.build.collective_result`, shared with ``train``).

With ``--device cuda`` each step's gradient is drawn on the host and copied
into a device buffer before the step starts (not timed); the whole step --
compensation, selection, exchange, update -- then runs on the device, and
the communicator's staging copies per step are reported
(``staging_copies_per_step``).
"""

from __future__ import annotations

import time

import numpy as np

from .. import backend
from ..mpi import device
from ..config import BenchConfig
from ..backend.fusion import FusionLayout
from .gradgen import SyntheticGradients
from ..models.shapes import layer_shapes
from ..backend.pages import settle
from ..schemes import create
from ..results.build import collective_result, current_rss_bytes, reset_peak_rss
from ..results.timing import PhaseTimer


class FloorPass:
    """``bench step --floor``: the pass a step's compute is measured against, timed in the same job.

    The floor of a sparse step with error feedback is one pass reading the
    gradient and the residual and writing the residual (``e += g``).  After
    each step every rank runs that pass at once (a barrier first), into a
    buffer of its own (one gradient buffer more in the peak RSS), so the
    step's phases and the floor share the machine's state: a shared host's
    memory bandwidth moves both.
    """

    def __init__(self, layout, xp, sync=None):
        self.buf = layout.zeros(xp=xp)
        self.xp, self.sync = xp, sync
        self.seconds: list[float] = []

    def run(self, grad, record: bool) -> None:
        if self.sync is not None:
            self.sync()
        t0 = time.perf_counter()
        self.xp.add(self.buf, grad, out=self.buf)
        if self.sync is not None:
            self.sync()
        if record:
            self.seconds.append(time.perf_counter() - t0)

    def result(self, comm) -> dict[str, float]:
        """The result's ``floor``: ``seconds`` (each rank's mean, max over ranks, as ``phases``) and
        ``seconds_median`` (each step's max over ranks, median over steps, as ``phases_median_step``)."""
        everyone = comm.allgather_obj(self.seconds)
        per_step = np.max(np.array(everyone, dtype=float), axis=0) if self.seconds else np.zeros(1)
        return {"seconds": max(float(np.mean(s)) if s else 0.0 for s in everyone),
                "seconds_median": float(np.median(per_step))}


def run_step_bench(comm, cfg: BenchConfig, *, progress=None):
    """Run ``cfg`` (a collective scheme) on every rank of ``comm``; returns its :class:`~mpisparse.results.RunResult`."""
    model, scheme, density, iters, warmup = cfg.model, cfg.scheme, cfg.density, cfg.iters, cfg.warmup
    seed, memory, diagnostics = cfg.seed, cfg.memory, cfg.diagnostics
    scheme_options = dict(cfg.scheme_options)
    if cfg.gradients == "model":  # real backward passes of the trainable net, on this rank's own batches
        from .model_grads import ModelGradients

        gen = ModelGradients(model, comm.rank, comm.size, seed=seed)
        layout = gen.layout
    else:
        layout = FusionLayout(layer_shapes(model))
        gen = SyntheticGradients(layout, comm.rank, seed=seed)
    timer = PhaseTimer(trace=cfg.trace is not None)
    sch = create(scheme, comm, layout, density, memory=memory, timer=timer, seed=seed, **scheme_options)
    xp = device.array_module_for(cfg.device, comm)
    timer.sync = device.synchronizer(xp)  # on a GPU, phases time their kernels, not their launches
    drawn = layout.empty()
    grad = drawn if xp is np else layout.empty(xp=xp)  # the step's input, on the run's device
    sch.use_array_module(xp)
    on_device = grad is not drawn
    in_place = cfg.output == "gradient"  # the update overwrites the step's input (refilled before each step)
    floor = FloorPass(layout, xp, timer.sync) if cfg.floor else None
    if cfg.separate_wait:  # the barrier before each collective is timed as "wait", not as the exchange
        comm.wait_timer = timer
    # the compiled loops loaded now, before the full-size buffers are written, and LLVM's code unmapped after
    settle(sch)
    # this scheme's own peak (Linux): what earlier schemes of the job held is freed and forgotten, and so is
    # the generator's start-up (a float64 draw of its pool); its pool and the gradient buffer stay counted
    reset_peak_rss()
    staging: list[dict[str, int]] = []
    step_bytes: list[int] = []
    cross_bytes: list[int] = []  # bytes that left the host (``--hierarchical``)
    selected: list[int] = []
    diags: list[dict[str, float]] = []
    rss_at, rss = set(cfg.rss_at), {}
    for it in range(warmup + iters):
        timer.recording = it >= warmup
        gen.fill(drawn, it)
        if on_device:
            grad.set(drawn)  # host -> device, before the step (untimed)
        comm.barrier()  # align the ranks' starts: each rank's step time is then comparable
        before, staged = comm.bytes_sent, dict(comm.staging)
        cross_before = getattr(comm, "cross_host_bytes", 0)
        with timer.step():
            update = sch.step(grad, out=grad if in_place else None)
        if floor is not None:
            comm.barrier()  # every rank's floor pass at once, as their compensations run
            floor.run(grad, timer.recording)
        if cfg.gradients == "model":
            gen.apply(backend.to_host(update))  # the ranks train on: the next gradients follow the run
        if timer.recording:
            step_bytes.append(comm.bytes_sent - before)
            cross_bytes.append(getattr(comm, "cross_host_bytes", 0) - cross_before)
            staging.append({k: comm.staging[k] - staged[k] for k in staged})
            selected.append(sch.selected_global())
            if diagnostics:
                diags.append(sch.diagnostics())
        if it + 1 in rss_at:
            rss[it + 1] = current_rss_bytes()
        if progress is not None:
            progress(it + 1, warmup + iters)
    if cfg.separate_wait:
        comm.wait_timer = None
    if cfg.trace is not None:  # collective: every rank's spans, written by rank 0
        from ..results.trace import write_trace

        write_trace(cfg.trace, comm, timer)
    if rss_at:  # max over ranks, keyed by the step as a string (a JSON object)
        everyone = comm.allgather_obj(rss)
        rss = {str(k): max(r[k] for r in everyone) for k in sorted(rss)}

    hierarchy = None
    if hasattr(comm, "cross_host_bytes"):  # two-level collectives: what crossed the host links
        per_rank = comm.allgather_obj(sum(cross_bytes) / max(len(cross_bytes), 1))
        hierarchy = {"hosts": comm.num_hosts, "ranks_per_host": [len(r) for r in comm.host_ranks],
                     "cross_host_bytes_per_step": float(sum(per_rank))}
    return collective_result(
        comm, scheme=scheme, density_target=density, timer=timer, step_bytes=step_bytes, selected=selected,
        n=layout.n, memory=True, k=sch.k, layers=len(layout), diagnostics=diags if diagnostics else None,
        staging=staging if on_device else None,
        rss_bytes_at_step=rss or None, hierarchy=hierarchy, floor=None if floor is None else floor.result(comm),
        config={"model": model, "scheme": scheme, "density": float(density), "iters": iters, "warmup": warmup,
                "seed": seed, "memory": memory, "diagnostics": diagnostics, "device": cfg.device,
                "gradients": cfg.gradients, "separate_wait": cfg.separate_wait, "output": cfg.output, "floor": cfg.floor,
                **({"rss_at": list(cfg.rss_at)} if cfg.rss_at else {}), **sch.opts})

