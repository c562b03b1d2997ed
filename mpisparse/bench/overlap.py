"""``bench overlap``: a training step with the exchange after backward, and overlapped with it.

Each rank trains the same net (:func:`mpisparse.models.nets.build_model`,
CIFAR-shaped random batches of its own) through
:func:`mpisparse.torch.DistributedOptimizer`, three ways, side by side in
one run:

* ``compute``: forward, backward and the local optimizer step, no exchange
  (the floor: what the step would cost if the exchange were free);
* ``plain``: the exchange of the whole fusion buffer after backward
  (``overlap=False``);
* ``overlap``: buckets exchanged from gradient hooks while backward runs
  (``overlap=True``, :mod:`mpisparse.torch_overlap`).

A step is timed from a barrier to the end of ``step()``; each rank's median
over the timed steps, the slowest rank's reported. ``hidden`` is the share
of the exchange's cost that overlapping removed:
``(plain - overlap) / (plain - compute)``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

#: nets of :mod:`mpisparse.models.nets` that take CIFAR-shaped images
OVERLAP_MODELS = ("mlp", "cnn", "resnet18")
INPUT_SHAPE = (3, 32, 32)


def time_steps(comm, model: str, *, scheme: str | None, density: float, options: dict[str, Any],
               overlap: bool, batch: int, iters: int, warmup: int, bucket_cap_mb: float, seed: int) -> dict[str, Any]:
    """Median step time of this rank (``scheme`` None: no exchange) and the optimizer's facts."""
    import torch

    from ..models.nets import build_model
    from ..torch import DistributedOptimizer

    torch.manual_seed(seed)
    net = build_model(model, input_shape=INPUT_SHAPE, num_classes=10)
    g = torch.Generator().manual_seed(seed + 1000 + comm.rank)
    x = torch.randn(batch, *INPUT_SHAPE, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    if scheme is not None:
        opt = DistributedOptimizer(opt, named_parameters=net.named_parameters(), comm=comm, scheme=scheme,
                                   density=density, overlap=overlap, bucket_cap_mb=bucket_cap_mb, seed=seed,
                                   **options)
    times = []
    for it in range(warmup + iters):
        comm.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        if it >= warmup:
            times.append(time.perf_counter() - t0)
    facts: dict[str, Any] = {"median_s": statistics.median(times)}
    if scheme is not None and overlap:
        facts["buckets"] = len(opt.overlap.buckets)
        facts["started_in_backward"] = opt.overlap.started_in_backward
        opt.overlap.close()
    return facts


def run_overlap(comm, *, model: str, schemes: list[tuple[str, dict[str, Any]]], density: float, batch: int,
                iters: int, warmup: int, bucket_cap_mb: float, seed: int, progress=None) -> dict[str, Any]:
    """Every scheme with and without overlap (and the no-exchange floor once); the same on every rank."""
    kw = dict(density=density, batch=batch, iters=iters, warmup=warmup, bucket_cap_mb=bucket_cap_mb, seed=seed)

    def slowest(facts: dict[str, Any]) -> float:
        return max(comm.allgather_obj(facts["median_s"]))

    compute = slowest(time_steps(comm, model, scheme=None, options={}, overlap=False, **kw))
    rows = []
    for name, opts in schemes:
        plain = slowest(time_steps(comm, model, scheme=name, options=opts, overlap=False, **kw))
        over_facts = time_steps(comm, model, scheme=name, options=opts, overlap=True, **kw)
        over = slowest(over_facts)
        exchange = plain - compute
        rows.append({"scheme": name, "options": opts, "compute_ms": compute * 1e3, "plain_ms": plain * 1e3,
                     "overlap_ms": over * 1e3, "speedup": plain / over if over > 0 else None,
                     "hidden": (plain - over) / exchange if exchange > 0 else None,
                     "buckets": over_facts["buckets"],
                     "started_in_backward_per_step": over_facts["started_in_backward"] / (warmup + iters)})
        if progress is not None:
            progress(name)
    return {"command": "bench overlap", "model": model, "density": density, "batch": batch, "iters": iters,
            "warmup": warmup, "bucket_cap_mb": bucket_cap_mb, "world_size": comm.size, "seed": seed,
            "rows": rows}


def format_overlap(res: dict[str, Any]) -> str:
    """The comparison table (step times of the slowest rank, ms)."""
    from ..results.tables import Column, format_rows

    rows = [{**r, "label": r["scheme"] + "".join(f" --{k}" if v is True else f" --{k} {v}"
                                                 for k, v in r["options"].items())} for r in res["rows"]]
    pct = lambda v: f"{100 * v:.0f}%"  # noqa: E731
    cols = [Column("label", "scheme", "{}", "<"), Column("compute_ms", "compute only (ms)", "{:.1f}"),
            Column("plain_ms", "exchange after backward (ms)", "{:.1f}"),
            Column("overlap_ms", "overlapped (ms)", "{:.1f}"), Column("speedup", "speedup", "{:.2f}x"),
            Column("hidden", "exchange hidden", pct), Column("buckets", "buckets", "{}")]
    title = (f"bench overlap: {res['model']}, batch {res['batch']}, W={res['world_size']}, density "
             f"{res['density']}, bucket cap {res['bucket_cap_mb']} MB, median of {res['iters']} steps (slowest rank)")
    return format_rows(rows, cols, title=title)
