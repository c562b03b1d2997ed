"""The schemes without MPI: a torch DDP communication hook over ``torch.distributed``.

::

    import torch.distributed as dist
    from mpisparse.torch import comm_hook

    dist.init_process_group("gloo")            # or "nccl"; under torchrun
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state, hook = comm_hook("deft", density=0.01)
    ddp.register_comm_hook(state, hook)

DDP hands the hook one bucket of gradients at a time (a flat tensor, the
concatenation of some parameters' gradients) and expects the bucket's mean
over ranks back.  The hook runs the scheme on the bucket: one scheme
instance per bucket, with the bucket's parameters as its fusion layout, so
error feedback, DGC momentum and the other per-step state stay with their
bucket.  DDP rebuilds its buckets once after the first iteration; a bucket
whose layout changed gets a fresh scheme (its residual restarts from zero).
A bfloat16 or float16 bucket (a 16-bit model, or DDP's mixed precision) is
widened to float32 with torch (NumPy takes no bfloat16 through DLPack), so the
scheme computes and keeps its error feedback in float32; the mean is rounded
back into the bucket's dtype once.  The hook overlaps: it queues the bucket on
the state's exchange thread and returns a future at once, so backward goes on
while buckets are exchanged (:class:`HookState`; ``overlap=False`` exchanges
inside the hook).

The schemes talk to :class:`TorchDistCommunicator`, which offers the
subset of :class:`mpisparse.mpi.comm.Communicator` the data-parallel schemes use
(collectives, Alltoallv included, blocking point-to-point, byte counting with
the same model) over ``torch.distributed``: gloo for CPU tensors, NCCL for CUDA
tensors (``mpisparse train --device cuda`` under torchrun starts both,
``cpu:gloo,cuda:nccl``; in a group of NCCL alone the counts of a variable-size
exchange go on the GPU).  Every data-parallel scheme runs, ``oktopk`` and the
16-bit wire (``wire_dtype``) included: gloo moves no 16-bit integers (``Invalid
scalar type``), so a pure copy (gather, all-to-all, broadcast, send) of a dtype
outside :data:`_NATIVE` (the wire's ``uint16`` bit patterns) moves its bytes,
and a 16-bit sum is the wire's own (:func:`mpisparse.mpi.wire.allreduce_sum`:
an Alltoallv reduce-scatter with float32 sums, then an Allgatherv).  For the
same seeds and inputs a scheme returns the same aggregate as under MPI
(``tests/test_torch_dist.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .. import backend
from ..mpi.comm import CallStats, Communicator, check_dtype
from ..backend.fusion import FusionLayout

__all__ = ["BUCKET_DTYPES", "HookState", "TorchDistCommunicator", "comm_hook", "init_process_group_from_mpi"]

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


#: dtypes gloo and NCCL both move and reduce as they are; any other moves as its bytes (:func:`_moved`)
_NATIVE = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64, np.int8, np.uint8))


def _tensor(x) -> torch.Tensor:
    """``x`` (NumPy or CuPy, contiguous) as a torch tensor sharing its memory."""
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x)
    return torch.from_dlpack(x)


def _moved(x) -> torch.Tensor:
    """``x`` as a pure copy (gather, all-to-all, broadcast, send) moves it: its own tensor, or, for a dtype
    outside :data:`_NATIVE` (the 16-bit wire's ``uint16`` patterns, float16), its bytes (``uint8``, shared
    memory): gloo has no 16-bit integers, and bytes are what a copy moves anyway."""
    t = _tensor(x)
    return t if np.dtype(x.dtype) in _NATIVE else t.view(torch.uint8)


class TorchDistCommunicator:
    """The data-parallel schemes' communicator interface over a ``torch.distributed`` process group.

    Bytes are counted with the same model as :class:`mpisparse.mpi.comm.Communicator`
    (ring Allreduce and Allgather, chain broadcast), so results compare with
    MPI runs.  Every call is timed.
    """

    def __init__(self, group: Any = None):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: call torch.distributed.init_process_group "
                               "first (e.g. under torchrun)")
        self.group = group
        self.rank: int = dist.get_rank(group)
        self.size: int = dist.get_world_size(group)
        self.check = False
        self.stats: dict[str, CallStats] = {}
        #: no host staging: the backend (gloo, NCCL) takes the tensors where they are
        self.staging = {"d2h": 0, "h2d": 0, "d2h_bytes": 0, "h2d_bytes": 0}
        backend_name = str(dist.get_backend(group))
        self.cuda_aware, self.cuda_aware_how = None, f"torch.distributed ({backend_name})"
        #: where the counts of a variable-size exchange go: NCCL alone takes CUDA tensors only
        self._counts_device = "cuda" if backend_name == "nccl" else "cpu"

    # the counters and the byte model are the MPI communicator's own (one place for both)
    bytes_sent = Communicator.bytes_sent
    _record = Communicator._record
    _timed = Communicator._timed
    #: ``bench step --separate-wait`` runs over MPI only: never set here (read by :meth:`_timed`)
    wait_timer = None
    _ring_allreduce_bytes = Communicator.ring_allreduce_bytes
    _ring_allgather_bytes = Communicator.ring_allgather_bytes
    _chain_bcast_bytes = Communicator.chain_bcast_bytes

    # ------------------------------------------------------------ collectives
    def allreduce(self, x, out=None, *, op: str = "sum"):
        """Sum (or ``op``) of ``x`` over ranks, into ``out`` (in place if ``out is x``).

        A dtype outside :data:`_NATIVE` is reduced in a wider one and cast back (float16 in float32, one
        rounding at the end; integers in int64); bytes are counted for ``x``'s own dtype.  The schemes
        never sum 16-bit values here: their 16-bit sum is :func:`mpisparse.mpi.wire.allreduce_sum`."""
        check_dtype(x, reduce=True)
        if out is None:
            out = x.copy()
        elif out is not x:
            out[...] = x
        nbytes = int(x.size) * np.dtype(x.dtype).itemsize
        with self._timed("allreduce", self._ring_allreduce_bytes(nbytes)):
            if np.dtype(x.dtype) in _NATIVE:
                dist.all_reduce(_tensor(out), op=_OPS[op], group=self.group)
            else:
                wide = out.astype(np.float32 if np.dtype(x.dtype).kind == "f" else np.int64)
                dist.all_reduce(_tensor(wide), op=_OPS[op], group=self.group)
                out[...] = wide
        return out

    def bcast(self, x, root: int = 0):
        """Broadcast ``x`` from ``root`` in place; returns ``x``."""
        check_dtype(x, reduce=False)
        nbytes = int(x.size) * np.dtype(x.dtype).itemsize
        with self._timed("bcast", self._chain_bcast_bytes(nbytes, root)):
            dist.broadcast(_moved(x), src=root, group=self.group)
        return x

    def allgather_counts(self, count: int) -> np.ndarray:
        mine = torch.tensor([count], dtype=torch.int64, device=self._counts_device)
        parts = [torch.empty(1, dtype=torch.int64, device=self._counts_device) for _ in range(self.size)]
        with self._timed("allgather_counts", self._ring_allgather_bytes([8] * self.size)):
            dist.all_gather(parts, mine, group=self.group)
        return torch.cat(parts).cpu().numpy()

    def allgatherv(self, x, counts: np.ndarray | None = None):
        """Concatenate every rank's 1-D ``x`` (any length); returns ``(recv, counts)``.

        ``torch.distributed`` gathers equal sizes only: each block is padded
        to the largest count and the padding dropped (bytes are counted as the
        variable-size gather of the MPI path would send them).
        """
        check_dtype(x, reduce=False)
        if counts is None:
            counts = self.allgather_counts(int(x.size))
        elif int(counts[self.rank]) != int(x.size):
            raise ValueError(f"allgatherv: this rank passes {x.size} elements but counts[{self.rank}] "
                             f"is {int(counts[self.rank])}")
        xp = backend.array_module(x)
        width = int(max(counts)) if len(counts) else 0
        padded = xp.zeros(width, dtype=x.dtype)
        padded[:x.size] = x
        blocks = [xp.empty(width, dtype=x.dtype) for _ in range(self.size)]
        itemsize = np.dtype(x.dtype).itemsize
        with self._timed("allgatherv", self._ring_allgather_bytes(np.asarray(counts) * itemsize)):
            dist.all_gather([_moved(b) for b in blocks], _moved(padded), group=self.group)
        recv = xp.concatenate([b[:int(c)] for b, c in zip(blocks, counts)]) if self.size else padded[:0]
        return recv, counts

    def alltoallv(self, x, sendcounts, recvcounts=None):
        """Send ``x[displs[r]:displs[r]+sendcounts[r]]`` to rank ``r`` (``all_to_all_single`` with split
        sizes); returns ``(recv, recvcounts)``.  Counts are exchanged first unless the caller knows them
        (``recvcounts``: what each rank sends this one).  Bytes as the MPI path counts them."""
        check_dtype(x, reduce=False)
        sendcounts = np.asarray(sendcounts, dtype=np.int64)
        if sendcounts.shape != (self.size,) or int(sendcounts.sum()) != int(x.size):
            raise ValueError(f"alltoallv: sendcounts must have {self.size} entries summing to {x.size}, "
                             f"got {sendcounts.tolist()}")
        if recvcounts is not None:
            recvcounts = np.asarray(recvcounts, dtype=np.int64)
        else:
            mine = torch.from_numpy(sendcounts.copy()).to(self._counts_device)
            theirs = torch.empty(self.size, dtype=torch.int64, device=self._counts_device)
            with self._timed("alltoall_counts", 8 * (self.size - 1)):
                dist.all_to_all_single(theirs, mine, group=self.group)
            recvcounts = theirs.cpu().numpy()
        recv = backend.array_module(x).empty(int(recvcounts.sum()), dtype=x.dtype)
        itemsize = np.dtype(x.dtype).itemsize
        s, r = _moved(x), _moved(recv)
        per = itemsize // s.element_size()  # moved elements per value (its bytes: the itemsize)
        sent = (int(sendcounts.sum()) - int(sendcounts[self.rank])) * itemsize
        with self._timed("alltoallv", sent):
            dist.all_to_all_single(r, s, output_split_sizes=[int(c) * per for c in recvcounts],
                                   input_split_sizes=[int(c) * per for c in sendcounts], group=self.group)
        return recv, recvcounts

    # ------------------------------------------------------- point to point
    def send(self, x, dest: int, tag: int = 0) -> None:
        check_dtype(x, reduce=False)
        with self._timed("send", int(x.size) * np.dtype(x.dtype).itemsize):
            dist.send(_moved(x), dst=dest, group=self.group, tag=tag)

    def recv(self, x, source: int | None = None, tag: int | None = None) -> tuple[int, int, int]:
        """Receive exactly ``x.size`` elements into ``x``; returns ``(source, tag, elements)``."""
        check_dtype(x, reduce=False)
        with self._timed("recv", 0):
            src = dist.recv(_moved(x), src=source, group=self.group, tag=0 if tag is None else tag)
        return int(src), int(tag or 0), int(x.size)

    def sendrecv(self, x, peer: int, *, tag: int = 0):
        """Exchange 1-D arrays of any lengths with ``peer`` (counts first); returns the peer's array."""
        check_dtype(x, reduce=False)
        mine = torch.tensor([x.size], dtype=torch.int64, device=self._counts_device)
        theirs = torch.empty(1, dtype=torch.int64, device=self._counts_device)
        with self._timed("sendrecv_counts", 8):
            self._exchange(mine, theirs, peer, tag)
        recv = backend.array_module(x).empty(int(theirs[0].item()), dtype=x.dtype)
        with self._timed("sendrecv", int(x.size) * np.dtype(x.dtype).itemsize):
            self._exchange(_moved(x), _moved(recv), peer, tag + 1)
        return recv

    def _exchange(self, send: torch.Tensor, recv: torch.Tensor, peer: int, tag: int) -> None:
        ops = [dist.P2POp(dist.isend, send, peer, self.group, tag), dist.P2POp(dist.irecv, recv, peer, self.group, tag)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()

    # ----------------------------------------------------- control plane
    def allgather_obj(self, obj: Any) -> list:
        out: list = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def bcast_obj(self, obj: Any, root: int = 0) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=root, group=self.group)
        return box[0]

    def close(self) -> None:
        """End a job's use of the process group: wait for every rank, then destroy it (a gloo group left
        to the interpreter's exit can abort a process in its teardown)."""
        self.barrier()
        if self.group is None:
            dist.destroy_process_group()

    def barrier(self) -> None:
        dist.barrier(group=self.group)


