"""torch DDP with a sparsified gradient exchange: mpisparse's schemes as a communication hook, no MPI.

    torchrun --nproc-per-node 2 examples/ddp_hook.py --scheme deft --density 0.01
    torchrun --nproc-per-node 2 examples/ddp_hook.py --scheme topk --dtype bfloat16

Trains the MLP on the bundled digits data set with DistributedDataParallel
over gloo (CPU) or NCCL (with --cuda), the gradients exchanged by the
chosen scheme, and prints the test accuracy on rank 0.  The buckets are
exchanged on the hook's thread while backward goes on (--sync: inside the
hook, for debugging); --dtype bfloat16 or float16 trains a 16-bit model
(the scheme works in float32 on each bucket, the mean comes back 16-bit).
"""

import argparse

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits

from mpisparse.torch.dist import comm_hook


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheme", default="topk")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--cuda", action="store_true")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    ap.add_argument("--sync", action="store_true", help="exchange each bucket inside the hook (no overlap)")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)

    dist.init_process_group("nccl" if args.cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if args.cuda else torch.device("cpu")
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=dtype)
    y = torch.tensor(y)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(y), generator=g)
    test, train = perm[:360], perm[360:]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(device, dtype)
    net = torch.nn.parallel.DistributedDataParallel(model)
    state, hook = comm_hook(args.scheme, density=args.density, overlap=not args.sync)
    net.register_comm_hook(state, hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    mine = train[rank::world]
    for epoch in range(args.epochs):
        order = mine[torch.randperm(len(mine), generator=torch.Generator().manual_seed(epoch))]
        for i in range(0, len(order) - 31, 32):
            idx = order[i:i + 32]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x[idx].to(device)).float(), y[idx].to(device)).backward()
            opt.step()
    with torch.no_grad():
        acc = (model(x[test].to(device)).argmax(1).cpu() == y[test]).float().mean().item()
    if rank == 0:
        print(f"{args.scheme} (density {args.density:g}, {args.dtype}) on {world} processes: "
              f"test accuracy {100 * acc:.2f}%")
    state.close()  # the exchange thread stopped, its process group destroyed
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
