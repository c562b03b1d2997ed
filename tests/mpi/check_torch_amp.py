"""DDP's gradient contract in DistributedOptimizer: mixed precision, GradScaler, clipping, 16-bit parameters.

Every rank's local gradient is computed again with plain torch and gathered
(``allgather_object``), so each expectation is a NumPy reference computed
from all ranks' inputs:

* when ``backward()`` returns, ``.grad`` holds the aggregate (dense: the mean
  of the ranks' gradients; every scheme: the same tensor on every rank), and
  ``step()`` applies it without a second exchange;
* ``clip_grad_norm_`` between ``backward()`` and ``step()`` clips the aggregate;
* the plain PyTorch AMP loop (``scaler.scale(loss).backward(); scaler.step(opt);
  scaler.update()``) with one rank's loss overflowing at a chosen step: every
  rank skips that step, the loss scales stay equal, the parameters equal
  across ranks, for dense, topk, cltk and deft (and without ``scaler=``);
* error feedback stays in unscaled units: with ``scaler=`` a run whose loss
  scale doubles after every step and halves after an overflow equals, bit
  for bit (parameters and residual), a run without scaling that skips the
  same step;
* bfloat16 and float16 parameters: the gradients widened to float32 for the
  exchange, the aggregate written back in the parameter's dtype.
"""

import numpy as np
import torch

import mpisparse.torch as hvd

hvd.init()
R, W = hvd.rank(), hvd.size()
LR = 0.05


def model_and_batches(dtype=torch.float32, steps=6):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).to(dtype)
    g = torch.Generator().manual_seed(10 + R)  # each rank its own data
    batches = [(torch.randn(5, 6, generator=g).to(dtype), torch.randint(0, 3, (5,), generator=g))
               for _ in range(steps)]
    return model, batches


def loss_of(model, x, y):
    return torch.nn.functional.cross_entropy(model(x).float(), y)


def local_grads(model, x, y) -> list[np.ndarray]:
    """This rank's own gradient of the batch, computed on a copy of the model (no exchange)."""
    twin = model_and_batches(next(model.parameters()).dtype)[0]
    twin.load_state_dict(model.state_dict())
    loss_of(twin, x, y).backward()
    return [p.grad.detach().float().numpy().copy() for p in twin.parameters()]


def optimizer(model, scheme, density=0.25, **kw):
    return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), scheme=scheme, density=density,
                                    named_parameters=model.named_parameters(), **kw)


def same_everywhere(arrays, what):
    everyone = hvd.allgather_object([np.asarray(a) for a in arrays])
    for r, theirs in enumerate(everyone):
        assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(everyone[0], theirs)), f"{what}: rank {r} differs"


def params(model):
    return [p.detach().float().numpy().copy() for p in model.parameters()]


# --- 1. when backward() returns, .grad is the aggregate; step() applies it (no second exchange)
for scheme, overlap in (("dense", False), ("dense", True), ("topk", False), ("cltk", False), ("deft", False)):
    if overlap and W == 1:
        continue
    model, batches = model_and_batches()
    opt = optimizer(model, scheme, overlap=overlap)
    for x, y in batches[:3]:
        mine = local_grads(model, x, y)
        opt.zero_grad()
        loss_of(model, x, y).backward()
        grads = [p.grad.detach().numpy().copy() for p in model.parameters()]
        same_everywhere(grads, f"{scheme} .grad after backward")
        if scheme == "dense":
            everyone = hvd.allgather_object(mine)
            for i, gr in enumerate(grads):
                mean = np.mean([e[i] for e in everyone], axis=0, dtype=np.float64)
                assert np.allclose(gr, mean, rtol=1e-5, atol=1e-7), (scheme, overlap, i)
        before = params(model)
        calls = []
        step_of = opt.scheme.step
        opt.scheme.step = lambda *a, **k: calls.append(1) or step_of(*a, **k)
        assert opt.step() is True
        opt.scheme.step = step_of
        assert not calls, f"{scheme}: step() exchanged again"
        for b, a, gr in zip(before, params(model), grads):
            assert np.allclose(b - a, LR * gr, rtol=1e-5, atol=1e-7), scheme
    opt.close()

