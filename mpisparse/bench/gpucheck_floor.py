"""The table ``bin/gpu-check``'s report opens with: the GPU floor's rows, each measured, target, met.

One row per line of the issue that set these targets (issue 47, "GPU at the
memory floor"), read from the JSON of the checks that measure them; a row
whose check did not run or gave no result says so (``met`` None), never a
number from elsewhere.  A *copy* is the read and write of the 25M-element
float32 buffer (``dst[...] = x``, timed beside the kernels in the same run of
``bench select``): the kernels' times are given in copies, so the targets do
not depend on the device's bandwidth.

Pure functions of the checks' results (tests feed them recorded results).
"""

from __future__ import annotations

from typing import Any

#: exact top-k (radix2): at most one copy (two reads of x) and at least this many times faster than torch.topk
TOPK_COPIES = 1.0
TOPK_VS_TORCH = 11.0
#: threshold select: one read of x plus the selected writes
THRESHOLD_COPIES = 0.75
#: fixed cost of a replayed call on 65,536 elements (ms)
FIXED_MS = 0.015
#: DEFT's per-rank selection, resnet50 d=0.01 (ms), by world size; its layer norms (ms, one read)
DEFT_MS = {4: 0.30, 1: 0.80}
NORMS_MS = 0.05
#: what DistributedOptimizer adds to a resnet18 step at W=2 beyond the local optimizer step (ms)
LIBRARY_MS = {"dense": 1.0, "topk": 0.5}

__all__ = ["floor_table", "DEFT_MS", "FIXED_MS", "LIBRARY_MS", "NORMS_MS", "THRESHOLD_COPIES", "TOPK_COPIES",
           "TOPK_VS_TORCH"]


def _first(x: Any) -> Any:
    return x[0] if isinstance(x, list) and x else x


def _as_list(x: Any) -> list:
    return x if isinstance(x, list) else [x] if x else []


def _best(sel: Any, name: str) -> float | None:
    if not isinstance(sel, dict):
        return None
    return (sel.get("timings", {}).get(name) or {}).get("best_ms")


def _staging(r: dict[str, Any]) -> float:
    s = r.get("staging_copies_per_step") or {}
    return float(s.get("d2h", 0)) + float(s.get("h2d", 0))


def floor_table(results: dict[str, Any]) -> list[dict[str, Any]]:
    """``{"row", "measured", "target", "met"}`` per row; ``met`` None where no check gave a result,
    ``"yardstick"`` for the copy every other row is measured in."""
    rows: list[dict[str, Any]] = []

    def row(name: str, measured: str | None, target: str, met: Any) -> None:
        rows.append({"row": name, "measured": measured if met is not None and measured else "-",
                     "target": target, "met": met})

    sel = _first(results.get("select"))
    copy = _best(sel, "copy")
    row("copy (read + write), 25M float32", f"{copy:.3f} ms" if copy else None, "-",
        "yardstick" if copy else None)
    r2, torch_topk = _best(sel, "topk_abs_radix2"), _best(sel, "torch_topk")
    if copy and r2 and torch_topk:
        c, x = r2 / copy, torch_topk / r2
        row("exact top-k (radix2), 25M float32, d=0.001",
            f"{r2:.3f} ms = {c:.2f} copies; torch.topk {torch_topk:.3f} ms = {x:.1f}x",
            f"<= {TOPK_COPIES:g} copy and >= {TOPK_VS_TORCH:g}x torch.topk", c <= TOPK_COPIES and x >= TOPK_VS_TORCH)
    else:
        row("exact top-k (radix2), 25M float32, d=0.001", None,
            f"<= {TOPK_COPIES:g} copy and >= {TOPK_VS_TORCH:g}x torch.topk", None)
    th = _best(sel, "threshold_select")
    row("threshold select, 25M float32, d=0.001", f"{th:.3f} ms = {th / copy:.2f} copies" if copy and th else None,
        f"<= {THRESHOLD_COPIES:g} copy", None if not (copy and th) else th / copy <= THRESHOLD_COPIES)

    fc = results.get("fixed-cost")
    if isinstance(fc, dict) and fc.get("ms"):
        replay = {k: min(v.get("graph", float("inf")), v.get("graph_reuse", float("inf"))) for k, v in fc["ms"].items()}
        ok = all(v <= FIXED_MS for v in replay.values()) and bool(fc.get("replay_equals_fresh"))
        row(f"fixed cost of a call, {fc.get('n', 65536):,} elements, graph replay",
            ", ".join(f"{k} {v:.4f} ms" for k, v in replay.items())
            + ("" if fc.get("replay_equals_fresh") else "; a replay differed from a fresh call"), f"<= {FIXED_MS} ms",
            ok)
    else:
        row("fixed cost of a call, 65,536 elements, graph replay", None, f"<= {FIXED_MS} ms", None)

    deft = {r.get("world_size"): r for r in _as_list(results.get("select-deft")) if isinstance(r, dict)}
    for w, target in DEFT_MS.items():
        r = deft.get(w)
        ms = 1e3 * float(r["deft_max_seconds"]) if r and r.get("deft_max_seconds") is not None else None
        row(f"DEFT selection, resnet50 d=0.01, W={w}", f"{ms:.3f} ms" if ms is not None else None,
            f"<= {target:g} ms", None if ms is None else ms <= target)
    n1 = (deft.get(1) or {}).get("norms_ms")
    row("layer norms, resnet50 (161 layers)", f"{n1:.3f} ms" if n1 is not None else None, f"<= {NORMS_MS:g} ms",
        None if n1 is None else n1 <= NORMS_MS)

    lib = _first(results.get("library-cuda"))
    lib_rows = {r.get("scheme"): r for r in (lib or {}).get("rows", []) if "library_ms" in r} \
        if isinstance(lib, dict) else {}
    for scheme, target in LIBRARY_MS.items():
        r = lib_rows.get(scheme)
        adds = r["library_ms"] - r["library_local_step_ms"] if r else None
        row(f"library adds to a step beyond the local optimizer step, resnet18 W=2, {scheme}",
            f"{adds:.2f} ms (local step {r['library_local_step_ms']:.2f} ms"
            + (f"; flag reads a step {r['library_flag_reads_per_step']:g}" if "library_flag_reads_per_step" in r
               else "") + ")" if r else None, f"<= {target:g} ms",
            None if adds is None else adds <= target)

    info = _first(results.get("cuda-mpi-info"))
    row("CUDA-aware MPI (the carried build): mpisparse info -n 2",
        f"cuda_aware {info.get('cuda_aware')} ({info.get('cuda_aware_how', '')})" if isinstance(info, dict) else None,
        "CUDA-aware yes", None if not isinstance(info, dict) else bool(info.get("cuda_aware")))
    step = [r for r in _as_list(results.get("cuda-mpi-step")) if isinstance(r, dict)]
    row("CUDA-aware MPI: bench step --device cuda, staging copies per step",
        ", ".join(f"{r.get('scheme')} {_staging(r):g} copies, {1e3 * r['step_seconds']:.2f} ms" for r in step)
        if step else None, "0", None if not step else all(_staging(r) == 0 for r in step))
    return rows
