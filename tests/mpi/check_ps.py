"""Run on W >= 2 ranks: the parameter-server runtime against NumPy references.

``python -m mpi4py check_ps.py MODE [SERVERS]``; the last SERVERS ranks
serve.  Workers train on a toy problem: the gradient of worker ``k`` at
step ``t`` is ``0.5 (w - target) + noise(k, t)`` (float32, seeded), so
every rank can recompute every worker's gradient at any model.

``reference``
    every scheme against a plain-NumPy simulation of the same math
    (synchronous rounds in worker order; round-robin order for the
    asynchronous schemes), bit for bit; Slim-DP with alpha = beta = 1
    equals Plump-DP bit for bit; DGS at density 1 without secondary
    compression equals ASGD (to float32 rounding: DGS's worker holds
    ``w^0 + sum G`` where ASGD's holds the server's ``w``); bytes per
    communication equal the formulas (Slim-DP Sec. 3.5, DGS, ASGD).
``shutdown``
    workers run different numbers of steps, the asynchronous schemes in
    arrival order: every job ends, every push is applied exactly once
    (staleness histogram total), and every worker ends with the servers'
    final model; DGS's final difference closes the gap (``final_gap``).
``fail-worker`` / ``fail-server``
    one rank raises in the middle: ``python -m mpi4py`` must end the job.

Any mismatch raises, which aborts the job.
"""

import sys

import numpy as np

from mpisparse.mpi.comm import Communicator
from mpisparse.backend.fusion import FusionLayout
from mpisparse.ps.algorithm import layer_k
from mpisparse.ps.slimdp import bytes_per_direction, comm_set_sizes, complement, sample_explorer, select_core
from mpisparse.schemes import create
from mpisparse.results.timing import PhaseTimer

LAYERS = [("a.weight", (40, 25)), ("a.bias", (25,)), ("b.weight", (25, 12)), ("b.bias", (12,)), ("c", (300,))]
SEED = 3
LR = np.float32(0.1)
MOM = np.float32(0.5)

mode = sys.argv[1]
S = int(sys.argv[2]) if len(sys.argv) > 2 else 1
comm = Communicator()
W, rank = comm.size, comm.rank
K = W - S
layout = FusionLayout(LAYERS)
n = layout.n
W0 = np.random.default_rng(11).standard_normal(n).astype(np.float32)
TARGET = np.random.default_rng(12).standard_normal(n).astype(np.float32)


def grad(w, k, t):
    noise = np.random.default_rng([7, k, t]).standard_normal(n).astype(np.float32)
    return np.float32(0.5) * (w - TARGET) + np.float32(0.1) * noise


def run(name, density, steps, *, fail_at=None, fail_server=False, momentum=MOM, **opts):
    """One run of ``name``; returns (role, payload) on this rank. Collective over the world."""
    if name in ("asgd", "dgs"):
        # the references below are the algorithms with the momentum as given; the lowering for
        # asynchrony (--async-momentum compensated) is tested in tests/test_ps_units.py
        opts.setdefault("async_momentum", "as-given")
    sch = create(name, comm, layout, density, seed=SEED, servers=S, **opts)
    w = W0.copy()
    timer = PhaseTimer()
    if sch.is_server():
        loop = sch.make_server(w, timer=timer)
        if fail_server:
            def boom(*a, **k):
                raise RuntimeError(f"injected failure on server rank {rank}")
            loop.algo.apply = boom
        stats = loop.run()
        out = ("server", {"model": loop.algo.model().copy(), "lo": loop.shard.lo, "hi": loop.shard.hi,
                          "staleness": dict(stats.staleness), "pushes": stats.pushes, "algo": loop.algo})
    else:
        worker = sch.make_worker(lr=float(LR), momentum=float(momentum), timer=timer)
        worker.start(w)
        traj = []
        for t in range(steps(rank)):
            if fail_at is not None and t == fail_at and rank == 0:
                raise RuntimeError("injected failure on worker rank 0")
            g = grad(w, rank, t)
            if sch.local_optimizer:
                w -= LR * g
            worker.step(w, g)
            traj.append(w.copy())
        extra = worker.finish(w)
        out = ("worker", {"w": w.copy(), "traj": traj, "log": list(worker.log), "extra": extra,
                          "algo": worker.algo})
    comm.barrier()
    return sch, out


def server_model(out):
    """The servers' final model, assembled on every rank."""
    role, p = out
    pieces = comm.allgather_obj((p["lo"], p["hi"], p["model"]) if role == "server" else None)
    full = np.empty(n, dtype=np.float32)
    for piece in pieces:
        if piece is not None:
            full[piece[0]:piece[1]] = piece[2]
    return full


