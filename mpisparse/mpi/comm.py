"""The communicator layer: the only module of mpisparse that calls mpi4py.

Every scheme exchanges data through a :class:`Communicator`, which

* counts the bytes each rank sends, per call (see *Byte model* below), and
  times each call, so schemes report ``bytes_sent_per_rank`` and phase
  times without counting anything themselves;
* offers Allreduce, Bcast, Allgatherv (counts exchanged first, empty
  contributions allowed), Alltoallv and point-to-point send/recv;
* refuses dtypes that MPI cannot reduce correctly (bfloat16 passes through
  mpi4py as raw bytes: Open MPI silently returns garbage for a sum; a sum
  of 16-bit values is :func:`mpisparse.mpi.wire.allreduce_sum`, a
  reduce-scatter through :meth:`Communicator.alltoallv` with float32 sums);
* synchronises the device stream before any MPI call on a device buffer and
  decides, once, whether device buffers go to MPI directly (CUDA-aware MPI,
  confirmed by a run-time probe: :func:`decide_cuda_aware_how`) or are
  staged through pinned host buffers that are reused across calls; receive
  buffers of a device input are device arrays; a non-blocking operation is
  never issued on a device buffer under Open MPI (it is staged instead);
  every staging copy is counted (:attr:`Communicator.staging`: device-to-host
  and host-to-device copies and bytes), so a run reports what went through
  host memory;
* finds the ranks of one host (:meth:`Communicator.split_shared`,
  :meth:`Communicator.local_rank`), which pick their GPU (:mod:`mpisparse.mpi.device`);
* in debug mode (``check=True``, the CLI's ``--check-collectives``) first
  compares every collective's counts and dtypes across ranks and raises
  :class:`CollectiveMismatch` on *every* rank, naming both sides, instead of
  one rank silently receiving wrong data.

Byte model
----------
MPI does not report what went on the wire, so the counts follow the
bandwidth-optimal algorithm of each collective, per rank: ring Allreduce
sends ``2 (W-1)/W`` of the buffer; ring Allgather(v) forwards every block
but the one it receives last, i.e. ``total - counts[(rank+1) % W]``; a
pipelined chain Bcast sends the buffer from every rank but the chain's last;
Alltoallv sends what is addressed to other ranks; a point-to-point send
(or the send half of a sendrecv) sends its buffer; exchanging counts costs
8 bytes per count sent.  With one rank nothing is sent.  The emulated cluster
(``bin/``) can check the model against a link's counters.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from .. import backend

# dtype kinds that MPI reductions handle correctly (float16 sums included).
_REDUCIBLE_KINDS = "fiub"
_COUNT_DTYPE = np.int64


class CollectiveMismatch(RuntimeError):
    """Ranks called the same collective with disagreeing counts or dtypes."""


class UnsupportedDtype(TypeError):
    """A buffer dtype that MPI cannot move or reduce correctly."""


@dataclass
class CallStats:
    calls: int = 0
    bytes: int = 0
    seconds: float = 0.0


def dtype_name(x: Any) -> str:
    return str(getattr(x, "dtype", type(x).__name__))


def check_dtype(x: Any, *, reduce: bool) -> None:
    """Raise :class:`UnsupportedDtype` for buffers MPI would mishandle."""
    name = dtype_name(x)
    if "bfloat16" in name:
        raise UnsupportedDtype(
            f"dtype {name} cannot go through MPI: it travels as raw bytes and a "
            "reduction returns wrong sums; convert to float32 or float16 first"
        )
    if reduce and np.dtype(x.dtype).kind not in _REDUCIBLE_KINDS:
        raise UnsupportedDtype(
            f"dtype {name} cannot be reduced by MPI; use a float or integer dtype"
        )


def mpix_query_cuda_support() -> bool | None:
    """The MPI library's ``MPIX_Query_cuda_support()`` (Open MPI, MPICH >= 4), or None if it has none."""
    from mpi4py import MPI

    query = getattr(MPI, "Query_cuda_support", None)
    try:
        if query is not None:
            return bool(query())
        import ctypes

        fn = ctypes.CDLL(MPI.__file__).MPIX_Query_cuda_support  # resolved through mpi4py's libmpi
    except Exception:  # an MPI without the extension
        return None
    fn.restype, fn.argtypes = ctypes.c_int, []
    return bool(fn())


