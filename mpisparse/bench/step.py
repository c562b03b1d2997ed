"""``mpisparse bench step``: sparsified steps on model-shaped gradients.

Each rank draws synthetic gradients shaped like the real layers of a model
(:mod:`mpisparse.gradgen`), runs ``warmup + iters`` steps of a scheme, and
the per-phase times, bytes and density of the timed steps are reduced over
ranks into the result object of DESIGN.md section 2.
"""

from __future__ import annotations

import resource
import sys
from typing import Any

import numpy as np

from ..config import BenchConfig
from ..fusion import FusionLayout
from ..gradgen import SyntheticGradients
from ..models.shapes import layer_shapes
from ..schemes import create
from ..timing import PhaseTimer, reduce_over_ranks


def peak_rss_bytes() -> int:
    """Peak resident memory of this process (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def run_step_bench(comm, cfg: BenchConfig, *, progress=None) -> dict[str, Any]:
    """Run ``cfg`` (a collective scheme) on every rank of ``comm``; returns the result object."""
    model, scheme, density, iters, warmup = cfg.model, cfg.scheme, cfg.density, cfg.iters, cfg.warmup
    seed, memory, diagnostics = cfg.seed, cfg.memory, cfg.diagnostics
    scheme_options = dict(cfg.scheme_options)
    layout = FusionLayout(layer_shapes(model))
    timer = PhaseTimer()
    sch = create(scheme, comm, layout, density, memory=memory, timer=timer, seed=seed, **scheme_options)
    gen = SyntheticGradients(layout, comm.rank, seed=seed)
    grad = layout.empty()
    step_bytes: list[int] = []
    selected: list[int] = []
    diags: list[dict[str, float]] = []
    for it in range(warmup + iters):
        timer.recording = it >= warmup
        gen.fill(grad, it)
        comm.barrier()  # align the ranks' starts: each rank's step time is then comparable
        before = comm.bytes_sent
        with timer.step():
            sch.step(grad)
        if timer.recording:
            step_bytes.append(comm.bytes_sent - before)
            selected.append(sch.selected_global())
            if diagnostics:
                diags.append(sch.diagnostics())
        if progress is not None:
            progress(it + 1, warmup + iters)

    phases = reduce_over_ranks(comm, timer.means())
    per_rank = comm.allgather_obj({
        "bytes": float(np.mean(step_bytes)),
        "peak_rss": peak_rss_bytes(),
        "selected": float(np.mean(selected)),
    })
    step = phases.pop("step")
    result = {
        "scheme": scheme,
        "world_size": comm.size,
        "density_target": float(density),
        "density_actual": float(np.mean([p["selected"] for p in per_rank])) / layout.n,
        "bytes_sent_per_rank": max(p["bytes"] for p in per_rank),
        "phases": {k: v["max"] for k, v in phases.items()},
        "phases_mean_over_ranks": {k: v["mean"] for k, v in phases.items()},
        "step_seconds": step["max"],
        "step_seconds_mean_over_ranks": step["mean"],
        "n": layout.n,
        "k": sch.k,
        "layers": len(layout),
        "gradient_buffer_bytes": layout.n * 4,
        "peak_rss_bytes_per_rank": max(p["peak_rss"] for p in per_rank),
        "config": {"model": model, "scheme": scheme, "density": float(density), "iters": iters,
                   "warmup": warmup, "seed": seed, "memory": memory, "diagnostics": diagnostics,
                   **sch.opts},
    }
    if diagnostics:
        keys = sorted({k for d in diags for k in d})
        result["diagnostics"] = {
            "density_per_step": [s / layout.n for s in selected],
            "mean": {k: float(np.mean([d[k] for d in diags if k in d])) for k in keys},
            "per_step": diags,
        }
    return result
