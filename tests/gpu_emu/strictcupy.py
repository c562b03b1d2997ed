"""A strict stand-in for CuPy: device arrays that refuse to become NumPy arrays implicitly.

:mod:`gpu_emu.fakecupy` makes device arrays out of a NumPy subclass, so any
NumPy call accepts them silently; that proves the kernels, not that a step
stays on the device.  Here a device array is a *wrapper* around host memory
that behaves as a real ``cupy.ndarray`` does where it matters:

* ``np.asarray(a)`` / ``np.array(a)`` raise ``TypeError("Implicit conversion
  to a NumPy array is not allowed. ...")`` (CuPy's ``__array__``);
* a NumPy ufunc or operator mixing a device array with a ``numpy.ndarray``
  raises ``TypeError`` (CuPy: "Unsupported type"), and so do indices or
  assigned values that are host arrays, and any other NumPy function called
  on a device array (stricter than CuPy, whose NEP-18 dispatch would accept
  some: code that passes here passes on CuPy);
* results of reductions and of integer indexing are 0-d device arrays, as in
  CuPy, so reading a value on the host is always an explicit step.

Every device-to-host copy is counted (:data:`COUNTS`): ``.get()``,
``cupy.asnumpy``, ``float()``, ``int()``, ``bool()``, ``operator.index()``,
``.item()`` and ``.tolist()``; host-to-device copies too
(``cupy.asarray``/``cupy.array`` of host data, ``.set()``).  Copies within
the device (``copy``, ``astype``, slicing) are not transfers.

The selection kernels run as the package's CUDA C compiled with ``g++``
against the CPU emulator of :mod:`gpu_emu.fakecupy` (``RawModule`` here
unwraps the device arrays and hands them to it), or -- ``kernels="host"``,
for tests that run every scheme many times -- as the NumPy kernels behind
the device wall (:func:`host_kernels_module`): only the kernel module is
swapped, the schemes' code is the same.  ``__cuda_array_interface__``
points at host memory, so an MPI handed these arrays directly (a
"CUDA-aware" communicator) reads and writes them as host buffers.

Streams, stream capture and CUDA graphs are :mod:`gpu_emu.fakecupy`'s (a
read back, an assignment or an allocation during a capture raises; ``fill``
and launches are recorded); allocations (arrays owning new memory) are
counted in ``fakecupy.ALLOCS``.

Install with :func:`install` (pytest ``monkeypatch``) or
:func:`install_globally` (a script under ``mpiexec``).
"""

from __future__ import annotations

import operator
import sys
import types

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from . import fakecupy

IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. "
            "Please use `.get()` to construct a NumPy array explicitly.")

#: transfers since the last :func:`reset_counts`
COUNTS = {"d2h": 0, "d2h_bytes": 0, "h2d": 0, "h2d_bytes": 0}
#: the size in bytes of every device-to-host copy since the last reset, in order
D2H_SIZES: list[int] = []


def reset_counts() -> None:
    for key in COUNTS:
        COUNTS[key] = 0
    D2H_SIZES.clear()


def _d2h(nbytes: int) -> None:
    fakecupy.refuse_in_capture("a device-to-host copy")
    COUNTS["d2h"] += 1
    COUNTS["d2h_bytes"] += int(nbytes)
    D2H_SIZES.append(int(nbytes))


def _h2d(nbytes: int) -> None:
    COUNTS["h2d"] += 1
    COUNTS["h2d_bytes"] += int(nbytes)


def _refuse_host(obj, where: str):
    raise TypeError(f"Unsupported type {type(obj)} ({where}): a numpy.ndarray cannot be mixed with "
                    "device arrays; copy it with cupy.asarray() first")


def _unwrap(obj, where: str = "argument"):
    """The host memory behind device arrays (recursing into lists and tuples); host arrays refused."""
    if isinstance(obj, ndarray):
        return obj._a
    if isinstance(obj, np.ndarray):
        _refuse_host(obj, where)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_unwrap(o, where) for o in obj)
    return obj


def _wrap(obj):
    """Device arrays for NumPy results (NumPy scalars become 0-d device arrays, as CuPy returns)."""
    if isinstance(obj, np.ndarray):
        return ndarray(obj)
    if isinstance(obj, np.generic):
        return ndarray(np.asarray(obj))
    if isinstance(obj, tuple):
        return tuple(_wrap(o) for o in obj)
    if isinstance(obj, list):
        return [_wrap(o) for o in obj]
    return obj


