"""The library's fused GPU paths against per-tensor references on the device (``gpu``: real CUDA tensors).

``backend.abs_max`` over many CUDA tensors (the finite check of every parameter after a step) takes one fused
multi-tensor launch (``torch._foreach_norm``, inf); it must give what the per-tensor maxima give, NaN and Inf
included.
"""

import math

import pytest

torch = pytest.importorskip("torch")

from gpu_emu.gpu import gpu_required, require_gpu  # noqa: E402

from mpisparse import backend  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture
def cuda():
    require_gpu()
    if not torch.cuda.is_available():
        if gpu_required():
            pytest.fail("MPISPARSE_TEST_GPU=1 but torch sees no CUDA device (a CPU build of torch?)")
        pytest.skip("needs a CUDA build of torch")
    return torch.device("cuda")


def _reference(ts):
    vals = [float(t.detach().abs().max()) for t in ts if t.numel()]
    if any(math.isnan(v) for v in vals):
        return float("nan")
    return max(vals, default=0.0)


@pytest.mark.parametrize("poison", [None, float("nan"), float("inf"), -float("inf")])
def test_abs_max_of_many_cuda_tensors_equals_the_per_tensor_maxima(cuda, poison):
    g = torch.Generator(device="cuda").manual_seed(0)
    ts = [torch.randn(n, device=cuda, generator=g) * (i + 1) for i, n in enumerate((7, 1000, 65_537, 3))]
    ts.append(torch.empty(0, device=cuda))
    ts.append(torch.randn(5, 4, device=cuda, generator=g).half())
    ts.append(torch.randn(64, 3, device=cuda, generator=g)[:, 1])  # not contiguous
    if poison is not None:
        ts[2][12_345] = poison
    got, want = backend.abs_max(ts), _reference(ts)
    if math.isnan(want):
        assert math.isnan(got)
    else:
        assert got == want
    assert backend.abs_max([torch.empty(0, device=cuda), torch.empty(0, device=cuda)]) == 0.0


def test_distributed_optimizer_step_reads_its_flags_once_and_writes_back_in_one_copy(cuda):
    """``DistributedOptimizer`` (dense, one rank) on CUDA tensors: ``.grad`` after backward equals the local
    gradient (the mean at W = 1; a bfloat16 parameter's converted in the same fused copy); from the second step
    on one host read of the finite flags (the library's count) and one fused write-back per step, and no
    synchronising torch call in backward and ``step()`` (torch's sync debug mode raises on one: the one read is
    the flag vector's device-to-host copy); a NaN gradient skips the step and leaves every ``.grad`` NaN."""
    from conftest import SelfComm

    from mpisparse.torch import DistributedOptimizer

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)
            self.gain = torch.nn.Parameter(torch.ones(32, dtype=torch.bfloat16))

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)) * self.gain.float())

    torch.manual_seed(0)
    net = Net().to(cuda)
    opt = DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=net.named_parameters(),
                               comm=SelfComm(), scheme="dense")
    assert opt._on_device
    g = torch.Generator(device="cuda").manual_seed(1)
    for t in range(4):
        x = torch.randn(8, 16, device=cuda, generator=g)
        y = torch.randint(0, 4, (8,), device=cuda, generator=g)
        scale = float("nan") if t == 2 else 1.0
        want = [w.detach().clone() for w in torch.autograd.grad(
            torch.nn.functional.cross_entropy(net(x), y) * scale, list(net.parameters()))]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y) * scale
        r0, w0, s0 = opt.flag_reads, opt.write_back_ops, opt.skipped_steps
        torch.cuda.set_sync_debug_mode("error")
        try:
            loss.backward()
            got = [p.grad.detach().clone() for p in net.parameters()]
            stepped = opt.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        if t == 2:
            assert not stepped and opt.skipped_steps == s0 + 1 and all(bool(gr.isnan().all()) for gr in got)
            assert opt.flag_reads - r0 == 1 and opt.write_back_ops == w0
            continue
        assert stepped and opt.write_back_ops - w0 == 1
        assert opt.flag_reads - r0 == (2 if t == 0 else 1)  # the first step also reads its snapshot's check
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and torch.equal(a, b)
