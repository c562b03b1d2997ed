"""GPUs: which device each rank uses, and whether the MPI moves device buffers intact.

Device per rank
---------------
The ranks that share a host are found with a shared-memory split of the
communicator (``MPI.COMM_TYPE_SHARED``, :meth:`mpisparse.mpi.comm.Communicator.split_shared`);
a rank's position among them is its *local rank*.  :func:`pick_device`:

1. no device visible: ``None`` (the rank runs on the CPU);
2. the ranks of a host see *different* ``CUDA_VISIBLE_DEVICES`` (the
   launcher bound GPUs per task, e.g. SLURM's ``--gpus-per-task=1`` or
   ``--gpu-bind``): device 0, the first of this rank's own set;
3. otherwise the ranks share the host's GPUs round-robin:
   ``device = local_rank % n_devices``.

:func:`assign_device` applies it (CuPy's current device, and torch's when
torch is already imported); ``mpisparse info`` lists the mapping.

CUDA-aware probe
----------------
A library that claims CUDA support (``MPIX_Query_cuda_support``) can still
move device buffers wrongly at run time (a transport built without CUDA,
GPU support switched off by an environment variable).
:func:`probe_cuda_aware` checks the claim once per job: every rank hands
device buffers straight to MPI in an Allreduce, a Bcast and an Allgatherv
(into a device receive buffer), copies the results to the host and compares
them with the exact expected integers; the ranks then agree (a host
Allreduce of the verdicts, minimum), so either all ranks use device
buffers directly or all stage through pinned host memory.  The array
operations come from an ``ops`` object (CuPy by default), so the logic runs
on a CPU-only machine with a fake device array.  Only a library that says
yes is probed (see :func:`mpisparse.mpi.comm.decide_cuda_aware_how`): a device
pointer given to an MPI without CUDA support can crash the process.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["gpu_count", "gpu_names", "pick_device", "DeviceAssignment", "assign_device", "current_assignment",
           "probe_cuda_aware", "CupyOps", "cuda_unusable_reason", "check_device_usable", "array_module_for",
           "torch_device", "torchrun_device", "assign_torchrun_device"]

_assignment: "DeviceAssignment | None" = None


def gpu_count() -> int:
    """CUDA devices this process sees through CuPy (0 without CuPy, driver or device)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def gpu_names() -> list[str]:
    """Names of the CUDA devices this process sees (empty without CuPy or a GPU)."""
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
        return [_name(cupy.cuda.runtime.getDeviceProperties(i)["name"]) for i in range(n)]
    except Exception:
        return []


def gpu_name(dev: int | None) -> str:
    """The name of CUDA device ``dev`` (:func:`gpu_names`), "none" for None or a device this process does not see."""
    names = gpu_names() if dev is not None else []
    return names[dev] if dev is not None and dev < len(names) else "none"


def _name(raw) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def pick_device(local_rank: int, n_devices: int, local_visible: Sequence[str | None]) -> int | None:
    """The device index (among this rank's visible ones) for ``local_rank``; None without a device.

    ``local_visible``: ``CUDA_VISIBLE_DEVICES`` (or None) of every rank on
    this host, in local-rank order.  Steps 1-3 of the module docstring.
    """
    if local_rank < 0:
        raise ValueError(f"local_rank is {local_rank}; it must be >= 0")
    if n_devices < 0:
        raise ValueError(f"n_devices is {n_devices}; it must be >= 0")
    if n_devices == 0:  # 1.
        return None
    if len(set(local_visible)) > 1:  # 2. bound per task by the launcher
        return 0
    return local_rank % n_devices  # 3.


def torchrun_device(local_rank: int, local_world_size: int, n_devices: int) -> int:
    """The GPU of a ``torchrun`` worker for ``--device cuda`` (NCCL), or a one-line ``ValueError``.

    torchrun starts every worker of a host with the same environment, so
    they all see the same ``n_devices`` GPUs; NCCL needs a GPU of its own per
    rank (two ranks on one GPU fail in its set-up), so more local workers
    than GPUs are refused here, before NCCL starts.  An MPI job
    (``mpisparse train -n N --device cuda``) can share a GPU between ranks.
    """
    if n_devices < 1:
        raise ValueError("--device cuda under torchrun: no CUDA GPU is visible to this process")
    if local_world_size > n_devices:
        raise ValueError(f"--device cuda under torchrun: {local_world_size} processes on this host but "
                         f"{n_devices} GPU{'s' if n_devices > 1 else ''}; NCCL needs one GPU per process: "
                         f"--nproc-per-node at most {n_devices}, or an MPI job (mpisparse train -n "
                         f"{local_world_size} --device cuda), whose ranks may share a GPU")
    return local_rank


