"""GPU path checks that run on a CPU-only machine (quick).

* every CUDA C source of the package compiles with ``nvcc -arch=sm_90``
  (skipped, with the reason, where no ``nvcc`` is installed) and with NVRTC,
  the run-time compiler CuPy uses (skipped where ``libnvrtc`` is absent);
* every mpisparse module imports with CuPy absent, and none imports CuPy;
* the CuPy kernel module offers every NumPy kernel name;
* ``bench select --backend cupy`` without a GPU is a one-line usage error.
"""

from __future__ import annotations

import ctypes
import glob
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mpisparse.backend import cupy_kernels as ck
from mpisparse.backend import cupy_launch
from mpisparse.backend import numpy_kernels as nk

#: MPI here is one process at a time (a command without ``-n``): the unit lane (tests/conftest.py lane_of)
ONE_PROCESS_MPI = True

ROOT = Path(__file__).resolve().parents[1]
CUDA_DIR = ROOT / "mpisparse" / "backend" / "cuda"
SOURCES = sorted(CUDA_DIR.glob("*.cu"))


def test_every_cuda_source_is_listed():
    assert sorted(p.name for p in SOURCES) == sorted(ck.KERNEL_SOURCES)
    # every header is inlined for NVRTC, and no source is left with an include of the package's own
    assert sorted(p.name for p in CUDA_DIR.glob("*.cuh")) == sorted(cupy_launch.HEADERS)
    assert all('#include "' not in cupy_launch.kernel_source(p.name) for p in SOURCES)


def _nvcc() -> str | None:
    return os.environ.get("NVCC") or shutil.which("nvcc") or next(
        (p for p in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc") if os.access(p, os.X_OK)), None)


def test_cuda_sources_compile_with_nvcc_sm90(tmp_path):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("no nvcc on this machine (set NVCC=/path/to/nvcc to run this check)")

    def build(src: Path):
        # device code only, to Hopper machine code (what CuPy's RawModule builds from these files; no host pass)
        cmd = [nvcc, "-arch=sm_90", "-std=c++14", "-Werror", "all-warnings", "-cubin", "-o",
               str(tmp_path / (src.stem + ".cubin")), str(src)]
        return src.name, subprocess.run(cmd, capture_output=True, text=True, timeout=240)

    with ThreadPoolExecutor(max_workers=2) as pool:
        for name, proc in pool.map(build, SOURCES):
            assert proc.returncode == 0, f"nvcc failed on {name}:\n{proc.stderr[-3000:]}"


def _libnvrtc() -> ctypes.CDLL | None:
    candidates = [os.environ.get("MPISPARSE_NVRTC", "")]
    for base in sys.path + ["/usr/local/cuda/lib64", "/usr/lib/x86_64-linux-gnu"]:
        candidates += glob.glob(os.path.join(base, "nvidia", "*", "lib", "libnvrtc.so*"))
        candidates += glob.glob(os.path.join(base, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*"))
        candidates += glob.glob(os.path.join(base, "libnvrtc.so*"))
    for c in candidates:
        if c and "builtins" not in c:
            try:
                return ctypes.CDLL(c)
            except OSError:
                continue
    return None


def test_cuda_sources_compile_with_nvrtc():
    """What CuPy's RawModule does at run time: NVRTC on the text with the package's headers inlined, no system headers."""
    lib = _libnvrtc()
    if lib is None:
        pytest.skip("no libnvrtc here (pip install nvidia-cuda-nvrtc, or set MPISPARSE_NVRTC=/path/libnvrtc.so)")
    for name in ck.KERNEL_SOURCES:
        src = cupy_launch.kernel_source(name).encode()
        assert b"#include" not in src, f"{name}: NVRTC has no system headers"
        prog = ctypes.c_void_p()
        assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, name.encode(), 0, None, None) == 0
        opts = (ctypes.c_char_p * 2)(b"--std=c++14", b"-arch=compute_90")
        rc = lib.nvrtcCompileProgram(prog, 2, opts)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
        assert rc == 0, f"NVRTC failed on {name}:\n{log.value.decode(errors='replace')[-3000:]}"


def test_cupy_kernels_offer_every_numpy_kernel():
    for name in nk.__all__:
        if name != "CHUNK":
            assert callable(getattr(ck, name)), name


_IMPORT_ALL = r"""
import importlib, pkgutil, sys

class NoCupy:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('cupy', 'cupyx', 'cupy_backends'):
            raise ImportError(f'{name} is blocked: a CPU-only machine')
        return None

sys.meta_path.insert(0, NoCupy())
import mpisparse
import mpisparse.cli  # the entry point first, as the console script imports the package
names = ['mpisparse'] + [m.name for m in pkgutil.walk_packages(mpisparse.__path__, 'mpisparse.')]
for name in names:
    if name == 'mpisparse.__main__':
        continue
    importlib.import_module(name)
bad = [m for m in sys.modules if m.split('.')[0] in ('cupy', 'cupyx')]
assert not bad, bad
from mpisparse.backend import cupy_kernels as ck
assert not ck.available()
try:
    ck.topk_abs([1.0, 2.0], 1)
except RuntimeError as e:
    assert 'no GPU/CuPy available' in str(e), e
else:
    raise AssertionError('no error without CuPy')
from mpisparse.mpi import device
assert device.gpu_count() == 0 and device.gpu_names() == []
print(len(names), 'modules imported without CuPy')
"""


def test_every_module_imports_without_cupy():
    proc = subprocess.run([sys.executable, "-c", _IMPORT_ALL], capture_output=True, text=True, timeout=240,
                          cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "modules imported without CuPy" in proc.stdout


def test_bench_select_cupy_without_gpu_is_a_clean_error():
    if ck.available():
        pytest.skip("this machine has a GPU: the benchmark would run")
    proc = subprocess.run([sys.executable, "-m", "mpisparse", "bench", "select", "--backend", "cupy", "--size", "10"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2
    assert "no GPU/CuPy available" in proc.stderr and "Traceback" not in proc.stderr
