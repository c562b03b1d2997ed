"""The CuPy backend's plumbing: CuPy imported on first use, the CUDA C sources, their compiled kernels,
launch geometry, and the argument checks every GPU kernel shares.

CuPy is imported on first use only (:func:`_cupy`), so the GPU kernel
modules import on a machine without it; calling a kernel there raises
:class:`RuntimeError` ("no GPU/CuPy available").

The CUDA C sources live in ``mpisparse/backend/cuda/*.cu`` (loaded with
:mod:`importlib.resources`, compiled once per device by NVRTC through
``cupy.RawModule``).
"""

from __future__ import annotations

from importlib import resources

import numpy as np

from . import numpy_select as _nk

#: The CUDA C sources of this backend (in ``mpisparse/backend/cuda``).
KERNEL_SOURCES = ("select.cu", "rowwise.cu", "scatter.cu", "segmented.cu", "radix.cu")

#: Threads per block of the element-wise kernels (a multiple of 32).
BLOCK = 256
#: 16-byte loads per thread per iteration of the ``*_vec`` passes (``VILP`` in ``cuda/select.cu``).
VILP = 2
#: Threads of the one-block k-th key search (``KTH_THREADS`` in ``cuda/common.cuh``).
KTH_THREADS = 1024
#: Blocks per SM at most for the grid-stride loops.
BLOCKS_PER_SM = 8

_modules: dict[tuple, object] = {}  # (module, device[, kernel]) -> RawModule / kernel
_sm_count: dict[int, int] = {}


def _cupy():
    try:
        import cupy
    except ImportError as e:  # the CPU-only install
        raise RuntimeError(
            "no GPU/CuPy available: the cupy backend needs CuPy (pip install cupy-cuda12x) "
            "and a CUDA device"
        ) from e
    return cupy


def available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, no device
        return False


#: the package's CUDA headers, in the order a source includes them
HEADERS = ("common.cuh", "radix_select.cuh")


def kernel_source(name: str) -> str:
    """The CUDA C text of ``cuda/<name>`` with the package's headers inlined (what NVRTC compiles)."""
    base = resources.files("mpisparse.backend") / "cuda"
    text = (base / name).read_text()
    for header in HEADERS:
        text = text.replace(f'#include "{header}"', (base / header).read_text())
    return text


def _kernel(module: str, name: str):
    """The compiled kernel ``name`` of ``cuda/<module>`` on the current device (compiled once, cached)."""
    cp = _cupy()
    dev = cp.cuda.runtime.getDevice()
    fn = _modules.get((module, dev, name))
    if fn is None:
        mod = _modules.get((module, dev))
        if mod is None:
            mod = _modules[(module, dev)] = cp.RawModule(code=kernel_source(module), options=("--std=c++14",))
        fn = _modules[(module, dev, name)] = mod.get_function(name)
    return fn


def _grid(n: int, per_thread: int = 1) -> tuple[int]:
    cp = _cupy()
    dev = cp.cuda.runtime.getDevice()
    sms = _sm_count.get(dev)
    if sms is None:
        sms = _sm_count[dev] = int(cp.cuda.Device(dev).attributes["MultiProcessorCount"])
    blocks = -(-max(int(n), 1) // (BLOCK * per_thread))
    return (max(1, min(blocks, sms * BLOCKS_PER_SM)),)


def _tn(dtype) -> str:
    return {4: "f32", 8: "f64"}[np.dtype(dtype).itemsize]


def _in(idt) -> str:
    return {4: "i32", 8: "i64"}[np.dtype(idt).itemsize]


def _key_dtype(dtype):
    return np.uint32 if np.dtype(dtype).itemsize == 4 else np.uint64


_NULL = np.uint64(0)


# --------------------------------------------------------------------------
# argument checks (the NumPy kernels' messages)
# --------------------------------------------------------------------------


def _as_1d_float(x):
    # CuPy arrays as they are; CAI objects (torch CUDA) zero-copy; host arrays copied
    return _nk._as_1d_float(x, _cupy())


def _work(x):
    """What the kernels read: contiguous float32 or float64 (float16 widened exactly)."""
    cp = _cupy()
    if x.dtype == np.float16:
        x = x.astype(np.float32)
    elif x.dtype.itemsize > 8:
        raise TypeError(f"the GPU kernels handle float16/32/64, got dtype {x.dtype}")
    return cp.ascontiguousarray(x)


def _check_scratch(x, scratch) -> None:
    """``scratch`` is accepted for API parity; the GPU kernels need none (they allocate no ``|x|``)."""
    if scratch is None:
        return
    cp = _cupy()
    if not isinstance(scratch, cp.ndarray) or scratch.ndim != 1:
        raise ValueError("scratch must be a 1-D CuPy array")
    if scratch.dtype != x.dtype:
        raise ValueError(f"scratch dtype {scratch.dtype} does not match x dtype {x.dtype}")