def library_cuda_support_how(vendor_name: str | None = None, env=None, query=None) -> tuple[bool | None, str]:
    """The library's own answer to "CUDA-aware?" and where it came from.

    The vendor decides how to ask (:func:`mpisparse.mpi.vendor.library_cuda_support_for`): Intel MPI from
    ``I_MPI_OFFLOAD``/``I_MPI_OFFLOAD_MODE`` (so a job with ``I_MPI_OFFLOAD=1`` is CUDA-aware without
    ``--cuda-aware``; the run-time probe still confirms it), every other library from ``query``
    (``MPIX_Query_cuda_support``, :func:`mpix_query_cuda_support` unless given).  ``vendor_name`` and ``env``
    default to mpi4py's library and ``os.environ``.
    """
    from . import vendor

    name = vendor.mpi_vendor() if vendor_name is None else vendor_name
    return vendor.library_cuda_support_for(name, os.environ if env is None else env,
                                           query=query or mpix_query_cuda_support)


def library_cuda_support() -> bool | None:
    """The library's answer alone (:func:`library_cuda_support_how`): True, False or None (cannot tell)."""
    return library_cuda_support_how()[0]


def decide_cuda_aware_how(override: bool | None = None, mpi_comm=None, *, library=library_cuda_support_how,
                          have_gpu=None, probe=None) -> tuple[bool, str]:
    """``(cuda_aware, how it was decided)``, decided once per communicator.

    An explicit ``override`` wins (``--cuda-aware/--no-cuda-aware``), then the
    environment variable ``MPISPARSE_CUDA_AWARE`` (``0``/``1``).  Otherwise
    the MPI library is asked (:func:`library_cuda_support_how`: Intel MPI's
    ``I_MPI_OFFLOAD``, any other library's ``MPIX_Query_cuda_support``;
    ``library`` returns a bool/None or ``(answer, source)``): a library that
    says no, or cannot say, gets host staging (handing it a device pointer
    could crash).  A library that says yes is checked at run time when every
    rank of ``mpi_comm`` has CuPy and a GPU: :func:`mpisparse.mpi.device.probe_cuda_aware`
    sends device buffers through it and compares (collective on ``mpi_comm``;
    ``have_gpu`` and ``probe`` can be injected for tests).
    """
    if override is not None:
        return bool(override), "override"
    env = os.environ.get("MPISPARSE_CUDA_AWARE")
    if env is not None:
        return env.strip().lower() in ("1", "true", "yes", "on"), "MPISPARSE_CUDA_AWARE"
    lib, why = _answer_and_source(library())
    if not lib:
        return False, ("library: no" if lib is False else "library: cannot tell") + why
    if mpi_comm is None:
        return True, "library: yes" + why
    from . import device

    direct = Communicator(mpi_comm, cuda_aware=True)  # the probe's own stats, never the caller's
    mine = (have_gpu or device.gpu_count)() > 0
    if not direct.allreduce(np.array([int(mine)], np.int32), op="min")[0]:
        return True, f"library: yes{why} (not probed: a rank has no GPU)"
    ok = (probe or device.probe_cuda_aware)(direct)
    return ok, "probe: device buffers arrived intact" if ok else "probe: device buffers arrived wrong"


def _answer_and_source(got) -> tuple[bool | None, str]:
    """A library answer as ``(answer, " (source)")``: a bare bool/None (an injected test library) has no source;
    the plain ``MPIX_Query_cuda_support`` source is left unsaid (the historical wording)."""
    if isinstance(got, tuple):
        answer, source = got
        return answer, "" if "MPIX_Query_cuda_support" in source else f" ({source})"
    return got, ""


#: the collectives that wait at a barrier first under ``wait_timer`` (never point-to-point calls)
_COLLECTIVES = frozenset({"allreduce", "bcast", "allgather_counts", "allgatherv", "alltoall_counts", "alltoallv"})


