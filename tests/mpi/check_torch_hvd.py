"""Horovod-style DistributedOptimizer under MPI: Sum vs Average, backward_passes_per_step, join().

Rank r's gradient is known in closed form, so the aggregate is checked
exactly; then rank 1 runs fewer steps than rank 0 and calls join(): the
job ends and the parameters are equal on every rank.
"""

import numpy as np
import torch

import mpisparse.torch as hvd

hvd.init()
R, W = hvd.rank(), hvd.size()


def linear():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2, bias=False)


def run(op, passes):
    model = linear()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    dist = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=op,
                                    backward_passes_per_step=passes)
    before = model.weight.detach().clone()
    stepped = []
    for _ in range(passes):
        dist.zero_grad()
        (model.weight.sum() * (R + 1)).backward()  # d/dw = R + 1 everywhere
        stepped.append(dist.step())
    assert stepped == [False] * (passes - 1) + [True], stepped
    total = sum(r + 1 for r in range(W)) * passes
    expect = total if op == hvd.Sum else total / W
    assert torch.allclose(before - model.weight.detach(), torch.full_like(before, expect)), \
        (op, passes, (before - model.weight).flatten()[:3], expect)


run(hvd.Average, 1)
run(hvd.Sum, 1)
run(hvd.Average, 3)

# uneven step counts: rank 1 runs out of batches first
for scheme, density in (("dense", 1.0), ("deft", 0.5)):
    torch.manual_seed(1 + R)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters(), scheme=scheme, density=density)
    for step in range(5 if R == 0 else 2):
        opt.zero_grad()
        x = torch.randn(4, 8)
        model(x).pow(2).mean().backward()
        opt.step()
    last = hvd.join()
    assert last == 0, last  # rank 0 has the most steps: it joins last
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    everyone = hvd.allgather_object(flat)
    assert all(np.array_equal(everyone[0], f) for f in everyone), f"{scheme}: parameters differ after join"
# overlap=None (the default): bucket by bucket where the scheme allows, else the plain step
for scheme, on in (("dense", W > 1), ("topk", False)):
    model = linear()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), scheme=scheme, density=0.5,
                                   named_parameters=model.named_parameters())
    assert (opt.overlap is not None) == on, (scheme, opt.overlap)
    if opt.overlap is not None:
        opt.close()
if R == 0:
    print(f"torch_hvd OK on {W} ranks", flush=True)