class ndarray(NDArrayOperatorsMixin):
    """A device array (host memory behind it) that only leaves the device through explicit copies."""

    __array_priority__ = 100

    def __init__(self, a: np.ndarray):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"strictcupy.ndarray wraps a numpy.ndarray, got {type(a).__name__}")
        if a.base is None:  # memory of its own: an allocation (views, slices and reshapes are not)
            fakecupy.count_allocation(a.nbytes)
        self._a = a

    # ------------------------------------------------------------ refusals
    def __array__(self, *args, **kw):
        raise TypeError(IMPLICIT)

    def __array_function__(self, func, types_, args, kwargs):
        raise TypeError(f"numpy.{func.__name__} on a device array: call the array module's function "
                        "(backend.array_module(x)) instead")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        args = [_unwrap(x, f"input of numpy.{ufunc.__name__}") for x in inputs]
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(_unwrap(o, f"out of numpy.{ufunc.__name__}") for o in out)
        res = getattr(ufunc, method)(*args, **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _wrap(res)

    # ------------------------------------------------------------ interfaces
    @property
    def __cuda_array_interface__(self):
        a = self._a
        return {"shape": a.shape, "typestr": a.dtype.str, "data": (a.ctypes.data, False), "version": 3,
                "strides": None if a.flags.c_contiguous else a.strides, "stream": None}

    def __dlpack__(self, *args, **kw):
        return self._a.__dlpack__(*args, **kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    ndim = property(lambda self: self._a.ndim)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: ndarray(self._a.T))

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (_wrap(v) for v in self._a)

    def __repr__(self):
        return f"strictcupy.ndarray(shape={self.shape}, dtype={self.dtype})"

    # ------------------------------------------------------------ explicit transfers
    def get(self, stream=None, out=None, blocking=True):
        _d2h(self._a.nbytes)
        if out is None:
            return np.array(self._a, copy=True)
        if isinstance(out, ndarray):
            raise TypeError("get(out=) takes a host array")
        out[...] = self._a
        return out

    def set(self, arr, stream=None):
        if isinstance(arr, ndarray):
            raise TypeError("set() takes a host array")
        arr = np.asarray(arr)
        _h2d(arr.nbytes)
        self._a[...] = arr

    def item(self):
        _d2h(self._a.itemsize)
        return self._a.item()

    def tolist(self):
        _d2h(self._a.nbytes)
        return self._a.tolist()

    def _scalar(self, conv):
        if self._a.size != 1:
            raise TypeError("only size-1 device arrays can be converted to Python scalars")
        _d2h(self._a.itemsize)
        return conv(self._a.reshape(()).item())

    def __float__(self):
        return self._scalar(float)

    def __int__(self):
        return self._scalar(int)

    def __bool__(self):
        return self._scalar(bool)

    def __index__(self):
        if self._a.dtype.kind not in "iub":
            raise TypeError("only integer device arrays can be used as an index")
        return self._scalar(operator.index)

    # ------------------------------------------------------------ indexing
    def __getitem__(self, key):
        return _wrap(self._a[_unwrap(key, "index")])

    def __setitem__(self, key, value):
        fakecupy.refuse_in_capture("an element assignment")
        self._a[_unwrap(key, "index")] = _unwrap(value, "assigned value")

    # ------------------------------------------------------------ methods (all on the device)
    def copy(self, order="C"):
        return ndarray(self._a.copy(order=order))

    def astype(self, dtype, copy=True, **kw):
        return ndarray(self._a.astype(dtype, copy=copy))

    def view(self, dtype=None):
        return ndarray(self._a.view(dtype) if dtype is not None else self._a.view())

    def reshape(self, *shape, **kw):
        return ndarray(self._a.reshape(*shape, **kw))

    def ravel(self):
        return ndarray(self._a.ravel())

    def fill(self, value):
        a, v = self._a, _unwrap(value, "fill value")
        fakecupy.enqueue(lambda: a.fill(v))  # recorded when the current stream captures

    def sort(self):
        self._a.sort(kind="stable")

    def argsort(self):
        return ndarray(np.argsort(self._a, kind="stable"))

    def nonzero(self):
        return _wrap(self._a.nonzero())

    def _reduce(name):  # noqa: N805 - a method factory in the class body
        def method(self, *args, **kw):
            kw = {k: _unwrap(v, name) for k, v in kw.items()}
            return _wrap(getattr(self._a, name)(*_unwrap(args, name), **kw))
        method.__name__ = name
        return method

    sum = _reduce("sum")
    min = _reduce("min")
    max = _reduce("max")
    mean = _reduce("mean")
    var = _reduce("var")
    any = _reduce("any")
    all = _reduce("all")
    dot = _reduce("dot")
    cumsum = _reduce("cumsum")
    argmax = _reduce("argmax")
    argmin = _reduce("argmin")
    del _reduce


ndarray.__module__ = "cupy"  # backend.array_module() recognises CuPy arrays by their type's module
ndarray.__qualname__ = "ndarray"


# --------------------------------------------------------------------------- module functions
def asarray(a, dtype=None, order=None):
    if isinstance(a, ndarray):
        return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)
    host = np.array(a, dtype=dtype, copy=True)
    _h2d(host.nbytes)
    return ndarray(host)


