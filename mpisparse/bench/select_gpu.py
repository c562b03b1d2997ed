"""``mpisparse bench select --backend cupy``: the GPU selection kernels on one device.

Times, on one float32 vector of ``n`` elements on the current device (CuPy
device 0 unless selected otherwise), each call wall-clocked between two
device synchronisations (so launch overheads and the kernels' own
device-to-host reads are included), best and median of ``repeats`` after a
warm-up call:

- ``copy``: ``dst[...] = x`` (device-to-device copy) -- the yardstick: the
  measured copy bandwidth is ``2 n 4 / t`` (read + write) and one read of
  ``x`` at that bandwidth takes ``t / 2`` (``one_read``);
- ``threshold_select`` (at the exact k-th largest ``|x|``), and
  ``threshold_select_values`` (indices and values in the same pass);
- ``topk_abs`` (auto), ``topk_abs_sample``, ``topk_abs_radix``, ``topk_abs_radix2`` (about two reads of
  ``x``, the bucket chosen on the device, nothing read back);
- ``torch_topk``: ``torch.topk(x.abs(), k)`` on the same memory (DLPack),
  when torch has CUDA;
- ``estimate_threshold`` (1 % sample).

Targets of the GPU floor (issue 47, :mod:`mpisparse.bench.gpucheck_floor`), in copies:
``threshold_select / copy <= 0.75`` (one read plus the selected writes),
``topk_abs_radix2 / copy <= 1`` (two reads) and ``torch_topk / topk_abs_radix2 >= 11``.
The results are checked (exact top-k value set, threshold count) and
returned as a dict; nothing is printed here.
"""

from __future__ import annotations

import platform
import statistics
import time
from typing import Callable

import numpy as np

from ..backend import cupy_kernels as ck
from ..backend.numpy_select import kth_largest
from . import gpucheck_floor as floor

__all__ = ["run_select_bench_gpu", "format_select_bench_gpu", "run_deft_select_bench_gpu",
           "format_deft_select_bench_gpu"]


def _timer(cp):
    def run(fn: Callable[[], object], repeats: int) -> dict:
        dev = cp.cuda.Device()
        fn()
        dev.synchronize()
        ts = []
        for _ in range(repeats):
            dev.synchronize()
            t0 = time.perf_counter()
            fn()
            dev.synchronize()
            ts.append(time.perf_counter() - t0)
        return {"best_ms": min(ts) * 1e3, "median_ms": statistics.median(ts) * 1e3,
                "times_ms": [t * 1e3 for t in ts]}

    return run


