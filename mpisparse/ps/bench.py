"""``mpisparse bench step`` with a parameter-server scheme.

Workers draw the synthetic gradients of :mod:`mpisparse.bench.gradgen` (worker
``k`` as rank ``k``) for ``warmup + iters`` minibatch steps; the model is a
seeded random vector (``N(0, 0.05^2)``, the same on every rank, so servers
and workers agree on ``w^0``).  Where a scheme trains locally (Plump-DP,
Slim-DP) the step is ``w <- w - eta g`` (phase ``update``), and the
asynchronous schemes use ``eta`` and momentum ``m`` below.  Warm-up steps
are not timed and not counted (servers skip their first ``warmup * K``
pushes).
"""

from __future__ import annotations

import numpy as np

from ..config import BenchConfig
from ..backend.fusion import FusionLayout
from ..bench.gradgen import SyntheticGradients
from ..models.shapes import layer_shapes
from ..registry import create
from ..results.build import peak_rss_bytes
from ..results.timing import PhaseTimer
from .results import gather_ps_result

BENCH_LR = 0.01
BENCH_MOMENTUM = 0.9


def run_ps_step_bench(comm, cfg: BenchConfig, *, progress=None):
    """Run ``cfg`` (a parameter-server scheme) on every rank of ``comm``; returns its :class:`~mpisparse.results.RunResult`."""
    model, scheme, density, iters, warmup = cfg.model, cfg.scheme, cfg.density, cfg.iters, cfg.warmup
    seed, memory, servers, scheme_options = cfg.seed, cfg.memory, cfg.servers, cfg.scheme_options
    layout = FusionLayout(layer_shapes(model))
    sch = create(scheme, comm, layout, density, memory=memory, seed=seed, servers=servers,
                 **dict(scheme_options or {}))
    w = (np.random.default_rng([seed, 17]).standard_normal(layout.n, dtype=np.float32) * np.float32(0.05))
    timer = PhaseTimer()
    if sch.is_server():
        local = sch.make_server(w, timer=timer, warmup=warmup).run().summary(timer)
    else:
        worker = sch.make_worker(lr=BENCH_LR, momentum=BENCH_MOMENTUM, timer=timer)
        gen = SyntheticGradients(layout, comm.rank, seed=seed)
        g = layout.empty()
        worker.start(w)
        for it in range(warmup + iters):
            timer.recording = it >= warmup
            gen.fill(g, it)
            with timer.step():
                if sch.local_optimizer:
                    with timer.phase("update"):
                        w -= np.float32(BENCH_LR) * g
                worker.step(w, g)
            if progress is not None and comm.rank == 0:
                progress(it + 1, warmup + iters)
        worker.finish(w)
        local = worker.stats.summary(timer, layout.n)
    rss = comm.allgather_obj(peak_rss_bytes())
    res = gather_ps_result(
        comm, sch, local, k=sch.k, layers=len(layout), gradient_buffer_bytes=layout.n * 4,
        peak_rss_bytes_per_rank=max(rss),
        config={"model": model, "scheme": scheme, "density": float(density), "iters": iters, "warmup": warmup,
                "seed": seed, "memory": memory, "servers": servers, "lr": BENCH_LR,
                "momentum": BENCH_MOMENTUM, **sch.opts})
    res.ps.pop("worker_extra")
    return res