def array(a, dtype=None, copy=True, order=None):
    if isinstance(a, ndarray):
        return ndarray(np.array(a._a, dtype=dtype, copy=True))
    return asarray(a, dtype=dtype)


def asnumpy(a, stream=None, out=None):
    if isinstance(a, ndarray):
        return a.get(out=out)
    return np.asarray(a)


def from_dlpack(x):
    """Zero-copy view of a DLPack producer (a CPU torch tensor here: the test's stand-in for a CUDA one)."""
    return ndarray(np.from_dlpack(x))


def get_array_module(*args):
    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else np


def empty(shape, dtype=np.float64, order="C"):
    out = np.empty(shape, dtype=dtype)
    if out.size:
        out.view(np.uint8).fill(fakecupy.POISON)  # reading what nothing wrote shows up
    return ndarray(out)


def empty_like(a, dtype=None):
    return empty(a.shape, a.dtype if dtype is None else dtype)


def zeros_like(a, dtype=None):
    return ndarray(np.zeros(a.shape, a.dtype if dtype is None else dtype))


def _numpy_function(name: str):
    fn = getattr(np, name)

    def device_function(*args, **kw):
        args = _unwrap(args, f"cupy.{name}")
        kw = {k: _unwrap(v, f"cupy.{name}") for k, v in kw.items()}
        return _wrap(fn(*args, **kw))

    device_function.__name__ = name
    return device_function


def _ufunc_with_out(name: str):
    fn = getattr(np, name)

    def device_ufunc(*args, out=None, **kw):
        args = _unwrap(args, f"cupy.{name}")
        if out is not None:
            fn(*args, out=_unwrap(out, f"out of cupy.{name}"), **kw)
            return out
        return _wrap(fn(*args, **kw))

    device_ufunc.__name__ = name
    return device_ufunc


for _name in ("zeros", "ones", "full", "arange", "concatenate", "unique", "argsort", "sort", "where",
              "flatnonzero", "nonzero", "cumsum", "searchsorted", "count_nonzero", "dot", "partition", "isin", "all", "any", "sum", "stack", "repeat", "diff", "argmax"):
    globals()[_name] = _numpy_function(_name)
for _name in ("abs", "absolute", "isfinite", "isnan", "sqrt", "minimum", "maximum", "add", "subtract",
              "multiply", "divide", "square", "logical_not", "logical_and", "equal", "greater_equal", "matmul"):
    globals()[_name] = _ufunc_with_out(_name)
del _name


def ascontiguousarray(a, dtype=None):
    """The array itself when it is already C-contiguous (of ``dtype``), as CuPy's: no copy, no allocation."""
    if isinstance(a, ndarray) and a._a.flags.c_contiguous and (dtype is None or np.dtype(dtype) == a.dtype):
        return a
    return ndarray(np.ascontiguousarray(_unwrap(a, "cupy.ascontiguousarray"), dtype=dtype))


def _sort_stable(a, **kw):  # CuPy's sort is stable; keep the emulation deterministic
    return ndarray(np.sort(_unwrap(a, "cupy.sort"), kind="stable"))


def _argsort_stable(a, **kw):
    return ndarray(np.argsort(_unwrap(a, "cupy.argsort"), kind="stable"))


sort, argsort = _sort_stable, _argsort_stable


def _norm(x, ord=None):
    return _wrap(np.linalg.norm(_unwrap(x, "cupy.linalg.norm"), ord=ord))


linalg = types.SimpleNamespace(norm=_norm)

bool_ = np.bool_
float16, float32, float64 = np.float16, np.float32, np.float64
int8, int32, int64, uint8, uint32, uint64 = np.int8, np.int32, np.int64, np.uint8, np.uint32, np.uint64
cuda = fakecupy.cuda
__version__ = "0.0-strict-emu"


class _Kernel:
    """A compiled emulated kernel; device-array arguments are handed over as their host memory."""

    def __init__(self, kernel):
        self._k = kernel

    def __call__(self, grid, block, args):
        self._k(grid, block, tuple(a._a if isinstance(a, ndarray) else a for a in args))


class RawModule:
    def __init__(self, code: str, options=(), **kw):
        self._m = fakecupy.RawModule(code=code, options=options)

    def get_function(self, name: str):
        return _Kernel(self._m.get_function(name))


# --------------------------------------------------------------------------- the kernel module, swapped
HOST_KERNELS = "gpu_emu.strict_host_kernels"


