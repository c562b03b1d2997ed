"""mpisparse.torch as a Horovod drop-in: exports, an Optimizer subclass, synchronize/skip, join under MPI."""

import pytest
import torch

import mpisparse.torch as hvd
from conftest import TORCH_CASES, SelfComm, rank_case, rank_script


def _setup(**kw):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, opt, hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), comm=SelfComm(),
                                                **kw)


def _backward(model):
    model(torch.ones(3, 4)).sum().backward()


def test_exports_what_a_horovod_script_uses():
    for name in ("init", "rank", "size", "local_rank", "local_size", "allreduce", "allgather", "broadcast",
                 "broadcast_object", "broadcast_parameters", "broadcast_optimizer_state", "join", "Compression",
                 "Average", "Sum", "DistributedOptimizer", "comm_hook"):
        assert callable(getattr(hvd, name)) or name in ("Average", "Sum"), name
    assert hvd.Compression.fp16 is not hvd.Compression.none


def test_is_the_wrapped_optimizer_and_schedulers_work():
    model, opt, dist = _setup()
    assert isinstance(dist, torch.optim.SGD) and isinstance(dist, torch.optim.Optimizer)
    assert dist.param_groups is opt.param_groups and dist.state is opt.state
    sched = torch.optim.lr_scheduler.StepLR(dist, step_size=1, gamma=0.5)
    for _ in range(2):
        dist.zero_grad()
        _backward(model)
        assert dist.step() is True
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.025)
    state = dist.state_dict()
    assert {"state", "param_groups", "scheme", "steps"} <= set(state) and state["steps"] == 2
    assert len(opt.state) == 2  # momentum buffers live in the shared state
    dist.load_state_dict(state)
    assert dist.steps == 2


def test_synchronize_then_clip_then_step_without_a_second_exchange():
    model, _, dist = _setup()
    dist.zero_grad()
    _backward(model)
    assert dist.synchronize() is True
    calls = []
    dist.scheme.step = lambda buf: calls.append(1)  # a second exchange would be recorded
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
    before = model.weight.detach().clone()
    with dist.skip_synchronize():
        assert dist.step() is True
    assert not calls
    assert (before - model.weight).abs().max() <= 0.1 * 1e-3 + 1e-9  # the clipped gradient was applied


def test_backward_passes_accumulate_locally():
    model, _, dist = _setup(backward_passes_per_step=2)
    before = model.weight.detach().clone()
    dist.zero_grad()
    _backward(model)
    assert dist.step() is False and torch.equal(before, model.weight)  # no exchange, no step yet
    dist.zero_grad()  # keeps the local sum while accumulating
    _backward(model)
    assert dist.step() is True and dist.skipped_steps == 0
    assert torch.allclose(before - model.weight, torch.full_like(before, 0.1 * 2 * 3))


def test_snapshot_only_near_overflow():
    model, _, dist = _setup()
    for _ in range(3):
        dist.zero_grad()
        _backward(model)
        dist.step()
    assert dist.snapshots == 1  # the first step (|parameter| not known yet) only


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="op is 'max'"):
        _setup(op="max")
    with pytest.raises(ValueError, match="backward_passes_per_step is 0"):
        _setup(backward_passes_per_step=0)
    with pytest.raises(ValueError, match="scaler is float; allowed: a torch.amp.GradScaler or None"):
        _setup(scaler=1.0)
    w = torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match="parameter 'w' is torch.complex64; allowed: floating-point"):
        hvd.DistributedOptimizer(torch.optim.SGD([w], lr=0.1), named_parameters=[("w", w)], comm=SelfComm())


def test_the_exchange_ends_backward_and_a_skipped_one_leaves_nan_gradients():
    """DDP's contract: the exchange runs in the callback queued at the end of backward; a non-finite step
    leaves NaN in every .grad (so a GradScaler skips it too) and step() returns False without stepping."""
    model, _, dist = _setup()
    calls = []
    step_of = dist.scheme.step
    dist.scheme.step = lambda *a, **k: calls.append(1) or step_of(*a, **k)
    dist.zero_grad()
    _backward(model)
    assert calls == [1] and dist._synchronized  # exchanged before backward() returned
    assert dist.step() is True and calls == [1]  # step() only applies
    before = model.weight.detach().clone()
    dist.zero_grad()
    (model(torch.ones(3, 4)).sum() * float("inf")).backward()
    assert all(torch.isnan(p.grad).all() for p in model.parameters())
    assert dist.step() is False and dist.skipped_steps == 1 and torch.equal(before, model.weight)
    dist.close()
    dist.zero_grad()
    _backward(model)  # hooks removed: no exchange, so step() does it (the path of join() and of hand-set grads)
    assert calls == [1] and not dist._synchronized  # (the skipped step never reached the scheme)
    assert dist.step() is True and calls == [1, 1]


