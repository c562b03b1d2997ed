"""A host job touches no GPU: ``open_comm`` without ``gpu`` makes no CUDA call; with it, it selects the GPU.

On a GPU node a CUDA context costs each rank host memory (268 MiB on an
H100 host, docs/performance.md "Memory"), so a ``--device cpu`` job must not
create one.  Here the device module's CUDA entry points are replaced by
recorders that fail.
"""

from mpisparse.mpi import device
from mpisparse.cli.session import open_comm

calls = []


def no_cuda(*args, **kwargs):
    calls.append(args)
    raise RuntimeError("CUDA touched")


device.gpu_count = device.assign_device = no_cuda

comm = open_comm(None)  # a host job: bench step / train with --device cpu
assert calls == [], calls
assert device.current_assignment() is None
comm.barrier()
try:
    open_comm(None, gpu=True)  # a device job selects each rank's GPU first
except RuntimeError as e:
    assert str(e) == "CUDA touched" and len(calls) == 1, (e, calls)
else:
    raise AssertionError("open_comm(gpu=True) did not select a GPU")
if comm.rank == 0:
    print(f"host job OK on {comm.size} ranks")
