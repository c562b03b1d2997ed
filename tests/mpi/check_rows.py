"""Run on W ranks: the row-sparse exchange of embedding tables (mpisparse.torch.rows) against NumPy and torch.

1. Aggregates: a model of three tables (two ``nn.Embedding(sparse=True)`` of
   dimensions 3 and 5, one dense table of dimension 4 named in
   ``sparse_rows``) and a dense layer.  Rank r looks up its own ids (rank 0
   none of table 1); after backward every table's ``.grad`` equals the mean
   over ranks of every rank's dense-table gradient, computed here from all
   ranks' inputs with NumPy, in its layout (sparse COO for the sparse
   tables, untouched rows absent; dense for the dense one), the same bits
   on every rank; the bytes the communicator counted for the rows equal
   :func:`row_exchange_bytes` of the rows touched and are below the tables'
   dense size.  Twice: op Average, then op Sum with a predivide factor.
2. Training: NCF with ``sparse=True`` tables (row-sparse) and NCF with dense
   tables through the dense scheme, ``torch.optim.SGD`` with momentum, 6
   steps on each rank's own batches: the parameters are the same bits on
   every rank and equal to the dense-table run's within float tolerance; the
   train runtime's SGD (``mpisparse.torch.sgd``) as well.  Then ``topk``
   with the tables row-sparse: the parameters stay equal across ranks and
   the tables' rows were exchanged exactly (not selected).
3. The DDP hook (``comm_hook``, gloo started from MPI): NCF with ``sparse=True``
   tables, each table its own sparse bucket, exchanged as its touched rows'
   exact mean; with ``dense`` it trains to the parameters of step 2's
   ``DistributedOptimizer`` run, with ``topk`` the ranks stay equal.
4. With ``--pipeline`` (only this), at 2 or 4 ranks, the pipeline: ``dlrm`` with its tables on stage 1 (split
   after ``bottom.4``), ``dct-mp``, at 4 ranks two replicas with ``--dp-scheme
   topk`` (the tables row-sparse in the stage's group); a run checkpointed
   after one epoch and resumed ends where the uninterrupted one does.
"""

import sys

import numpy as np
import torch
from torch import nn

from mpisparse.mpi.comm import Communicator
from mpisparse.models.ncf import NCF
from mpisparse.torch import DistributedOptimizer
from mpisparse.torch.rows import row_exchange_bytes
from mpisparse.torch.sgd import SGD as RuntimeSGD

comm = Communicator(check="--check" in sys.argv)
W, rank = comm.size, comm.rank
torch.set_num_threads(1)
ROWS, DIMS = (40, 30, 25), (3, 5, 4)


class Tables(nn.Module):
    def __init__(self):
        super().__init__()
        self.t0 = nn.Embedding(ROWS[0], DIMS[0], sparse=True)
        self.t1 = nn.Embedding(ROWS[1], DIMS[1], sparse=True)
        self.t2 = nn.Embedding(ROWS[2], DIMS[2])
        self.fc = nn.Linear(sum(DIMS), 1)

    def forward(self, ids, use_t1=True):
        e1 = self.t1(ids[:, 1]) if use_t1 else torch.zeros(ids.shape[0], DIMS[1])
        return self.fc(torch.cat([self.t0(ids[:, 0]), e1, self.t2(ids[:, 2])], 1)).sum()


def ids_of(r):
    g = np.random.default_rng(100 + r)
    return torch.from_numpy(np.stack([g.integers(0, n, size=6 + r) for n in ROWS], 1)).long()


def dense_grads(model, r):
    """Rank r's gradient of each table as a dense array (a twin with dense tables)."""
    twin = Tables()
    twin.load_state_dict(model.state_dict())
    for t in (twin.t0, twin.t1):
        t.sparse = False
    twin(ids_of(r), use_t1=r != 0).backward()
    return [np.zeros(tuple(w.shape), np.float32) if w.grad is None else w.grad.numpy().copy()
            for w in (twin.t0.weight, twin.t1.weight, twin.t2.weight)]