def run_select_bench_gpu(n: int = 25_000_000, density: float = 0.001, repeats: int = 20, seed: int = 0,
                         distribution: str = "normal") -> dict:
    if not ck.available():
        raise RuntimeError("no GPU/CuPy available: `bench select --backend cupy` needs CuPy and a CUDA device")
    import cupy as cp

    if n < 1 or repeats < 1:
        raise ValueError(f"n and repeats must be >= 1, got n={n}, repeats={repeats}")
    k = max(1, min(n, int(round(density * n))))
    rng = np.random.default_rng(seed)
    if distribution == "normal":
        host = rng.standard_normal(n, dtype=np.float32)
    elif distribution in ("student-t", "t"):
        host = rng.standard_t(3.0, size=n).astype(np.float32)
    else:
        raise ValueError(f"unknown distribution {distribution!r} (normal, student-t)")
    x = cp.asarray(host)
    dst = cp.empty_like(x)
    kth = float(kth_largest(np.abs(host), k))
    krng = np.random.default_rng(seed + 1)
    timed = _timer(cp)

    def copy():
        dst[...] = x

    timings = {
        "copy": timed(copy, repeats),
        "threshold_select": timed(lambda: ck.threshold_select(x, kth), repeats),
        "threshold_select_values": timed(lambda: ck.threshold_select_values(x, kth), repeats),
        "topk_abs": timed(lambda: ck.topk_abs(x, k, rng=krng), repeats),
        "topk_abs_sample": timed(lambda: ck.topk_abs(x, k, rng=krng, method="sample"), repeats),
        "topk_abs_radix": timed(lambda: ck.topk_abs(x, k, method="radix"), repeats),
        "topk_abs_radix2": timed(lambda: ck.topk_abs(x, k, method="radix2"), repeats),
        "estimate_threshold": timed(lambda: ck.estimate_threshold(x, k, rng=krng), repeats),
    }
    torch_version = None
    try:
        import torch

        if torch.cuda.is_available():
            xt = torch.from_dlpack(x)  # the same device memory
            timings["torch_topk"] = timed(lambda: torch.topk(xt.abs(), k), repeats)
            torch_version = torch.__version__
    except ImportError:
        pass

    # host time of each call beside its device time (events on the stream): where a kernel's wall time goes
    split = {}
    try:
        from cupyx.profiler import benchmark
    except ImportError:  # an old CuPy, or the tests' emulator
        benchmark = None
    if benchmark is not None and isinstance(x, cp.ndarray):
        for name, fn in (("threshold_select", lambda: ck.threshold_select(x, kth)),
                         ("topk_abs_sample", lambda: ck.topk_abs(x, k, rng=krng, method="sample")),
                         ("topk_abs_radix", lambda: ck.topk_abs(x, k, method="radix")),
                         ("topk_abs_radix2", lambda: ck.topk_abs(x, k, method="radix2")),
                         ("estimate_threshold", lambda: ck.estimate_threshold(x, k, rng=krng))):
            b = benchmark(fn, n_repeat=repeats, n_warmup=2)
            split[name] = {"host_ms": float(np.median(b.cpu_times)) * 1e3,
                           "device_ms": float(np.median(b.gpu_times[0])) * 1e3}

    auto = ck.auto_method(n, k)
    methods = {m: timings[f"topk_abs_{m}"]["best_ms"] for m in ("sample", "radix", "radix2")}
    fastest = min(methods, key=methods.get)

    copy_best = timings["copy"]["best_ms"] / 1e3
    one_read_ms = copy_best / 2 * 1e3
    ratios = {"threshold_select/one_read": timings["threshold_select"]["best_ms"] / one_read_ms,
              "topk_abs/one_read": timings["topk_abs"]["best_ms"] / one_read_ms,
              "threshold_select/copy": timings["threshold_select"]["best_ms"] / timings["copy"]["best_ms"],
              "topk_abs_radix2/copy": timings["topk_abs_radix2"]["best_ms"] / timings["copy"]["best_ms"]}
    if "torch_topk" in timings:
        for name in ("topk_abs", "topk_abs_sample", "topk_abs_radix", "topk_abs_radix2"):
            ratios[f"torch_topk/{name}"] = timings["torch_topk"]["best_ms"] / timings[name]["best_ms"]

    # correctness of what was timed
    checks = {}
    for method in ("auto", "sample", "radix", "radix2"):
        idx = cp.asnumpy(ck.topk_abs(x, k, rng=krng, method=method))
        checks[f"topk_exact_{method}"] = bool(idx.size == k and np.unique(idx).size == k
                                              and np.abs(host[idx]).min() >= kth)
    checks["threshold_select_count"] = int(ck.threshold_select(x, kth).size)
    checks["threshold_select_expected"] = int(np.count_nonzero(np.abs(host) >= np.float32(kth)))
    checks["kth_abs"] = kth
    est = ck.estimate_threshold(x, k, rng=krng)
    checks["estimate_threshold"] = est
    checks["estimate_rel_error"] = (est - kth) / kth if kth else float("nan")
    checks["x_unmodified"] = bool(np.array_equal(cp.asnumpy(x), host))

    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"]
    return {
        "backend": "cupy",
        "params": {"n": n, "k": k, "density": density, "repeats": repeats, "seed": seed,
                   "distribution": distribution, "dtype": "float32"},
        "timings": timings,
        "copy_bandwidth_bytes_per_s": 2 * x.nbytes / copy_best,
        "one_read_ms": one_read_ms,
        "ratios": ratios,
        "targets": {f"threshold_select/copy <= {floor.THRESHOLD_COPIES:g}":
                    ratios["threshold_select/copy"] <= floor.THRESHOLD_COPIES,
                    f"topk_abs_radix2/copy <= {floor.TOPK_COPIES:g}": ratios["topk_abs_radix2/copy"] <= floor.TOPK_COPIES,
                    **({f"torch_topk/topk_abs_radix2 >= {floor.TOPK_VS_TORCH:g}":
                        ratios["torch_topk/topk_abs_radix2"] >= floor.TOPK_VS_TORCH}
                       if "torch_topk/topk_abs_radix2" in ratios else {})},
        "checks": checks,
        "auto": {"picked": auto, "fastest": fastest, "times_ms": methods, "auto_is_fastest": auto == fastest},
        "host_device_split": split,
        "machine": {"device": name.decode() if isinstance(name, bytes) else str(name),
                    "cupy": cp.__version__, "torch": torch_version, "python": platform.python_version(),
                    "numpy": np.__version__},
    }


