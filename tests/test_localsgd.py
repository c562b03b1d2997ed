"""``localsgd``: local SGD and DiLoCo's outer step (tests/mpi/check_localsgd.py at 1-4 ranks), its outer step
as a pure function, and its refusals (one line, exit 2 before MPI starts)."""

import numpy as np
import pytest

pytest.importorskip("torch")

from conftest import TORCH_CASES, rank_case  # noqa: E402


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_local_sgd_and_diloco_equal_the_numpy_reference(ranks):
    """Two periods and a step of each rank's trajectory, the bytes and the density; H = 1 is dense SGD; a NaN
    is skipped everywhere; a restored state continues the same; at 2 ranks train's resume mid-period."""
    rank_case("localsgd", ranks, family=TORCH_CASES)


def test_the_outer_step_is_sgd_with_nesterov_momentum_as_torch_has_it():
    import torch

    from mpisparse.schemes.localsgd import outer_step

    rng = np.random.default_rng(0)
    start, deltas = rng.standard_normal(7), [rng.standard_normal(7) for _ in range(3)]
    p = torch.nn.Parameter(torch.tensor(start))
    sgd = torch.optim.SGD([p], lr=0.7, momentum=0.9, nesterov=True)
    theta, velocity = start, None
    for d in deltas:  # torch's SGD given the outer gradient as the gradient of theta
        p.grad = torch.tensor(d)
        sgd.step()
        theta, velocity = outer_step(theta, d, velocity, 0.7, 0.9)
        np.testing.assert_allclose(theta, p.detach().numpy(), rtol=1e-12)
    plain, _ = outer_step(start, deltas[0], None, 1.0, 0.0)  # lr 1, no momentum: theta_0 - Delta, the mean
    np.testing.assert_allclose(plain, start - deltas[0], rtol=0)


@pytest.mark.parametrize("args, message", [
    (["--local-steps", "0"], "--local-steps is 0; allowed range is [1, inf]"),
    (["--outer-lr", "0"], "--outer-lr is 0.0; allowed range is (0, inf]"),
    (["--outer-momentum", "1"], "--outer-momentum is 1.0; allowed range is [0, 0.999]"),
    (["--overlap"], "--overlap does not apply to scheme 'localsgd' (it exchanges parameters after the optimizer's"),
    (["--wire-dtype", "float16"], "scheme 'localsgd' sends float32 values only"),
    (["--mp-stages", "2", "--dp-scheme", "localsgd", "--scheme", "dense"],
     "--dp-scheme localsgd averages parameters every --local-steps steps"),
])
def test_bad_options_are_one_line_and_exit_2(args, message):
    from click.testing import CliRunner

    from mpisparse.cli import cli

    if "--dp-scheme" not in args:
        args = ["--scheme", "localsgd", *args]
    res = CliRunner().invoke(cli, ["train", "-n", "2", *args])
    assert res.exit_code == 2 and message in res.output, res.output
    assert len([line for line in res.output.splitlines() if line.startswith("Error")]) == 1


def test_bench_step_refuses_it_in_one_line():
    from click.testing import CliRunner

    from mpisparse.cli import cli

    res = CliRunner().invoke(cli, ["bench", "step", "-n", "2", "--scheme", "localsgd"])
    assert res.exit_code == 2, res.output
    assert "scheme 'localsgd' averages parameters" in res.output and "time gradients only" in res.output