def worker_values(out, key):
    role, p = out
    return [v for v in comm.allgather_obj(p[key] if role == "worker" else None)][:K]


def same(a, b, what):
    if not np.array_equal(a, b):
        raise AssertionError(f"{what}: max |diff| {np.max(np.abs(np.asarray(a) - np.asarray(b)))}")


def close(a, b, what, rtol=2e-5, atol=1e-5):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=what)


def layer_topk(x, pieces, density):
    """Reference per-layer top-k by a full argsort (independent of the backend kernels)."""
    keys = []
    for a, b in pieces:
        if b > a:
            k = max(1, min(b - a, int(round(density * (b - a)))))
            keys.append(a + np.argsort(-np.abs(x[a:b]), kind="stable")[:k])
    return np.sort(np.concatenate(keys))


LAYER_PIECES = [(s.offset, s.end) for s in layout.layers]


# --------------------------------------------------------------------------- references
def ref_plumpdp(T, p=1):
    w = W0.copy()
    models = [W0.copy() for _ in range(K)]
    traj = [[] for _ in range(K)]
    for t in range(T):
        for k in range(K):
            models[k] -= LR * grad(models[k], k, t)
        if (t + 1) % p == 0:
            acc = np.zeros(n, np.float32)
            for k in range(K):
                acc += models[k] - w
            acc /= np.float32(K)
            w += acc
            for k in range(K):
                models[k][...] = w
        for k in range(K):
            traj[k].append(models[k].copy())
    return w, traj


def ref_slimdp(sch, T, alpha, beta, q):
    """Slim-DP Alg. 1 over the scheme's shards, worker explorers from their own generators."""
    shards = sch.shards
    w = W0.copy()
    sizes = [comm_set_sizes(sh.n, alpha, beta) for sh in shards]
    core = [select_core(w[sh.lo:sh.hi], None, sizes[s][0], None) for s, sh in enumerate(shards)]
    rngs = [np.random.default_rng([SEED, 3, k]) for k in range(K)]
    models = [W0.copy() for _ in range(K)]
    sync = [W0.copy() for _ in range(K)]
    traj = [[] for _ in range(K)]
    for t in range(T):
        full = (t + 1) % q == 0
        deltas, expls = [], []
        for k in range(K):
            models[k] -= LR * grad(models[k], k, t)
            deltas.append(models[k] - sync[k])
            expls.append([sample_explorer(complement(sh.n, core[s]), sizes[s][1], rngs[k])
                          for s, sh in enumerate(shards)])
        new_core = list(core)
        for s, sh in enumerate(shards):
            ws = w[sh.lo:sh.hi]
            acc = np.zeros(sh.n, np.float32)
            gsum = np.zeros(sh.n, np.float32)
            for k in range(K):
                d = deltas[k][sh.lo:sh.hi]
                acc[core[s]] += d[core[s]]
                acc[expls[k][s]] += d[expls[k][s]]
                if full:
                    gsum += d
            acc /= np.float32(K)
            ws += acc
            if full:
                new_core[s] = select_core(ws, gsum / np.float32(K), sizes[s][0], None)
            for k in range(K):
                ms = models[k][sh.lo:sh.hi]
                ms[core[s]] = ws[core[s]]
                ms[expls[k][s]] = ws[expls[k][s]]
        core = new_core
        for k in range(K):
            sync[k][...] = models[k]
            traj[k].append(models[k].copy())
    return w, traj


def ref_asgd_round_robin(T, worker_density=1.0, weight_decay=0.0):
    w = W0.copy()
    models = [W0.copy() for _ in range(K)]
    u = [np.zeros(n, np.float32) for _ in range(K)]
    r = [np.zeros(n, np.float32) for _ in range(K)]
    traj = [[] for _ in range(K)]
    for t in range(T):
        for k in range(K):
            g = grad(models[k], k, t)
            if weight_decay:
                g = models[k] * np.float32(weight_decay) + g
            u[k] = u[k] * MOM + LR * g
            if worker_density < 1.0:
                r[k] += u[k]
                keys = layer_topk(r[k], LAYER_PIECES, worker_density)
                w[keys] -= r[k][keys]
                r[k][keys] = 0
            else:
                w -= u[k]
            models[k] = w.copy()
            traj[k].append(models[k].copy())
    return w, traj


