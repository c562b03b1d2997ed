"""``bench overlap``: a training step with the exchange after backward, and overlapped with it.

Each rank trains the same net (:func:`mpisparse.models.nets.build_model`,
CIFAR-shaped random batches of its own) through
:func:`mpisparse.torch.DistributedOptimizer`, three ways, side by side in
one run:

* ``compute``: forward, backward and the local optimizer step, no exchange
  (the floor: what the step would cost if the exchange were free);
* ``plain``: the exchange of the whole fusion buffer once backward's
  gradients are all in (``overlap=False``);
* ``overlap``: buckets exchanged from gradient hooks while backward runs
  (``overlap=True``, :mod:`mpisparse.torch.overlap`);
* with ``ddp`` (``--ddp``): the same net under torch DDP with mpisparse's
  communication hook, exchanged in backward and overlapped, and DDP's own
  allreduce (:mod:`mpisparse.bench.overlap_ddp`).

The ways take turns step by step (a change of the machine's load falls on
all of them alike). A step is timed from a barrier to the end of
``step()``: ``zero_grad``, forward, backward (which holds the exchange where
it runs at the end of backward, as the optimizer's callback and DDP run it)
and ``step()``; each rank's median over the timed steps, the slowest rank's
reported. ``hidden`` is the share of the exchange's cost that overlapping
removed: ``(plain - overlap) / (plain - compute)``.

The library's own cost is measured in the same run (``library_*`` fields):
the ``plain`` way's exchange and step (``library_opt_step``: its
``synchronize()``, which runs at the end of backward or else inside
``step()``, plus ``step()``) split into the scheme's own ``Scheme.step``
(compensate, select, exchange), the 4-byte agreements on skipping (mostly
a wait for the slowest rank) and the rest -- what
:class:`~mpisparse.torch.DistributedOptimizer` adds: the gather into the
fusion buffer, the finite checks, the write-back into ``.grad``, the
parameter check -- and the wrapped optimizer's step; beside it, the
``compute`` way's local optimizer step and one copy of a gradient-sized
float32 vector (NumPy, into a vector allocated once), both timed in the
same loop. ``library_adds`` is ``library - local step`` (the target of issue 47: <= 1.0 ms dense, <= 0.5 ms
topk ``--layerwise``, resnet18 on an H200) and ``library_copies`` is ``library_adds / copy``;
``library_flag_reads_per_step`` and ``library_write_back_ops_per_step`` are the optimizer's own counters
(:mod:`mpisparse.torch.guard`: the host reads of the finite flags and the fused write-back operations on a
device; 0 on the host, where a read costs nothing and the write-back is views).

``device`` (a :class:`torch.device`): where the net, the batches and the
gradients live; on a GPU the step's boundaries synchronise the device, so
each interval holds its kernels, and the copy is a device-to-device copy of
a gradient-sized float32 tensor.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

#: nets of :mod:`mpisparse.models.nets` that take CIFAR-shaped images
OVERLAP_MODELS = ("mlp", "cnn", "resnet18")
INPUT_SHAPE = (3, 32, 32)


def _way(comm, model: str, *, scheme: str | None, density: float, options: dict[str, Any], overlap: bool,
         batch: int, bucket_cap_mb: float, seed: int, device=None):
    """A net, this rank's batch and its optimizer (``scheme`` None: the local optimizer, no exchange)."""
    import torch

    from ..models.nets import bench_net
    from ..torch import DistributedOptimizer

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1000 + comm.rank)
    net, x, y = bench_net(model, batch, generator=g, input_shape=INPUT_SHAPE)  # a language model: random tokens
    if device is not None:
        net, x, y = net.to(device), x.to(device), y.to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    if scheme is not None:
        opt = DistributedOptimizer(opt, named_parameters=net.named_parameters(), comm=comm, scheme=scheme,
                                   density=density, overlap=overlap, bucket_cap_mb=bucket_cap_mb, seed=seed,
                                   **options)
    return net, x, y, opt


