"""Benchmark of the CPU selection kernels against torch.topk and NumPy baselines.

:func:`run_select_bench` returns a dict and prints nothing; the CLI (or
``python -m mpisparse.bench.select``) formats it.  torch is imported inside
the function, so importing this module does not need torch.

Set ``OMP_NUM_THREADS`` before starting Python for a clean single-thread
measurement; ``threads`` sets torch's intra-op threads for the run (and
restores it afterwards).  NumPy's element-wise ufuncs, ``argpartition`` and
our kernels are single-threaded regardless.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Callable

import numpy as np

from mpisparse.backend import numpy_select as nk

__all__ = ["run_select_bench", "format_select_bench"]


def _plain(fn):
    """``fn()`` with the compiled passes switched off (``MPISPARSE_FUSED=0``) for its duration."""
    old = os.environ.get("MPISPARSE_FUSED")
    os.environ["MPISPARSE_FUSED"] = "0"
    try:
        return fn()
    finally:
        if old is None:
            del os.environ["MPISPARSE_FUSED"]
        else:
            os.environ["MPISPARSE_FUSED"] = old


def _time(fn: Callable[[], object], repeats: int) -> dict:
    fn()  # warm-up: page-in, allocator, lazy init
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return {
        "best_ms": min(ts) * 1e3,
        "median_ms": statistics.median(ts) * 1e3,
        "times_ms": [t * 1e3 for t in ts],
    }


def _make_vector(n: int, seed: int, distribution: str) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if distribution == "normal":
        return rng.standard_normal(n, dtype=np.float32)
    if distribution in ("student-t", "t"):
        return rng.standard_t(3.0, size=n).astype(np.float32)
    raise ValueError(f"unknown distribution {distribution!r} (normal, student-t)")


def run_select_bench(
    n: int = 25_000_000,
    density: float = 0.001,
    repeats: int = 5,
    seed: int = 0,
    threads: int = 1,
    distribution: str = "normal",
) -> dict:
    """Time top-k / threshold selection on an ``n``-element float32 vector.

    Timed (each ``repeats`` times after one warm-up call; best and median):

    - ``torch_topk``: ``torch.topk(torch.from_numpy(x).abs(), k)``
    - ``np_argpartition``: ``np.argpartition(np.abs(x), n - k)[n - k:]``
    - ``topk_abs``: ours, with a reused scratch buffer
    - ``topk_abs_noscratch``: ours, allocating per call
    - ``topk_abs_numpy``: ours with the compiled candidate pass switched off
      (``MPISPARSE_FUSED=0``: the NumPy chunked pass; the same as ``topk_abs``
      where numba is not installed)
    - ``abs_pass``: ``np.abs(x)`` (fresh allocation: one pass over the data)
    - ``abs_pass_out``: ``np.abs(x, out=buf)`` (reused buffer)
    - ``threshold_select``: ours, at the exact k-th largest ``|x|``
    - ``estimate_threshold``: ours, default 1 % sample

    Ratios: ``torch_topk / topk_abs`` (speed-up, >1 is better),
    ``np_argpartition / topk_abs``, ``topk_abs / abs_pass_out`` (the exact
    top-k in passes over the data), ``threshold_select / abs_pass`` and
    ``threshold_select / abs_pass_out`` (cost in passes, <2 is the target).
    """
    import torch  # lazy: the package imports without torch

    if n < 1:
        raise ValueError("n must be >= 1")
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    k = max(1, min(n, int(round(density * n))))
    x = _make_vector(n, seed, distribution)
    x_before = x.copy()
    scratch = np.empty_like(x)
    out_buf = np.empty_like(x)
    rng = np.random.default_rng(seed + 1)
    xt = torch.from_numpy(x)

    kth = float(nk.kth_largest(np.abs(x), k))  # exact k-th largest |x|

    old_threads = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        timings = {
            "torch_topk": _time(lambda: torch.topk(xt.abs(), k), repeats),
            "np_argpartition": _time(lambda: np.argpartition(np.abs(x), n - k)[n - k :], repeats),
            "topk_abs": _time(lambda: nk.topk_abs(x, k, scratch=scratch, rng=rng), repeats),
            "topk_abs_noscratch": _time(lambda: nk.topk_abs(x, k, rng=rng), repeats),
            "topk_abs_numpy": _time(lambda: _plain(lambda: nk.topk_abs(x, k, scratch=scratch, rng=rng)), repeats),
            "abs_pass": _time(lambda: np.abs(x), repeats),
            "abs_pass_out": _time(lambda: np.abs(x, out=out_buf), repeats),
            "threshold_select": _time(lambda: nk.threshold_select(x, kth, scratch=scratch), repeats),
            "estimate_threshold": _time(lambda: nk.estimate_threshold(x, k, rng=rng), repeats),
        }
    finally:
        torch.set_num_threads(old_threads)

    # Correctness of what was timed.
    idx = nk.topk_abs(x, k, scratch=scratch, rng=rng)
    sel = np.abs(x[idx])
    topk_exact = bool(idx.size == k and np.unique(idx).size == k and sel.min() >= kth)
    n_thr = int(nk.threshold_select(x, kth, scratch=scratch).size)
    est = float(nk.estimate_threshold(x, k, rng=rng))
    unmodified = bool(np.array_equal(x, x_before))

    def ratio(a: str, b: str, stat: str = "best_ms") -> float:
        return timings[a][stat] / timings[b][stat]

    ratios = {
        "torch_topk/topk_abs": ratio("torch_topk", "topk_abs"),
        "np_argpartition/topk_abs": ratio("np_argpartition", "topk_abs"),
        "topk_abs/abs_pass_out": ratio("topk_abs", "abs_pass_out"),
        "threshold_select/abs_pass": ratio("threshold_select", "abs_pass"),
        "threshold_select/abs_pass_out": ratio("threshold_select", "abs_pass_out"),
    }
    ratios_median = {
        name: ratio(*name.split("/"), stat="median_ms") for name in ratios
    }
    return {
        "params": {
            "n": n,
            "k": k,
            "density": density,
            "repeats": repeats,
            "seed": seed,
            "threads": int(threads),
            "distribution": distribution,
            "dtype": str(x.dtype),
        },
        "timings": timings,
        "ratios": ratios,
        "ratios_median": ratios_median,
        "checks": {
            "topk_exact": topk_exact,
            "kth_abs": kth,
            "threshold_select_count": n_thr,
            "estimate_threshold": est,
            "estimate_rel_error": (est - kth) / kth if kth else float("nan"),
            "x_unmodified": unmodified,
        },
        "machine": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "torch": torch.__version__,
            "torch_threads": int(threads),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
        },
    }


def format_select_bench(res: dict) -> str:
    """A small text table of :func:`run_select_bench`'s result."""
    p = res["params"]
    m = res["machine"]
    lines = [
        f"n={p['n']:,} k={p['k']:,} (density {p['density']}) {p['dtype']} {p['distribution']}, "
        f"repeats={p['repeats']}, torch threads={p['threads']}, "
        f"OMP_NUM_THREADS={m['OMP_NUM_THREADS']}",
        f"numpy {m['numpy']}, torch {m['torch']}, python {m['python']}, {m['cpu_count']} CPUs",
        "",
        f"{'kernel':<22}{'best ms':>10}{'median ms':>12}",
    ]
    for name, t in res["timings"].items():
        lines.append(f"{name:<22}{t['best_ms']:>10.2f}{t['median_ms']:>12.2f}")
    lines.append("")
    lines.append(f"{'ratio':<32}{'best':>8}{'median':>9}")
    for name, r in res["ratios"].items():
        lines.append(f"{name:<32}{r:>8.2f}{res['ratios_median'][name]:>9.2f}")
    c = res["checks"]
    lines.append("")
    lines.append(
        f"topk exact: {c['topk_exact']}, x unmodified: {c['x_unmodified']}, "
        f"threshold_select count at k-th |x|: {c['threshold_select_count']:,}, "
        f"estimate_threshold {c['estimate_threshold']:.4g} vs k-th {c['kth_abs']:.4g} "
        f"({c['estimate_rel_error']:+.1%})"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_select_bench(run_select_bench()))