def ref_dgs_round_robin(sch, T, density, server_density):
    M = np.zeros(n, np.float32)
    v = [np.zeros(n, np.float32) for _ in range(K)]
    r = [np.zeros(n, np.float32) for _ in range(K)]
    models = [W0.copy() for _ in range(K)]
    traj = [[] for _ in range(K)]
    for t in range(T):
        for k in range(K):
            r[k] += LR * grad(models[k], k, t)  # a = m u + eta grad, with r = m u
            keys = layer_topk(r[k], LAYER_PIECES, density)
            M[keys] -= r[k][keys]
            r[k][keys] *= MOM  # SAMomentum
            for sh in sch.shards:
                G = M[sh.lo:sh.hi] - v[k][sh.lo:sh.hi]
                if server_density is None:
                    sel = np.flatnonzero(G)
                else:
                    sel = layer_topk(G, [(a - sh.lo, b - sh.lo) for _, a, b in sh.pieces], server_density)
                v[k][sh.lo + sel] += G[sel]
                models[k][sh.lo + sel] += G[sel]
            traj[k].append(models[k].copy())
    return W0 + M, traj


def check_traj(out, ref_traj, what, exact=True):
    role, p = out
    if role != "worker":
        return
    for t, (a, b) in enumerate(zip(p["traj"], ref_traj[rank])):
        (same if exact else close)(a, b, f"{what}: worker {rank} after step {t}")
    if len(p["traj"]) != len(ref_traj[rank]):
        raise AssertionError(f"{what}: {len(p['traj'])} steps, reference {len(ref_traj[rank])}")


def check_bytes(out, expect_up, expect_down, what):
    role, p = out
    if role != "worker":
        return
    for c, (up, down, _) in enumerate(p["log"]):
        ok_up = up in (expect_up(c) if isinstance(expect_up(c), tuple) else (expect_up(c),))
        ok_down = down in (expect_down(c) if isinstance(expect_down(c), tuple) else (expect_down(c),))
        if not (ok_up and ok_down):
            raise AssertionError(f"{what}: communication {c} of worker {rank} sent {up} up / {down} down, "
                                 f"expected {expect_up(c)} / {expect_down(c)}")


