"""Run on W ranks: 16-bit values on the wire (``--wire-dtype``), against float64 references.

* :func:`mpisparse.mpi.wire.allreduce_sum` of float16 and bfloat16 values equals the float64 sum of every
  rank's inputs within the wire type's precision, gives every rank the same bits, does not overflow in
  float16 where the sum of the inputs would, and sends half the bytes of a float32 Allreduce (the
  byte model's count, :func:`mpisparse.mpi.wire.allreduce_bytes`).
* ``dense`` with a 16-bit wire: the mean within precision, half the bytes.
* every sparse data-parallel scheme that declares the option: its error feedback keeps the rounding
  (``residual = acc - sent``: mass is conserved), a top-k reference step by step, values' bytes halved.
* with ``torch`` (2 ranks): ``DistributedOptimizer(compression=Compression.fp16)`` sends float16: the
  counted bytes are half of float32's.
"""

import sys

import numpy as np
from _common import RankWorld

from mpisparse.mpi import wire
from mpisparse.schemes import create, k_for

EPS = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}  # unit roundoff of each wire type
world = RankWorld(steps=3, seed=11)
comm, W, rank, layout, n, grads = world


def everyone_same(x, what):
    world.same_everywhere(np.asarray(x).tobytes(), what)


# ------------------------------------------------------------------ the 16-bit sum over ranks
m = 1000 * W  # a multiple of W: the blocks are equal and the bytes exactly half
rng = [np.random.default_rng([5, r]) for r in range(W)]
xs = [(g.standard_normal(m) * 10.0 ** g.integers(-3, 4, m)).astype(np.float32) for g in rng]
ref = np.sum(xs, axis=0, dtype=np.float64)
mag = np.sum(np.abs(xs), axis=0, dtype=np.float64)
for w in ("float16", "bfloat16"):
    x = xs[rank].copy()
    b0 = comm.bytes_sent
    out = wire.allreduce_sum(comm, x, w)
    sent = comm.bytes_sent - b0
    assert out is x and out.dtype == np.float32
    assert sent == wire.allreduce_bytes(m, W, rank, w), (w, sent)
    assert 2 * sent == world.ring_allreduce(m * 4), (w, "not half of float32's bytes", sent)
    # each rank's input rounded once (W x / W for float16), the float32 block sum rounded once more
    tol = 1.01 * EPS[w] * (mag + np.abs(ref)) + (W * 2.0 ** -24 if w == "float16" else 0.0)
    err = np.abs(out - ref)
    assert np.all(err <= tol), (w, "sum outside the wire's precision", float(np.max(err / tol)))
    everyone_same(out, f"{w} sum")
    # float16: the inputs sum beyond 65504, their mean does not: predivided, nothing overflows
    big = np.full(10, 60000.0, np.float32)
    got = wire.allreduce_sum(comm, big, w)
    assert np.all(np.isfinite(got)) and np.allclose(got, 60000.0 * W, rtol=4 * EPS[w]), (w, got)
# float32 stays one Allreduce
x = xs[rank].copy()
b0 = comm.bytes_sent
wire.allreduce_sum(comm, x, "float32")
assert comm.bytes_sent - b0 == world.ring_allreduce(m * 4)
np.testing.assert_allclose(x, ref, rtol=1e-5, atol=1e-3)

# ------------------------------------------------------------------ dense
for w in ("float16", "bfloat16"):
    sch = create("dense", comm, layout, 1.0, wire_dtype=w)
    outs, nbytes, _ = world.run(sch, f"dense {w}")
    for t in range(world.steps):
        mean = world.dense(t)
        mag = np.mean(np.abs(grads[t]), axis=0, dtype=np.float64)
        assert np.all(np.abs(outs[t] - mean) <= 1.01 * EPS[w] * (mag + np.abs(mean)) + 2.0 ** -24), (w, t)
    want = wire.allreduce_bytes(n, W, rank, w)
    assert all(b == want for b in nbytes), (w, nbytes, want)
    assert abs(2 * want - world.ring_allreduce(n * 4)) <= 8, (w, want)

# ------------------------------------------------------------------ sparse schemes: the rounding stays in memory
DENSITY = 0.05
k = k_for(DENSITY, n)


def topk_reference(w):
    """Error-feedback top-k with values rounded to ``w`` on the wire, every rank simulated (float64)."""
    resid = [np.zeros(n) for _ in range(W)]
    outs = []
    for t in range(world.steps):
        total = np.zeros(n)
        for r in range(W):
            acc = resid[r] + grads[t][r]
            idx = np.argsort(-np.abs(acc), kind="stable")[:k]
            sent = wire.round_trip(acc[idx].astype(np.float32), w).astype(np.float64)
            total[idx] += sent
            acc[idx] -= sent  # what rounding lost stays
            resid[r] = acc
        outs.append(total / W)
    return outs, resid