def time_ways(comm, model: str, *, scheme: str, density: float, options: dict[str, Any], batch: int, iters: int,
              warmup: int, bucket_cap_mb: float, seed: int, device=None, ddp: bool = False) -> dict[str, Any]:
    """This rank's median step time of each way (``compute``, ``plain``, ``overlap``; with ``ddp`` also the
    DDP ways of :mod:`mpisparse.bench.overlap_ddp`), the ways taking turns step by step so that a change of
    the machine's load falls on all of them alike."""
    import torch

    ways = {name: _way(comm, model, scheme=s, density=density, options=options, overlap=name == "overlap",
                       batch=batch, bucket_cap_mb=bucket_cap_mb, seed=seed, device=device)
            for name, s in (("compute", None), ("plain", scheme), ("overlap", scheme))}
    sent_by = {name: (lambda o=w[3]: _bytes(o)) for name, w in ways.items()}
    if ddp:
        from .overlap_ddp import ddp_ways

        extra = ddp_ways(comm, lambda: _way(comm, model, scheme=None, density=density, options=options,
                                            overlap=False, batch=batch, bucket_cap_mb=bucket_cap_mb, seed=seed,
                                            device=device),
                         scheme=scheme, density=density, options=options, bucket_cap_mb=bucket_cap_mb, seed=seed,
                         device=device)
        ways.update({name: (w.net, w.x, w.y, w.opt) for name, w in extra.items()})
        sent_by.update({name: w.sent for name, w in extra.items()})
    on_gpu = device is not None and device.type == "cuda"
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    times: dict[str, list[float]] = {name: [] for name in ways}
    sent = {name: 0 for name in ways}
    plain = ways["plain"][3]
    scheme_sw, wait_sw = _Stopwatch(plain.scheme, "step"), _Stopwatch(plain, "_all_finite")
    # the exchange may run in backward (the optimizer's end-of-backward callback calls synchronize()): the
    # library's time is synchronize() during backward plus step()
    sync_sw = _Stopwatch(plain, "synchronize")
    if on_gpu:
        src = torch.ones(plain.layout.n, dtype=torch.float32, device=device)
        dst = torch.zeros_like(src)
        copy = dst.copy_
    else:
        src = np.ones(plain.layout.n, dtype=np.float32)
        dst = np.zeros_like(src)
        copy = lambda a: np.copyto(dst, a)  # noqa: E731
    lib: dict[str, list[float]] = {k: [] for k in ("opt_step", "scheme", "wait", "local_step", "copy")}
    counted = {"flag_reads": 0, "write_back_ops": 0}  # the plain way's, over the timed steps
    for it in range(warmup + iters):
        for name, (net, x, y, opt) in ways.items():
            sync()
            comm.barrier()
            b0 = sent_by[name]()
            n0 = {k: getattr(opt, k, 0) for k in counted}
            scheme_sw.seconds = wait_sw.seconds = sync_sw.seconds = 0.0
            t0 = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            sync()
            t1 = time.perf_counter()
            in_backward = sync_sw.seconds  # the exchange inside backward (0 when step() runs it)
            opt.step()
            sync()
            t2 = time.perf_counter()
            if name == "compute":
                copy(src)  # one gradient copy, in the same loop
                sync()
                t3 = time.perf_counter()
            if it >= warmup:
                times[name].append(t2 - t0)
                sent[name] += sent_by[name]() - b0
                if name == "plain":
                    for k in counted:
                        counted[k] += getattr(opt, k) - n0[k]
                    lib["opt_step"].append(in_backward + t2 - t1)
                    lib["scheme"].append(scheme_sw.seconds)
                    lib["wait"].append(wait_sw.seconds)
                elif name == "compute":
                    lib["local_step"].append(t2 - t1)
                    lib["copy"].append(t3 - t2)
    over = ways["overlap"][3].overlap
    facts = {name: statistics.median(t) for name, t in times.items()}
    own = [s - a - w for s, a, w in zip(lib["opt_step"], lib["scheme"], lib["wait"])]
    facts.update({f"library_{k}": statistics.median(v) for k, v in lib.items()}, library=statistics.median(own))
    facts.update({f"library_{k}_per_step": v / iters for k, v in counted.items()})
    facts.update({f"{name}_bytes": sent[name] / iters for name in ("plain", "overlap", "ddp_overlap")
                  if name in sent})
    facts.update(buckets=len(over.buckets), started_in_backward=over.started_in_backward)
    for name in ("plain", "overlap"):
        ways[name][3].close()  # the optimizer's gradient hooks removed, the overlap's thread stopped
    if ddp:
        for w in extra.values():
            w.close()
    return facts


class _Stopwatch:
    """Wraps ``obj.name`` (a method) on the instance, summing the seconds its calls take in ``seconds``."""

    def __init__(self, obj, name: str):
        self.seconds = 0.0
        inner = getattr(obj, name)

        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                self.seconds += time.perf_counter() - t0

        setattr(obj, name, timed)


def _bytes(opt) -> int:
    """Bytes this rank's optimizer sent so far (its buckets' own communicator included; 0 for a local one)."""
    comm = getattr(opt, "comm", None)
    if comm is None:
        return 0
    return comm.bytes_sent + (opt.overlap.bytes_sent if opt.overlap is not None else 0)


