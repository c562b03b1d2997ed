"""Horovod-style process functions for torch scripts under MPI (``import mpisparse.torch as hvd``).

The calls a Horovod PyTorch script makes around its optimizer, with
Horovod's names and arguments, on one process-wide
:class:`mpisparse.mpi.comm.Communicator` (``COMM_WORLD``)::

    hvd.init()
    torch.manual_seed(hvd.rank())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    acc = hvd.allreduce(torch.tensor(correct / total), name="acc")   # averaged over ranks

Tensors are reduced on the host (metrics and start-up state are small);
the gradient exchange itself is :class:`mpisparse.torch.DistributedOptimizer`.
:func:`init` also installs an exception hook: under MPI with more than one
rank, an uncaught exception on any rank prints its traceback and aborts the
whole job, so the other ranks never wait forever in a collective.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from typing import Any, Iterable, Mapping

import numpy as np
import torch

__all__ = ["Average", "Compression", "Max", "Min", "Sum", "allgather", "allgather_object", "allreduce",
           "broadcast", "broadcast_", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters",
           "init", "is_initialized", "local_rank", "local_size", "rank", "size", "communicator"]

#: reduction operations, as Horovod names them
Average, Sum, Min, Max = "average", "sum", "min", "max"

_lock = threading.Lock()
_comm = None


def init(comm=None) -> None:
    """Start (or adopt ``comm``, a :class:`mpisparse.mpi.comm.Communicator`) the process-wide communicator."""
    global _comm
    with _lock:
        if _comm is None or comm is not None:
            if comm is None:
                from ..mpi.comm import Communicator

                comm = Communicator()
            _comm = comm
            _install_abort_hook(comm)


def is_initialized() -> bool:
    return _comm is not None


def communicator():
    """The communicator :func:`init` started (it starts one if needed)."""
    if _comm is None:
        init()
    return _comm


def rank() -> int:
    return communicator().rank


def size() -> int:
    return communicator().size


def local_rank() -> int:
    """This rank's number among the ranks on its host."""
    return communicator().local_rank()[0]


def local_size() -> int:
    return communicator().local_rank()[1]


def _install_abort_hook(comm) -> None:
    if comm.size < 2 or getattr(sys.excepthook, "_mpisparse_abort", False):
        return
    previous = sys.excepthook

    def abort_on_exception(kind, value, tb):
        sys.stderr.flush()
        if previous is sys.__excepthook__:
            # the whole traceback in one write: the launcher forwards it before the abort tears the job
            # down (written piece by piece, the last pieces could be lost)
            text = "".join(traceback.format_exception(kind, value, tb))
            try:
                os.write(2, text.encode(errors="replace"))
            except OSError:
                previous(kind, value, tb)
        else:  # the user's own hook
            previous(kind, value, tb)
            sys.stderr.flush()
        comm.abort(1)

    abort_on_exception._mpisparse_abort = True  # type: ignore[attr-defined]
    sys.excepthook = abort_on_exception


# ------------------------------------------------------------------ tensors
def _host(tensor: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(tensor.detach().cpu().numpy())


class _NoCompression:
    """No compression: tensors travel as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx) -> torch.Tensor:
        return tensor


class _FP16Compression:
    """Floating-point tensors travel as float16 and come back in their own dtype."""

    @staticmethod
    def compress(tensor: torch.Tensor):
        if tensor.is_floating_point():
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx) -> torch.Tensor:
        return tensor.to(ctx) if ctx is not None else tensor


class Compression:
    """Wire compression of :func:`allreduce` (and of the dense exchange): ``none`` or ``fp16``."""

    none = _NoCompression
    fp16 = _FP16Compression


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression=Compression.none, op: str | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0) -> torch.Tensor:
    """A new tensor: ``tensor`` reduced over ranks (``op``: Average (default), Sum, Min, Max)."""
    if op is None:
        op = Sum if average is False else Average
    elif average is not None:
        raise ValueError("allreduce: give op or average, not both")
    if op not in (Average, Sum, Min, Max):
        raise ValueError(f"allreduce: op is {op!r}; allowed: Average, Sum, Min, Max")
    comm = communicator()
    wire, ctx = compression.compress(tensor * prescale_factor if prescale_factor != 1.0 else tensor)
    arr = _host(wire)
    if arr.dtype == np.float16:  # MPI has no half-precision sum: the float16 values are summed in float32
        arr = arr.astype(np.float32)
    out = comm.allreduce(arr, op="sum" if op in (Average, Sum) else op)
    if op == Average:
        out = out / comm.size
    reduced = torch.from_numpy(np.ascontiguousarray(out)).view(wire.shape).to(device=tensor.device, dtype=wire.dtype)
    result = compression.decompress(reduced, ctx).to(tensor.dtype)
    return result * postscale_factor if postscale_factor != 1.0 else result


def allgather(tensor: torch.Tensor, name: str | None = None) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along the first dimension (first dimensions may differ)."""
    recv, _ = communicator().allgatherv(_host(tensor).reshape(-1))
    out = torch.from_numpy(np.array(recv)).to(tensor.device)
    return out.view(-1, *tensor.shape[1:]) if tensor.ndim else out


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    """A new tensor holding ``root_rank``'s ``tensor``."""
    arr = _host(tensor).copy()
    communicator().bcast(arr, root_rank)
    return torch.from_numpy(arr).to(tensor.device).view(tensor.shape)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    """Overwrite ``tensor`` with ``root_rank``'s, in place."""
    with torch.no_grad():
        tensor.copy_(broadcast(tensor, root_rank, name))
    return tensor


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
    """``root_rank``'s (picklable) ``obj`` on every rank."""
    return communicator().bcast_obj(obj, root_rank)


def allgather_object(obj: Any, name: str | None = None) -> list:
    return communicator().allgather_obj(obj)


def broadcast_parameters(params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                         root_rank: int) -> None:
    """Make every rank's tensors equal to ``root_rank``'s, in place.

    ``params``: a ``state_dict()`` or ``named_parameters()``; the same names
    on every rank (checked).
    """
    items = sorted(params.items() if isinstance(params, Mapping) else params, key=lambda kv: kv[0])
    names = [n for n, _ in items]
    root_names = broadcast_object(names, root_rank)
    if root_names != names:
        raise ValueError(f"broadcast_parameters: rank {rank()} has {len(names)} tensors, rank {root_rank} "
                         f"{len(root_names)}; their names differ")
    for _, t in items:
        if isinstance(t, torch.Tensor):
            broadcast_(t, root_rank)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int) -> None:
    """Make every rank's optimizer state (hyper-parameters and buffers) equal to ``root_rank``'s."""
    state = optimizer.state_dict()
    host = broadcast_object(_to_cpu(state), root_rank)
    optimizer.load_state_dict(host)


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