def mode_reference():
    T = 9
    steps = lambda r: T  # noqa: E731

    # Plump-DP = synchronous SGD on the mean update (also with p = 2 local steps)
    for p in (1, 2):
        sch, out = run("plumpdp", 1.0, steps, local_steps=p)
        w_ref, traj = ref_plumpdp(T, p)
        check_traj(out, traj, f"plumpdp p={p}")
        same(server_model(out), w_ref, f"plumpdp p={p} server model")
        check_bytes(out, lambda c: 4 * n, lambda c: 4 * n, "plumpdp bytes")

    # Slim-DP (alpha, beta) against the reference, bytes = (2 alpha - beta) n
    alpha, beta, q = 0.3, 0.15, 3
    sch, out = run("slimdp", alpha, steps, core=beta, core_every=q)
    w_ref, traj = ref_slimdp(sch, T, alpha, beta, q)
    check_traj(out, traj, "slimdp")
    same(server_model(out), w_ref, "slimdp server model")
    formula = bytes_per_direction(sch.shards, alpha, beta)
    cores = [comm_set_sizes(sh.n, alpha, beta)[0] for sh in sch.shards]
    n_expl = sum(comm_set_sizes(sh.n, alpha, beta)[1] for sh in sch.shards)
    # an answer after a re-selection also carries the new core keys of each shard whose core changed
    with_keys = tuple(sorted({formula + 4 * sum(c for c, on in zip(cores, mask) if on)
                              for mask in np.ndindex(*([2] * len(cores)))}))
    assert abs(formula - 4 * (2 * alpha - beta) * n) <= 4 * 2 * len(sch.shards), (formula, n)
    check_bytes(out, lambda c: 4 * (n + n_expl) if (c + 1) % q == 0 else formula,
                lambda c: with_keys if (c + 1) % q == 0 else formula, "slimdp bytes")

    # Slim-DP with alpha = beta = 1 is Plump-DP, bit for bit and byte for byte
    _, plump = run("plumpdp", 1.0, steps)
    _, slim = run("slimdp", 1.0, steps, core=1.0, core_every=2)
    if plump[0] == "worker":
        for t, (a, b) in enumerate(zip(plump[1]["traj"], slim[1]["traj"])):
            same(a, b, f"slimdp(1, 1) vs plumpdp, step {t}")
        if plump[1]["log"] != slim[1]["log"]:
            raise AssertionError(f"slimdp(1, 1) bytes {slim[1]['log']} != plumpdp {plump[1]['log']}")
    same(server_model(plump), server_model(slim), "slimdp(1, 1) vs plumpdp server model")

    # ASGD (round-robin) = sequential momentum SGD over the workers' pushes; also gradient dropping
    sch, out = run("asgd", 1.0, steps, round_robin=True)
    w_ref, traj = ref_asgd_round_robin(T)
    check_traj(out, traj, "asgd")
    same(server_model(out), w_ref, "asgd server model")
    check_bytes(out, lambda c: 4 * n, lambda c: 4 * n, "asgd bytes")
    wd = 0.1
    sch, out = run("asgd", 1.0, steps, round_robin=True, worker_density=0.1)
    w_ref, traj = ref_asgd_round_robin(T, worker_density=0.1)
    check_traj(out, traj, "asgd gradient dropping")
    same(server_model(out), w_ref, "asgd gradient dropping server model")
    up = 8 * int(layer_k(layout, 0.1).sum())
    check_bytes(out, lambda c: up if S == 1 else out[1]["log"][c][0], lambda c: 4 * n, "asgd GD bytes")
    del wd

    # DGS (round-robin), both sparsifications, against the reference
    d, sd = 0.1, 0.2
    sch, out = run("dgs", d, steps, round_robin=True, server_density=sd)
    w_ref, traj = ref_dgs_round_robin(sch, T, d, sd)
    check_traj(out, traj, "dgs")
    close(server_model(out), w_ref, "dgs server model", rtol=1e-6, atol=1e-6)
    up = 8 * int(layer_k(layout, d).sum())
    down = sum(4 * min(sh.n, 2 * sum(max(1, int(round(sd * (b - a)))) for _, a, b in sh.pieces))
               for sh in sch.shards)
    if S == 1:
        check_bytes(out, lambda c: up, lambda c: down, "dgs bytes")
    else:
        check_bytes(out, lambda c: out[1]["log"][c][0], lambda c: down, "dgs bytes")
    # model-difference tracking lost nothing: the final difference closes the gap
    if out[0] == "worker" and out[1]["extra"]["final_gap"] > 1e-5:
        raise AssertionError(f"dgs: final gap {out[1]['extra']['final_gap']}")

    # DGS at density 1 without secondary compression is ASGD (round-robin order)
    _, a = run("asgd", 1.0, steps, round_robin=True)
    _, g = run("dgs", 1.0, steps, round_robin=True)
    if a[0] == "worker":
        for t, (x, y) in enumerate(zip(a[1]["traj"], g[1]["traj"])):
            close(y, x, f"dgs(1) vs asgd, worker {rank} step {t}", rtol=1e-5, atol=2e-6)
    close(server_model(g), server_model(a), "dgs(1) vs asgd server model", rtol=1e-5, atol=2e-6)


def mode_shutdown():
    steps = lambda r: 6 + 5 * r  # noqa: E731  workers stop at different times
    total = sum(steps(k) for k in range(K))
    for name, density, opts in [("plumpdp", 1.0, {}), ("slimdp", 0.3, {"core_every": 4}),
                                ("asgd", 1.0, {}), ("asgd", 1.0, {"worker_density": 0.2}),
                                ("dgs", 0.05, {"server_density": 0.05}), ("dgs", 0.05, {"round_robin": True})]:
        sch, out = run(name, density, steps, **opts)
        model = server_model(out)
        finals = worker_values(out, "w")
        for k, wk in enumerate(finals):
            same(wk, model, f"{name} {opts}: worker {k} does not end with the servers' model")
        role, p = out
        if role == "server":
            applied = sum(p["staleness"].values())
            if p["pushes"] != total or applied != total:
                raise AssertionError(f"{name}: server applied {p['pushes']} pushes ({applied} in the "
                                     f"histogram), workers made {total}")
            if sch.server_mode == "sync" and set(p["staleness"]) != {0}:
                raise AssertionError(f"{name}: synchronous staleness {p['staleness']}")
        if name == "dgs" and role == "worker" and p["extra"]["final_gap"] > 1e-4 * (1 + np.abs(model).max()):
            raise AssertionError(f"dgs: final gap {p['extra']['final_gap']}")


if mode == "reference":
    mode_reference()
elif mode == "shutdown":
    mode_shutdown()
elif mode == "fail-worker":
    run("asgd", 1.0, lambda r: 1000, fail_at=5)
elif mode == "fail-server":
    run("slimdp", 0.3, lambda r: 1000, fail_server=True)
else:
    raise SystemExit(f"unknown mode {mode}")

if rank == 0:
    print(f"ps {mode} OK on {W} ranks ({S} server{'s' if S > 1 else ''})", flush=True)