@dataclass
class DeviceAssignment:
    rank: int
    host: str
    local_rank: int
    local_size: int
    device: int | None
    device_name: str
    visible: str | None
    n_devices: int


def _use(device: int) -> None:
    import cupy

    cupy.cuda.Device(device).use()
    torch = sys.modules.get("torch")  # only when the program already uses torch
    if torch is not None:
        try:
            if torch.cuda.is_available():
                torch.cuda.set_device(device)
        except Exception:
            pass


def assign_device(comm, *, use: bool = True) -> DeviceAssignment:
    """Pick (and with ``use``, select) this rank's GPU; collective over ``comm``."""
    global _assignment
    local = comm.split_shared()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    everyone = local.allgather_obj(visible)
    n = gpu_count()
    dev = pick_device(local.rank, n, everyone)
    a = DeviceAssignment(rank=comm.rank, host=comm.processor_name(), local_rank=local.rank,
                         local_size=local.size, device=dev, device_name=gpu_name(dev),
                         visible=visible, n_devices=n)
    local.comm.Free()
    if use and dev is not None:
        _use(dev)
    _assignment = a
    return a


def assign_torchrun_device(env: "dict[str, str] | None" = None) -> DeviceAssignment:
    """Select this ``torchrun`` worker's GPU (:func:`torchrun_device`, from torchrun's ``RANK``,
    ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``) before NCCL starts; recorded as :func:`assign_device`'s is,
    so :func:`torch_device` finds it (a torch.distributed job has no MPI node communicator to split)."""
    global _assignment
    env = os.environ if env is None else env
    local = int(env.get("LOCAL_RANK", "0"))
    local_size = int(env.get("LOCAL_WORLD_SIZE", local + 1))
    n = gpu_count()
    dev = torchrun_device(local, local_size, n)
    a = DeviceAssignment(rank=int(env.get("RANK", "0")), host=platform.node(), local_rank=local,
                         local_size=local_size, device=dev, device_name=gpu_name(dev),
                         visible=env.get("CUDA_VISIBLE_DEVICES"), n_devices=n)
    _use(dev)
    _assignment = a
    return a


def current_assignment() -> DeviceAssignment | None:
    """The last :func:`assign_device` result of this process (None before)."""
    return _assignment


class CupyOps:
    """The device-array operations of :func:`probe_cuda_aware`, on CuPy."""

    def to_device(self, host: np.ndarray):
        import cupy

        return cupy.asarray(host)

    def to_host(self, x) -> np.ndarray:
        import cupy

        return cupy.asnumpy(x) if isinstance(x, cupy.ndarray) else np.asarray(x)


