"""Pipeline split, hybrid layout, the dlrm model and the pipeline options' checks (no MPI)."""

import sys

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from mpisparse.cli import cli  # noqa: E402
from mpisparse.models.nets import build_model  # noqa: E402
from mpisparse.mp.config import check_mp_options, parse_split_after  # noqa: E402
from mpisparse.mp.stages import (balanced_cuts, layer_parameters, pipeline_layers, plan_stages,  # noqa: E402
                                    stage_module)
from mpisparse.mp.topology import HybridLayout  # noqa: E402


def model(name, image=None):
    torch.manual_seed(0)
    shape = (1, 8, 8) if (image if image is not None else name == "cnn") else (64,)
    return build_model(name, input_shape=shape, num_classes=10)


@pytest.mark.parametrize("name", ["mlp", "cnn", "dlrm"])
def test_the_chain_of_layers_computes_the_model(name):
    net = model(name)
    x = torch.randn(5, 1, 8, 8) if name == "cnn" else torch.randn(5, 64)
    chain = torch.nn.Sequential(*[m for _, m in pipeline_layers(net)])
    torch.testing.assert_close(chain(x), net(x), rtol=0, atol=0)
    # and the stages, one after the other, compute it too
    for stages in (2, 3):
        plan = plan_stages(net, stages)
        h = x
        for s in range(stages):
            h = stage_module(net, plan, s)(h)
        torch.testing.assert_close(h, net(x), rtol=0, atol=0)


def test_balanced_split_of_the_mlp_cuts_after_the_relus():
    net = model("mlp")
    names = [n for n, _ in pipeline_layers(net)]
    assert names == ["net.0", "net.1", "net.2", "net.3", "net.4", "net.5"]
    assert layer_parameters(pipeline_layers(net)) == [0, 8320, 0, 16512, 0, 1290]
    assert plan_stages(net, 2).split_after == ["net.2"]       # 8,320 | 17,802 (not 24,832 | 1,290)
    plan = plan_stages(net, 3)
    assert plan.split_after == ["net.2", "net.4"]
    assert plan.stage_parameters == [8320, 16512, 1290]
    assert plan.stage_layers == [["net.0", "net.1", "net.2"], ["net.3", "net.4"], ["net.5"]]


def test_balanced_split_of_the_cnn_and_dlrm():
    assert plan_stages(model("cnn"), 2).split_after == ["features.4"]  # after the max pool
    plan = plan_stages(model("dlrm"), 2)
    assert plan.split_after == ["bottom.6"]
    assert plan.stage_parameters == [181056, 175258]


def test_balanced_cuts_minimise_the_largest_stage():
    assert balanced_cuts([5, 5, 5, 5], 2) == [1]
    assert balanced_cuts([1, 0, 1, 0, 8], 2) == [3]
    assert balanced_cuts([9, 0, 1, 0, 1, 0, 1], 2) == [1]
    assert balanced_cuts([3, 3, 3], 3) == [0, 1]
    with pytest.raises(ValueError, match="4 stages need 4 layers with parameters; the model has 3"):
        balanced_cuts([3, 0, 3, 3], 4)


def test_named_splits_and_their_errors():
    net = model("dlrm")
    plan = plan_stages(net, 3, ["bottom.4", "top.3"])  # DCT paper, Sec. 3.1: after two layers of each MLP
    assert plan.stage_layers[1] == ["bottom.5", "bottom.6", "bottom.7", "bottom.8", "top.0", "top.1", "top.2",
                                    "top.3"]
    with pytest.raises(ValueError, match=r"--split-after 'net.9' is not a layer of this model; its layers: net.0"):
        plan_stages(model("mlp"), 2, ["net.9"])
    with pytest.raises(ValueError, match="names 1 layer.* but --mp-stages 3 needs 2"):
        plan_stages(model("mlp"), 3, ["net.2"])
    with pytest.raises(ValueError, match="distinct and in forward order"):
        plan_stages(model("mlp"), 3, ["net.4", "net.2"])
    with pytest.raises(ValueError, match="'net.5' is the last layer"):
        plan_stages(model("mlp"), 2, ["net.5"])
    with pytest.raises(ValueError, match=r"stage 1 \(net.2\) has no trainable parameters"):
        plan_stages(model("mlp"), 3, ["net.1", "net.2"])
    with pytest.raises(ValueError, match="ResNet18 cannot be split into pipeline stages"):
        plan_stages(build_model("resnet18", input_shape=(3, 8, 8), num_classes=10), 2)
    assert parse_split_after(" net.2 , net.4") == ["net.2", "net.4"]
    with pytest.raises(ValueError, match="empty layer name"):
        parse_split_after("net.2,,net.4")