def format_select_bench_gpu(res: dict) -> str:
    p, m = res["params"], res["machine"]
    lines = [
        f"n={p['n']:,} k={p['k']:,} (density {p['density']}) float32 {p['distribution']}, repeats={p['repeats']}",
        f"{m['device']}, cupy {m['cupy']}, torch {m['torch']}",
        f"copy bandwidth {res['copy_bandwidth_bytes_per_s'] / 1e9:,.0f} GB/s (read+write); "
        f"one read of x: {res['one_read_ms']:.3f} ms",
        "",
        f"{'kernel':<26}{'best ms':>10}{'median ms':>12}",
    ]
    for name, t in res["timings"].items():
        lines.append(f"{name:<26}{t['best_ms']:>10.3f}{t['median_ms']:>12.3f}")
    lines += ["", f"{'ratio':<34}{'best':>8}"]
    for name, r in res["ratios"].items():
        lines.append(f"{name:<34}{r:>8.2f}")
    a = res["auto"]
    lines += ["", "topk_abs method times (best ms): " + ", ".join(f"{m} {t:.3f}" for m, t in a["times_ms"].items())
              + f"; auto picked {a['picked']}"
              + ("" if a["auto_is_fastest"] else f"  <-- NOT the fastest ({a['fastest']}): update "
                 "cupy_select.AUTO_TABLE")]
    split = res.get("host_device_split") or {}
    if split:
        lines += ["", "per call, median ms (cupyx.profiler.benchmark): " + ", ".join(
            f"{name} host {t['host_ms']:.3f} / device {t['device_ms']:.3f}" for name, t in split.items())]
    lines += ["", "targets: " + ", ".join(f"{k}: {'met' if v else 'NOT met'}" for k, v in res["targets"].items())]
    c = res["checks"]
    lines.append(f"checks: topk exact auto/sample/radix/radix2 {c['topk_exact_auto']}/{c['topk_exact_sample']}/"
                 f"{c['topk_exact_radix']}/{c.get('topk_exact_radix2')}, "
                 f"threshold count {c['threshold_select_count']:,} "
                 f"(expected {c['threshold_select_expected']:,}), estimate {c['estimate_threshold']:.4g} "
                 f"vs k-th {c['kth_abs']:.4g} ({c['estimate_rel_error']:+.1%}), x unmodified {c['x_unmodified']}")
    return "\n".join(lines)


#: Targets of the segmented DEFT selection on the device (resnet50's layers, density 0.01; issue 47's table):
#: ``(model, density, world size or None for the norms) -> ms``.
DEFT_TARGETS_MS = {**{("resnet50", 0.01, w): ms for w, ms in floor.DEFT_MS.items()},
                   ("resnet50", 0.01, None): floor.NORMS_MS}


