"""Parameter-server pieces without MPI: roles and shards, the wire format, the schemes' math."""

import sys

import numpy as np
import pytest
from click.testing import CliRunner

from mpisparse.cli import cli
from mpisparse.backend.fusion import FusionLayout
from mpisparse.ps.algorithm import WorkerContext, ServerContext, layer_k, layerwise_topk
from mpisparse.ps.dgs import DGSServer, DGSWorker
from mpisparse.ps.asgd import ASGDWorker
from mpisparse.ps.plumpdp import PlumpDPServer
from mpisparse.ps.polling import default_max_sleep
from mpisparse.ps.protocol import (CORE, DIFF, MODEL, PULL, PUSH, Part, ProtocolError, decode_into, encode,
                                   is_dense, send_bundle)
from mpisparse.ps.roles import Roles, make_shards, shard_bounds, split_by_shard
from mpisparse.ps.slimdp import (SlimDPServer, bytes_per_direction, comm_set_sizes, complement, sample_explorer,
                                 select_core, significance)
from mpisparse.schemes import SCHEMES

LAYOUT = FusionLayout([("a", (10, 30)), ("b", (30,)), ("c", (30, 5)), ("d", (5,))])


# --------------------------------------------------------------------------- roles, shards
def test_roles_workers_first_servers_last():
    r = Roles(5, 2)
    assert r.workers == 3 and r.worker_ranks == [0, 1, 2] and r.server_ranks == [3, 4]
    assert r.is_server(3) and not r.is_server(2) and r.server_index(4) == 1 and r.server_rank(0) == 3


