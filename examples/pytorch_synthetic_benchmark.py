"""Horovod's PyTorch synthetic benchmark shape: images/s of a model on random data.

    mpiexec -n 2 python examples/pytorch_synthetic_benchmark.py
    mpiexec -n 2 python examples/pytorch_synthetic_benchmark.py --scheme deft --density 0.01

The only line that differs from a Horovod script is the import. The
default model is a small CNN (CPU-sized); --model takes any
torchvision-free name below.
"""

import argparse
import timeit

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import mpisparse.torch as hvd

MODELS = {
    "smallcnn": lambda: nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                                      nn.Flatten(), nn.Linear(32 * 16, 1000)),
    "mlp": lambda: nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 512), nn.ReLU(), nn.Linear(512, 1000)),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fp16-allreduce", action="store_true")
    ap.add_argument("--model", default="smallcnn", choices=sorted(MODELS))
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--num-warmup-batches", type=int, default=2)
    ap.add_argument("--num-batches-per-iter", type=int, default=5)
    ap.add_argument("--num-iters", type=int, default=3)
    ap.add_argument("--scheme", default="dense", help="gradient exchange: dense, deft, topk, ...")
    ap.add_argument("--density", type=float, default=1.0)
    ap.add_argument("--checksum", action="store_true", help="print a checksum of the final parameters")
    args = ap.parse_args()

    hvd.init()
    torch.manual_seed(hvd.rank())  # different start on every rank: broadcast_parameters makes them equal
    torch.set_num_threads(1)

    model = MODELS[args.model]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average,
                                         scheme=args.scheme, density=args.density)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, 1000, (args.batch_size,))

    def benchmark_step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()

    def log(text):
        if hvd.rank() == 0:
            print(text, flush=True)

    log(f"Model: {args.model}, batch size: {args.batch_size}, ranks: {hvd.size()}, scheme: {args.scheme}")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    img_secs = []
    for it in range(args.num_iters):
        t = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / t
        log(f"Iter #{it}: {img_sec:.1f} img/sec per rank")
        img_secs.append(img_sec)
    img_sec_mean, img_sec_conf = np.mean(img_secs), 1.96 * np.std(img_secs)
    log(f"Img/sec per rank: {img_sec_mean:.1f} +-{img_sec_conf:.1f}")
    log(f"Total img/sec on {hvd.size()} rank(s): {hvd.size() * img_sec_mean:.1f} +-{hvd.size() * img_sec_conf:.1f}")

    if args.checksum:
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
        print(f"rank {hvd.rank()} checksum {flat.sum().item():.12e} {flat.abs().sum().item():.12e}", flush=True)


if __name__ == "__main__":
    main()
