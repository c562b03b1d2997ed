"""DistributedOptimizer(overlap=True): bucket-wise exchanges from gradient hooks equal the plain step.

Same model, same seed, same batches on each rank (rank-dependent data):
several steps with overlap=False and with overlap=True (a small bucket cap,
so the model has several buckets). The parameters after each step must
agree (a bucket-wise dense, per-layer top-k and fixed-threshold step does
the same math as the whole-vector one), the buckets must have been started
from the hooks (during backward), and a non-finite gradient on one rank is
skipped on every rank.

``--cuda``: the model, its batches and so the fusion buffer on the rank's
GPU (``local_rank``): the buckets' copies are made on torch's stream in the
hook and exchanged from the second thread.
"""

import sys

import numpy as np
import torch

import mpisparse.torch as hvd

hvd.init()
R, W = hvd.rank(), hvd.size()
DEVICE = torch.device("cpu")
if "--cuda" in sys.argv:
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    DEVICE = torch.device("cuda", torch.cuda.current_device())

SETTLED = []  # the schemes each optimizer loaded its compiled loops for (mpisparse.backend.pages.settle)
_settle = hvd.settle
hvd.settle = lambda *schemes: (SETTLED.append(schemes), _settle(*schemes))[1]


def model_and_data():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4)).to(DEVICE)
    g = torch.Generator().manual_seed(100 + R)
    batches = [(torch.randn(8, 12, generator=g).to(DEVICE), torch.randint(0, 4, (8,), generator=g).to(DEVICE))
               for _ in range(4)]
    return model, batches


def train(overlap, scheme, density, **opts):
    model, batches = model_and_data()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), scheme=scheme, density=density,
                                   overlap=overlap, bucket_cap_mb=0.0004, **opts)  # 100 floats: 3 buckets
    if overlap:  # every bucket's scheme warmed up too, before the first step
        assert SETTLED[-1] == (opt.scheme, *(b.scheme for b in opt.overlap.buckets)), SETTLED[-1]
    trace = []
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        assert opt.step()
        trace.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone())
    return opt, trace


for scheme, density, opts in (("dense", 1.0, {}), ("topk", 0.1, {"layerwise": True}),
                              ("threshold", 0.1, {"threshold": 0.01})):
    _, plain = train(False, scheme, density, **opts)
    opt, over = train(True, scheme, density, **opts)
    assert len(opt.overlap.buckets) >= 3, len(opt.overlap.buckets)
    assert opt.overlap.started_in_backward >= len(opt.overlap.buckets) * len(over) - 1, \
        (scheme, opt.overlap.started_in_backward)  # every bucket but possibly the first layer's went from a hook
    for step, (a, b) in enumerate(zip(plain, over)):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), (scheme, step, float((a - b).abs().max()))
    assert W == 1 or opt.overlap.bytes_sent > 0
    everyone = hvd.allgather_object(over[-1].cpu().numpy())
    assert all(np.array_equal(everyone[0], f) for f in everyone), f"{scheme}: ranks differ"

# a non-finite gradient on the last rank: every rank skips that step, parameters unchanged and finite
model, batches = model_and_data()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                               overlap=True, bucket_cap_mb=0.0004)
before = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
opt.zero_grad()
x, y = batches[0]
loss = torch.nn.functional.cross_entropy(model(x), y) * (float("inf") if R == W - 1 else 1.0)
loss.backward()
assert opt.step() is False
assert opt.skipped_steps == 1
after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
assert torch.equal(before, after)
# and the next step works again
opt.zero_grad()
torch.nn.functional.cross_entropy(model(x), y).backward()
assert opt.step() is True
# uneven step counts with overlap: the joined rank's buckets go out from synchronize() (no backward)
model, batches = model_and_data()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                               overlap=True, bucket_cap_mb=0.0004)
for x, y in batches[: 4 if R == 0 else 1]:
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
assert hvd.join() == 0
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu().numpy()
everyone = hvd.allgather_object(flat)
assert all(np.array_equal(everyone[0], f) for f in everyone), "parameters differ after join with overlap"
if R == 0:
    print(f"torch_overlap{' (cuda)' if DEVICE.type == 'cuda' else ''} OK on {W} ranks")