def probe_cuda_aware(comm, *, ops=None, n: int = 4099) -> bool:
    """Whether device buffers handed to MPI arrive intact on every rank (collective).

    ``comm`` is a :class:`mpisparse.mpi.comm.Communicator` that hands device
    buffers to MPI directly (``cuda_aware=True``).  Steps:

    1. Allreduce (sum) of ``x_i = rank + 1 + i`` (int32, ``n`` elements,
       odd so no transport rounds it to a nicer size): expect
       ``W (W + 1) / 2 + W i``;
    2. Bcast from rank 0 of ``3 i + 7`` into zeros elsewhere;
    3. Allgatherv of ``rank + 1`` copies of ``rank`` (a device receive
       buffer for CuPy arrays);
    4. every rank compares on the host, and the verdicts are combined with a
       host Allreduce (minimum): True only if every rank saw exact results.

    The device buffers are made before the first collective and the ranks
    agree that all of them could (so a rank that fails there cannot leave
    the others waiting in a collective); an exception later counts as a
    wrong result on that rank.
    """
    if not comm.cuda_aware:
        raise ValueError("probe_cuda_aware needs a communicator that hands device buffers to MPI "
                         "(cuda_aware=True)")
    ops = CupyOps() if ops is None else ops
    W, rank = comm.size, comm.rank
    i = np.arange(n, dtype=np.int32)
    try:
        x = ops.to_device(i + np.int32(rank + 1))
        b = ops.to_device(3 * i + 7 if rank == 0 else np.zeros(n, np.int32))
        g = ops.to_device(np.full(rank + 1, rank, np.int32))
        ready = True
    except Exception:
        ready = False
    if not comm.allreduce(np.array([int(ready)], np.int32), op="min")[0]:
        return False
    ok = True
    try:
        s = comm.allreduce(x)  # 1.
        ok &= bool(np.array_equal(ops.to_host(s), np.int32(W * (W + 1) // 2) + np.int32(W) * i))
        comm.bcast(b, root=0)  # 2.
        ok &= bool(np.array_equal(ops.to_host(b), 3 * i + 7))
        got, counts = comm.allgatherv(g)  # 3.
        expect = np.concatenate([np.full(r + 1, r, np.int32) for r in range(W)])
        ok &= bool(np.array_equal(ops.to_host(got), expect)) and counts.tolist() == list(range(1, W + 1))
    except Exception:
        ok = False
    verdict = comm.allreduce(np.array([int(ok)], np.int32), op="min")  # 4.
    return bool(verdict[0])


# --------------------------------------------------------------------------- where a step runs
def cuda_unusable_reason(*, need_torch: bool) -> str | None:
    """Why ``--device cuda`` cannot run in this process (None when it can).

    It needs CuPy seeing a CUDA device, and for ``train`` also a CUDA build
    of torch that sees one.  Asked before MPI starts, so the refusal is one
    usage line.
    """
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "CuPy is not installed (pip install cupy-cuda12x)"
    if gpu_count() < 1:
        return "CuPy sees no CUDA device"
    if need_torch:
        import torch

        if not torch.cuda.is_available():
            return f"torch {torch.__version__} has no usable CUDA device (a CPU-only build, or no driver)"
    return None


def check_device_usable(device: str, *, need_torch: bool) -> None:
    """ValueError (one line) when ``--device`` names a device this process cannot use."""
    if device == "cpu":
        return
    why = cuda_unusable_reason(need_torch=need_torch)
    if why is not None:
        raise ValueError(f"--device {device} is not usable here: {why}; use --device cpu")


def check_amp_usable(device: str, amp: str) -> None:
    """ValueError (one line) when ``--amp`` cannot run on ``device`` here: autocast must produce the 16-bit
    dtype (tried on a small matmul: a build whose autocast lacks it falls back to float32 silently)."""
    if amp == "none":
        return
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[amp]
    if device == "cuda" and amp == "bf16" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"--amp bf16 is not usable on this GPU ({torch.cuda.get_device_name()}: no bfloat16); "
                         "allowed here: --amp fp16 or none")
    try:
        x = torch.ones(2, 2, device=device)
        with torch.autocast(device, dtype=dtype):
            got = (x @ x).dtype
    except (RuntimeError, ValueError) as e:
        got = str(e).splitlines()[0] if str(e) else type(e).__name__
    if got != dtype:
        other = [m for m in ("bf16", "fp16") if m != amp]
        raise ValueError(f"--amp {amp} is not usable on --device {device} with this torch ({torch.__version__}: "
                         f"autocast gives {got}); allowed: --amp {other[0]} or none")


def array_module_for(device: str, comm=None):
    """The array module of a run on ``device``: NumPy for ``cpu``, CuPy for ``cuda``.

    ``cuda``: this rank's GPU is made current (:func:`assign_device`,
    collective over ``comm``, when it was not assigned yet).
    """
    if device == "cpu":
        return np
    import cupy

    a = current_assignment()
    if a is None and comm is not None:
        a = assign_device(comm)
    if a is not None and a.device is not None:
        _use(a.device)
    return cupy


def synchronizer(xp):
    """What a :class:`~mpisparse.results.timing.PhaseTimer` calls at each boundary for work on array module ``xp``:
    None on the host (NumPy runs synchronously); for CuPy, the current stream's ``synchronize``, so a phase
    times its kernels and not only their launches (the one place that decides it)."""
    if getattr(xp, "__name__", "") != "cupy":
        return None
    import cupy

    return lambda: cupy.cuda.get_current_stream().synchronize()


def torch_synchronizer(dev):
    """:func:`synchronizer` for a torch device: None on the CPU; on a CUDA device, ``torch.cuda.synchronize``
    of it (torch's and CuPy's streams on it alike), so a training phase times its kernels."""
    if getattr(dev, "type", "cpu") != "cuda":
        return None
    import torch

    return lambda: torch.cuda.synchronize(dev)


def torch_device(device: str, comm=None):
    """The torch device of this rank for a run on ``device``.

    ``cuda``: this rank's GPU as :func:`assign_device` picked it (by local
    rank; assigned here, collectively over ``comm``, when it was not yet).
    """
    import torch

    if device == "cpu":
        return torch.device("cpu")
    a = current_assignment()
    if a is None and comm is not None:
        a = assign_device(comm)
    if a is None or a.device is None:
        raise RuntimeError("--device cuda: this rank has no CUDA device")
    _use(a.device)
    return torch.device("cuda", a.device)
