"""A NumPy-backed stand-in for the part of CuPy that the GPU backend uses.

Installed as ``sys.modules["cupy"]`` by the tests (never by the package), it
lets the CuPy kernels (:mod:`mpisparse.backend.cupy_kernels`) run unchanged on a machine
without a GPU: arrays are NumPy arrays of a subclass that calls itself
``cupy.ndarray`` (so :func:`mpisparse.backend.array_module` dispatches to the
CuPy kernels), and ``RawModule`` compiles the package's CUDA C sources with
``g++`` against ``emu.hpp`` -- a CPU emulator of blocks, threads,
``__syncthreads`` and warp intrinsics -- and launches them with
cuLaunchKernel-style argument marshalling.  A launch runs its blocks in the
order ``MPISPARSE_EMU_BLOCK_ORDER`` asks for (:func:`block_order`; by default
interleaved, several blocks resident at once), so a kernel whose result
depends on which block runs or finishes first fails here as it could on a
GPU.  Every launch checks each
argument against the kernel's parameter (pointer or scalar, and the scalar's
byte size), as a real launch would silently misread them.  ``empty`` fills
with a poison byte pattern, so reading memory no kernel wrote shows up.

Streams and CUDA graphs are emulated as CuPy has them
(``cuda.Stream(non_blocking=True)``, ``with stream:``, ``begin_capture``,
``end_capture`` returning a graph whose ``launch(stream)`` replays it):
while a stream captures, kernel launches and ``fill`` are recorded, not run
-- each launch's arguments marshalled at capture time, device addresses and
scalars as a real graph holds them -- and a read back, an element
assignment or an allocation raises, as they would break (or escape) a real
capture.  ``CAPTURE["supported"] = False`` makes ``begin_capture`` fail (a
platform without capture).  Every allocation of device memory is counted
(:data:`ALLOCS`, :func:`reset_allocations`).

Only what the backend needs is here; anything else raises AttributeError.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import re
import shutil
import subprocess
import tempfile
import types
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
POISON = 0xA5
__version__ = "0.0-emu"


#: how the emulator orders a launch's blocks (see :func:`block_order`)
ORDER_ENV = "MPISPARSE_EMU_BLOCK_ORDER"
#: the test suite's order: fixed (a failure reproduces by rerunning the test), not the forward one
DEFAULT_ORDER = "interleave:1"
_MODES = {"forward": 0, "reverse": 1, "seed": 2, "interleave": 3}


def block_order() -> tuple[int, int, str]:
    """``(mode, seed, text)`` of ``$MPISPARSE_EMU_BLOCK_ORDER`` (default :data:`DEFAULT_ORDER`).

    ``forward``: blocks 0, 1, 2, ... one after another; ``reverse``: the last
    block first; ``seed:N``: a permutation drawn from N, one block after
    another; ``interleave:N``: that permutation with up to ``EMU_SLOTS``
    (emu.hpp) blocks resident at once, a choice drawn from N deciding which
    one runs to its next barrier.  Each launch draws from N mixed with the
    kernel's name, grid, block and scalar arguments (never with what ran
    before), so a test run alone reproduces the orders it had in the suite.
    """
    text = os.environ.get(ORDER_ENV, "").strip() or DEFAULT_ORDER
    name, _, arg = text.partition(":")
    ok = name in _MODES and (arg.isdigit() if name in ("seed", "interleave") else arg == "")
    if not ok:
        raise ValueError(f"{ORDER_ENV}={text!r}: expected forward, reverse, seed:N or interleave:N "
                         "(N a non-negative integer)")
    return _MODES[name], int(arg or 0), text


def describe_block_order() -> str:
    """One line naming the order in force and how to choose another (printed by :func:`install`)."""
    return (f"emu: blocks run in the order {ORDER_ENV}={block_order()[2]} "
            "(choose forward, reverse, seed:N or interleave:N to rerun another)")


def _launch_seed(seed: int, name: str, grid: int, block: int, scalars: bytes) -> int:
    h = hashlib.blake2b(f"{seed}|{name}|{grid}|{block}|".encode() + scalars, digest_size=8)
    return int.from_bytes(h.digest(), "little")


_SHARED_RE = re.compile(r"(\bextern\s+)?\b__shared__\s+([^;{}()]*);")
_FIRST_DECL_RE = re.compile(r"(.*?)\b([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*)", re.S)
_NEXT_DECL_RE = re.compile(r"([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*)", re.S)


def rewrite_shared(code: str) -> str:
    """Every ``__shared__ T a[N], b;`` as one static copy per resident block and a reference to the running one's.

    ``static T emu_sh_a[EMU_SLOTS][N]; auto& a = emu_sh_a[emu::g_slot];`` (emu.hpp sets ``g_slot`` for the
    thread that runs, so interleaved blocks never share their shared memory).  A form this does not
    understand raises; one it misses fails to compile (emu.hpp defines ``__shared__`` as an error).
    """
    def one(m: re.Match) -> str:
        parts = [p.strip() for p in m.group(2).split(",")]
        first = _FIRST_DECL_RE.fullmatch(parts[0])
        typ = first.group(1).strip() if first else ""
        if not first or not typ or m.group(1) or "=" in m.group(2):
            raise RuntimeError(f"emu: cannot rewrite the shared declaration {m.group(0)!r}")
        decls = [(first.group(2), first.group(3))]
        for p in parts[1:]:
            d = _NEXT_DECL_RE.fullmatch(p)
            if d is None:
                raise RuntimeError(f"emu: cannot rewrite the shared declaration {m.group(0)!r}")
            decls.append((d.group(1), d.group(2)))
        return " ".join(f"static {typ} emu_sh_{n}[EMU_SLOTS]{dims.strip()}; auto& {n} = emu_sh_{n}[emu::g_slot];"
                        for n, dims in decls)

    return _SHARED_RE.sub(one, code)


def compiler_available() -> bool:
    return shutil.which(os.environ.get("CXX", "g++")) is not None


#: device allocations since the last :func:`reset_allocations` (both emulators count here)
ALLOCS = {"count": 0, "bytes": 0}
#: ``supported`` False: ``Stream.begin_capture`` raises (a platform without stream capture)
CAPTURE = {"supported": True}


def reset_allocations() -> None:
    ALLOCS["count"] = ALLOCS["bytes"] = 0


def count_allocation(nbytes: int) -> None:
    if capturing() is not None:
        raise RuntimeError("emu: an allocation inside a stream capture (a graph must not own temporaries: "
                           "allocate the workspace before capturing)")
    ALLOCS["count"] += 1
    ALLOCS["bytes"] += int(nbytes)


def refuse_in_capture(what: str) -> None:
    if capturing() is not None:
        raise RuntimeError(f"emu: {what} while the current stream is capturing (CUDA: operation not "
                           "permitted when stream is capturing)")


def enqueue(op) -> None:
    """Run ``op`` now, or record it in the capture of the current stream."""
    s = capturing()
    if s is None:
        op()
    else:
        s._ops.append(op)


class ndarray(np.ndarray):
    """A host array presenting itself as a CuPy device array."""

    def __array_finalize__(self, obj):
        if self.base is None and obj is not None:  # fresh memory (a copy, a fancy index, an ufunc's result)
            count_allocation(self.nbytes)

    def fill(self, value):
        base = self.view(np.ndarray)
        enqueue(lambda: np.ndarray.fill(base, value))

    def __setitem__(self, key, value):
        refuse_in_capture("an element assignment")
        super().__setitem__(key, value)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ctypes.data, False),
                "version": 3, "strides": None if self.flags.c_contiguous else self.strides, "stream": None}

    def get(self, stream=None, out=None, blocking=True):
        refuse_in_capture("a device-to-host copy")
        if out is None:
            return np.array(self, copy=True).view(np.ndarray)
        out[...] = self
        return out

    def set(self, arr, stream=None):
        self[...] = arr


ndarray.__module__ = "cupy"  # backend.array_module() recognises CuPy arrays by their type's module
ndarray.__name__ = ndarray.__qualname__ = "ndarray"


def _dev(a) -> ndarray:
    if a.base is None and not isinstance(a, ndarray):
        count_allocation(a.nbytes)
    return a.view(ndarray)


def asarray(a, dtype=None):
    if isinstance(a, ndarray) and (dtype is None or np.dtype(dtype) == a.dtype):
        return a
    return _dev(np.array(a, dtype=dtype, copy=True))


def array(a, dtype=None):
    return _dev(np.array(a, dtype=dtype, copy=True))


def ascontiguousarray(a):
    return _dev(np.ascontiguousarray(a))


def empty(shape, dtype=np.float64):
    out = np.empty(shape, dtype=dtype)
    out.view(np.uint8).fill(POISON) if out.size else None
    return _dev(out)


def empty_like(a, dtype=None):
    return empty(a.shape, a.dtype if dtype is None else dtype)


def zeros(shape, dtype=np.float64):
    return _dev(np.zeros(shape, dtype=dtype))


def ones(shape, dtype=np.float64):
    return _dev(np.ones(shape, dtype=dtype))


def full(shape, value, dtype=None):
    return _dev(np.full(shape, value, dtype=dtype))


def arange(*args, **kw):
    return _dev(np.arange(*args, **kw))


def argsort(a, axis=-1, kind=None):  # CuPy's sort is always stable
    return _dev(np.argsort(np.asarray(a), axis=axis, kind="stable"))


def sort(a, axis=-1, kind=None):
    return _dev(np.sort(np.asarray(a), axis=axis, kind="stable"))


def searchsorted(a, v, side="left", sorter=None):
    return _dev(np.asarray(np.searchsorted(np.asarray(a), np.asarray(v), side=side, sorter=sorter)))


def maximum(x1, x2, out=None, dtype=None):
    return _dev(np.asarray(np.maximum(np.asarray(x1), np.asarray(x2), dtype=dtype)))


def abs(a):  # noqa: A001 - CuPy's name
    return _dev(np.abs(np.asarray(a)))


def concatenate(arrays):
    return _dev(np.concatenate([np.asarray(a) for a in arrays]))


def asnumpy(a):
    return np.array(a, copy=True).view(np.ndarray)


bool_ = np.bool_
float32, float64, int32, int64, uint32, uint64 = np.float32, np.float64, np.int32, np.int64, np.uint32, np.uint64


# --------------------------------------------------------------------------- cuda namespace
class _Device:
    def __init__(self, i: int = 0):
        self.id = int(i)
        self.attributes = {"MultiProcessorCount": 2}  # small: grid-stride loops take several turns

    def use(self):
        pass

    def synchronize(self):
        pass


_stream_ptrs = itertools.count(0x1000)


class Stream:
    """A CUDA stream as CuPy has it: current inside ``with``, capturing between begin and end_capture."""

    null = None

    def __init__(self, null=False, non_blocking=False, ptds=False):
        self.ptr = 0 if null else next(_stream_ptrs)
        self.device_id = -1 if null else 0
        self._ops = None

    def __enter__(self):
        _CURRENT.append(self)
        return self

    def __exit__(self, *exc):
        _CURRENT.pop()
        return False

    def synchronize(self):
        if self._ops is not None:
            raise RuntimeError("emu: synchronize on a capturing stream")

    def begin_capture(self, mode=None):
        if not CAPTURE["supported"]:
            raise RuntimeError("emu: stream capture is not supported here (fakecupy.CAPTURE)")
        if self.ptr in (0, 1):
            raise RuntimeError("cannot capture on the default (legacy) stream")
        if self._ops is not None:
            raise RuntimeError("emu: the stream is already capturing")
        self._ops = []

    def end_capture(self):
        if self._ops is None:
            raise RuntimeError("emu: the stream is not capturing")
        ops, self._ops = self._ops, None
        return Graph(ops)

    def is_capturing(self):
        return self._ops is not None


class Graph:
    """A captured sequence; ``launch`` replays it (each launch with the arguments it had at capture)."""

    def __init__(self, ops):
        self._ops = list(ops)
        self.launches = 0

    def launch(self, stream=None):
        refuse_in_capture("a graph launch")
        for op in self._ops:
            op()
        self.launches += 1

    def upload(self, stream=None):
        pass


Stream.null = Stream(null=True)
_CURRENT: list[Stream] = [Stream.null]


def get_current_stream() -> Stream:
    return _CURRENT[-1]


def capturing() -> Stream | None:
    """The current stream when it is capturing, else None."""
    s = _CURRENT[-1]
    return s if s._ops is not None else None


class _Runtime:
    @staticmethod
    def getDevice():
        return 0

    @staticmethod
    def getDeviceCount():
        return 1

    @staticmethod
    def getDeviceProperties(i):
        return {"name": b"CPU emulator (tests/gpu_emu)"}


def _alloc_pinned_memory(nbytes):
    return bytearray(nbytes)


cuda = types.SimpleNamespace(runtime=_Runtime(), Device=_Device, get_current_stream=get_current_stream,
                             alloc_pinned_memory=_alloc_pinned_memory, Stream=Stream, Graph=Graph,
                             graph=types.SimpleNamespace(Graph=Graph))


# --------------------------------------------------------------------------- RawModule
_LIBS: dict[str, ctypes.CDLL] = {}
_KERNEL_RE = re.compile(r'extern\s+"C"\s+__attribute__\(\(used\)\)\s+void\s+(\w+)\s*\(')


#: the emulator switches fibers with _longjmp, which _FORTIFY_SOURCE's checked form refuses across stacks
_CXXFLAGS = ("-std=c++17", "-O1", "-g0", "-U_FORTIFY_SOURCE", "-fPIC", "-shared", "-Wno-unknown-pragmas")


def _cache_dir() -> Path:
    d = Path(tempfile.gettempdir()) / f"mpisparse-gpu-emu-{os.getuid()}"
    d.mkdir(exist_ok=True)
    return d


def _build(code: str) -> ctypes.CDLL:
    cxx = os.environ.get("CXX", "g++")
    emu = (HERE / "emu.hpp").read_text()
    code = rewrite_shared(code)
    key = hashlib.sha256((" ".join(_CXXFLAGS) + "\0" + emu + "\0" + code).encode()).hexdigest()[:20]
    if key in _LIBS:
        return _LIBS[key]
    d = _cache_dir()
    so = d / f"k{key}.so"
    if not so.exists():
        src = d / f"k{key}.{os.getpid()}.cpp"  # per process: concurrent test runs never share a half-written file
        body = f'#include "{HERE / "emu.hpp"}"\n' + code
        src.write_text(body)
        pre = subprocess.run([cxx, "-std=c++17", "-E", "-P", str(src)], capture_output=True, text=True, check=True)
        names = sorted(set(_KERNEL_RE.findall(pre.stdout)))
        if not names:
            raise RuntimeError("emu: no extern \"C\" __global__ kernels found in the module")
        wrap = ["", "// launchers generated by tests/gpu_emu/fakecupy.py",
                "template <typename... A> int emu_params(void (*)(A...), unsigned long long* size, int* ptr) {",
                "  int i = 0; ((size[i] = sizeof(A), ptr[i] = std::is_pointer<A>::value, ++i), ...); return i; }"]
        for n in names:
            wrap.append(f'extern "C" void emu_launch_{n}(unsigned g, unsigned b, void** a, int mode, '
                        f'unsigned long long seed) '
                        f'{{ emu::launch(g, b, mode, seed, [&] {{ emu::call_with(&{n}, a); }}); }}')
            wrap.append(f'extern "C" int emu_params_{n}(unsigned long long* s, int* p) '
                        f'{{ return emu_params(&{n}, s, p); }}')
        src.write_text(body + "\n".join(wrap) + "\n")
        tmp = d / f"k{key}.{os.getpid()}.so"
        cmd = [cxx, *_CXXFLAGS, "-o", str(tmp), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"emu: compiling the kernels failed:\n{proc.stderr[-4000:]}")
        os.replace(tmp, so)
        src.unlink(missing_ok=True)
    lib = _LIBS[key] = ctypes.CDLL(str(so))
    return lib


class RawKernel:
    def __init__(self, lib: ctypes.CDLL, name: str):
        self.name = name
        try:
            self._launch = getattr(lib, f"emu_launch_{name}")
        except AttributeError:
            raise AttributeError(f"emu: no kernel named {name!r} in the module") from None
        sizes, ptrs = (ctypes.c_ulonglong * 32)(), (ctypes.c_int * 32)()
        count = getattr(lib, f"emu_params_{name}")(sizes, ptrs)
        self.params = [(int(sizes[i]), bool(ptrs[i])) for i in range(count)]
        self.launches = 0

    def __call__(self, grid, block, args):
        if len(args) != len(self.params):
            raise TypeError(f"{self.name}: {len(args)} arguments for {len(self.params)} parameters")
        keep, slots, scalars = [], [], []
        for i, (a, (size, is_ptr)) in enumerate(zip(args, self.params)):
            if isinstance(a, np.ndarray):
                if not is_ptr:
                    raise TypeError(f"{self.name}: argument {i} is an array but the parameter is not a pointer")
                h = ctypes.c_void_p(a.ctypes.data)
                keep.append(h)
                slots.append(ctypes.addressof(h))
            elif isinstance(a, np.generic):
                if is_ptr:
                    if a.dtype.itemsize != 8 or int(a) != 0:
                        raise TypeError(f"{self.name}: argument {i} is a scalar {a!r} for a pointer parameter")
                elif a.dtype.itemsize != size:
                    raise TypeError(f"{self.name}: argument {i} is {a.dtype} ({a.dtype.itemsize} bytes) "
                                    f"but the parameter has {size} bytes")
                h = np.array(a)
                scalars.append(h.tobytes())
                keep.append(h)
                slots.append(h.ctypes.data)
            else:
                raise TypeError(f"{self.name}: argument {i} of type {type(a).__name__}: pass arrays or "
                                "NumPy scalars (CuPy would guess the C type of a Python scalar)")
        argv = (ctypes.c_void_p * max(1, len(slots)))(*slots)
        g, b = (grid[0] if isinstance(grid, tuple) else grid), (block[0] if isinstance(block, tuple) else block)

        scalar_bytes = b"".join(scalars)

        def run(keep=keep):  # the arguments as marshalled now: addresses and scalar values (a graph's node)
            mode, seed, _ = block_order()  # read at run time: a replayed graph follows the order in force
            self._launch(ctypes.c_uint(int(g)), ctypes.c_uint(int(b)), argv, ctypes.c_int(mode),
                         ctypes.c_ulonglong(_launch_seed(seed, self.name, int(g), int(b), scalar_bytes)))
            self.launches += 1

        enqueue(run)


class RawModule:
    def __init__(self, code: str, options=(), **kw):
        self._lib = _build(code)
        self._kernels: dict[str, RawKernel] = {}

    def get_function(self, name: str) -> RawKernel:
        k = self._kernels.get(name)
        if k is None:
            k = self._kernels[name] = RawKernel(self._lib, name)
        return k


def reset_graph_state(setattr_) -> None:
    """Fresh workspaces and graphs in the backend, capture supported, allocations counted from 0."""
    from collections import OrderedDict

    from mpisparse.backend import cupy_graph

    setattr_(cupy_graph, "_WORKSPACES", OrderedDict())
    setattr_(cupy_graph, "_CAPTURE_STREAMS", {})
    setattr_(cupy_graph, "_UNSUPPORTED", {})
    cupy_graph.reset_stats()
    CAPTURE["supported"] = True
    del _CURRENT[1:]
    reset_allocations()


def as_cupy_module() -> types.ModuleType:
    """This module's names in a module called ``cupy`` (the backend dispatches on the module's name)."""
    import sys

    mod = types.ModuleType("cupy", __doc__)
    mod.__dict__.update({k: v for k, v in vars(sys.modules[__name__]).items() if not k.startswith("__")})
    mod.__version__ = __version__
    return mod


def install(monkeypatch) -> types.ModuleType:
    """Make this emulator ``cupy`` for the duration of a test (pytest ``monkeypatch``)."""
    import sys

    from mpisparse.backend import cupy_launch, cupy_segments, cupy_select

    mod = as_cupy_module()
    print(describe_block_order(), file=sys.stderr)  # shown with a failing test's captured output
    monkeypatch.setitem(sys.modules, "cupy", mod)
    reset_graph_state(monkeypatch.setattr)
    monkeypatch.setattr(cupy_launch, "_modules", {})
    monkeypatch.setattr(cupy_launch, "_sm_count", {})
    monkeypatch.setattr(cupy_select, "_cap_hint", {})
    monkeypatch.setattr(cupy_segments, "_TILE_PLANS", {})
    monkeypatch.setattr(cupy_select, "_PASS_PLANS", {})
    return mod