@pytest.mark.parametrize("world, servers, msg", [
    (2, 2, "--servers 2 leaves no worker among 2 ranks"),
    (3, 0, "--servers is 0; allowed range is [1, 2]"),
])
def test_roles_reject_worlds_without_workers(world, servers, msg):
    with pytest.raises(ValueError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        Roles(world, servers)


def test_shards_by_range_and_by_layer_cover_the_vector():
    n = LAYOUT.n  # 300 + 30 + 150 + 5 = 485
    assert shard_bounds(LAYOUT, 1) == [0, n]
    assert shard_bounds(LAYOUT, 2) == [0, 242, n]
    assert shard_bounds(LAYOUT, 2, by_layer=True) == [0, 300, n]  # nearest layer boundary to 242.5
    assert shard_bounds(LAYOUT, 4, by_layer=True) == [0, 300, 330, 480, n]
    with pytest.raises(ValueError, match="4 non-empty layers cannot be shared by 5 servers"):
        shard_bounds(LAYOUT, 5, by_layer=True)
    shards = make_shards(LAYOUT, Roles(4, 2))
    assert [(s.rank, s.lo, s.hi) for s in shards] == [(2, 0, 242), (3, 242, n)]
    assert shards[0].pieces == ((0, 0, 242),)
    assert shards[1].pieces == ((0, 242, 300), (1, 300, 330), (2, 330, 480), (3, 480, 485))
    assert shards[1].local_pieces()[0] == (0, 0, 58)
    keys = np.array([3, 241, 242, 400])
    assert [keys[s].tolist() for s in split_by_shard(keys, shards)] == [[3, 241], [242, 400]]


# --------------------------------------------------------------------------- wire format
def test_encode_picks_the_smaller_form_and_decodes_both():
    sparse = encode(PUSH, np.array([1, 4]), np.array([2.0, -1.0]), 10)
    assert sparse.keys.tolist() == [1, 4] and sparse.nbytes == 16 and not is_dense(sparse, 10)
    dense = encode(PUSH, np.arange(5), np.ones(5), 10)
    assert dense.keys.size == 0 and dense.values.size == 10 and dense.nbytes == 40
    out = np.ones(10, np.float32)
    decode_into(out, sparse, mode="add")
    assert out[1] == 3 and out[4] == 0 and out.sum() == 10 + 1
    decode_into(out, dense, mode="sub")
    assert out[0] == 0 and out[9] == 1
    decode_into(out, dense)
    assert out.tolist() == [1] * 5 + [0] * 5
    with pytest.raises(ProtocolError, match="3 keys but 2 values"):
        decode_into(out, Part(PULL, np.arange(3, dtype=np.int32), np.ones(2, np.float32)))


def test_bundles_end_with_their_only_terminal_part():
    with pytest.raises(ProtocolError):
        send_bundle(None, [Part(PULL), Part(PULL)], 0)
    with pytest.raises(ProtocolError):
        send_bundle(None, [Part(CORE)], 0)
    with pytest.raises(TypeError, match="int32 keys and float32 values"):
        Part(PUSH, np.arange(2), np.ones(2, np.float32))


def test_polling_default_spins_only_with_a_core_per_rank(monkeypatch):
    monkeypatch.setenv("MPISPARSE_PS_POLL", "spin")
    assert default_max_sleep(64) == 0.0
    monkeypatch.setenv("MPISPARSE_PS_POLL", "300")
    assert default_max_sleep(2) == pytest.approx(3e-4)
    monkeypatch.setenv("MPISPARSE_PS_POLL", "-1")
    with pytest.raises(ValueError, match="must be >= 0"):
        default_max_sleep(2)


# --------------------------------------------------------------------------- Slim-DP math
def test_comm_set_sizes_and_the_byte_formula():
    assert comm_set_sizes(1000, 0.3, 0.15) == (150, 150)
    assert comm_set_sizes(1000, 1.0, 1.0) == (1000, 0)
    assert comm_set_sizes(1000, 0.3, 0.0) == (0, 300)
    with pytest.raises(ValueError, match=r"--core is 0.5; allowed range is \[0, --density = 0.3\]"):
        comm_set_sizes(1000, 0.3, 0.5)
    shards = make_shards(FusionLayout([("x", (1000,))]), Roles(2, 1))
    assert bytes_per_direction(shards, 0.3, 0.15) == 4 * round((2 * 0.3 - 0.15) * 1000)


def test_significance_core_and_explorer():
    rng = np.random.default_rng(0)
    w = rng.standard_normal(200).astype(np.float32)
    g = (100 * rng.standard_normal(200)).astype(np.float32)
    s = significance(w, g, None)  # auto c: |w| and c|g| have the same mean
    c = np.mean(np.abs(w)) / np.mean(np.abs(g))
    np.testing.assert_allclose(s, np.abs(w) + c * np.abs(g), rtol=1e-5)
    np.testing.assert_array_equal(significance(w, g, 0.0), np.abs(w))
    core = select_core(w, g, 30, 2.0)
    assert core.dtype == np.int32 and np.all(np.diff(core) > 0)
    assert set(core) == set(np.argsort(-(np.abs(w) + 2 * np.abs(g)))[:30])
    outside = complement(200, core)
    assert outside.size == 170 and not set(outside) & set(core)
    e1 = sample_explorer(outside, 40, np.random.default_rng(5))
    e2 = sample_explorer(outside, 40, np.random.default_rng(5))
    assert e1.size == 40 and np.array_equal(e1, e2) and not set(e1) & set(core) and np.all(np.diff(e1) > 0)


def test_slimdp_server_at_alpha_beta_one_computes_what_plumpdp_computes():
    shard = make_shards(LAYOUT, Roles(3, 1))[0]
    w0 = np.random.default_rng(1).standard_normal(LAYOUT.n).astype(np.float32)
    ctx = lambda opts: ServerContext(LAYOUT, shard, 2, 1.0, opts)  # noqa: E731
    slim = SlimDPServer(ctx({"core": 1.0, "core_every": 2}), w0)
    plump = PlumpDPServer(ctx({}), w0)
    assert slim.C == LAYOUT.n and slim.E == 0 and np.array_equal(slim.core, np.arange(LAYOUT.n))
    for t in range(4):
        deltas = [np.random.default_rng([t, k]).standard_normal(LAYOUT.n).astype(np.float32) for k in range(2)]
        kind = PUSH if (t + 1) % 2 else 0x5300 + 2  # PUSH_FULL every second round
        slim.apply([(k, slim.receive(k, [Part(kind, values=d)])) for k, d in enumerate(deltas)])
        plump.apply([(k, plump.receive(k, [Part(PUSH, values=d)])) for k, d in enumerate(deltas)])
        assert np.array_equal(slim.w, plump.w)
        assert np.array_equal(slim.reply(0)[-1].values, plump.reply(0)[-1].values)
    assert slim.reselections == []  # beta = 1: the core never changes, no keys are re-sent


# --------------------------------------------------------------------------- DGS math
def _worker_ctx(cls, density, momentum, **opts):
    shards = make_shards(LAYOUT, Roles(2, 1))
    return cls(WorkerContext(LAYOUT, shards, 0, 1, density, opts, lr=0.1, momentum=momentum))


def _pushed(bundles):
    out = np.zeros(LAYOUT.n, np.float32)
    decode_into(out, bundles[0][0])
    return out


@pytest.mark.parametrize("m", [0.0, 0.9])
def test_dgs_worker_is_samomentum_as_on_the_slides(m):
    """Velocity form of the slides: a = m u + eta g; send sparsify(a); u = a on sent, a / m on unsent."""
    wk = _worker_ctx(DGSWorker, 0.05, m)
    pieces = [(j, s.offset, s.end) for j, s in enumerate(LAYOUT.layers)]
    u = np.zeros(LAYOUT.n)
    r = np.zeros(LAYOUT.n)  # m = 0: the plain residual of the slides' worker algorithm
    w = np.zeros(LAYOUT.n, np.float32)
    for t in range(8):
        g = np.random.default_rng(t).standard_normal(LAYOUT.n).astype(np.float32)
        sent = _pushed(wk.make_push(w, g))
        a = (m * u + 0.1 * g) if m else (r + 0.1 * g)
        mask = np.zeros(LAYOUT.n, bool)
        for _, lo, hi in pieces:  # per layer: keep the top R% of |a|
            k = max(1, round(0.05 * (hi - lo)))
            mask[lo + np.argsort(-np.abs(a[lo:hi]))[:k]] = True
        np.testing.assert_allclose(sent, np.where(mask, a, 0), rtol=1e-5, atol=1e-6)
        if m:
            u = np.where(mask, a, a / m)
        else:
            r = np.where(mask, 0, a)
        assert wk.last_pushed == int(layer_k(LAYOUT, 0.05).sum())


def test_dgs_at_density_one_pushes_what_asgd_pushes():
    dgs, asgd = _worker_ctx(DGSWorker, 1.0, 0.7), _worker_ctx(ASGDWorker, 1.0, 0.7)
    w = np.ones(LAYOUT.n, np.float32)
    for t in range(5):
        g = np.random.default_rng(t).standard_normal(LAYOUT.n).astype(np.float32)
        assert np.array_equal(_pushed(dgs.make_push(w, g)), _pushed(asgd.make_push(w, g)))


def test_dgs_server_tracks_model_differences_losslessly():
    """However the downlink is compressed, what each worker received plus what is pending is M."""
    shard = make_shards(LAYOUT, Roles(4, 1))[0]
    srv = DGSServer(ServerContext(LAYOUT, shard, 3, 0.1, {"server_density": 0.02}), np.zeros(LAYOUT.n, np.float32))
    received = np.zeros((3, LAYOUT.n), np.float32)
    rng = np.random.default_rng(0)
    for t in range(30):
        k = int(rng.integers(3))
        keys = np.sort(rng.choice(LAYOUT.n, 20, replace=False))
        srv.apply([(k, srv.receive(k, [encode(PUSH, keys, rng.standard_normal(20), LAYOUT.n)]))])
        part = srv.reply(k)[0]
        assert part.kind == PULL and part.keys.size == int(layer_k(LAYOUT, 0.02).sum())  # sparse downlink
        decode_into(received[k], part, mode="add")
        np.testing.assert_allclose(received + (srv.M - srv.v), np.broadcast_to(srv.M, received.shape), atol=1e-5)
    for k in range(3):
        diff, model = srv.final_parts(k)
        assert diff.kind == DIFF and model.kind == MODEL
        decode_into(received[k], diff, mode="add")
        np.testing.assert_allclose(received[k], model.values, atol=1e-5)


def test_layerwise_topk_keeps_k_per_layer():
    x = np.random.default_rng(3).standard_normal(LAYOUT.n).astype(np.float32)
    keys = layerwise_topk(x, [(j, s.offset, s.end) for j, s in enumerate(LAYOUT.layers)], 0.1)
    counts = [np.sum((keys >= s.offset) & (keys < s.end)) for s in LAYOUT.layers]
    assert counts == [30, 3, 15, 1] == layer_k(LAYOUT, 0.1).tolist()


# --------------------------------------------------------------------------- registry, CLI
def test_ps_schemes_are_registered_in_the_ps_runtime():
    from mpisparse.ps.scheme import PSScheme
    from mpisparse.runtimes import runtime_of, schemes_of

    assert schemes_of("ps") == ["asgd", "dgs", "plumpdp", "slimdp"]
    for name in ("plumpdp", "slimdp", "asgd", "dgs"):
        assert issubclass(SCHEMES[name], PSScheme) and runtime_of(name).name == "ps"
        assert SCHEMES[name].min_world_size == 2
    assert SCHEMES["slimdp"].mode == "sync" and SCHEMES["dgs"].mode == "async"


@pytest.mark.parametrize("args, message", [
    (["train", "-n", "1", "--scheme", "slimdp"], "scheme 'slimdp' needs at least 2 ranks; -n is 1"),
    (["bench", "step", "-n", "1", "--scheme", "dgs"], "scheme 'dgs' needs at least 2 ranks; -n is 1"),
    (["train", "-n", "2", "--scheme", "dgs", "--servers", "2"], "--servers 2 leaves no worker among 2 ranks"),
    (["bench", "step", "-n", "3", "--scheme", "asgd", "--servers", "3"], "--servers 3 leaves no worker among 3"),
    (["train", "-n", "2", "--scheme", "dense", "--servers", "1"], "--servers applies to the parameter-server"),
    (["train", "-n", "3", "--scheme", "slimdp", "--density", "0.3", "--core", "0.5"],
     "--core is 0.5; the core is part of the communication set, allowed range is [0, --density = 0.3]"),
    (["train", "-n", "3", "--scheme", "dgs", "--sam-momentum", "1"], "--sam-momentum is 1.0; allowed range is [0, 1)"),
    (["train", "-n", "3", "--scheme", "asgd", "--resume"], "--resume needs --checkpoint DIR"),
    (["train", "-n", "3", "--scheme", "asgd", "--server-density", "0.1"], "--server-density is an option of dgs"),
])
def test_bad_ps_options_fail_in_one_line_before_mpi(args, message, tmp_path):
    res = CliRunner().invoke(cli, [a.replace("{tmp}", str(tmp_path)) for a in args])
    assert res.exit_code == 2, res.output
    assert message in res.output, res.output
    assert "Traceback" not in res.output
    assert "mpi4py.MPI" not in sys.modules or not sys.modules["mpi4py.MPI"].Is_initialized()
