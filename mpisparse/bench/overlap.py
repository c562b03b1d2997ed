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
  (``overlap=True``, :mod:`mpisparse.torch.overlap`).

The three ways take turns step by step (a change of the machine's load
falls on all three alike). A step is timed from a barrier to the end of
``step()``; each rank's median over the timed steps, the slowest rank's
reported. ``hidden`` is the share
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


def _way(comm, model: str, *, scheme: str | None, density: float, options: dict[str, Any], overlap: bool,
         batch: int, bucket_cap_mb: float, seed: int):
    """A net, this rank's batch and its optimizer (``scheme`` None: the local optimizer, no exchange)."""
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
    return net, x, y, opt


def time_ways(comm, model: str, *, scheme: str, density: float, options: dict[str, Any], batch: int, iters: int,
              warmup: int, bucket_cap_mb: float, seed: int) -> dict[str, Any]:
    """This rank's median step time of each way (``compute``, ``plain``, ``overlap``), the ways taking turns
    step by step so that a change of the machine's load falls on all three alike."""
    import torch

    ways = {name: _way(comm, model, scheme=s, density=density, options=options, overlap=name == "overlap",
                       batch=batch, bucket_cap_mb=bucket_cap_mb, seed=seed)
            for name, s in (("compute", None), ("plain", scheme), ("overlap", scheme))}
    times: dict[str, list[float]] = {name: [] for name in ways}
    sent = {name: 0 for name in ways}
    for it in range(warmup + iters):
        for name, (net, x, y, opt) in ways.items():
            comm.barrier()
            b0 = _bytes(opt)
            t0 = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
            if it >= warmup:
                times[name].append(time.perf_counter() - t0)
                sent[name] += _bytes(opt) - b0
    over = ways["overlap"][3].overlap
    facts = {name: statistics.median(t) for name, t in times.items()}
    facts.update({f"{name}_bytes": sent[name] / iters for name in ("plain", "overlap")})
    facts.update(buckets=len(over.buckets), started_in_backward=over.started_in_backward)
    over.close()
    return facts


def _bytes(opt) -> int:
    """Bytes this rank's optimizer sent so far (its buckets' own communicator included; 0 for a local one)."""
    comm = getattr(opt, "comm", None)
    if comm is None:
        return 0
    return comm.bytes_sent + (opt.overlap.bytes_sent if opt.overlap is not None else 0)


def run_overlap(comm, *, model: str, schemes: list[tuple[str, dict[str, Any]]], density: float, batch: int,
                iters: int, warmup: int, bucket_cap_mb: float, seed: int, progress=None) -> dict[str, Any]:
    """Every scheme's three ways; the same on every rank (the slowest rank's medians)."""
    rows = []
    for name, opts in schemes:
        facts = time_ways(comm, model, scheme=name, density=density, options=opts, batch=batch, iters=iters,
                          warmup=warmup, bucket_cap_mb=bucket_cap_mb, seed=seed)
        everyone = comm.allgather_obj(facts)
        compute, plain, over = (max(f[w] for f in everyone) for w in ("compute", "plain", "overlap"))
        exchange = plain - compute
        rows.append({"scheme": name, "options": opts, "wire_dtype": opts.get("wire_dtype", "float32"),
                     "bytes_plain": max(f["plain_bytes"] for f in everyone),
                     "bytes_overlap": max(f["overlap_bytes"] for f in everyone),
                     "compute_ms": compute * 1e3, "plain_ms": plain * 1e3,
                     "overlap_ms": over * 1e3, "speedup": plain / over if over > 0 else None,
                     "hidden": (plain - over) / exchange if exchange > 0 else None,
                     "buckets": facts["buckets"],
                     "started_in_backward_per_step": facts["started_in_backward"] / (warmup + iters)})
        if progress is not None:
            progress(name)
    return {"command": "bench overlap", "model": model, "density": density, "batch": batch, "iters": iters,
            "warmup": warmup, "bucket_cap_mb": bucket_cap_mb, "world_size": comm.size, "seed": seed,
            "rows": rows}


def format_overlap(res: dict[str, Any]) -> str:
    """The comparison table (step times of the slowest rank, ms)."""
    from ..results.tables import Column, format_rows

    rows = [{**r, "label": r["scheme"] + "".join(f" --{k.replace('_', '-')}" if v is True else
                                                 f" --{k.replace('_', '-')} {v}" for k, v in r["options"].items())}
            for r in res["rows"]]
    pct = lambda v: f"{100 * v:.0f}%"  # noqa: E731
    cols = [Column("label", "scheme", "{}", "<"), Column("compute_ms", "compute only (ms)", "{:.1f}"),
            Column("plain_ms", "exchange after backward (ms)", "{:.1f}"),
            Column("overlap_ms", "overlapped (ms)", "{:.1f}"), Column("speedup", "speedup", "{:.2f}x"),
            Column("hidden", "exchange hidden", pct), Column("buckets", "buckets", "{}"),
            Column("bytes_plain", "bytes/rank/step", "{:,.0f}")]
    title = (f"bench overlap: {res['model']}, batch {res['batch']}, W={res['world_size']}, density "
             f"{res['density']}, bucket cap {res['bucket_cap_mb']} MB, median of {res['iters']} steps (slowest rank)")
    return format_rows(rows, cols, title=title)
