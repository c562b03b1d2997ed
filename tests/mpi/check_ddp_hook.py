"""The DDP hook with 16-bit buckets, overlapped and synchronous, and an exception in its thread (gloo).

Called by ``check_torch_dist.py gloo`` (one process per rank, ``torch.distributed``
initialised): :func:`hook_cases` trains small DDP models through
:func:`mpisparse.torch.dist.comm_hook` and adds to ``out``, for each case,
every rank's bucket inputs (widened to float32) and outputs per step, the
residual each bucket's scheme keeps after the step, the final parameters of
every rank and, for dense, the parameters of a plain torch replica trained
on the mean of every rank's gradient (gathered, averaged in float32,
rounded to the model's dtype).  The test computes the expected means from
the inputs with NumPy.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from mpisparse.torch.dist import comm_hook

#: case -> (model dtype, scheme, options of comm_hook)
CASES = {
    "bf16/dense": (torch.bfloat16, "dense", {}),
    "bf16/topk": (torch.bfloat16, "topk", {}),
    "fp16/dense": (torch.float16, "dense", {}),
    "bf16/dense/wire16": (torch.bfloat16, "dense", {"wire_dtype": "float16"}),
    "f32/dense/sync": (torch.float32, "dense", {"overlap": False}),
    "f32/dense/overlap": (torch.float32, "dense", {}),
    "f32/topk/sync": (torch.float32, "topk", {"overlap": False}),
    "f32/topk/overlap": (torch.float32, "topk", {}),
}
STEPS, LR, DENSITY = 3, 0.5, 0.1


def _model(dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 3)).to(dtype)


def _batch(g, dtype):
    return torch.randn(16, 8, generator=g).to(dtype), torch.randint(0, 3, (16,), generator=g)


def _everyone(t: torch.Tensor) -> np.ndarray:
    """``t`` (1-D, float32) of every rank, stacked by rank."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.stack(parts).numpy()


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().float().ravel() for p in model.parameters()])


def run_case(out: dict, key: str) -> None:
    dtype, scheme, opts = CASES[key]
    rank = dist.get_rank()
    model = _model(dtype)
    net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.02)
    state, hook = comm_hook(scheme, density=DENSITY, seed=1, **opts)
    seen: list = []

    def recording(st, bucket):  # what DDP hands the hook, kept to compare with what comes back
        seen.append((bucket.index(), bucket.buffer().detach().float().clone(), bucket.buffer()))
        return hook(st, bucket)

    net.register_comm_hook(state, recording)
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    ref = _model(dtype) if scheme == "dense" and "wire_dtype" not in opts else None
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR) if ref is not None else None
    g = torch.Generator().manual_seed(100 + rank)
    for t in range(STEPS):
        x, y = _batch(g, dtype)
        seen.clear()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x).float(), y).backward()
        opt.step()
        for b, given, buf in seen:
            out[f"hook/{key}/in/{t}/{b}"] = _everyone(given)
            out[f"hook/{key}/out/{t}/{b}"] = _everyone(buf.detach().float())
            sch = state.schemes[b]
            res = getattr(sch.memory, "residual", None)
            if res is not None:
                assert res.dtype == np.float32, res.dtype
                out[f"hook/{key}/res/{t}/{b}"] = _everyone(torch.from_numpy(np.array(res, copy=True)))
                out[f"hook/{key}/sid/{t}/{b}"] = np.array([id(sch)])
        out[f"hook/{key}/buckets/{t}"] = np.array(sorted(b for b, _, _ in seen))
        if ref is not None:  # torch's reference: the mean of every rank's gradient, in float32, then rounded
            ref_opt.zero_grad()
            torch.nn.functional.cross_entropy(ref(x).float(), y).backward()
            for p in ref.parameters():
                mean = _everyone(p.grad.float().ravel()).sum(0) * np.float32(1.0 / dist.get_world_size())
                p.grad = torch.from_numpy(mean).to(dtype).view_as(p)
            ref_opt.step()
    out[f"hook/{key}/params"] = _everyone(_flat(model))
    out[f"hook/{key}/start"] = _flat(_model(dtype)).numpy()
    if ref is not None:
        out[f"hook/{key}/ref"] = _flat(ref).numpy()
    state.close()


def failing(out: dict) -> None:
    """An exception in the exchange thread (planted on every rank) is raised by ``backward()``."""
    model = _model(torch.bfloat16)
    net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.02)
    state, hook = comm_hook("dense")
    net.register_comm_hook(state, hook)
    g = torch.Generator().manual_seed(7)
    message = ""
    for t in range(3):
        if t == 2:  # after DDP rebuilt its buckets (at the second step), so these schemes are the ones used
            for sch in state.schemes.values():
                def boom(*a, **k):
                    raise ValueError("planted in the exchange")
                sch.step = boom
        x, y = _batch(g, torch.bfloat16)
        try:
            torch.nn.functional.cross_entropy(net(x).float(), y).backward()
        except RuntimeError as exc:
            message = str(exc)
    out["hook/failing/message"] = np.array([message])
    out["hook/failing/recorded"] = np.array([type(state.failure).__name__])
    state.close()


def hook_cases(out: dict) -> None:
    for key in CASES:
        run_case(out, key)
    failing(out)