#: the bucket dtypes the hook takes: float32 as it is, the 16-bit ones widened to float32 for the scheme
BUCKET_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class HookState:
    """What :func:`comm_hook`'s hook keeps between calls: one scheme per DDP bucket, and with ``overlap``
    the exchange thread and its process group.

    ``overlap=True`` (the default): the hook hands each bucket to one thread and returns a future at once,
    so backward goes on while buckets are exchanged; DDP waits for the futures at the end of backward.  The
    thread takes buckets first in, first out (DDP calls the hook in bucket order on every rank, so every rank
    issues the same collectives in the same order) and talks over a process group of its own, a copy of
    ``group`` made with ``torch.distributed.new_group`` (at construction when the default group exists,
    else at the first bucket: every rank at the same point), so that a collective the script or DDP makes
    meanwhile on another group cannot interleave with a bucket's.  An exception in the thread fails that
    bucket's future (``backward()`` raises it) and every later bucket's: the ranks' exchanges are no longer
    known to be in step.  ``overlap=False``: the exchange runs inside the hook, on ``group`` itself, and the
    future is returned completed (backward waits for each bucket).
    """

    def __init__(self, scheme: str, density: float, *, memory: bool = True, seed: int = 0, group: Any = None,
                 overlap: bool = True, **options: Any):
        from ..registry import SCHEMES, scheme_class, validate_density

        cls = scheme_class(scheme)  # an unknown name fails here, before training starts
        if getattr(cls, "runtime", None) != "collective" or getattr(cls, "local_update", False):
            ours = sorted(n for n in SCHEMES if getattr(SCHEMES[n], "runtime", None) == "collective"
                          and not getattr(SCHEMES[n], "local_update", False))
            why = (cls.local_refusal if getattr(cls, "local_update", False)
                   else "is not a data-parallel (collective) scheme")
            raise ValueError(f"scheme {scheme!r} {why}; a DDP hook can run {', '.join(ours)}")
        # a bad density or option (a wire_dtype the scheme does not take) is one line here, not at the first bucket
        validate_density(density)
        cls.validate_options(dict(options))
        if not isinstance(overlap, bool):
            raise ValueError(f"overlap is {overlap!r}; allowed: True or False")
        self.scheme, self.density, self.memory, self.seed = scheme, float(density), bool(memory), int(seed)
        self.options = dict(options)
        self.group = group
        self.overlap = overlap
        self._comm: TorchDistCommunicator | None = None
        self._own_group: Any = None
        self._thread: Any = None  # the exchange thread (a one-worker executor: first in, first out)
        self.failure: BaseException | None = None  # the first exception of the exchange thread
        self.schemes: dict[int, Any] = {}
        self._wide: dict[int, torch.Tensor] = {}  # per 16-bit bucket: its float32 copy, reused
        self.steps = 0
        if overlap and dist.is_available() and dist.is_initialized():
            self._open_group()

    def _open_group(self) -> None:
        """The exchange thread's process group: a copy of ``group`` (every rank of the default group calls
        ``new_group`` here, at the same point)."""
        if self._own_group is None:
            ranks = None if self.group is None else dist.get_process_group_ranks(self.group)
            self._own_group = dist.new_group(ranks=ranks)

    @property
    def comm(self) -> TorchDistCommunicator:
        if self._comm is None:
            if self.overlap:
                self._open_group()
            self._comm = TorchDistCommunicator(self._own_group if self.overlap else self.group)
        return self._comm

    def scheme_for(self, index: int, layout: FusionLayout):
        """The scheme of bucket ``index`` (a new one when the bucket's layout changed)."""
        from ..schemes import create

        sch = self.schemes.get(index)
        if sch is None or [(s.name, s.shape) for s in sch.layout.layers] != [(s.name, s.shape)
                                                                          for s in layout.layers]:
            sch = create(self.scheme, self.comm, layout, self.density, memory=self.memory,
                         seed=self.seed + 7919 * index, **self.options)
            self.schemes[index] = sch
        return sch

    @torch.no_grad()
    def exchange(self, index: int, layout: FusionLayout, buf: torch.Tensor, last: bool) -> None:
        """Bucket ``index``'s mean over ranks written into ``buf`` (its own dtype): a float32 bucket in place
        (the scheme's array views it through DLPack), a 16-bit one through its float32 copy, so that the
        scheme computes and keeps its error feedback in float32 and the mean is rounded once, on the way back."""
        if buf.is_sparse:  # an nn.Embedding(sparse=True) table: its touched rows' exact mean (mpisparse.torch.rows)
            from .rows import sparse_mean

            buf.copy_(sparse_mean(self.comm, buf))
        elif buf.dtype == torch.float32:
            sch = self.scheme_for(index, layout)
            vec = backend.as_array(buf.detach())
            sch.step(vec, out=vec)  # vec views the bucket: the mean is written into it, no output vector
        else:
            sch = self.scheme_for(index, layout)
            wide = self._wide.get(index)
            if wide is None or wide.numel() != buf.numel() or wide.device != buf.device:
                wide = self._wide[index] = torch.empty(buf.numel(), dtype=torch.float32, device=buf.device)
            wide.copy_(buf.detach().reshape(-1))  # widened with torch: NumPy takes no bfloat16 through DLPack
            vec = backend.as_array(wide)
            sch.step(vec, out=vec)
            buf.copy_(wide.view(buf.shape))
        if buf.is_cuda:  # the future completes when the mean is in the bucket, not when it is queued
            torch.cuda.current_stream(buf.device).synchronize()
        if last:
            self.steps += 1

    def submit(self, index: int, layout: FusionLayout, buf: torch.Tensor, last: bool,
               fut: torch.futures.Future) -> None:
        """Queue bucket ``index`` on the exchange thread, which completes ``fut`` with ``buf`` (or fails it)."""
        self._open_group()  # here, not on the thread: every rank at its first bucket, before any exchange
        if self._thread is None:
            from concurrent.futures import ThreadPoolExecutor

            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mpisparse-ddp-hook")
        self._thread.submit(self._run, index, layout, buf, last, fut)

    def _run(self, index: int, layout: FusionLayout, buf: torch.Tensor, last: bool,
             fut: torch.futures.Future) -> None:
        try:
            if self.failure is not None:
                raise RuntimeError(f"not started: an earlier bucket's exchange failed "
                                   f"({type(self.failure).__name__}: {self.failure}), the ranks may be out of step")
            self.exchange(index, layout, buf, last)
        except BaseException as exc:  # reaches the script through the future: backward() raises it
            if self.failure is None:
                self.failure = exc
            # DDP's reducer reads a failed Python future as a value it cannot cast ("Unable to cast [...] to
            # Tensor"): the message names the bucket and the exception; ``state.failure`` keeps the traceback
            fut.set_exception(RuntimeError(f"[mpisparse DDP hook: bucket {index}'s exchange failed: "
                                           f"{type(exc).__name__}: {exc}]"))
        else:
            fut.set_result(buf)

    def close(self) -> None:
        """Stop the exchange thread (after the buckets queued) and destroy its process group, once every rank
        has stopped using it (a barrier first: a gloo group torn down while a peer still talks on it can hang
        that peer, seen under Open MPI's launcher)."""
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
        if self._own_group is not None and dist.is_initialized():
            dist.barrier(group=self._own_group)
            dist.destroy_process_group(self._own_group)
        self._own_group = self._comm = None