def check_aggregates(op, predivide):
    torch.manual_seed(1)
    model = Tables()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model, comm=comm, op=op,
                               gradient_predivide_factor=predivide, sparse_rows=["t0.weight", "t1.weight", "t2.weight"])
    before = comm.bytes_sent
    model(ids_of(rank), use_t1=rank != 0).backward()
    sent = comm.bytes_sent - before
    per_rank = [dense_grads(model, r) for r in range(W)]
    touched = [[int((np.abs(g).sum(1) > 0).sum()) for g in grads] for grads in per_rank]
    for k, name in enumerate(("t0", "t1", "t2")):
        ref = np.zeros_like(per_rank[0][k])
        for r in range(W):
            ref += per_rank[r][k]
        if op == "average":
            ref /= W
        g = getattr(model, name).weight.grad
        assert g.is_sparse == (k < 2), (name, g.layout)
        dense = g.to_dense().numpy()
        np.testing.assert_allclose(dense, ref, rtol=1e-5, atol=1e-7, err_msg=name)
        if k < 2:  # only touched rows are held
            assert g._nnz() == int((np.abs(ref).sum(1) > 0).sum()), (name, g._nnz())
        everyone = comm.allgather_obj(dense.tobytes())
        assert all(e == everyone[0] for e in everyone), f"{name}: ranks disagree"
    rows = [sum(t) for t in touched]
    elements = [sum(n * d for n, d in zip(t, DIMS)) for t in touched]
    # the bytes of this step: the finite-flag Allreduces (4 bytes each, twice) and the dense layer's Allreduce
    # (the dense scheme) besides the rows; the rows' part is the log's
    log = opt.rows.log
    assert log.rows == [rows[rank]], (log.rows, rows)
    assert log.sent == [row_exchange_bytes(rows, elements, rank)] == log.model, (log.sent, log.model)
    assert sent >= log.sent[0]
    assert log.sent[0] < 4 * sum(n * d for n, d in zip(ROWS, DIMS)) or W == 1
    opt.close()




# ---------------------------------------------------------------- training: sparse tables = dense tables
def batch(step):
    g = np.random.default_rng(1000 * step + rank)
    x = np.stack([g.integers(0, 50, 16), g.integers(0, 60, 16)], 1).astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy(g.integers(0, 2, 16))


def train(sparse, scheme="dense", make_opt=None, steps=6):
    torch.manual_seed(7)
    model = NCF(50, 60, dim=4, sparse=sparse)
    base = (make_opt or (lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9)))(model.parameters())
    opt = DistributedOptimizer(base, model=model, comm=comm, scheme=scheme, density=0.3, sparse_rows=None,
                               overlap=None if scheme == "dense" else False)
    for s in range(steps):
        x, y = batch(s)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        assert opt.step()
    params = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    everyone = comm.allgather_obj({n: v.tobytes() for n, v in params.items()})
    assert all(e == everyone[0] for e in everyone), f"parameters differ across ranks (sparse={sparse}, {scheme})"
    opt.close()
    return params, opt


def training():
    """Step 2; returns the first sparse run's parameters (torch.optim.SGD)."""
    runs = []
    for make in (None, lambda p: RuntimeSGD(p, lr=0.5, momentum=0.9)):
        sparse_run, opt = train(True, make_opt=make)
        runs.append(sparse_run)
        assert opt.rows is not None and len(opt.rows.tables) == 4
        dense_run, opt = train(False, make_opt=make)
        assert opt.rows is None
        for n in dense_run:
            np.testing.assert_allclose(sparse_run[n], dense_run[n], rtol=1e-5, atol=1e-6, err_msg=n)
        torch.manual_seed(7)
        init = NCF(50, 60, dim=4).state_dict()
        assert all(np.abs(sparse_run[n] - init[n].numpy()).max() > 1e-4 for n in ("gmf_user.weight", "out.weight"))
    _, opt = train(True, scheme="topk")
    assert opt.rows.log.rows and all(r > 0 for r in opt.rows.log.rows)
    return runs[0]


