"""The runtimes' own SGD (mpisparse/torch/sgd.py): torch.optim.SGD's update bit for bit, its state_dict
layout both ways, and a data-parallel step built by ``train`` that never imports torch._dynamo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mpisparse.torch.sgd import SGD

SETTINGS = [dict(lr=0.1), dict(lr=0.05, momentum=0.9), dict(lr=0.05, momentum=0.9, weight_decay=1e-3),
            dict(lr=0.02, momentum=0.8, dampening=0.25, weight_decay=5e-4),
            dict(lr=0.02, momentum=0.9, nesterov=True, weight_decay=1e-4)]


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 9), torch.nn.Tanh(), torch.nn.Linear(9, 4))


def _train(model, opt, steps: int, *, freeze_bias_at: int | None = None) -> None:
    gen = torch.Generator().manual_seed(1)
    for i in range(steps):
        x, y = torch.randn(8, 12, generator=gen), torch.randint(0, 4, (8,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if freeze_bias_at is not None and i >= freeze_bias_at:
            model[2].bias.grad = None  # a parameter without a gradient is left as it is
        opt.step()


@pytest.mark.parametrize("kw", SETTINGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_equals_torch_sgd_bit_for_bit(kw):
    ours, ref = _model(), _model()
    _train(ours, SGD(ours.parameters(), **kw), 6, freeze_bias_at=3)
    _train(ref, torch.optim.SGD(ref.parameters(), **kw), 6, freeze_bias_at=3)
    for a, b in zip(ours.parameters(), ref.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("direction", ["torch to ours", "ours to torch"])
def test_state_dicts_load_into_each_other_and_training_goes_on_identically(direction):
    kw = dict(lr=0.05, momentum=0.9, weight_decay=1e-3)
    first, second = (torch.optim.SGD, SGD) if direction == "torch to ours" else (SGD, torch.optim.SGD)
    a, ref = _model(), _model()
    opt_a, opt_ref = first(a.parameters(), **kw), torch.optim.SGD(ref.parameters(), **kw)
    _train(a, opt_a, 3)
    _train(ref, opt_ref, 3)
    b = _model(5)
    b.load_state_dict(a.state_dict())
    opt_b = second(b.parameters(), lr=1.0, momentum=0.5)  # the loaded groups' options replace these
    opt_b.load_state_dict(opt_a.state_dict())
    assert opt_b.param_groups[0]["lr"] == 0.05 and opt_b.param_groups[0]["momentum"] == 0.9
    _train(b, opt_b, 3)
    _train(ref, opt_ref, 3)
    for x, y in zip(b.parameters(), ref.parameters()):
        assert torch.equal(x, y)
    assert set(opt_b.state_dict()["state"]) == {0, 1, 2, 3}


def test_loaded_buffers_are_copies_and_a_mismatched_state_is_refused():
    m = _model()
    opt = SGD(m.parameters(), lr=0.1, momentum=0.9)
    _train(m, opt, 1)
    saved = opt.state_dict()
    other = SGD(_model().parameters(), lr=0.1, momentum=0.9)
    other.load_state_dict(saved)
    buf = next(iter(other.state.values()))["momentum_buffer"]
    assert buf.data_ptr() != saved["state"][0]["momentum_buffer"].data_ptr()
    with pytest.raises(ValueError, match="parameter groups do not match"):
        SGD(list(m.parameters())[:2], lr=0.1).load_state_dict(saved)


def test_zero_grad_and_bad_options():
    m = _model()
    opt = SGD(m.parameters(), lr=0.1)
    _train(m, opt, 1)
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in m.parameters())
    opt.zero_grad()
    assert all(p.grad is None for p in m.parameters())
    with pytest.raises(ValueError, match="lr is -1"):
        SGD(m.parameters(), lr=-1)
    with pytest.raises(ValueError, match="nesterov"):
        SGD(m.parameters(), lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="empty parameter list"):
        SGD([], lr=0.1)


#: a data-parallel step as ``train`` builds it (CollectiveStep: SGD inside DistributedOptimizer), one rank
#: without MPI (the tests' SelfComm), in a fresh interpreter: what it imported
STEP_IMPORTS = """
import sys
from conftest import SelfComm
from mpisparse.config import TrainConfig
from mpisparse.train.loop import CollectiveStep
step = CollectiveStep(SelfComm(), TrainConfig(scheme="topk", density=0.05, batch_size=64))
for b, batch in zip(range(3), step.batches(0)):
    assert step.train_batch(b, batch).stepped
print("torch._dynamo" in sys.modules, "torch" in sys.modules)
"""


def test_a_data_parallel_training_step_imports_no_torch_dynamo():
    here = Path(__file__).parent
    out = subprocess.run([sys.executable, "-c", STEP_IMPORTS], capture_output=True, text=True, timeout=120,
                         cwd=here, env={**os.environ, "PYTHONPATH": f"{here}:{here.parent}"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["False", "True"], out.stdout
