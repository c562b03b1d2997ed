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
