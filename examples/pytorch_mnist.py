"""Horovod's PyTorch MNIST example shape, on the 8x8 digits bundled with scikit-learn (no download).

    mpiexec -n 2 python examples/pytorch_mnist.py --epochs 5
    mpiexec -n 2 python examples/pytorch_mnist.py --scheme deft --density 0.05

The only line that differs from a Horovod script is the import.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.data
from sklearn.datasets import load_digits
from torch.utils.data.distributed import DistributedSampler

import mpisparse.torch as hvd


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(32 * 2 * 2, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), dim=1)


def datasets():
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32).view(-1, 1, 8, 8)
    y = torch.tensor(y)
    cut = int(0.8 * len(x))
    return torch.utils.data.TensorDataset(x[:cut], y[:cut]), torch.utils.data.TensorDataset(x[cut:], y[cut:])


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(value), name=name).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--fp16-allreduce", action="store_true")
    ap.add_argument("--use-adasum", action="store_true", help="not available: rejected")
    ap.add_argument("--scheme", default="dense", help="gradient exchange: dense, deft, topk, ...")
    ap.add_argument("--density", type=float, default=1.0)
    ap.add_argument("--checksum", action="store_true", help="print a checksum of the final parameters")
    args = ap.parse_args()
    if args.use_adasum:
        raise SystemExit("--use-adasum: Adasum is not available; allowed: Average or Sum")

    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    train_set, test_set = datasets()
    train_sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_sampler = DistributedSampler(test_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=args.batch_size, sampler=test_sampler)

    model = Net()
    lr_scaler = hvd.size()  # as in Horovod: the learning rate grows with the number of workers
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average,
                                         scheme=args.scheme, density=args.density)

    for epoch in range(1, args.epochs + 1):
        model.train()
        train_sampler.set_epoch(epoch)
        for data, target in train_loader:
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()

        model.eval()
        test_loss, correct = 0.0, 0.0
        with torch.no_grad():
            for data, target in test_loader:
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                correct += output.argmax(dim=1).eq(target).sum().item()
        test_loss = metric_average(test_loss / len(test_sampler), "avg_loss")
        test_accuracy = metric_average(correct / len(test_sampler), "avg_accuracy")
        if hvd.rank() == 0:
            print(f"epoch {epoch}: test loss {test_loss:.4f}, accuracy {100 * test_accuracy:.2f}%", flush=True)

    if args.checksum:
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
        print(f"rank {hvd.rank()} checksum {flat.sum().item():.12e} {flat.abs().sum().item():.12e}", flush=True)


if __name__ == "__main__":
    main()
