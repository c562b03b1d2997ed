"""Per-rank selection time of DEFT against a whole-vector top-k (DEFT, Yoon & Oh, Fig. 9).

For each model and world size ``W``, on one synthetic gradient shaped like
the model (:class:`mpisparse.bench.gradgen.SyntheticGradients`, rank 0, step 0):

* ``topk_seconds``: ``backend.topk_abs`` on the whole vector, ``k = d n``
  (the selection of Top-k and CLT-k, cost ``n ln k``);
* DEFT: :func:`mpisparse.schemes.deft.simulate_selection_times` runs every
  rank's Alg. 5 share one after another in this process; the step waits for
  the slowest rank, so ``deft_max_seconds`` (eq. 5 measured) is compared;
* ``speedup_measured = topk_seconds / deft_max_seconds`` against
  ``speedup_predicted``, eq. 6 (``n ln k / max_i C_i``);
* ``overhead_seconds``: the layer norms (every rank, a pass over the whole
  vector) plus Alg. 3 and Alg. 4 (the leader), which DEFT adds on top of
  Alg. 5; ``speedup_with_overhead`` divides by ``max + overhead``.

Times are the best of ``repeats`` calls (the top-k baseline: of ``repeats``
calls before the DEFT runs and ``repeats`` after, so a burst of load on a
shared machine does not favour either side).  Set ``OMP_NUM_THREADS=1`` before
starting Python for a single-thread measurement (the kernels are
single-threaded NumPy; the norms use BLAS ``dot``).  :func:`run_deft_select_bench`
returns rows and prints nothing; :func:`format_deft_select_bench` makes a
table (``python -m mpisparse.bench.select_deft``).
"""

from __future__ import annotations

import math
import os
import time

from .. import backend
from ..backend import reference
from ..backend.reference import check_kernel
from ..backend.fusion import FusionLayout
from .gradgen import SyntheticGradients
from ..models.shapes import layer_shapes
from ..schemes.base import k_for, validate_density
from ..schemes.deft import simulate_selection_times

__all__ = ["run_deft_select_bench", "format_deft_select_bench"]


def _best(fn, repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        backend.synchronize(fn())
        best = min(best, time.perf_counter() - t0)
    return best


def run_deft_select_bench(models=("resnet50", "lstm-wt2"), worlds=(1, 2, 4, 8, 16),
                          density: float = 0.01, seed: int = 0, repeats: int = 3, kernel: str = "native",
                          threads: int = 1) -> list[dict]:
    """One row per (model, world size); see the module docstring for the columns.

    ``kernel``: the selection primitive of both sides
    (:mod:`mpisparse.backend.reference`; ``torch``: torch.topk on the whole
    vector and once per layer of a rank's share, with ``threads`` intra-op
    threads, the DEFT reference's way).
    """
    density = validate_density(density)
    kernel = check_kernel(kernel)
    if kernel == "torch":
        import torch

        torch.set_num_threads(int(threads))
    worlds = tuple(worlds)
    for w in worlds:
        if isinstance(w, bool) or int(w) != w or w < 1:
            raise ValueError(f"worlds holds {w!r}; every world size must be an integer of at least 1.")
    if isinstance(repeats, bool) or int(repeats) != repeats or repeats < 1:
        raise ValueError(f"repeats is {repeats!r}; it must be an integer of at least 1.")
    rows = []
    for model in models:
        layout = FusionLayout(layer_shapes(model))
        grad = SyntheticGradients(layout, 0, seed=seed).fill(layout.empty(), 0)
        k = k_for(density, layout.n)
        scratch = backend.array_module(grad).empty_like(grad)
        run_topk = lambda: reference.topk_abs(grad, k, kernel, scratch=scratch)  # noqa: E731
        topk = _best(run_topk, repeats)
        sims = [simulate_selection_times(layout, grad, density, int(w), repeats=repeats, kernel=kernel)
                for w in worlds]
        topk = min(topk, _best(run_topk, repeats))  # best of the calls before and after
        for w, sim in zip(worlds, sims):
            overhead = sim["norms_seconds"] + sim["alloc_seconds"]
            rows.append({
                "model": model,
                "n": layout.n,
                "tensors": len(layout),
                "k": k,
                "density": density,
                "world_size": int(w),
                "layers": sim["layers"],
                "selected": sim["selected"],
                "topk_seconds": topk,
                "deft_max_seconds": sim["max_seconds"],
                "deft_mean_seconds": sim["mean_seconds"],
                "imbalance": sim["imbalance"],
                "overhead_seconds": overhead,
                "speedup_measured": topk / sim["max_seconds"] if sim["max_seconds"] > 0 else math.inf,
                "speedup_with_overhead": topk / (sim["max_seconds"] + overhead),
                "speedup_predicted": sim["predicted_speedup"],
                "per_rank_seconds": sim["per_rank_seconds"],
                "repeats": int(repeats),
                "seed": seed,
                "select_kernel": kernel,
                "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            })
    return rows


def format_deft_select_bench(rows: list[dict]) -> str:
    """A text table of :func:`run_deft_select_bench`'s rows (times in ms)."""
    head = (f"{'model':<10}{'W':>4}{'layers':>8}{'topk ms':>10}{'deft max ms':>13}{'mean ms':>10}"
            f"{'imbal':>7}{'ovh ms':>9}{'speedup':>9}{'+ovh':>7}{'eq.6':>8}")
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['model']:<10}{r['world_size']:>4}{r['layers']:>8}{r['topk_seconds'] * 1e3:>10.2f}"
            f"{r['deft_max_seconds'] * 1e3:>13.2f}{r['deft_mean_seconds'] * 1e3:>10.2f}"
            f"{r['imbalance']:>7.2f}{r['overhead_seconds'] * 1e3:>9.2f}{r['speedup_measured']:>9.2f}"
            f"{r['speedup_with_overhead']:>7.2f}{r['speedup_predicted']:>8.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_deft_select_bench(run_deft_select_bench()))