def host_kernels_module() -> types.ModuleType:
    """The selection kernels' API on device arrays, computed by the NumPy kernels behind the device wall.

    The emulated CUDA kernels cost a fraction of a second per launch; a test
    that runs every scheme many times swaps the kernel module for this one
    (backend's ``cupy`` entry), which unwraps the device arrays, runs
    :mod:`mpisparse.backend.numpy_kernels` on their memory and returns device
    arrays -- the same results (index order aside), with no transfer.  The one
    value that does cross to the host, ``estimate_threshold``'s float, is
    counted as an 8-byte read, and ``segment_norms``' float64 norms as one read
    of theirs (the GPU kernel reads per-tile sums instead).
    """
    from mpisparse import backend
    from mpisparse.backend import numpy_kernels as nk

    def host(x):
        return x._a if isinstance(x, ndarray) else x

    def topk_abs(x, k, *, scratch=None, rng=None, method="auto"):
        return _wrap(nk.topk_abs(host(x), k, rng=rng))

    def threshold_select(x, t, *, scratch=None):
        return _wrap(nk.threshold_select(host(x), t))

    def estimate_threshold(x, k, *, sample=0.01, rng=None):
        t = nk.estimate_threshold(host(x), k, sample=sample, rng=rng)
        _d2h(8)
        return t

    def randomk(n, k, rng):
        return asarray(nk.randomk(n, k, rng))  # drawn on the host, copied (as the CuPy kernel does)

    def segment_norms(x, starts, sizes):
        norms = nk.segment_norms(host(x), starts, sizes)
        _d2h(norms.nbytes)  # the norms come to the host (one read)
        return norms

    def segment_topk_abs(x, starts, sizes, ks, *, rng=None, scratch=None):
        return _wrap(nk.segment_topk_abs(host(x), starts, sizes, ks, rng=rng))

    def rowwise_topk_mask(X, k):
        return _wrap(nk.rowwise_topk_mask(host(X), k))

    def scatter_sum(out, indices, values, counts, scale):
        backend.scatter_sum(host(out), host(indices), host(values), counts, scale)

    mod = types.ModuleType(HOST_KERNELS, host_kernels_module.__doc__)
    mod.__dict__.update(topk_abs=topk_abs, threshold_select=threshold_select,
                        estimate_threshold=estimate_threshold, randomk=randomk,
                        rowwise_topk_mask=rowwise_topk_mask, scatter_sum=scatter_sum,
                        segment_norms=segment_norms, segment_topk_abs=segment_topk_abs,
                        index_dtype=nk.index_dtype)
    return mod


def _use_kernels(kernels: str, setitem) -> None:
    """``emu``: the package's CUDA C on the emulator; ``host``: :func:`host_kernels_module`."""
    from mpisparse import backend

    if kernels == "host":
        setitem(sys.modules, HOST_KERNELS, host_kernels_module())
        setitem(backend._KERNEL_MODULES, "cupy", HOST_KERNELS)
    elif kernels != "emu":
        raise ValueError(f"kernels is {kernels!r}; use 'emu' or 'host'")


def as_cupy_module() -> types.ModuleType:
    """This module's names in a module called ``cupy`` (the backend dispatches on the module's name)."""
    mod = types.ModuleType("cupy", __doc__)
    mod.__dict__.update({k: v for k, v in vars(sys.modules[__name__]).items() if not k.startswith("__")})
    mod.__version__ = __version__
    return mod


def _clear_kernel_caches(setattr_) -> None:
    from mpisparse.backend import cupy_launch, cupy_segments, cupy_select

    setattr_(cupy_launch, "_modules", {})
    setattr_(cupy_launch, "_sm_count", {})
    setattr_(cupy_select, "_cap_hint", {})
    setattr_(cupy_segments, "_TILE_PLANS", {})
    setattr_(cupy_select, "_PASS_PLANS", {})
    fakecupy.reset_graph_state(setattr_)


def install(monkeypatch, kernels: str = "emu") -> types.ModuleType:
    """Make this strict emulator ``cupy`` for the duration of a test (pytest ``monkeypatch``)."""
    mod = as_cupy_module()
    if kernels == "emu":
        print(fakecupy.describe_block_order(), file=sys.stderr)  # shown with a failing test's captured output
    monkeypatch.setitem(sys.modules, "cupy", mod)
    _clear_kernel_caches(monkeypatch.setattr)
    _use_kernels(kernels, monkeypatch.setitem)
    reset_counts()
    return mod


def install_globally(kernels: str = "emu") -> types.ModuleType:
    """Make this strict emulator ``cupy`` for the rest of the process (a script run under ``mpiexec``)."""
    mod = as_cupy_module()
    sys.modules["cupy"] = mod
    _clear_kernel_caches(setattr)
    _use_kernels(kernels, lambda d, k, v: d.__setitem__(k, v))
    reset_counts()
    return mod
