"""Horovod-style functions of mpisparse.torch.api on every rank, against values computed from all ranks' inputs."""

import sys

import torch

import mpisparse.torch.api as hvd

hvd.init()
r, W = hvd.rank(), hvd.size()
if "--raise" in sys.argv:  # library mode: one rank raises, the others wait in a collective
    if r == W - 1:
        raise RuntimeError("planted failure on the last rank")
    hvd.allreduce(torch.zeros(1))
assert 0 <= hvd.local_rank() < hvd.local_size() <= W

x = torch.arange(6, dtype=torch.float32).view(2, 3) + 10 * r
every = [torch.arange(6, dtype=torch.float32).view(2, 3) + 10 * k for k in range(W)]
assert torch.allclose(hvd.allreduce(x), sum(every) / W)
assert torch.allclose(hvd.allreduce(x, op=hvd.Sum), sum(every))
assert torch.allclose(hvd.allreduce(x, average=False), sum(every))
assert torch.equal(hvd.allreduce(x, op=hvd.Max), every[-1])
half = hvd.allreduce(x, compression=hvd.Compression.fp16)
assert half.dtype == torch.float32 and torch.allclose(half, sum(every) / W, rtol=1e-3)
assert torch.allclose(hvd.allreduce(x, prescale_factor=2.0, postscale_factor=0.5), sum(every) / W)
assert hvd.allreduce(torch.tensor(float(r))).shape == ()

rows = torch.full((r + 1, 2), float(r))  # first dimension differs by rank
gathered = hvd.allgather(rows)
assert torch.equal(gathered, torch.cat([torch.full((k + 1, 2), float(k)) for k in range(W)]))

b = hvd.broadcast(torch.tensor([float(r), 1.0]), root_rank=W - 1)
assert torch.equal(b, torch.tensor([float(W - 1), 1.0]))
assert hvd.broadcast_object({"rank": r}, root_rank=0) == {"rank": 0}
assert hvd.allgather_object(r) == list(range(W))

torch.manual_seed(r)  # every rank starts different
model = torch.nn.Linear(4, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1), momentum=0.9)
model(torch.randn(5, 4)).sum().backward()
opt.step()
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
vec = torch.cat([p.detach().ravel() for p in model.parameters()])
assert torch.equal(hvd.allreduce(vec, op=hvd.Max), hvd.allreduce(vec, op=hvd.Min)), "parameters differ"
assert opt.param_groups[0]["lr"] == 0.1
buf = opt.state_dict()["state"][0]["momentum_buffer"]
assert torch.equal(hvd.allreduce(buf, op=hvd.Max), buf), "optimizer state differs"
print(f"torch_api OK on {W} ranks")