class Communicator:
    """A counted, timed, checked view of an MPI communicator.

    Parameters
    ----------
    mpi_comm:
        An ``mpi4py.MPI.Comm``; ``COMM_WORLD`` when omitted.
    check:
        Verify counts and dtypes of every collective across ranks first.
    cuda_aware:
        Force (True/False) or leave to :func:`decide_cuda_aware_how` (None).
    host_only:
        The job keeps its arrays in host memory: a library that says it is
        CUDA-aware is believed without the device probe (no CUDA call).
    """

    def __init__(self, mpi_comm=None, *, check: bool = False, cuda_aware: bool | None = None,
                 host_only: bool = False):
        from mpi4py import MPI

        self._MPI = MPI
        self.comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        self.rank: int = self.comm.Get_rank()
        self.size: int = self.comm.Get_size()
        self.check = bool(check)
        self.cuda_aware, self.cuda_aware_how = decide_cuda_aware_how(cuda_aware, None if host_only else self.comm)
        self.stats: dict[str, CallStats] = {}
        # host staging buffers (pinned), one per role, grown as needed and reused across calls
        self._host_buffers: dict[tuple, np.ndarray] = {}
        self.staging_allocations = 0
        #: staging copies so far: ``d2h``/``h2d`` copies and ``d2h_bytes``/``h2d_bytes`` (0 when CUDA-aware)
        self.staging = {"d2h": 0, "h2d": 0, "d2h_bytes": 0, "h2d_bytes": 0}
        # Open MPI's non-blocking operations must never see a device buffer
        self.open_mpi = "Open MPI" in MPI.Get_library_version()
        self._local: tuple[int, int] | None = None
        #: ``bench step --separate-wait``: a :class:`mpisparse.results.timing.PhaseTimer`; every collective first
        #: waits for all ranks at a barrier, and that wait moves from the caller's phase to ``wait``, so
        #: the exchange phases hold the transfer alone (None: no barrier)
        self.wait_timer = None

    # ------------------------------------------------------------------ stats
    @property
    def bytes_sent(self) -> int:
        return sum(s.bytes for s in self.stats.values())

    def _record(self, op: str, nbytes: int, seconds: float) -> None:
        s = self.stats.setdefault(op, CallStats())
        s.calls += 1
        s.bytes += int(nbytes)
        s.seconds += seconds

    @contextmanager
    def _timed(self, op: str, nbytes: int) -> Iterator[None]:
        if self.wait_timer is not None and op in _COLLECTIVES:
            w0 = time.perf_counter()
            self.comm.Barrier()
            self.wait_timer.carve("wait", time.perf_counter() - w0)
        t0 = time.perf_counter()
        yield
        self._record(op, nbytes, time.perf_counter() - t0)

    # ----------------------------------------------------------- byte model
    def ring_allreduce_bytes(self, nbytes: int) -> int:
        return 2 * (self.size - 1) * nbytes // self.size

    def ring_allgather_bytes(self, block_bytes: Sequence[int]) -> int:
        if self.size == 1:
            return 0
        return int(sum(block_bytes)) - int(block_bytes[(self.rank + 1) % self.size])

    def chain_bcast_bytes(self, nbytes: int, root: int) -> int:
        return nbytes if (self.rank - root) % self.size < self.size - 1 else 0

    # ------------------------------------------------------ debug agreement
    def _agree(self, op: str, sig: tuple, describe) -> None:
        """In check mode, raise on every rank if ranks disagree on ``sig``."""
        if not self.check:
            return
        sigs = self.comm.allgather(sig)
        for r, other in enumerate(sigs):
            if other != sigs[0]:
                raise CollectiveMismatch(
                    f"{op}: rank 0 passed {describe(sigs[0])} but rank {r} passed "
                    f"{describe(other)}; every rank must pass the same"
                )

    # --------------------------------------------------------- device path
    @contextmanager
    def _mpi_buffer(self, x: Any, *, read: bool = True, write: bool = False) -> Iterator[Any]:
        """The buffer to give MPI for ``x``.

        Host arrays pass through.  Device arrays: the stream is synchronised,
        then the array goes to MPI directly when the MPI is CUDA-aware, or
        through a reused host buffer (copied in if ``read``, copied back if
        ``write``).  Device arrays follow CuPy's ``get(out=)``/``set()`` API.
        """
        if not backend.is_device_array(x):
            yield x
            return
        backend.synchronize(x)
        if self.cuda_aware:
            yield x
            return
        host = self._staging(x, (read, write))
        if read:
            x.get(out=host)
            self._count_staging("d2h", host.nbytes)
        yield host
        if write:
            x.set(host)  # its next use starts with a stream synchronisation, so reuse is safe
            self._count_staging("h2d", host.nbytes)

    def _count_staging(self, way: str, nbytes: int) -> None:
        self.staging[way] += 1
        self.staging[way + "_bytes"] += int(nbytes)

    @property
    def staging_copies(self) -> int:
        """Staging copies so far, both directions (0 for host arrays and with a CUDA-aware MPI)."""
        return self.staging["d2h"] + self.staging["h2d"]

    def _staging(self, x: Any, role: tuple) -> np.ndarray:
        """A host buffer shaped like ``x`` for ``role`` (read, write), reused across calls.

        One pinned byte buffer per role, grown geometrically when a call needs
        more (so varying Allgatherv counts do not allocate every step), viewed
        with ``x``'s shape and dtype.
        """
        dt = np.dtype(x.dtype)
        nbytes = int(np.prod(x.shape, dtype=np.int64)) * dt.itemsize
        buf = self._host_buffers.get(role)
        if buf is None or buf.size < nbytes:
            size = max(nbytes, 2 * buf.size if buf is not None else 0, 4096)
            buf = self._host_buffers[role] = _pinned_empty((size,), np.uint8)
            self.staging_allocations += 1
        return buf[:nbytes].view(dt).reshape(x.shape)

    def _recv_buffer(self, like: Any, count: int):
        """A receive buffer of ``count`` elements of ``like``'s dtype, on ``like``'s side (host or device)."""
        return backend.array_module(like).empty(int(count), dtype=like.dtype)

    # ------------------------------------------------------------ collectives
    def allreduce(self, x, out=None, *, op: str = "sum"):
        """Sum (or ``op``) of ``x`` over ranks, into ``out`` (in place if ``out is x``)."""
        check_dtype(x, reduce=True)
        mpi_op = {"sum": self._MPI.SUM, "max": self._MPI.MAX, "min": self._MPI.MIN}[op]
        self._agree("allreduce", (int(x.size), dtype_name(x), op),
                    lambda s: f"{s[0]} x {s[1]} ({s[2]})")
        if out is None:
            out = np.empty_like(x) if not backend.is_device_array(x) else x.copy()
        nbytes = int(x.size) * np.dtype(x.dtype).itemsize
        with self._timed("allreduce", self.ring_allreduce_bytes(nbytes)):
            if out is x:
                with self._mpi_buffer(x, write=True) as b:
                    self.comm.Allreduce(self._MPI.IN_PLACE, b, op=mpi_op)
            else:
                with self._mpi_buffer(x) as s, self._mpi_buffer(out, read=False, write=True) as r:
                    self.comm.Allreduce(s, r, op=mpi_op)
        return out

    def bcast(self, x, root: int = 0):
        """Broadcast ``x`` from ``root`` in place; returns ``x``."""
        check_dtype(x, reduce=False)
        self._agree("bcast", (int(x.size), dtype_name(x), int(root)),
                    lambda s: f"{s[0]} x {s[1]} from root {s[2]}")
        nbytes = int(x.size) * np.dtype(x.dtype).itemsize
        with self._timed("bcast", self.chain_bcast_bytes(nbytes, root)):
            with self._mpi_buffer(x, read=self.rank == root, write=self.rank != root) as b:
                self.comm.Bcast(b, root=root)
        return x

    def allgather_counts(self, count: int) -> np.ndarray:
        """Every rank's ``count`` (int64 Allgather), the first step of Allgatherv."""
        mine = np.array([count], dtype=_COUNT_DTYPE)
        counts = np.empty(self.size, dtype=_COUNT_DTYPE)
        with self._timed("allgather_counts", self.ring_allgather_bytes([8] * self.size)):
            self.comm.Allgather(mine, counts)
        return counts

    def allgatherv(self, x, counts: np.ndarray | None = None):
        """Concatenate every rank's 1-D ``x`` (any length, zero included).

        Returns ``(recv, counts)``.  Pass the ``counts`` of an earlier call to
        gather a second array of the same lengths without exchanging them
        again (e.g. values after indices).
        """
        check_dtype(x, reduce=False)
        if counts is None:
            counts = self.allgather_counts(int(x.size))
        elif int(counts[self.rank]) != int(x.size):
            raise ValueError(
                f"allgatherv: this rank passes {x.size} elements but counts[{self.rank}] "
                f"is {int(counts[self.rank])}"
            )
        self._agree("allgatherv", (dtype_name(x), tuple(int(c) for c in counts)),
                    lambda s: f"dtype {s[0]} with counts {list(s[1])}")
        itemsize = np.dtype(x.dtype).itemsize
        displs = np.zeros_like(counts)
        np.cumsum(counts[:-1], out=displs[1:])
        recv = self._recv_buffer(x, counts.sum())  # on the device for a device x
        with self._timed("allgatherv", self.ring_allgather_bytes(counts * itemsize)):
            with self._mpi_buffer(x) as s, self._mpi_buffer(recv, read=False, write=True) as r:
                self.comm.Allgatherv(s, [r, (counts, displs)])
        return recv, counts

    def alltoallv(self, x, sendcounts: Sequence[int], recvcounts: Sequence[int] | None = None):
        """Send ``x[displs[r]:displs[r]+sendcounts[r]]`` to rank ``r``.

        Returns ``(recv, recvcounts)``; counts are exchanged first unless the
        caller knows them (``recvcounts``: what each rank sends this one).
        """
        check_dtype(x, reduce=False)
        sendcounts = np.asarray(sendcounts, dtype=_COUNT_DTYPE)
        if sendcounts.shape != (self.size,) or int(sendcounts.sum()) != int(x.size):
            raise ValueError(
                f"alltoallv: sendcounts must have {self.size} entries summing to "
                f"{x.size}, got {sendcounts.tolist()}"
            )
        if recvcounts is not None:
            recvcounts = np.asarray(recvcounts, dtype=_COUNT_DTYPE)
        else:
            recvcounts = np.empty_like(sendcounts)
            with self._timed("alltoall_counts", 8 * (self.size - 1)):
                self.comm.Alltoall(sendcounts, recvcounts)
        self._agree("alltoallv", (dtype_name(x),), lambda s: f"dtype {s[0]}")
        sdispl = np.concatenate(([0], np.cumsum(sendcounts)[:-1]))
        rdispl = np.concatenate(([0], np.cumsum(recvcounts)[:-1]))
        recv = self._recv_buffer(x, recvcounts.sum())
        itemsize = np.dtype(x.dtype).itemsize
        sent = (int(sendcounts.sum()) - int(sendcounts[self.rank])) * itemsize
        with self._timed("alltoallv", sent):
            with self._mpi_buffer(x) as s, self._mpi_buffer(recv, read=False, write=True) as r:
                self.comm.Alltoallv([s, (sendcounts, sdispl)], [r, (recvcounts, rdispl)])
        return recv, recvcounts

    def send(self, x, dest: int, tag: int = 0) -> None:
        check_dtype(x, reduce=False)
        with self._timed("send", int(x.size) * np.dtype(x.dtype).itemsize):
            with self._mpi_buffer(x) as b:
                self.comm.Send(b, dest=dest, tag=tag)

    def isend(self, x, dest: int, tag: int = 0):
        """Start sending ``x`` to ``dest`` without waiting; returns the pending request.

        Counted like :meth:`send` (its buffer) when posted.  ``x`` must stay
        unchanged until :meth:`waitall` completed the request (a device
        buffer is copied to the host first, and the copy is kept).  A
        parameter server replies with it, so it never blocks on a worker.
        """
        check_dtype(x, reduce=False)
        buf = x
        if backend.is_device_array(x):
            backend.synchronize(x)
            # never a non-blocking operation on a device buffer under Open MPI: stage it
            buf = x if self.cuda_aware and not self.open_mpi else x.get()
            if buf is not x:
                self._count_staging("d2h", buf.nbytes)
        with self._timed("isend", int(x.size) * np.dtype(x.dtype).itemsize):
            req = self.comm.Isend(buf, dest=dest, tag=tag)
        return _Pending(req, buf)

    def waitall(self, pending: Sequence[Any]) -> None:
        """Complete requests returned by :meth:`isend`."""
        if pending:
            with self._timed("waitall", 0):
                self._MPI.Request.Waitall([p.request for p in pending])

    def recv(self, x, source: int | None = None, tag: int | None = None) -> tuple[int, int, int]:
        """Receive into ``x``; returns ``(source, tag, elements received)``."""
        check_dtype(x, reduce=False)
        MPI = self._MPI
        status = MPI.Status()
        with self._timed("recv", 0):
            with self._mpi_buffer(x, read=False, write=True) as b:
                self.comm.Recv(b, source=MPI.ANY_SOURCE if source is None else source,
                               tag=MPI.ANY_TAG if tag is None else tag, status=status)
        count = status.Get_count(MPI._typedict[np.dtype(x.dtype).char])
        return status.Get_source(), status.Get_tag(), count

    def probe(self, source: int | None = None, tag: int | None = None) -> tuple[int, int, int]:
        """Wait until a message (from ``source`` with ``tag``; any when None) can be received.

        Returns ``(source, tag, bytes)`` of that message without receiving it,
        so the receiver can size its buffer (messages of varying length) and a
        caller can time the waiting apart from the transfer.  Sends nothing.
        """
        MPI = self._MPI
        status = MPI.Status()
        with self._timed("probe", 0):
            self.comm.Probe(source=MPI.ANY_SOURCE if source is None else source,
                            tag=MPI.ANY_TAG if tag is None else tag, status=status)
        return status.Get_source(), status.Get_tag(), status.Get_count(MPI.BYTE)

    def iprobe(self, source: int | None = None, tag: int | None = None) -> tuple[int, int, int] | None:
        """:meth:`probe` without waiting: ``(source, tag, bytes)``, or None when no message is there."""
        MPI = self._MPI
        status = MPI.Status()
        with self._timed("iprobe", 0):
            found = self.comm.Iprobe(source=MPI.ANY_SOURCE if source is None else source,
                                     tag=MPI.ANY_TAG if tag is None else tag, status=status)
        if not found:
            return None
        return status.Get_source(), status.Get_tag(), status.Get_count(MPI.BYTE)

    def test_all(self, pending: Sequence[Any]) -> bool:
        """Whether every request returned by :meth:`isend` has completed (completes them if so)."""
        if not pending:
            return True
        with self._timed("testall", 0):
            return bool(self._MPI.Request.Testall([p.request for p in pending]))

    def sendrecv(self, x, peer: int, *, tag: int = 0):
        """Exchange 1-D arrays of any lengths with ``peer`` (counts first).

        Both sides call it with each other as ``peer``; returns the peer's
        array.  Used by pairwise patterns (recursive doubling).
        """
        check_dtype(x, reduce=False)
        mine = np.array([x.size], dtype=_COUNT_DTYPE)
        theirs = np.empty(1, dtype=_COUNT_DTYPE)
        with self._timed("sendrecv_counts", 8):
            self.comm.Sendrecv(mine, dest=peer, sendtag=tag, recvbuf=theirs, source=peer, recvtag=tag)
        recv = self._recv_buffer(x, theirs[0])
        with self._timed("sendrecv", int(x.size) * np.dtype(x.dtype).itemsize):
            with self._mpi_buffer(x) as s, self._mpi_buffer(recv, read=False, write=True) as r:
                self.comm.Sendrecv(s, dest=peer, sendtag=tag + 1, recvbuf=r, source=peer,
                                   recvtag=tag + 1)
        return recv

    # ----------------------------------------------------- control plane
    # Small Python objects (configuration, statistics).  Not part of any
    # scheme's pattern, so not counted in the payload bytes.
    def allgather_obj(self, obj: Any) -> list:
        return self.comm.allgather(obj)

    def bcast_obj(self, obj: Any, root: int = 0) -> Any:
        return self.comm.bcast(obj, root=root)

    def barrier(self) -> None:
        self.comm.Barrier()

    def split(self, color: int, key: int | None = None) -> "Communicator":
        sub = self.comm.Split(color, self.rank if key is None else key)
        return Communicator(sub, check=self.check, cuda_aware=self.cuda_aware)

    def split_shared(self) -> "Communicator":
        """The ranks that share this rank's memory (one host): ``MPI.COMM_TYPE_SHARED``, ordered by rank."""
        sub = self.comm.Split_type(self._MPI.COMM_TYPE_SHARED, key=self.rank)
        return Communicator(sub, check=self.check, cuda_aware=self.cuda_aware)

    def local_rank(self) -> tuple[int, int]:
        """``(rank among the ranks on this host, ranks on this host)``; collective on first call."""
        if self._local is None:
            local = self.split_shared()
            self._local = (local.rank, local.size)
            local.comm.Free()
        return self._local

    def processor_name(self) -> str:
        return self._MPI.Get_processor_name()

    def abort(self, code: int = 1) -> None:
        """End the whole job, after the launcher had time to forward this rank's error."""
        from .launch import abort_job

        abort_job(self.comm, code)


@dataclass
class _Pending:
    """A started non-blocking send and the buffer it reads (kept alive until completed)."""

    request: Any
    buffer: Any


def _pinned_empty(shape, dtype) -> np.ndarray:
    """A host staging buffer, page-locked when CuPy is available."""
    try:
        import cupy

        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        mem = cupy.cuda.alloc_pinned_memory(nbytes)
        return np.frombuffer(mem, dtype=dtype, count=int(np.prod(shape))).reshape(shape)
    except Exception:  # no CuPy, or CuPy without a driver/device
        return np.empty(shape, dtype=dtype)