@pytest.mark.mpi
@pytest.mark.timeout(200)
def test_sum_average_accumulation_and_join_on_two_ranks():
    rank_case("torch_hvd", 2, family=TORCH_CASES)


@pytest.mark.mpi
@pytest.mark.timeout(200)
@pytest.mark.parametrize("ranks", [1, 2])
def test_ddp_contract_amp_loop_clipping_and_16_bit_parameters(ranks):
    """tests/mpi/check_torch_amp.py: .grad holds the aggregate when backward() returns; GradScaler's loop with
    one rank overflowing skips on every rank; clipping clips the aggregate; error feedback in unscaled units
    (bit for bit against an unscaled run); bfloat16 and float16 parameters."""
    rank_case("torch_amp", ranks, family=TORCH_CASES)


def test_overlap_plan_and_refusals():
    from mpisparse.torch.overlap import overlap_refusal, plan_buckets

    # last layer first, each bucket at least the cap unless it is the last
    assert plan_buckets([5, 1, 1, 8], 6) == [[3], [2, 1, 0]]
    assert plan_buckets([5, 1, 1, 8], 100) == [[3, 2, 1, 0]]
    assert plan_buckets([2, 2, 2], 2) == [[2], [1], [0]]
    assert overlap_refusal("dense", {}) is None
    assert overlap_refusal("topk", {"layerwise": True}) is None
    assert overlap_refusal("threshold", {"threshold": 0.1}) is None
    for scheme, opts in (("topk", {}), ("cltk", {}), ("deft", {}), ("threshold", {}), ("gtopk", {})):
        assert overlap_refusal(scheme, opts).startswith(f"overlap=True: scheme {scheme!r} cannot run bucket by bucket")


def test_overlap_refuses_a_whole_vector_scheme_in_one_line():
    with pytest.raises(ValueError, match=r"overlap=True: scheme 'cltk' cannot run bucket by bucket \(.*\); allowed:"):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                                 comm=SelfComm(), scheme="cltk", density=0.5, overlap=True)


@pytest.mark.mpi
@pytest.mark.timeout(200)
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_overlap_equals_the_plain_step(ranks):
    rank_case("torch_overlap", ranks, family=TORCH_CASES)


@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.timeout(200)
def test_overlap_equals_the_plain_step_on_cuda():
    """The same check with the model on the GPU: the hook's copy on torch's stream, the bucket's exchange on
    the second thread's."""
    from gpu_emu.gpu import require_gpu

    require_gpu()
    if not torch.cuda.is_available():
        pytest.fail("CuPy sees a GPU but torch has no CUDA (a CPU build of torch?)")
    rank_script("torch_overlap", 2, "--cuda", label="torch_overlap (cuda)", timeout=150)


def test_update_is_the_fusion_buffer_seen_as_grad():
    """The write-back makes each ``.grad`` a view of the fusion buffer (no copy); both zero_grad modes then
    step exactly as the local optimizer does (W=1: the update is the gradient)."""
    model, opt, dist = _setup()
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 2)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for set_to_none in (True, False, False, True):
        dist.zero_grad(set_to_none=set_to_none)
        ref_opt.zero_grad(set_to_none=set_to_none)
        _backward(model)
        _backward(ref)
        assert dist.step()
        ref_opt.step()
        for p, v in zip(dist.params, dist._grad_views):
            assert p.grad.data_ptr() == v.data_ptr()
        for a, b in zip(model.parameters(), ref.parameters()):
            assert torch.equal(a, b)


def test_overlap_by_default_where_the_scheme_allows(capsys):
    from mpisparse.torch.overlap import default_overlap

    class TwoRanks(SelfComm):  # no MPI communicator to duplicate
        size = 2

    assert not default_overlap(SelfComm(), "cltk", {})  # one rank: nothing to overlap, nothing said
    assert capsys.readouterr().err == ""
    for _ in range(2):
        assert not default_overlap(TwoRanks(), "cltk", {})
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "scheme 'cltk' cannot run bucket by bucket" in err  # once, one line
    assert not default_overlap(TwoRanks(), "dense", {})
    assert "no MPI communicator to duplicate" in capsys.readouterr().err
    model, opt, dist = _setup()
    assert dist.overlap is None  # overlap=None on one rank: the plain step