# --- 2. clip_grad_norm_ between backward() and step() clips the aggregate
model, batches = model_and_batches()
opt = optimizer(model, "dense", density=1.0)
x, y = batches[0]
everyone = hvd.allgather_object(local_grads(model, x, y))
mean = [np.mean([e[i] for e in everyone], axis=0, dtype=np.float64) for i in range(len(everyone[0]))]
norm = np.sqrt(sum(float((m ** 2).sum()) for m in mean))
cap = 0.25 * norm
expect = [p - LR * m * (cap / (norm + 1e-6)) for p, m in zip(params(model), mean)]
opt.zero_grad()
loss_of(model, x, y).backward()
total = torch.nn.utils.clip_grad_norm_(model.parameters(), cap)
assert abs(float(total) - norm) <= 1e-5 * norm, (float(total), norm)  # the aggregate's norm, not this rank's
assert opt.step() is True
for got, want in zip(params(model), expect):
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6)
opt.close()


# --- 3. the plain AMP loop, one rank's loss overflowing at step 2
def amp_loop(scheme, *, give_scaler=True, autocast=True, steps=6, bad_step=2, growth_interval=2,
             init_scale=2.0 ** 16):
    model, batches = model_and_batches(steps=steps)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    opt = optimizer(model, scheme, scaler=scaler if give_scaler else None)
    stepped, scales = [], []
    for step, (x, y) in enumerate(batches):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
            loss = loss_of(model, x, y)
        if step == bad_step and R == W - 1:
            loss = loss * float("inf")  # this rank alone overflows
        scaler.scale(loss).backward()
        stepped.append(scaler.step(opt) is not None)
        scaler.update()
        scales.append(scaler.get_scale())
    opt.close()
    return model, opt, stepped, scales


for scheme in ("dense", "topk", "cltk", "deft"):
    model, opt, stepped, scales = amp_loop(scheme)
    assert stepped == [True, True, False, True, True, True], (scheme, stepped)
    assert opt.skipped_steps == 1, (scheme, opt.skipped_steps)
    everyone = hvd.allgather_object((stepped, scales))
    assert all(e == everyone[0] for e in everyone), (scheme, everyone)
    assert scales[2] == scales[1] / 2, (scheme, scales)  # halved after the overflow, on every rank
    same_everywhere(params(model), f"{scheme} AMP parameters")
model, opt, stepped, scales = amp_loop("topk", give_scaler=False)  # the loop unchanged, no scaler= given
assert stepped[2] is False and sum(stepped) == 5, stepped
same_everywhere(params(model), "topk AMP without scaler=")

# --- 4. error feedback in unscaled units across scale changes: bit for bit equal to an unscaled run
scaled, opt_s, stepped_s, scales = amp_loop("topk", autocast=False, growth_interval=1, init_scale=2.0 ** 10)
assert len(set(scales)) >= 4 and scales[2] == scales[1] / 2, scales  # doubled each good step, halved once
plain, batches = model_and_batches()
opt_p = optimizer(plain, "topk")
stepped_p = []
for step, (x, y) in enumerate(batches):
    opt_p.zero_grad()
    loss = loss_of(plain, x, y)
    if step == 2 and R == W - 1:
        loss = loss * float("inf")
    loss.backward()
    stepped_p.append(opt_p.step())
opt_p.close()
assert stepped_p == stepped_s, (stepped_p, stepped_s)
for a, b in zip(params(scaled), params(plain)):
    assert np.array_equal(a, b), "a loss scale that changes changed the training (residual in scaled units?)"
res_s, res_p = opt_s.scheme.state_dict(), opt_p.scheme.state_dict()
for key in res_p:
    if isinstance(res_p[key], np.ndarray):
        assert np.array_equal(res_s[key], res_p[key]), key

# --- 5. 16-bit parameters: the aggregate written back in the parameter's dtype
for dtype in (torch.bfloat16, torch.float16):
    for scheme in ("dense", "topk"):
        model, batches = model_and_batches(dtype)
        opt = optimizer(model, scheme)
        for x, y in batches[:3]:
            mine = local_grads(model, x, y)
            opt.zero_grad()
            loss_of(model, x, y).backward()
            assert all(p.grad.dtype == dtype for p in model.parameters()), scheme
            if scheme == "dense":
                everyone = hvd.allgather_object(mine)
                for i, p in enumerate(model.parameters()):
                    mean = np.mean([e[i] for e in everyone], axis=0, dtype=np.float64)
                    want = torch.from_numpy(mean.astype(np.float32)).to(dtype).float().numpy()
                    # the widened mean of the ranks' 16-bit gradients, rounded once to the dtype
                    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10  # one rounding apart at most
                    assert np.allclose(p.grad.float().numpy(), want, rtol=ulp, atol=1e-6), (dtype, i)
            assert opt.step() is True
        assert all(p.dtype == dtype for p in model.parameters())
        same_everywhere(params(model), f"{scheme} {dtype} parameters")
        opt.close()

if R == 0:
    print(f"torch_amp OK on {W} ranks", flush=True)
