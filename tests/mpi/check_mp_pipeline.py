"""Run on W ranks: pipeline and hybrid training against a single-process torch reference.

Each configuration trains a few steps (the last batch partial) through
:class:`mpisparse.mp.runtime.MPTrainer` on a (sub-)communicator and compares
the last stage's losses and every stage's final parameters with one process
training the whole model with the same seed on the same batches:

* density 1 (``dense``, and ``dct-mp`` at density 1): exactly equal;
* ``dct-mp`` at density 0.25 (top-k and Laplace): exactly equal to the
  reference network with the layer ``X * M(X)`` inserted at each split
  (DCT paper, Sec. 2.2 "Analysis": SGD on the changed network), so forward
  masks and masked backward gradients are what Alg. 2 says;
* micro-batches, and hybrid replicas (W = 4: 2 replicas x 2 stages, the
  reference trains on both replicas' batches at once): equal to rounding.

Also checks :meth:`Communicator.probe` and the exact bytes of each split.
W = 2: mlp, cnn, dlrm with 2 stages; W = 3: mlp and dlrm (the paper's
split after two layers of each MLP) with 3 stages, cnn with 2 on a
sub-communicator; W = 4: hybrid.
"""

import numpy as np
import torch
import torch.nn.functional as F

from mpisparse.mpi.comm import Communicator
from mpisparse.data import load_dataset
from mpisparse.models.nets import build_model
from mpisparse.config import MPConfig, TrainConfig
from mpisparse.mp.stages import pipeline_layers, plan_stages, stage_module
from mpisparse.mp.runtime import MPTrainer
from mpisparse.mp.sparsify import forward_bytes, laplace_mask, row_keep_count, topk_row_mask

comm = Communicator()
W, rank = comm.size, comm.rank
SEED, LR, MOM, WD, B = 3, 0.05, 0.9, 1e-4, 24

# ---------------------------------------------------------------- probe
if W >= 2:
    if rank == 0:
        comm.send(np.arange(10, dtype=np.float64), 1, tag=5)
    elif rank == 1:
        src, tag, nbytes = comm.probe(0)
        assert (src, tag, nbytes) == (0, 5, 80), (src, tag, nbytes)
        buf = np.empty(10)
        comm.recv(buf, 0, 5)
        assert np.array_equal(buf, np.arange(10.0))
        assert comm.stats["probe"].bytes == 0
    if rank == 0:
        assert comm.stats["send"].bytes == 80
    comm.barrier()

DATA = {False: load_dataset("synthetic", seed=SEED, n_train=512, n_test=64),
        True: load_dataset("synthetic", seed=SEED, n_train=512, n_test=64, image=True)}


def batches(image, replica=0, replicas=1, steps=4, last=13):
    """``steps`` batches of B rows, then one of ``last`` rows, disjoint per replica."""
    ds = DATA[image]
    out, start = [], replica * (steps * B + last)
    for t in range(steps + 1):
        n = B if t < steps else last
        out.append((ds.train_x[start:start + n], ds.train_y[start:start + n]))
        start += n
    return out


def reference(name, image, stages, split_after, density, threshold, replicas):
    """One process, whole model, masks inserted at the cuts when density < 1; returns (losses, params by stage)."""
    torch.manual_seed(SEED)
    ds = DATA[image]
    net = build_model(name, input_shape=ds.input_shape, num_classes=ds.num_classes)
    plan = plan_stages(net, stages, split_after or None)
    layers = pipeline_layers(net)
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOM, weight_decay=WD)
    per_replica = [batches(image, r, replicas) for r in range(replicas)]
    losses = []
    for t in range(len(per_replica[0])):
        x = torch.cat([per_replica[r][t][0] for r in range(replicas)])
        y = torch.cat([per_replica[r][t][1] for r in range(replicas)])
        h = x
        for i, (_, layer) in enumerate(layers):
            h = layer(h)
            if i in plan.cuts and density < 1:
                flat = h.detach().reshape(h.shape[0], -1).numpy()
                if threshold == "laplace":  # one tau per replica's batch
                    rows = flat.shape[0] // replicas
                    m = np.concatenate([laplace_mask(flat[r * rows:(r + 1) * rows], density)[0]
                                        for r in range(replicas)])
                else:
                    m = topk_row_mask(flat, density)
                h = h * torch.from_numpy(m).reshape(h.shape)
        if replicas == 1:
            loss = F.cross_entropy(h, y)
        else:  # the mean of the replicas' mean losses
            loss = sum(F.cross_entropy(hh, yy) for hh, yy in zip(h.chunk(replicas), y.chunk(replicas))) / replicas
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = [[p.detach().numpy().copy() for p in stage_module(net, plan, s).parameters()] for s in range(stages)]
    return losses, params


