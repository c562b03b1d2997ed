"""``bench overlap --ddp``: the same net under torch DDP, its buckets through mpisparse's communication hook.

The MPI ranks of ``bench overlap`` also start ``torch.distributed`` (gloo on
a CPU; gloo and NCCL with ``--device cuda``) over the same ranks
(:func:`mpisparse.torch.dist.init_process_group_from_mpi`) and time three
more ways, taking turns with the library's:

* ``ddp_sync``: ``DistributedDataParallel`` with
  :func:`mpisparse.torch.dist.comm_hook` exchanging each bucket inside the
  hook (``overlap=False``: backward waits for every bucket);
* ``ddp_overlap``: the same hook overlapped (``overlap=True``, the default:
  buckets exchanged on the hook's thread while backward goes on);
* ``ddp_allreduce`` (dense only): DDP's own allreduce, no hook, the
  reference of what DDP itself overlaps.

DDP's buffers are not synchronised at each forward (``forward_sync_buffers``,
formerly ``broadcast_buffers``, False: the library's ways do not either) and
its buckets are ``--bucket-cap-mb`` MB. The hook's hidden share is
``(ddp_sync - ddp_overlap) / (ddp_sync - compute)``, beside the library's
``(plain - overlap) / (plain - compute)``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

#: the DDP ways, in the order they take their turns
DDP_WAYS = ("ddp_sync", "ddp_overlap", "ddp_allreduce")


@dataclass
class DDPWay:
    """A DDP-wrapped net, its batch, its (local) optimizer and the bytes its hook sent so far."""

    net: Any
    x: Any
    y: Any
    opt: Any
    sent: Callable[[], int]
    close: Callable[[], None]


def start(comm, device) -> None:
    """``torch.distributed`` over ``comm``'s ranks, once per process (gloo; with CUDA also NCCL)."""
    import torch.distributed as dist

    from ..torch.dist import init_process_group_from_mpi

    if not dist.is_initialized():
        on_gpu = device is not None and device.type == "cuda"
        init_process_group_from_mpi(comm, "cpu:gloo,cuda:nccl" if on_gpu else "gloo")


def stop() -> None:
    """End this job's use of ``torch.distributed`` (every rank, then the group destroyed), if it started."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def ddp_ways(comm, make_way: Callable[[], tuple], *, scheme: str, density: float, options: dict[str, Any],
             bucket_cap_mb: float, seed: int, device) -> dict[str, DDPWay]:
    """The DDP ways of one scheme; ``make_way()`` builds the net, this rank's batch and a local optimizer
    (the ``compute`` way's), the same for each way."""
    import torch

    from ..torch.dist import comm_hook

    start(comm, device)
    # buffers synchronised once at construction, not at every forward (the library's ways do not either);
    # torch 2.13 renamed broadcast_buffers (which then warns) to forward_sync_buffers
    params = inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
    no_sync = {"forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers": False}
    ways: dict[str, DDPWay] = {}
    for name in DDP_WAYS:
        if name == "ddp_allreduce" and scheme != "dense":
            continue
        net, x, y, opt = make_way()
        ids = [device.index] if device is not None and device.type == "cuda" else None
        ddp = torch.nn.parallel.DistributedDataParallel(net, device_ids=ids, bucket_cap_mb=bucket_cap_mb, **no_sync)
        if name == "ddp_allreduce":
            ways[name] = DDPWay(ddp, x, y, opt, lambda: 0, lambda: None)
            continue
        state, hook = comm_hook(scheme, density, seed=seed, overlap=name == "ddp_overlap", **options)
        ddp.register_comm_hook(state, hook)
        ways[name] = DDPWay(ddp, x, y, opt, lambda st=state: st.comm.bytes_sent if st._comm is not None else 0,
                            state.close)
    return ways


def ddp_row(everyone: list[dict[str, Any]], compute: float) -> dict[str, Any]:
    """The DDP columns of a ``bench overlap`` row from every rank's medians (the slowest rank's), ms; the
    hook's hidden share against the ``compute`` way's step (seconds)."""
    row: dict[str, Any] = {}
    for name in DDP_WAYS:
        if name in everyone[0]:
            row[f"{name}_ms"] = 1e3 * max(f[name] for f in everyone)
    sync, over = row.get("ddp_sync_ms"), row.get("ddp_overlap_ms")
    if sync is not None and over is not None:
        exchange = sync - 1e3 * compute
        row["ddp_hidden"] = (sync - over) / exchange if exchange > 0 else None
        row["ddp_speedup"] = sync / over if over > 0 else None
        row["bytes_ddp_hook"] = max(f["ddp_overlap_bytes"] for f in everyone)
    return row


def format_ddp(res: dict[str, Any]) -> str:
    """The DDP table: the hook synchronous and overlapped, DDP's own allreduce, beside the library's overlap."""
    from ..results.tables import Column, format_rows

    rows = [{**r, "label": r["scheme"] + "".join(f" --{k.replace('_', '-')}" if v is True else
                                                 f" --{k.replace('_', '-')} {v}" for k, v in r["options"].items())}
            for r in res["rows"] if "ddp_sync_ms" in r]
    pct = lambda v: f"{100 * v:.0f}%"  # noqa: E731
    cols = [Column("label", "scheme", "{}", "<"), Column("compute_ms", "compute only (ms)", "{:.1f}"),
            Column("ddp_sync_ms", "DDP, hook in backward (ms)", "{:.1f}"),
            Column("ddp_overlap_ms", "DDP, hook overlapped (ms)", "{:.1f}"),
            Column("ddp_hidden", "hook: exchange hidden", pct),
            Column("hidden", "library: exchange hidden", pct),
            Column("ddp_allreduce_ms", "DDP's own allreduce (ms)", "{:.1f}"),
            Column("bytes_ddp_hook", "hook bytes/rank/step", "{:,.0f}")]
    title = ("DDP (torch.distributed gloo over the same ranks) with mpisparse's hook: 'hook: exchange hidden' = "
             "(in backward - overlapped) / (in backward - compute only); the library's share from the table above")
    return format_rows(rows, cols, title=title)
