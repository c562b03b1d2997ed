"""The data-parallel schemes over MPI or over torch.distributed (gloo): the same aggregates.

``python check_torch_dist.py mpi OUT.npz`` runs under ``mpiexec``;
``python check_torch_dist.py gloo OUT.npz`` runs as one of the processes a
test starts with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``
set.  Each rank steps every scheme on the same synthetic gradients and
rank 0 writes every step's aggregate (``oktopk``, whose exchange is an
Alltoallv, and ``dense``/``topk`` with float16 and bfloat16 on the wire
included); ``ddp`` additionally trains a small model with
``DistributedDataParallel`` and the hook and writes its parameters from
every rank.
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mpisparse.backend.fusion import FusionLayout  # noqa: E402
from mpisparse.bench.gradgen import SyntheticGradients  # noqa: E402
from mpisparse.schemes import create  # noqa: E402

SCHEMES = ["dense", "topk", "randomk", "threshold", "cltk", "deft", "dct", "gtopk", "dgc", "oktopk"]
#: the 16-bit wire (uint16 patterns, which gloo does not move as such; dense's sum is an Alltoallv reduce-scatter)
WIRE_CASES = [(f"{name}/{wire}", name, {"wire_dtype": wire}) for name in ("dense", "topk")
              for wire in ("float16", "bfloat16")]
CASES = [(name, name, {}) for name in SCHEMES] + WIRE_CASES
LAYERS = [("a.weight", (50, 20)), ("a.bias", (20,)), ("b.weight", (300,)), ("c.weight", (7, 7)), ("d", (3,))]
STEPS = 4


def aggregates(comm) -> dict:
    layout = FusionLayout(LAYERS)
    out = {}
    for key, name, options in CASES:
        sch = create(name, comm, layout, 0.05, seed=3, **options)
        gen = SyntheticGradients(layout, comm.rank, seed=11)
        grad = layout.empty()
        for t in range(STEPS):
            gen.fill(grad, t)
            out[f"{key}/{t}"] = np.array(sch.step(grad), copy=True)
            out[f"{key}/bytes/{t}"] = np.array([comm.bytes_sent])
            if name == "dense" and options:  # every rank's gradient: the 16-bit sum against NumPy's
                out[f"{key}/grads/{t}"] = np.stack(comm.allgather_obj(np.array(grad, copy=True)))
    return out


def ddp(out: dict) -> None:
    import torch
    import torch.distributed as dist

    from mpisparse.torch.dist import comm_hook

    rank = dist.get_rank()
    for key in ("dense", "topk", "deft", "oktopk", "dense/float16", "topk/bfloat16", "builtin"):
        scheme, _, wire = key.partition("/")
        torch.manual_seed(0)
        # 1.1 MB of parameters: more than DDP's first bucket (1 MiB), so the hook sees several buckets
        model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4096), torch.nn.ReLU(),
                                    torch.nn.Linear(4096, 3))
        net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
        if scheme != "builtin":
            state, hook = comm_hook(scheme, density=0.2, seed=1, **({"wire_dtype": wire} if wire else {}))
            net.register_comm_hook(state, hook)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(100 + rank)
        for _ in range(5):
            x, y = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        vec = torch.cat([p.detach().ravel() for p in model.parameters()])
        everyone = [torch.empty_like(vec) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, vec)
        out[f"ddp/{key}"] = torch.stack(everyone).numpy()
        if scheme != "builtin":
            out[f"ddp/{key}/buckets"] = np.array([len(state.schemes)])


def main() -> None:
    transport, path = sys.argv[1], sys.argv[2]
    if transport == "mpi":
        from mpisparse.mpi.comm import Communicator

        comm = Communicator()
    else:
        import torch.distributed as dist

        from mpisparse.torch.dist import TorchDistCommunicator

        dist.init_process_group("gloo")
        comm = TorchDistCommunicator()
    out = aggregates(comm)
    if transport == "gloo":
        from check_ddp_hook import hook_cases

        ddp(out)
        hook_cases(out)
    if comm.rank == 0:
        np.savez(path, **out)
    comm.barrier()
    print(f"{transport} OK on {comm.size} ranks")


if __name__ == "__main__":
    main()