def run(sub, name, image, stages, *, scheme="dense", density=1.0, threshold="topk", split_after=(), micro=1,
        exact=True):
    replicas = sub.size // stages
    opts = {"mp_threshold": threshold} if scheme == "dct-mp" else {}
    cfg = TrainConfig(model=name, data="synthetic", scheme=scheme, density=density, lr=LR, momentum=MOM,
                      weight_decay=WD, seed=SEED, scheme_options=opts)
    tr = MPTrainer(sub, cfg, MPConfig(stages=stages, split_after=list(split_after), micro_batches=micro),
                   dataset=DATA[image])
    data = batches(image, tr.replica, replicas)
    losses = []
    for x, y in data:
        loss = tr.train_step(x if tr.first else None, y)
        if tr.last:
            losses.append(loss)
    # exact bytes of the split this rank sends activations over (top-k: k per row; dense: 4 rows d)
    if tr.next is not None and threshold == "topk":
        d = tr.next.d
        k = row_keep_count(d, density) if scheme == "dct-mp" else d
        want = 0
        for x, y in data:
            for part in torch.tensor_split(y, min(micro, len(y))):
                want += forward_bytes(len(part), d, len(part) * k)
        assert tr.next.stats.bytes_forward == want, (tr.next.stats.bytes_forward, want)
        assert tr.next.stats.kept == sum(len(y) for _, y in data) * k
    if tr.prev is not None and threshold == "topk":
        d = tr.prev.d
        k = row_keep_count(d, density) if scheme == "dct-mp" else d
        assert tr.prev.stats.bytes_backward == 4 * k * sum(len(y) for _, y in data)
    mine = {"stage": tr.stage, "replica": tr.replica, "losses": losses,
            "params": [p.detach().numpy().copy() for p in tr.module.parameters()]}
    everyone = sub.allgather_obj(mine)
    ref_losses, ref_params = reference(name, image, stages, list(split_after), density, threshold, replicas)
    label = f"{name} S={stages} R={replicas} {scheme} density={density} {threshold} M={micro}"
    tol = dict(rtol=0, atol=0) if exact else dict(rtol=2e-5, atol=2e-6)
    for e in everyone:
        for got, want in zip(e["params"], ref_params[e["stage"]]):
            np.testing.assert_allclose(got, want, err_msg=f"{label}: stage {e['stage']} parameters", **tol)
    # the reference loss is the mean of the replicas' losses
    last = np.mean([e["losses"] for e in everyone if e["stage"] == stages - 1], axis=0)
    np.testing.assert_allclose(last, ref_losses, err_msg=f"{label}: losses", **tol)
    assert len(ref_losses) == 5
    return everyone


def sub_comm(n):
    """The first ``n`` ranks (None on the others)."""
    sub = comm.split(0 if rank < n else 1)
    return sub if rank < n else None


if W == 2:
    for kw in (dict(), dict(scheme="dct-mp", density=1.0), dict(scheme="dct-mp", density=0.25),
               dict(scheme="dct-mp", density=0.25, threshold="laplace"), dict(split_after=["net.4"])):
        run(comm, "mlp", False, 2, **kw)
    run(comm, "mlp", False, 2, micro=3, exact=False)
    run(comm, "mlp", False, 2, scheme="dct-mp", density=0.25, micro=3, exact=False)
    run(comm, "cnn", True, 2)
    run(comm, "cnn", True, 2, scheme="dct-mp", density=0.25)
    run(comm, "dlrm", False, 2, scheme="dct-mp", density=0.1)
elif W == 3:
    run(comm, "mlp", False, 3)
    run(comm, "mlp", False, 3, scheme="dct-mp", density=0.25)
    run(comm, "dlrm", False, 3, split_after=["bottom.4", "top.3"])
    run(comm, "dlrm", False, 3, scheme="dct-mp", density=0.1, split_after=["bottom.4", "top.3"])
    two = sub_comm(2)
    if two is not None:
        run(two, "cnn", True, 2)
elif W == 4:
    run(comm, "mlp", False, 2, exact=False)
    run(comm, "mlp", False, 2, scheme="dct-mp", density=0.25, exact=False)
    run(comm, "mlp", False, 2, scheme="dct-mp", density=0.25, micro=2, exact=False)
else:
    raise SystemExit(f"run this check on 2, 3 or 4 ranks, not {W}")

comm.barrier()
if rank == 0:
    print(f"mp pipeline OK on {W} ranks")