# ---------------------------------------------------------------- the DDP hook: a sparse bucket's exact mean
def ddp_hook(reference):
    import torch.distributed as dist

    from mpisparse.torch.dist import comm_hook, init_process_group_from_mpi

    own_group = not dist.is_initialized()  # in a job of several cases another may have started it
    if own_group:
        init_process_group_from_mpi(comm)
    for scheme, overlap in (("dense", True), ("topk", False)):
        torch.manual_seed(7)
        model = NCF(50, 60, dim=4, sparse=True)
        ddp = nn.parallel.DistributedDataParallel(model)
        state, hook = comm_hook(scheme, density=0.3, overlap=overlap)
        ddp.register_comm_hook(state, hook)
        sgd = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
        for s in range(6):
            x, y = batch(s)
            sgd.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            assert model.gmf_user.weight.grad.is_sparse
            sgd.step()
        state.close()
        params = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
        everyone = comm.allgather_obj({n: v.tobytes() for n, v in params.items()})
        assert all(e == everyone[0] for e in everyone), f"DDP {scheme}: parameters differ across ranks"
        if scheme == "dense":  # the same mean as DistributedOptimizer's
            for n in params:
                np.testing.assert_allclose(params[n], reference[n], rtol=1e-5, atol=1e-6, err_msg=f"DDP {n}")
    if own_group:  # every rank done with the group before it goes (a peer torn down early can hang the other)
        dist.barrier()
        dist.destroy_process_group()


# ---------------------------------------------------------------- the pipeline: DLRM's tables on a stage, resumed
def pipeline():
    import shutil
    import tempfile
    from dataclasses import replace
    from pathlib import Path

    from mpisparse.config import MPConfig, TrainConfig
    from mpisparse.mp.runtime import run_mp_training
    from mpisparse.runtimes import validate

    root = Path(comm.bcast_obj(tempfile.mkdtemp(prefix="rows-mp-") if rank == 0 else None))
    cfg = validate(TrainConfig(model="dlrm", scheme="dct-mp", density=0.25, batch_size=512, emb_tables=3,
                               emb_rows=60, emb_dim=8, mp=MPConfig(stages=2, split_after=["bottom.4"],
                                                                   dp_scheme="topk" if W == 4 else "dense")), W)
    full = run_mp_training(comm, replace(cfg, epochs=2))
    assert full.mp["stage_parameters"][1] > 3 * 60 * 8 and "test_auc" in full.metrics["final"], full.mp
    ck = str(root / "ck")
    run_mp_training(comm, replace(cfg, epochs=1, checkpoint=ck))
    resumed = run_mp_training(comm, replace(cfg, epochs=2, checkpoint=ck, resume=True))
    keys = ("epoch", "iteration", "train_loss", "test_loss")
    for a, b in zip(resumed.metrics["per_epoch"], full.metrics["per_epoch"]):
        assert [a[k] for k in keys] == [b[k] for k in keys], (resumed.metrics, full.metrics)
        # the AUC orders float32 scores, and one ulp of a score (BLAS's rounding) can swap a pair of them
        assert abs(a["test_auc"] - b["test_auc"]) < 1e-4, (resumed.metrics, full.metrics)
    comm.barrier()
    if rank == 0:
        shutil.rmtree(root, ignore_errors=True)


if "--pipeline" in sys.argv:
    assert W in (2, 4), "--pipeline runs at 2 or 4 ranks"
    pipeline()
else:
    check_aggregates("average", 1.0)
    check_aggregates("sum", 2.0)
    ddp_hook(training())
if rank == 0:
    print(f"rows OK on {W} ranks")
