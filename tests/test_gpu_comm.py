"""Device path of the communicator, the CUDA-aware decision and probe, and the GPU of each rank.

The MPI script (tests/mpi/check_gpu_comm.py) runs on the fake device array
(host memory behind ``__cuda_array_interface__``); the ``gpu`` test runs the
same collectives on real CuPy arrays.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import NUMPY_CASES, mpi_run, mpi_script, rank_case
from gpu_emu.gpu import require_gpu
from mpisparse.mpi.device import pick_device

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("local_rank,n,visible,want", [
    (0, 0, [None, None], None),           # no GPU: CPU
    (3, 0, ["0", "1"], None),
    (0, 4, [None] * 4, 0),                # shared host GPUs, round-robin by local rank
    (5, 4, [None] * 8, 1),
    (1, 2, ["0,1", "0,1"], 1),            # same visible set everywhere: still round-robin
    (1, 1, ["0", "1"], 0),                # SLURM bound one GPU per task: each rank's own device 0
    (3, 2, ["0,1", "2,3", "4,5", "6,7"], 0),
])
def test_pick_device(local_rank, n, visible, want):
    assert pick_device(local_rank, n, visible) == want


def test_pick_device_rejects_bad_values():
    with pytest.raises(ValueError, match="local_rank is -1"):
        pick_device(-1, 2, [None])
    with pytest.raises(ValueError, match="n_devices is -2"):
        pick_device(0, -2, [None])


@pytest.mark.mpi
@pytest.mark.parametrize("W", [2, 3])
def test_device_path_probe_and_local_ranks_on_fake_device(W):
    rank_case("gpu_comm", W, family=NUMPY_CASES, label="gpu comm")


@pytest.mark.mpi
def test_info_lists_rank_device_mapping_and_override(tmp_path):
    path = tmp_path / "info.json"
    out = mpi_run(2, ["info", "--no-cuda-aware", "--json", str(path)], module=True)
    r = json.loads(path.read_text())
    assert r["cuda_aware"] is False and r["cuda_aware_how"] == "override"
    assert [x["local_rank"] for x in r["ranks"]] == [0, 1]
    assert all("device" in x and "device_name" in x for x in r["ranks"])
    assert "local rank" in out.stdout and "[override]" in out.stdout


def test_cuda_aware_flags_are_on_the_commands():
    for cmd in (["info"], ["bench", "step"], ["train"]):
        p = subprocess.run([sys.executable, "-m", "mpisparse", *cmd, "--help"], capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
        assert p.returncode == 0 and "--cuda-aware / --no-cuda-aware" in p.stdout, (cmd, p.stdout[-500:])


@pytest.mark.gpu
@pytest.mark.mpi
def test_collectives_on_cupy_arrays():
    require_gpu()
    out = mpi_run(2, [mpi_script("check_gpu_comm.py"), "--cupy"])
    assert "gpu comm (cupy) OK on 2 ranks" in out.stdout


@pytest.mark.mpi
def test_a_host_job_makes_no_cuda_call():
    out = mpi_run(2, [mpi_script("check_host_job.py")])
    assert "host job OK on 2 ranks" in out.stdout


def test_a_claimed_cuda_aware_library_is_not_probed_in_a_host_job():
    from mpisparse.mpi.comm import decide_cuda_aware_how

    def no_gpu_call():
        raise AssertionError("probed")

    # Communicator(host_only=True) passes no communicator: believed, never probed
    assert decide_cuda_aware_how(None, None, library=lambda: True, have_gpu=no_gpu_call,
                                 probe=no_gpu_call) == (True, "library: yes")