def test_dlrm_shapes_follow_the_paper():
    net = model("dlrm")
    widths = [m.out_features for _, m in pipeline_layers(net) if isinstance(m, torch.nn.Linear)]
    assert widths == [512, 256, 64, 16, 512, 256, 128, 10]
    relus = [n for n, m in pipeline_layers(net) if isinstance(m, torch.nn.ReLU)]
    assert relus == ["bottom.2", "bottom.4", "bottom.6", "bottom.8", "top.1", "top.3", "top.5"]


def test_hybrid_layout():
    lay = HybridLayout(6, 3)
    assert lay.replicas == 2
    assert [lay.stage_of(r) for r in range(6)] == [0, 1, 2, 0, 1, 2]
    assert [lay.replica_of(r) for r in range(6)] == [0, 0, 0, 1, 1, 1]
    assert lay.pipeline_ranks(1) == [3, 4, 5] and lay.group_ranks(2) == [2, 5]
    with pytest.raises(ValueError, match="3 ranks cannot run pipelines of --mp-stages 2"):
        HybridLayout(3, 2)


def opts(**kw):
    base = dict(model="mlp", data="digits", schemes=("dct-mp",), stages=2, split_after=[], micro_batches=1,
                batch_size=32, dp_scheme=None, dp_density=None)
    base.update(kw)
    return base


def test_check_mp_options():
    assert check_mp_options(**opts()) is True
    assert check_mp_options(**opts(schemes=("topk",), stages=1)) is False
    for kw, msg in [
        (dict(world=3), "-n 3 is not divisible by --mp-stages 2"),
        (dict(stages=1), "scheme 'dct-mp' sparsifies activations between pipeline stages: it needs --mp-stages S"),
        (dict(schemes=("topk",)), "--scheme topk is not a pipeline scheme"),
        (dict(schemes=("topk",), stages=1, micro_batches=2), "--micro-batches only apply to pipeline runs"),
        (dict(model="resnet18", data="cifar10"), "--model resnet18 cannot be split"),
        (dict(micro_batches=33), r"--micro-batches is 33; allowed range is \[1, --batch-size 32\]"),
        (dict(split_after=["net.7"]), "'net.7' is not a layer"),
        (dict(stages=7), "7 stages need 7 layers with parameters"),
    ]:
        with pytest.raises(ValueError, match=msg):
            check_mp_options(**opts(**kw))


@pytest.mark.parametrize("args, message", [
    (["-n", "3", "--mp-stages", "2"], "-n 3 is not divisible by --mp-stages 2"),
    (["--scheme", "dct-mp"], "it needs --mp-stages S with S >= 2, got 1"),
    (["--mp-stages", "2", "--split-after", "net.9"], "--split-after 'net.9' is not a layer of this model"),
    (["--mp-stages", "2", "--scheme", "dct-mp", "--mp-threshold", "x"], "'x' is not one of 'topk', 'laplace'"),
    (["--mp-stages", "2", "--scheme", "topk"], "pass topk as --dp-scheme"),
    (["--dp-scheme", "dct"], "--dp-scheme only apply to pipeline runs"),
    (["--mp-stages", "2", "--dp-scheme", "dct", "--lifespan", "0"], "--lifespan is 0; allowed range is [1, inf]"),
])
def test_train_pipeline_options_fail_in_one_line_before_mpi(args, message):
    res = CliRunner().invoke(cli, ["train", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output, res.output
    assert "Traceback" not in res.output
    assert "mpi4py.MPI" not in sys.modules or not sys.modules["mpi4py.MPI"].Is_initialized()


def test_bench_step_refuses_the_model_parallel_scheme():
    res = CliRunner().invoke(cli, ["bench", "step", "--scheme", "dct-mp"])
    assert res.exit_code == 2 and "mpisparse train --scheme dct-mp --mp-stages S" in res.output
