"""Run under mpiexec by test_fault_numbers.py: finite gradients near the float32 maximum, on every rank.

For each collective scheme: every rank sets each gradient to 3e38 and steps a
DistributedOptimizer.  The exchange's sum overflows; whatever a scheme does,
every rank must agree whether the step was taken, the parameters must stay
finite, and a skipped step must leave them unchanged.  Then a step whose
update is finite but whose optimizer step overflows (a huge learning rate)
must be undone.  Prints ``SCHEME stepped=B skipped=N`` per scheme and
``overflow OK on W ranks``.
"""

import sys

import torch

from mpisparse.mpi.comm import Communicator
from mpisparse.schemes import SCHEMES, CollectiveScheme
from mpisparse.torch import DistributedOptimizer

comm = Communicator()
torch.manual_seed(0)
schemes = sys.argv[1].split(",") if len(sys.argv) > 1 else sorted(
    n for n, c in SCHEMES.items() if issubclass(c, CollectiveScheme))
for name in schemes:
    if comm.size < SCHEMES[name].min_world_size:
        continue
    model = torch.nn.Linear(50, 20)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, name, 0.1, comm=comm)
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.full_like(p, 3e38)
    stepped = opt.step()
    everyone = comm.allgather_obj(stepped)
    assert len(set(everyone)) == 1, f"{name}: ranks disagree whether the step was taken: {everyone}"
    assert all(torch.isfinite(p).all() for p in model.parameters()), f"{name}: a parameter became non-finite"
    if not stepped:
        assert all(torch.equal(a, p) for a, p in zip(before, model.parameters())), f"{name}: skipped but moved"
        assert opt.skipped_steps == 1
    if comm.rank == 0:
        print(f"{name} stepped={stepped} skipped={opt.skipped_steps}", flush=True)

# a finite update whose optimizer step overflows: undone, counted
model = torch.nn.Linear(50, 20)
opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e30), model, "dense", 1.0, comm=comm)
before = [p.detach().clone() for p in model.parameters()]
for p in model.parameters():
    p.grad = torch.full_like(p, 1e10)
assert opt.step() is False and opt.skipped_steps == 1
assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
for p in model.parameters():
    p.grad = torch.full_like(p, 1e-40)  # a harmless step afterwards is taken
assert opt.step() is True and opt.steps == 1
if comm.rank == 0:
    print(f"overflow OK on {comm.size} ranks", flush=True)
