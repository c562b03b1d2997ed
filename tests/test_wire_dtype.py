"""16-bit values on the wire (``--wire-dtype``, :mod:`mpisparse.mpi.wire`): codecs, byte model, refusals, and
the multi-rank checks of tests/mpi/check_wire_dtype.py (float64 references) at 2 and 3 ranks."""

import sys

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import NUMPY_CASES, TORCH_CASES, rank_case
from mpisparse.bench import costmodel as cm
from mpisparse.cli import cli
from mpisparse.mpi import wire
from mpisparse.registry import scheme_class
from mpisparse.results.schema import RunResult


def _values(n=200_000, seed=0):
    g = np.random.default_rng(seed)
    x = (g.standard_normal(n) * 10.0 ** g.integers(-30, 30, n)).astype(np.float32)
    x[:6] = [0.0, -0.0, np.inf, -np.inf, 1.00390625, 1.01171875]  # zeros, infinities, ties to even
    return x


def test_bfloat16_and_float16_round_as_torch_does():
    torch = pytest.importorskip("torch")
    x = _values()
    t = torch.from_numpy(x)
    assert np.array_equal(wire.round_trip(x, "bfloat16"), t.to(torch.bfloat16).float().numpy())
    assert np.array_equal(wire.encode(x, "bfloat16"), t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16))
    sys.modules.pop("torch")  # the NumPy casts, as a rank without torch converts
    try:
        assert np.array_equal(wire.round_trip(x, "bfloat16"), t.to(torch.bfloat16).float().numpy())
        assert np.array_equal(wire.round_trip(x, "float16"), t.to(torch.float16).float().numpy())
    finally:
        sys.modules["torch"] = torch
    assert np.array_equal(wire.round_trip(x, "float16"), t.to(torch.float16).float().numpy())
    nan = wire.round_trip(np.array([np.nan, np.float32(np.nan) * -1], np.float32), "bfloat16")
    assert np.isnan(nan).all()
    assert wire.round_trip(x, "float32") is x


def test_the_byte_model_halves_the_dense_exchange():
    for W in (2, 3, 4, 8):
        n = 1000 * W
        for r in range(W):
            assert 2 * wire.allreduce_bytes(n, W, r, "float16") == wire.allreduce_bytes(n, W, r, "float32")
            assert wire.allreduce_bytes(n, W, r, "bfloat16") == wire.allreduce_bytes(n, W, r, "float16")
    assert wire.allreduce_bytes(10, 1, 0, "float16") == 0
    link = cm.Link(latency=0.0, bandwidth=1e9)
    rates = cm.Rates(stream=0, topk=0, fused=0, scatter=0, segmented=0)
    for scheme in ("dense", "cltk", "deft"):
        full = cm.predict(scheme, 10**7, 0.01, 8, link, rates)["exchange"]
        half = cm.predict(scheme, 10**7, 0.01, 8, link, rates, wire="bfloat16")["exchange"]
        assert half < full
    assert cm.predict("dense", 10**7, 1, 8, link, rates, wire="float16")["exchange"] == pytest.approx(
        cm.predict("dense", 10**7, 1, 8, link, rates)["exchange"] / 2)
    topk = cm.predict("topk", 10**7, 0.01, 8, link, rates, wire="float16")["exchange"]  # indices stay 4 bytes
    assert topk == pytest.approx(cm.predict("topk", 10**7, 0.01, 8, link, rates)["exchange"] * 6 / 8)
    with pytest.raises(ValueError, match="gtopk"):
        cm.predict("gtopk", 10**7, 0.01, 8, link, rates, wire="float16")


def test_a_scheme_that_cannot_carry_16_bit_values_says_so_in_one_line():
    gtopk = scheme_class("gtopk")
    with pytest.raises(ValueError) as e:
        gtopk.validate_options({"wire_dtype": "bfloat16"})
    msg = str(e.value)
    assert "'gtopk'" in msg and "allowed values are float32" in msg and "\n" not in msg
    assert "wire_dtype" not in gtopk.validate_options({"wire_dtype": "float32"})
    assert scheme_class("topk").validate_options({"wire_dtype": "float16"})["wire_dtype"] == "float16"
    with pytest.raises(ValueError, match="--wire-dtype is 'int8'; allowed values are float32, float16, bfloat16"):
        scheme_class("dense").validate_options({"wire_dtype": "int8"})


@pytest.mark.parametrize("args, message", [
    (["train", "--scheme", "gtopk", "--wire-dtype", "float16"], "scheme 'gtopk' sends float32 values only"),
    (["bench", "step", "--scheme", "gtopk", "--wire-dtype", "bfloat16"], "allowed values are float32"),
    (["bench", "step", "--scheme", "dense", "--wire-dtype", "int8"], "'int8' is not one of"),
    (["train", "--scheme", "topk", "--overlap"], "--overlap does not apply to scheme 'topk'"),
    (["train", "--scheme", "dense", "--overlap", "--hierarchical"], "--hierarchical is not allowed"),
])
def test_bad_wire_and_overlap_options_fail_in_one_line_before_mpi(args, message):
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, res.output
    assert message in res.output, res.output
    assert "Traceback" not in res.output
    assert "mpi4py.MPI" not in sys.modules or not sys.modules["mpi4py.MPI"].Is_initialized()


def test_the_help_of_the_commands_names_the_wire_dtype():
    for cmd in (["train"], ["bench", "step"], ["bench", "overlap"]):
        out = CliRunner().invoke(cli, [*cmd, "--help"]).output
        assert "--wire-dtype [float32|float16|bfloat16]" in out, cmd
    assert "--overlap" in CliRunner().invoke(cli, ["train", "--help"]).output


def test_a_result_names_its_baseline():
    base = dict(scheme="dense", runtime="collective", world_size=2, density_target=1.0, density_actual=1.0,
                bytes_sent_per_rank=1.0, phases={}, phases_mean_over_ranks={}, step_seconds=1.0,
                step_seconds_mean_over_ranks=1.0, n=1, config={})
    assert RunResult(**base).label == "dense"
    assert RunResult(**base, wire_dtype="float32", overlap=False).label == "dense"
    r = RunResult(**base, wire_dtype="float16", overlap=True)
    assert r.label == "dense (float16, overlapped)"
    back = RunResult.from_dict(r.to_dict())
    assert (back.wire_dtype, back.overlap) == ("float16", True)


def test_sums_bytes_and_error_feedback_on_2_ranks_and_the_library():
    rank_case(("wire_dtype", "--torch"), 2, family=TORCH_CASES, label="wire_dtype")


def test_sums_bytes_and_error_feedback_on_3_ranks():
    rank_case("wire_dtype", 3, family=NUMPY_CASES)