def run_overlap(comm, *, model: str, schemes: list[tuple[str, dict[str, Any]]], density: float, batch: int,
                iters: int, warmup: int, bucket_cap_mb: float, seed: int, progress=None,
                device: str = "cpu", ddp: bool = False) -> dict[str, Any]:
    """Every scheme's three ways (with ``ddp`` also the DDP ways); the same on every rank (the slowest rank's
    medians)."""
    from ..mpi.device import torch_device
    from .overlap_ddp import ddp_row

    dev = torch_device(device, comm)
    rows = []
    for name, opts in schemes:
        facts = time_ways(comm, model, scheme=name, density=density, options=opts, batch=batch, iters=iters,
                          warmup=warmup, bucket_cap_mb=bucket_cap_mb, seed=seed, device=dev, ddp=ddp)
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
                     **_library_row(everyone), **(ddp_row(everyone, compute) if ddp else {}),
                     "started_in_backward_per_step": facts["started_in_backward"] / (warmup + iters)})
        if progress is not None:
            progress(name)
    if ddp:
        from .overlap_ddp import stop

        stop()
    return {"command": "bench overlap", "model": model, "device": device, "density": density, "batch": batch,
            "iters": iters, "ddp": ddp,
            "warmup": warmup, "bucket_cap_mb": bucket_cap_mb, "world_size": comm.size, "seed": seed,
            "rows": rows}


def _library_row(everyone: list[dict[str, Any]]) -> dict[str, Any]:
    """The library's cost beside a local optimizer step and one gradient copy (ms; the slowest rank's medians)."""
    row = {f"library_{k}_ms": 1e3 * max(f[f"library_{k}"] for f in everyone)
           for k in ("opt_step", "scheme", "wait", "local_step", "copy")}
    row["library_ms"] = 1e3 * max(f["library"] for f in everyone)
    copy = row["library_copy_ms"]
    row["library_adds_ms"] = row["library_ms"] - row["library_local_step_ms"]
    row["library_copies"] = row["library_adds_ms"] / copy if copy > 0 else None
    for k in ("flag_reads", "write_back_ops"):  # the library's own counters (DistributedOptimizer), per step
        row[f"library_{k}_per_step"] = max(f[f"library_{k}_per_step"] for f in everyone)
    return row


def format_library(res: dict[str, Any]) -> str:
    """The library's cost table: ``step()`` of the plain way split, beside a local step and one copy (ms)."""
    from ..results.tables import Column, format_rows

    rows = [r for r in res["rows"] if "library_ms" in r]
    cols = [Column("scheme", "scheme", "{}", "<"), Column("library_opt_step_ms", "exchange + step() (ms)", "{:.1f}"),
            Column("library_scheme_ms", "scheme's own (ms)", "{:.1f}"),
            Column("library_wait_ms", "agreement wait (ms)", "{:.1f}"),
            Column("library_ms", "library + optimizer (ms)", "{:.1f}"),
            Column("library_local_step_ms", "local optimizer step (ms)", "{:.1f}"),
            Column("library_adds_ms", "library adds (ms)", "{:.2f}"),
            Column("library_flag_reads_per_step", "flag reads/step", "{:.1f}"),
            Column("library_write_back_ops_per_step", "write-back ops/step", "{:.1f}"),
            Column("library_copy_ms", "one gradient copy (ms)", "{:.1f}"),
            Column("library_copies", "library in copies", "{:.1f}")]
    title = ("library cost (exchange after backward): synchronize() and step() less the scheme's own step and "
             "the skip agreement, beside a local optimizer step and one gradient copy; 'library adds' = "
             "library + optimizer - local step; 'flag reads/step': the host reads of the finite flags "
             "(device-to-host copies on a device; on the host they cost nothing and are not counted); "
             "'write-back ops/step': the fused operations writing the aggregate into .grad (on a device); "
             "'library in copies' = library adds / copy")
    return format_rows(rows, cols, title=title)


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
    title = (f"bench overlap: {res['model']} on {res.get('device', 'cpu')}, batch {res['batch']}, "
             f"W={res['world_size']}, density "
             f"{res['density']}, bucket cap {res['bucket_cap_mb']} MB, median of {res['iters']} steps (slowest rank)")
    text = format_rows(rows, cols, title=title)
    if any("ddp_sync_ms" in r for r in res["rows"]):
        from .overlap_ddp import format_ddp

        text += "\n\n" + format_ddp(res)
    return text + "\n\n" + format_library(res) if any("library_ms" in r for r in res["rows"]) else text