def _bucket_layout(bucket) -> FusionLayout:
    return FusionLayout([(f"p{i}", tuple(p.shape)) for i, p in enumerate(bucket.parameters())])


def sparse_hook(state, bucket):  # unannotated: DDP compares annotations literally
    """The DDP communication hook: the bucket's gradients through the scheme, their mean over ranks back
    (in the bucket's dtype), exchanged on the hook state's thread (``overlap``) or here."""
    buf = bucket.buffer()
    layout = _bucket_layout(bucket)
    if layout.n != buf.numel():
        raise RuntimeError(f"DDP bucket {bucket.index()} holds {buf.numel()} values but its parameters have "
                           f"{layout.n}: a bucket with unused parameters is not supported (find_unused_parameters)")
    if buf.dtype not in BUCKET_DTYPES:
        raise TypeError(f"DDP bucket {bucket.index()} is {buf.dtype}; allowed: float32, bfloat16, float16 "
                        "(the 16-bit ones exchanged in float32)")
    fut: torch.futures.Future = torch.futures.Future()
    if state.overlap:
        state.submit(bucket.index(), layout, buf, bucket.is_last(), fut)
    else:
        state.exchange(bucket.index(), layout, buf, bucket.is_last())
        fut.set_result(buf)
    return fut


def comm_hook(scheme: str = "dense", density: float = 0.01, *, memory: bool = True, seed: int = 0,
              group: Any = None, overlap: bool = True, **scheme_options: Any) -> tuple[HookState, Any]:
    """``(state, hook)`` for ``DistributedDataParallel.register_comm_hook(state, hook)``.

    ``scheme`` is any data-parallel scheme (the registry's schemes of runtime ``collective``: ``topk``,
    ``cltk``, ``deft``, ``gtopk``, ``oktopk``, ``dgc``, ``powersgd``, ``randomk``, ``threshold``, ``dct``,
    ``dense``) with its ``density`` and options, ``wire_dtype="float16"`` or ``"bfloat16"`` included, as
    ``mpisparse train`` takes them; a bad name, density or option is a ValueError here.  A scheme that
    applies momentum itself (``dgc``) needs an optimizer without momentum.  Buckets may be float32,
    bfloat16 or float16 (a 16-bit model, or DDP's mixed precision): the scheme works in float32.
    ``overlap`` (default True): buckets exchanged on a thread of the hook state while backward goes on
    (:class:`HookState`); False: inside the hook, backward waiting for each.  ``state.close()`` stops the
    thread and destroys its process group.
    """
    return (HookState(scheme, density, memory=memory, seed=seed, group=group, overlap=overlap, **scheme_options),
            sparse_hook)


def init_process_group_from_mpi(comm, backend_name: str = "gloo", timeout: Any = None) -> None:
    """Start ``torch.distributed`` over the ranks of an MPI communicator ``comm`` (same ranks, same size):
    rank 0 picks a free TCP port and broadcasts it through MPI; the address is ``MASTER_ADDR`` where rank 0
    has it set, else 127.0.0.1 when every rank is on rank 0's host, else rank 0's host name."""
    import os
    import socket
    from datetime import timedelta

    host = socket.gethostname()
    hosts = comm.allgather_obj(host)
    where = None
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        addr = os.environ.get("MASTER_ADDR") or ("127.0.0.1" if all(h == host for h in hosts) else host)
        where = f"tcp://{addr}:{port}"
    where = comm.bcast_obj(where, 0)
    dist.init_process_group(backend_name, init_method=where, rank=comm.rank, world_size=comm.size,
                            timeout=timeout if timeout is not None else timedelta(minutes=10))