def run_deft_select_bench_gpu(models=("resnet50", "lstm-wt2"), worlds=(1, 2, 4, 8, 16), density: float = 0.01,
                              seed: int = 0, repeats: int = 5) -> list[dict]:
    """DEFT's per-rank selection (Alg. 5) on a device gradient, landed vs peers vs targets.

    The model-shaped synthetic gradient of ``bench step`` (rank 0's) is
    copied to the device.  Landed: :func:`mpisparse.schemes.deft.simulate_selection_times`
    (the segmented kernels: one ``segment_topk_abs`` call per rank, one
    ``segment_norms`` call for the norms), the max over the ``W`` simulated
    ranks; the norms are timed the same way (wall clock between device
    synchronisations, best of ``repeats``, the device-to-host read of the
    norms included; the layers' starts and sizes built once, as the scheme
    does).  Peers on the same device and the same bins, when torch
    has CUDA: ``peer_topk_ms``, one ``torch.topk(x[layer].abs(), k)`` per
    layer of a rank (the DEFT reference's way; max over ranks), and
    ``peer_norms_ms``, ``torch.segment_reduce`` of the squares over the
    layer lengths (one reduction launch, plus the squaring).  Whole-vector
    ``topk_abs`` is timed too (``topk_seconds``).  ``dense_bytes`` is the
    buffer a dense Allreduce would move.  Targets: :data:`DEFT_TARGETS_MS`.
    """
    if not ck.available():
        raise RuntimeError("no GPU/CuPy available: `bench select --backend cupy` needs CuPy and a CUDA device")
    import cupy as cp

    from ..backend.fusion import FusionLayout
    from .gradgen import SyntheticGradients
    from ..schemes.deft_partition import bin_pack, my_part
    from ..models.shapes import layer_shapes
    from ..schemes.base import k_for
    from ..schemes.deft import deft_layers, layer_norms, local_k, simulate_selection_times

    try:
        import torch

        torch_cuda = torch.cuda.is_available()
    except ImportError:
        torch, torch_cuda = None, False
    timed = _timer(cp)
    rows = []
    for model in models:
        layout = FusionLayout(layer_shapes(model))
        g = cp.asarray(SyntheticGradients(layout, 0, seed=seed).fill(layout.empty(), 0))
        k = k_for(density, layout.n)
        topk = timed(lambda: ck.topk_abs(g, k), repeats)["best_ms"] / 1e3
        gt = torch.from_dlpack(g) if torch_cuda else None
        for w in worlds:
            w = int(w)
            sim = simulate_selection_times(layout, g, density, w, repeats=repeats)
            layers = deft_layers(layout, w)
            spans = (np.array([x.start for x in layers], np.int64), np.array([x.size for x in layers], np.int64))
            norms_ms = timed(lambda: layer_norms(g, layers, spans), repeats)["best_ms"]  # spans once, as Deft does
            peer_topk_ms = peer_norms_ms = None
            if torch_cuda:
                sizes = [layer.size for layer in layers]
                ks = local_k(sizes, layer_norms(g, layers), k)
                bins = bin_pack(sizes, ks, w)
                parts = [bins[my_part(rank, 0, w)] for rank in range(w)]
                per_rank = []
                for part in parts:
                    spans = [(layers[x].start, layers[x].end, int(ks[x])) for x in part if ks[x] > 0]

                    def per_layer(spans=spans):
                        return [torch.topk(gt[a:e].abs(), kk).indices for a, e, kk in spans]

                    per_rank.append(timed(per_layer, repeats)["best_ms"])
                peer_topk_ms = max(per_rank)
                lens = torch.tensor(sizes, device=gt.device)
                peer_norms_ms = timed(lambda: torch.segment_reduce(gt.square(), "sum", lengths=lens),
                                      repeats)["best_ms"]
            rows.append({"model": model, "n": layout.n, "k": k, "density": density, "world_size": w,
                         "layers": sim["layers"], "topk_seconds": topk, "deft_max_seconds": sim["max_seconds"],
                         "deft_mean_seconds": sim["mean_seconds"], "imbalance": sim["imbalance"],
                         "overhead_seconds": sim["norms_seconds"] + sim["alloc_seconds"],
                         "norms_ms": norms_ms, "peer_topk_ms": peer_topk_ms, "peer_norms_ms": peer_norms_ms,
                         "target_select_ms": DEFT_TARGETS_MS.get((model, density, w)),
                         "target_norms_ms": DEFT_TARGETS_MS.get((model, density, None)),
                         "dense_bytes": layout.n * 4, "backend": "cupy"})
    return rows


def _vs(landed: float, peer, target) -> str:
    p = "-" if peer is None else f"{peer:.3f}"
    t = "-" if target is None else f"<= {target:g} {'met' if landed <= target else 'NOT met'}"
    return f"{landed:>9.3f}{p:>10}  {t}"


def format_deft_select_bench_gpu(rows: list[dict]) -> str:
    lines = [f"{'model':<10}{'W':>4}{'layers':>8}{'top-k ms':>10}{'DEFT max ms':>13}{'overhead ms':>13}"
             f"{'imbalance':>11}"]
    for r in rows:
        lines.append(f"{r['model']:<10}{r['world_size']:>4}{r['layers']:>8}{r['topk_seconds'] * 1e3:>10.3f}"
                     f"{r['deft_max_seconds'] * 1e3:>13.3f}{r['overhead_seconds'] * 1e3:>13.3f}"
                     f"{r['imbalance']:>11.2f}")
    lines += ["", "landed (segmented kernels) vs peer (torch on the same device) vs target, ms:",
              f"{'':<34}{'landed':>9}{'peer':>10}  target"]
    for r in rows:
        lines.append(f"{r['model'] + ' W=' + str(r['world_size']) + ' DEFT select (max rank)':<34}"
                     + _vs(r["deft_max_seconds"] * 1e3, r["peer_topk_ms"], r["target_select_ms"]))
        lines.append(f"{r['model'] + ' W=' + str(r['world_size']) + ' layer norms':<34}"
                     + _vs(r["norms_ms"], r["peer_norms_ms"], r["target_norms_ms"]))
    if rows and rows[0]["peer_topk_ms"] is None:
        lines.append("(peers not timed: torch has no CUDA)")
    lines.append("peers: one torch.topk per layer of a rank (max over ranks); "
                 "torch.segment_reduce(x.square(), 'sum', lengths) for the norms")
    return "\n".join(lines)
