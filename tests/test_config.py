"""The typed configurations: one validation per field, the runtime's checks, the agreement across ranks (no MPI)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from conftest import GatherComm
from mpisparse.cli import cli
from mpisparse.config import BenchConfig, ConfigMismatch, MPConfig, TrainConfig, check_agreement
from mpisparse.runtimes import validate

#: MPI here is one process at a time (a command without ``-n``): the unit lane (tests/conftest.py lane_of)
ONE_PROCESS_MPI = True


@pytest.mark.parametrize("kw, message", [
    ({"density": 0.0}, "--density 0.0 is not in the allowed range (0, 1]"),
    ({"density": float("inf")}, "--density inf is not in the allowed range (0, 1]"),
    ({"epochs": 0}, "--epochs is 0; allowed range is an integer >= 1"),
    ({"lr": float("nan")}, "--lr is nan; allowed range is (0, inf)"),
    ({"momentum": 1.0}, "--momentum is 1.0; allowed range is [0, 1)"),
    ({"model": "alexnet"}, "--model is 'alexnet'; allowed values are"),
    ({"model": "lstm", "data": "digits"}, "--model lstm does not fit --data digits"),
    ({"model": "gpt", "data": "synthetic"}, "--model gpt does not fit --data synthetic: the language models"),
    ({"model": "gpt", "gpt_width": 30}, "--gpt-width 30 is not divisible by --gpt-heads 4; allowed: a width"),
    ({"model": "gpt", "gpt_layers": 0}, "--gpt-layers is 0; allowed range is an integer >= 1"),
    ({"model": "gpt", "gpt_context": -1}, "--gpt-context is -1; allowed range is an integer >= 1"),
    ({"model": "mlp", "gpt_heads": 2}, "--gpt-heads sets the size of --model gpt; --model is 'mlp'"),
    ({"steps_per_epoch": -1}, "--steps-per-epoch is -1; allowed range is an integer >= 0"),
    ({"resume": True}, "--resume needs --checkpoint DIR"),
    ({"scheme": "nope"}, "--scheme: unknown scheme 'nope'"),
    ({"scheme": "topk", "scheme_options": {"lifespan": 3}}, "scheme 'topk' has no option --lifespan"),
    ({"scheme": "slimdp", "density": 0.3, "scheme_options": {"core": 0.5}}, "--core is 0.5; the core is part"),
    ({"scheme": "dct-mp"}, "it needs --mp-stages S with S >= 2, got 1"),
    ({"mp": MPConfig(stages=2, dp_density=2.0)}, "--dp-density 2.0 is not in the allowed range (0, 1]"),
    ({"mp": MPConfig(stages=1, micro_batches=2)}, "--micro-batches only apply to pipeline runs"),
    ({"amp": "fp8"}, "--amp is 'fp8'; allowed values are none, bf16, fp16"),
    ({"amp": "bf16", "scheme": "slimdp"}, "--amp bf16 applies to data-parallel schemes; scheme 'slimdp' trains"),
    ({"amp": "fp16", "mp": MPConfig(stages=2)}, "--amp fp16 applies to data-parallel schemes; scheme 'dense' in a pipeline"),
])
def test_train_config_names_the_bad_value(kw, message):
    with pytest.raises(ValueError) as e:
        validate(TrainConfig(**kw))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_data_defaults_to_the_models_bundled_set():
    assert TrainConfig().data == "digits" and TrainConfig(model="resnet18").data == "digits"
    assert TrainConfig(model="gpt").data == TrainConfig(model="lstm").data == "pydoc"
    assert TrainConfig(model="gpt", data="text").data == "text"
    assert TrainConfig(model="gpt", gpt_context=16).seq_len == 16 and TrainConfig(model="lstm", bptt=9).seq_len == 9


@pytest.mark.parametrize("args, message", [
    (["--gpt-width", "30"], "--gpt-width 30 is not divisible by --gpt-heads 4"),
    (["--gpt-layers", "0"], "Invalid value for '--gpt-layers': 0 is not in the range x>=1"),
    (["--data", "digits"], "--model gpt does not fit --data digits"),
])
def test_bad_gpt_sizes_are_one_line_before_mpi(args, message):
    r = CliRunner().invoke(cli, ["train", "--model", "gpt", *args])
    assert r.exit_code == 2 and message in r.output, r.output
    assert len([line for line in r.output.splitlines() if line.startswith("Error")]) == 1


@pytest.mark.parametrize("args, message", [
    (["--amp", "fp8"], "Invalid value for '--amp': 'fp8' is not one of 'none', 'bf16', 'fp16'"),
    (["--amp", "fp16", "--scheme", "asgd"], "--amp fp16 applies to data-parallel schemes; scheme 'asgd'"),
])
def test_bad_amp_is_one_line_before_mpi(args, message):
    r = CliRunner().invoke(cli, ["train", *args])
    assert r.exit_code == 2 and message in r.output, r.output
    assert len([line for line in r.output.splitlines() if line.startswith("Error")]) == 1


def test_amp_a_device_cannot_run_is_named(monkeypatch):
    """``--amp`` is tried on the device: a torch whose autocast does not give the 16-bit dtype is refused."""
    torch = pytest.importorskip("torch")
    from contextlib import nullcontext

    from mpisparse.mpi.device import check_amp_usable

    check_amp_usable("cpu", "bf16"), check_amp_usable("cpu", "fp16"), check_amp_usable("cpu", "none")
    monkeypatch.setattr(torch, "autocast", lambda *a, **k: nullcontext())  # autocast that does nothing
    with pytest.raises(ValueError, match=r"--amp fp16 is not usable on --device cpu with this torch .*autocast "
                                         r"gives torch.float32\); allowed: --amp bf16 or none"):
        check_amp_usable("cpu", "fp16")


def test_validate_fills_the_option_defaults_and_checks_the_world():
    cfg = validate(TrainConfig(scheme="threshold"), world=2)
    assert cfg.scheme_options == {"threshold": None, "wire_dtype": "float32"}  # the declared defaults, filled in
    with pytest.raises(ValueError, match="scheme 'slimdp' needs at least 2 ranks; -n is 1"):
        validate(TrainConfig(scheme="slimdp"), world=1)
    with pytest.raises(ValueError, match="--servers 2 leaves no worker among 2 ranks"):
        validate(BenchConfig(model="ncf", scheme="dgs", servers=2), world=2)
    with pytest.raises(ValueError, match="sparsifies activations between pipeline stages"):
        validate(BenchConfig(model="ncf", scheme="dct-mp"))
    assert validate(BenchConfig(model="ncf", scheme="topk"), world=4).scheme_options == {
        "layerwise": False, "select_kernel": "native", "wire_dtype": "float32"}


def test_agreement_compares_every_field_but_the_per_rank_ones():
    from dataclasses import asdict

    mine = [TrainConfig(scheme="topk"), TrainConfig(scheme="dense")]
    same = [{k: v for k, v in asdict(c).items() if k != "data_dir"} for c in mine]
    check_agreement(GatherComm([same]), mine)
    other = [dict(c, bptt=12) for c in same]  # a field no hand-picked list held
    with pytest.raises(ConfigMismatch, match=r"^ranks disagree on the configuration: bptt: rank 0 has 35, "
                                             r"rank 1 has 12$"):
        check_agreement(GatherComm([other]), mine)
    with pytest.raises(ConfigMismatch, match="schemes: rank 0 has"):
        check_agreement(GatherComm([same[:1]]), mine)


def test_agreement_names_nested_fields_and_the_communicator_settings():
    from dataclasses import asdict

    mine = [TrainConfig(scheme="dct", mp=MPConfig(stages=2), check_collectives=True)]
    theirs = [{k: v for k, v in asdict(c).items() if k != "data_dir"} for c in mine]
    theirs[0]["mp"] = dict(theirs[0]["mp"], micro_batches=4)
    theirs[0]["check_collectives"] = False
    with pytest.raises(ConfigMismatch, match=r"check_collectives: rank 0 has True, rank 1 has False; "
                                             r"mp.micro_batches: rank 0 has 1, rank 1 has 4$"):
        check_agreement(GatherComm([theirs]), mine)


def test_config_differences_ignores_the_named_fields():
    from dataclasses import asdict

    from mpisparse.config import RESUME_FREE_FIELDS, config_differences

    a = asdict(TrainConfig(scheme="dct", scheme_options={"lifespan": 5}))
    b = asdict(TrainConfig(scheme="dct", scheme_options={"lifespan": 7}, epochs=50, checkpoint="x", resume=True,
                           diagnostics=True, cuda_aware=False, max_skipped_steps=3, data_dir="/elsewhere"))
    assert config_differences(a, b, ignore=RESUME_FREE_FIELDS) == ["scheme_options.lifespan"]
    assert "epochs" in config_differences(a, b)


def test_new_fields_are_checked():
    with pytest.raises(ValueError, match="--cuda-aware is 'yes'; allowed values are True, False, None"):
        validate(TrainConfig(cuda_aware="yes"))
    with pytest.raises(ValueError, match="--check-collectives is 1; allowed values are True, False"):
        validate(BenchConfig(model="ncf", check_collectives=1))
    with pytest.raises(ValueError, match=r"--rss-at is \[0\]; allowed: steps in \[1, 12\]"):
        validate(BenchConfig(model="ncf", rss_at=[0]))
    assert validate(BenchConfig(model="ncf", rss_at=[12, 3, 3])).rss_at == [3, 12]


def test_bench_output_is_checked():
    with pytest.raises(ValueError, match="--output is 'grad'"):
        validate(BenchConfig(model="ncf", output="grad"))
    with pytest.raises(ValueError, match="--output gradient overwrites the gradient that --diagnostics re-reads"):
        validate(BenchConfig(model="ncf", scheme="topk", output="gradient", diagnostics=True))
    with pytest.raises(ValueError, match="--output gradient applies to the data-parallel schemes, not to 'asgd'"):
        validate(BenchConfig(model="ncf", scheme="asgd", output="gradient"), 2)
    assert validate(BenchConfig(model="ncf", scheme="dgc", output="gradient")).output == "gradient"


def test_help_shows_common_options_first_then_one_section_per_scheme():
    for cmd in (["train"], ["bench", "step"], ["bench", "exchange"]):
        out = CliRunner().invoke(cli, [*cmd, "--help"]).output
        assert out.index("Options:") < out.index("--density") < out.index("Options of topk:") \
            < out.index("--layerwise"), out
        assert "Options of asgd, dgs:" in out and "--round-robin" in out


@pytest.mark.parametrize("option, value, message", [
    ("--lr", "nan", "--lr is nan; allowed range is (0, inf)"),
    ("--lr", "inf", "--lr is inf; allowed range is (0, inf)"),
    ("--weight-decay", "nan", "--weight-decay is nan; allowed range is [0, inf)"),
    ("--clip", "nan", "--clip is nan; allowed range is [0, inf)"),
    ("--density", "nan", "--density nan is not in the allowed range (0, 1]"),
])
def test_non_finite_options_are_refused_before_mpi_starts(option, value, message):
    """One line naming the value and the range, exit code 2, no MPI job."""
    import subprocess
    import sys
    from pathlib import Path

    p = subprocess.run([sys.executable, "-m", "mpisparse", "train", option, value, "--epochs", "1"],
                       capture_output=True, text=True, timeout=60, cwd=Path(__file__).parent.parent)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("Error:")