def conserves(sch, outs, w, what, aggregate_rounding):
    """W sum_t out_t + sum_r e_r == sum_r sum_t g_r,t; a sum over ranks in 16 bits rounds the aggregate
    once more (that rounding belongs to no rank's memory), within the wire's precision of it."""
    lhs, rhs = world.mass_balance(outs, sch.memory.residual)
    summed = np.sum([np.abs(g) for step in grads for g in step], axis=0, dtype=np.float64)
    tol = 2e-5 * np.abs(rhs) + 16 * np.finfo(np.float32).eps * summed + 1e-9
    if aggregate_rounding:
        tol = tol + 1.01 * EPS[w] * W * np.sum(np.abs(outs), axis=0) * (2 if w == "float16" else 1)
    bad = np.flatnonzero(np.abs(lhs - rhs) > tol)
    assert bad.size == 0, (what, w, "mass not conserved", bad[:5], lhs[bad[:5]], rhs[bad[:5]])


for w in ("float16", "bfloat16"):
    sch = create("topk", comm, layout, DENSITY, seed=3, wire_dtype=w)
    outs, nbytes, _ = world.run(sch, f"topk {w}")
    ref_outs, ref_resid = topk_reference(w)
    for t in range(world.steps):
        np.testing.assert_allclose(outs[t], ref_outs[t], rtol=1e-5, atol=1e-7, err_msg=f"topk {w} step {t}")
        want = world.ring_allgather([k] * W, 4) + world.ring_allgather([k] * W, 2) + world.ring_allgather([1] * W, 8)
        assert nbytes[t] == want, ("topk bytes", w, nbytes[t], want)
    np.testing.assert_allclose(sch.memory.residual, ref_resid[rank], rtol=1e-5, atol=1e-7, err_msg=f"topk {w}")
    conserves(sch, outs, w, "topk", False)
    assert np.count_nonzero(sch.memory.residual) > n - W * k  # the rounding is kept where values were sent

tau = float(np.quantile(np.abs(grads[0][0]), 0.9))
CASES = [("threshold", {"threshold": tau}, False), ("randomk", {}, True), ("cltk", {}, True),
         ("cltk", {"beta": 1.0, "chunks": 2}, True), ("deft", {}, True), ("dgc", {"momentum": 0.0}, False),
         ("dct", {"lifespan": 2}, False)]
for name, opts, agg in CASES:
    for w in ("float16", "bfloat16"):
        plain = create(name, comm, layout, DENSITY, seed=3, **opts)
        p_outs, p_bytes, _ = world.run(plain, f"{name} float32")
        sch = create(name, comm, layout, DENSITY, seed=3, wire_dtype=w, **opts)
        outs, nbytes, _ = world.run(sch, f"{name} {w}")
        conserves(sch, outs, w, name, agg)
        assert sum(nbytes) < sum(p_bytes), (name, w, nbytes, p_bytes)
        for t in range(world.steps):  # the same selections up to rounding: close to the float32 run
            scale = np.max(np.abs(p_outs[t])) + 1e-30
            assert np.max(np.abs(outs[t] - p_outs[t])) <= 0.2 * scale, (name, w, t)

# a scheme that cannot carry 16-bit values says so in one line
try:
    create("gtopk", comm, layout, DENSITY, wire_dtype="float16")
except ValueError as e:
    msg = str(e)
    assert "gtopk" in msg and "allowed values are float32" in msg and "\n" not in msg, msg
else:
    raise AssertionError("gtopk took --wire-dtype float16")
create("gtopk", comm, layout, DENSITY, wire_dtype="float32")

# ------------------------------------------------------------------ the library: Compression.fp16 halves the bytes
if "--torch" in sys.argv:
    import torch

    from mpisparse.torch import Compression, DistributedOptimizer

    def library_bytes(**kw):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(40, 50), torch.nn.ReLU(), torch.nn.Linear(50, 10))
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model, comm=comm, **kw)
        torch.manual_seed(1 + rank)
        x, y = torch.randn(16, 40), torch.randint(0, 10, (16,))
        # the overlapped buckets (the default) send over their own communicator, from backward on
        sent = lambda: opt.comm.bytes_sent + (opt.overlap.bytes_sent if opt.overlap else 0)  # noqa: E731
        b0 = sent()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        assert opt.step()
        grads_now = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        return sent() - b0, grads_now, opt

    full, g32, _ = library_bytes()
    half, g16, opt = library_bytes(compression=Compression.fp16)
    assert opt.scheme.wire == "float16"
    # the exchange's bytes halve; the 4-byte flags' Allreduces (twice 12 bytes a step) stay
    flags = 2 * world.ring_allreduce(12)
    assert (full - flags) == 2 * (half - flags) or abs((full - flags) - 2 * (half - flags)) <= 8, (full, half)
    assert torch.allclose(g16, g32, rtol=2e-3, atol=1e-5)
    bf, gbf, opt = library_bytes(wire_dtype="bfloat16")
    assert opt.scheme.wire == "bfloat16" and bf == half, (bf, half)
    assert torch.allclose(gbf, g32, rtol=1e-2, atol=1e-4)
    try:
        library_bytes(compression=Compression.fp16, wire_dtype="bfloat16")
    except ValueError as e:
        assert "Compression.fp16" in str(e), e
    else:
        raise AssertionError("fp16 compression with a bfloat16 wire was taken")

world.done("wire_dtype")
