"""GPU (CuPy) selection kernels: threshold_select (and threshold_select_values), topk_abs, estimate_threshold,
randomk, rowwise_topk_mask.

How the kernels work
--------------------
*Magnitude keys.*  The bits of ``|v|`` (sign bit cleared) read as an
unsigned integer order like ``|v|``; radix passes work on these keys.

``threshold_select`` is one fused pass (``select_ge``): each thread loads 4
elements (coalesced, independent loads in flight; ``select_ge_vec``: two
16-byte vectors where ``x`` is 16-byte aligned), compares ``|x| >= t``,
and the hits of a warp get consecutive output slots from one
``atomicAdd`` on a global counter (warp-aggregated: ballot, popcount,
shuffle of the base).  Indices (and, for :func:`threshold_select_values`,
values) are written in that pass.  The output is sized from the previous
call's count for the same ``n``; in the rare case it was too small the count
is exact after the pass, and the pass runs once more.

``topk_abs`` is exact (exactly ``k`` distinct indices, ties included):

1. ``sample``: the ``r``-th largest key of a hashed
   random sample (``r`` = expected sampled top-k count + 4 sigma + 4) is a
   threshold a little below the true k-th magnitude; one pass (16-byte
   loads) collects the candidates ``key >= t`` (indices and keys,
   warp-aggregated as above); the exact k-th largest candidate is found and
   the top ``k`` written (``take_top``) without leaving the device -- the
   sample's ``r``-th key and the candidates' k-th key each by one block
   (``block_kth``: 11-bit radix digits in shared memory).  Four launches and
   one device-to-host read (the candidate count: too few and the rank is
   raised and the pass retried, at most :data:`MAX_RETRIES`; far too many,
   e.g. mostly zeros: step 2).
2. ``radix``: a 12-bit digit histogram of the keys (shared-memory bins,
   merged with global atomics), one block finds the bin that holds the k-th
   largest key, and a split pass appends every index whose digit is above
   that bin to the output and collects the bin's own entries as candidates.
   Two reads of ``x``, one device-to-host read of three numbers.
3. Resolving ``need`` winners among the radix path's ``c`` candidate keys: all of them when
   ``c == need``; a device sort of the keys when ``c <=``
   :data:`SORT_LIMIT`; otherwise the next 12-bit digit (radix passes on the
   candidate arrays); when the digits are used up the remaining keys are
   all equal and any ``need`` of them complete the top k.
4. ``radix2`` (:mod:`.cupy_radix`, ``cuda/radix.cu``; ``auto`` picks it up to 4M
   elements, and to density 0.01 beyond: :data:`AUTO_TABLE`, measured): the radix select with
   every decision on the device -- the filtering of one digit fused with the
   histogram of the next, the bucket chosen by the last block to finish, an
   early stop, nothing read back; one CUDA graph per call.

``estimate_threshold`` gathers the keys at ``m`` hashed random positions and
returns the ``round(k m / n)``-th largest (``block_kth``, one read back); ``randomk`` draws on
the host with the NumPy kernel (so every rank, CPU or GPU, gets the same set
from the same generator) and copies the ``k`` indices to the device;
``rowwise_topk_mask`` runs one block per row (8-bit radix passes in shared
memory, ties taken in index order), see ``cuda/rowwise.cu``.
"""

from __future__ import annotations

import math

import numpy as np

from . import index_dtype  # the one place the index width is decided
from . import cupy_graph as _graph
from . import cupy_radix as _radix2
from . import numpy_select as _nk
from .cupy_launch import (BLOCK, KTH_THREADS, VILP, _NULL, _as_1d_float, _check_scratch, _cupy, _grid, _in,
                          _kernel, _key_dtype, _tn, _work)

#: Candidate sets up to this size are resolved by one device sort.
SORT_LIMIT = 1 << 20
#: As in the NumPy kernel: small inputs and large k go straight to the radix path.
SMALL_N = _nk.SMALL_N
DENSE_FRACTION = _nk.DENSE_FRACTION
MAX_RETRIES = _nk.MAX_RETRIES
_RADIX_BINS = 4096
_SHIFTS = {4: (19, 7, 0), 8: (51, 39, 27, 15, 3, 0)}  # 12-bit digits of 31 / 63 key bits
_METHODS = ("auto", "sample", "radix", "radix2")

_cap_hint: dict[int, int] = {}

#: (array module, device, aligned, n, dtype, index dtype, keys) -> (kernel, grid) of a threshold or candidate pass
_PASS_PLANS: dict[tuple, tuple] = {}


def _pass(w, idt, keys: bool):
    """``(kernel, grid)`` of the threshold (``keys`` False) or candidate pass over ``w``.

    The ``*_vec`` kernels read 16-byte vectors: used where ``w`` starts on a
    16-byte boundary (every CuPy allocation does; a view may not).  Looked
    up once per (device, alignment, size, dtypes): a call's fixed cost is
    host time, and this pass runs every step.
    """
    try:
        mem = w.data
        dev, aligned = mem.device_id, mem.ptr % 16 == 0
    except AttributeError:  # an array that is not CuPy's (the tests' emulator)
        dev, aligned = 0, w.__cuda_array_interface__["data"][0] % 16 == 0
    key = (id(_cupy()), dev, aligned, w.shape[0], w.dtype.char, np.dtype(idt).char, keys)
    plan = _PASS_PLANS.get(key)
    if plan is None:
        name = "select_key_ge" if keys else "select_ge"
        if aligned:
            kern, per_thread = _kernel("select.cu", f"{name}_vec_{_tn(w.dtype)}_{_in(idt)}"), \
                VILP * (16 // w.dtype.itemsize)
        else:
            kern, per_thread = _kernel("select.cu", f"{name}_{_tn(w.dtype)}_{_in(idt)}"), 4
        if len(_PASS_PLANS) >= 1024:  # many sizes (layer by layer): start over rather than grow
            _PASS_PLANS.clear()
        plan = _PASS_PLANS[key] = (kern, _grid(w.shape[0], per_thread))
    return plan


def _kth(keys, dtype, need: int, found, *, kth_out=None, n_ptr=None, cap: int = 0) -> None:
    """Launch ``block_kth``: the ``need``-th largest of ``keys`` (of ``dtype``'s magnitude keys) into ``found``.

    ``n_ptr`` (a device count, clipped to ``cap``) replaces ``keys.size``
    when the count is only known on the device.  No host round trip.
    """
    _kernel("select.cu", f"block_kth_{_tn(dtype)}")(
        (1,), (KTH_THREADS,), (keys, np.int64(keys.size), _NULL if n_ptr is None else n_ptr, np.uint64(cap),
                               np.uint64(need), found, _NULL if kth_out is None else kth_out))



# --------------------------------------------------------------------------
# threshold select
# --------------------------------------------------------------------------


def _select_ws(w, idt, values: bool):
    """The threshold select's workspace for ``w``'s shape: counter, threshold slot, outputs."""
    cp = _cupy()
    n = w.shape[0]

    def build(ws):
        ws.counter = cp.zeros(1, dtype=np.uint64)
        ws.t = cp.zeros(1, dtype=w.dtype)  # the threshold, read by the pass (a graph holds its address)
        ws.t_bits = None
        ws.cap = 0
        _outputs(ws, min(n, _cap_hint.get(n, max(4096, n // 64))), w.dtype, idt, values)

    return _graph.workspace(("select_ge", _graph.device_of(w), n, w.dtype.char, np.dtype(idt).char, values),
                            build)


def _outputs(ws, cap: int, dtype, idt, values: bool) -> None:
    """New output buffers of ``cap`` entries (a graph holds the old ones: forgotten)."""
    cp = _cupy()
    ws.cap = cap
    ws.idx = cp.empty(cap, dtype=idt)
    ws.vals = cp.empty(cap, dtype=dtype) if values else None
    ws.drop_graphs()


def _select_ge(x, t, values: bool, reuse: bool = False):
    n = x.shape[0]
    idt = index_dtype(n)
    tc = _nk._ceil_to_dtype(t, x.dtype)  # exact comparison, as the NumPy kernel
    w = _work(x)
    tw = w.dtype.type(tc)  # float16 -> float32 is exact
    kern, grid = _pass(w, idt, keys=False)
    ws = _select_ws(w, idt, values)
    bits = np.asarray(tw).tobytes()
    if ws.t_bits != bits:  # a new threshold: one fill launch, no host-to-device copy
        ws.t.fill(tw)
        ws.t_bits = bits
    for attempt in range(2):
        cap, idx, vals, counter = ws.cap, ws.idx, ws.vals, ws.counter

        def launch():
            counter.fill(0)
            kern(grid, (BLOCK,), (w, np.int64(n), w.dtype.type(0), ws.t, idx, _NULL if vals is None else vals,
                                  counter, np.uint64(cap)))

        _graph.run(ws, _graph.address(w), launch)
        c = int(counter.get()[0])  # the one device-to-host read: the result's size
        if c <= cap:
            break
        _outputs(ws, min(n, max(c + c // 4 + 1024, 2 * cap)), w.dtype, idt, values)  # outgrown: run again
    _cap_hint[n] = min(n, int(c * 1.25) + 1024)
    idx = ws.idx[:c] if reuse else ws.idx[:c].copy()
    if values:
        if x.dtype != w.dtype:
            return idx, x[idx]
        return idx, ws.vals[:c] if reuse else ws.vals[:c].copy()
    return idx, None


def threshold_select(x, t, *, scratch=None, reuse: bool = False):
    """Indices ``i`` with ``|x[i]| >= t``, in no particular order (one fused pass).

    ``t`` is compared exactly (rounded *up* to ``x``'s dtype); ``t <= 0``
    selects every non-NaN entry, ``t`` NaN nothing.  ``scratch`` is accepted
    for API parity and not needed.  ``reuse=True`` returns a view of the
    call's workspace (no allocation; overwritten by the next call of the
    same size), else a copy of it.
    """
    cp = _cupy()
    x = _as_1d_float(x)
    n = x.shape[0]
    _check_scratch(x, scratch)
    if n == 0:
        return cp.empty(0, dtype=index_dtype(n))
    return _select_ge(x, t, values=False, reuse=reuse)[0]


def threshold_select_values(x, t, *, reuse: bool = False):
    """``(indices, values)`` of the entries with ``|x| >= t``, written in the same single pass."""
    cp = _cupy()
    x = _as_1d_float(x)
    n = x.shape[0]
    if n == 0:
        return cp.empty(0, dtype=index_dtype(n)), cp.empty(0, dtype=x.dtype)
    return _select_ge(x, t, values=True, reuse=reuse)


# --------------------------------------------------------------------------
# exact top-k
# --------------------------------------------------------------------------


class _Radix:
    """Device buffers and kernels of one radix selection (one dtype, one index dtype)."""

    def __init__(self, dtype, idt):
        cp = _cupy()
        self.tn, self.inn = _tn(dtype), _in(idt)
        self.idt, self.kdt = idt, _key_dtype(dtype)
        self.shifts = _SHIFTS[np.dtype(dtype).itemsize]
        self.hist = cp.zeros(_RADIX_BINS, dtype=np.uint64)
        self.found = cp.zeros(3, dtype=np.uint64)
        self.find = _kernel("select.cu", "radix_find_bin")

    def _find(self, need: int) -> tuple[int, int]:
        self.find((1,), (1024,), (self.hist, np.uint64(need), self.found))
        _, above, c = (int(v) for v in self.found.get())  # sync: sizes the candidate buffers
        return above, c

    def level_x(self, w, k, out):
        """First level, from ``x``: winners into ``out[:above]``, the bin's entries as candidates."""
        cp = _cupy()
        n = w.shape[0]
        shift = self.shifts[0]
        _kernel("select.cu", f"radix_hist_x_{self.tn}")(_grid(n), (BLOCK,), (w, np.int64(n), np.int32(shift),
                                                                            self.hist))
        above, c = self._find(k)
        cand_idx, cand_key = cp.empty(c, dtype=self.idt), cp.empty(c, dtype=self.kdt)
        n_out, n_cand = cp.zeros(1, dtype=np.uint64), cp.zeros(1, dtype=np.uint64)
        _kernel("select.cu", f"radix_split_x_{self.tn}_{self.inn}")(
            _grid(n), (BLOCK,), (w, np.int64(n), np.int32(shift), self.found, out, n_out, cand_idx, cand_key,
                                 n_cand))
        return above, cand_key, cand_idx, c

    def resolve(self, out, pos: int, keys, idx, c: int, need: int, shifts) -> None:
        """Write the ``need`` largest of the ``c`` candidate keys' indices into ``out[pos:pos+need]``."""
        cp = _cupy()
        shifts = tuple(shifts)
        while True:
            if need == c:  # the whole candidate set belongs to the top k
                out[pos:pos + need] = idx
                return
            if not shifts:  # every digit fixed: the remaining keys are all equal (ties)
                out[pos:pos + need] = idx[:need]
                return
            if c <= SORT_LIMIT:
                order = cp.argsort(keys)[c - need:]
                out[pos:pos + need] = idx[order]
                return
            shift, shifts = shifts[0], shifts[1:]
            self.hist.fill(0)
            _kernel("select.cu", f"radix_hist_k_{self.tn}")(_grid(c), (BLOCK,), (keys, np.int64(c),
                                                                                np.int32(shift), self.hist))
            above, c2 = self._find(need)
            n_out, n_cand = cp.array([pos], dtype=np.uint64), cp.zeros(1, dtype=np.uint64)
            new_idx, new_key = cp.empty(c2, dtype=self.idt), cp.empty(c2, dtype=self.kdt)
            _kernel("select.cu", f"radix_split_k_{self.tn}_{self.inn}")(
                _grid(c), (BLOCK,), (keys, idx, np.int64(c), np.int32(shift), self.found, out, n_out, new_idx,
                                     new_key, n_cand))
            pos, need, keys, idx, c = pos + above, need - above, new_key, new_idx, c2


def _radix_topk(w, k: int, idt):
    cp = _cupy()
    out = cp.empty(k, dtype=idt)
    rx = _Radix(w.dtype, idt)
    above, keys, idx, c = rx.level_x(w, k, out)
    rx.resolve(out, above, keys, idx, c, k - above, rx.shifts[1:])
    return out


def _sample_ws(w, k: int, idt):
    """The sampled top-k's workspace for ``w``'s shape and ``k``: sample, counters, candidates, output."""
    cp = _cupy()
    n = w.shape[0]
    kdt = _key_dtype(w.dtype)

    def build(ws):
        ws.m, ws.r = _nk.sample_plan(n, k)  # the NumPy kernel's sample sizing
        ws.samp = cp.empty(ws.m, dtype=kdt)
        ws.found = cp.empty(6, dtype=np.uint64)  # [0:3] the sample's r-th key, [3:6] the candidates' k-th
        ws.found_r, ws.found_k = ws.found[:3], ws.found[3:]
        ws.t_key = cp.empty(1, dtype=kdt)
        ws.counts = cp.zeros(3, dtype=np.uint64)  # candidates, above the k-th, equal to it
        ws.n_cand, ws.taken = ws.counts[:1], ws.counts[1:]
        ws.out = cp.empty(k, dtype=idt)
        ws.cap = 0

    ws = _graph.workspace(("topk_sample", _graph.device_of(w), n, k, w.dtype.char, np.dtype(idt).char), build)
    return ws


def _sampled_topk(w, k: int, idt, rng, reuse: bool = False):
    """Sampled threshold, one candidate pass, the exact k-th candidate: one device-to-host read.

    The launches of an attempt run on the shape's workspace and, from the
    second call on the same input, as one replayed CUDA graph
    (:mod:`.cupy_graph`); the sample's rank ``r`` that worked is kept for the
    next call.
    """
    cp = _cupy()
    n = w.shape[0]
    tn, inn, kdt = _tn(w.dtype), _in(idt), _key_dtype(w.dtype)
    ws = _sample_ws(w, k, idt)
    sample = _kernel("select.cu", f"sample_keys_{tn}")
    kern, grid = _pass(w, idt, keys=True)
    take = _kernel("select.cu", f"take_top_{tn}_{inn}")
    r = ws.r
    for attempt in range(MAX_RETRIES):
        if r >= ws.m:
            break
        if r != ws.r:  # a rank that works for this input: start there next time
            ws.r = r
            ws.drop_graphs()
        cap = min(n, int(math.ceil(2.0 * r * n / ws.m)) + 4096)
        if ws.cap < cap:  # candidate buffers for this rank (a graph holds the old ones)
            ws.cap = cap
            ws.cand_idx, ws.cand_key = cp.empty(cap, dtype=idt), cp.empty(cap, dtype=kdt)
            ws.drop_graphs()
        seed = np.uint64(int(rng.integers(0, 2**63)))  # a replayed graph keeps its capture's seed: speed only
        cap, m, ci, ck = ws.cap, ws.m, ws.cand_idx, ws.cand_key

        def launch():
            sample(_grid(m), (BLOCK,), (w, np.int64(n), seed, np.int64(m), ws.samp))
            ws.counts.fill(0)
            _kth(ws.samp, w.dtype, r, ws.found_r, kth_out=ws.t_key)  # threshold: the r-th largest sampled key
            kern(grid, (BLOCK,), (w, np.int64(n), ws.t_key, ci, ck, ws.counts, np.uint64(cap)))
            _kth(ck, w.dtype, k, ws.found_k, n_ptr=ws.counts, cap=cap)  # the k-th largest candidate
            take(_grid(cap), (BLOCK,), (ck, ci, ws.counts, np.uint64(cap), ws.found_k, np.uint64(k), ws.out,
                                        ws.taken))

        _graph.run(ws, _graph.address(w), launch)
        c = int(ws.n_cand.get()[0])  # the one device-to-host read: the candidates' count
        if c > cap:  # threshold far too low (mostly-equal or zero input): radix from x
            break
        if c >= k:
            return ws.out if reuse else ws.out.copy()
        r = _nk.lowered_rank(r, k, c)  # too few: lower the threshold
    return _radix_topk(w, k, idt)


#: ``auto``'s choice of exact top-k method by (size, density) band: the first row with ``n <= max_n`` and
#: ``k <= round(max_density * n)`` gives the method; past every row, radix.  Measured on an NVIDIA H200
#: (CuPy 14.2, CUDA 13, 2026-11-28 19:55 UTC, commit e0a43f3) by ``mpisparse bench select --backend cupy
#: --sizes 65536,262144,1000000,4000000,25000000 --densities 0.0001,0.001,0.01,0.1,0.3 --repeats 10``
#: (``bin/gpu-check``'s select-sweep, docs/results/gpu/select-sweep-h200-e0a43f3.csv): radix2 (every
#: decision on the device, no read back) is the fastest at 22 of the 25 points: 0.05-0.11 ms up to 1M
#: elements at any density, 0.07-0.26 ms at 4M; at 25M it ties the sampled path at density 0.001 (0.156 against 0.153 ms) and
#: loses to radix at 0.1 and 0.3 (1.04 against 0.81 ms, 1.29 against 1.17).  The earlier table (sample up to
#: about 80,000 selected entries, radix beyond) was measured before radix2 existed (select-sweep-h200.csv).
AUTO_TABLE: tuple[tuple[float, float, str], ...] = (
    (math.inf, 0.01, "radix2"),
    (4_000_000, 1.0, "radix2"),
)


def auto_method(n: int, k: int) -> str:
    """The method ``topk_abs(method="auto")`` uses for ``k`` of ``n`` (:data:`AUTO_TABLE`).

    A band's density bound counts as a ``k`` as the benchmark draws it
    (``round(density * n)``), so a measured point falls inside its own band.
    """
    for max_n, max_density, method in AUTO_TABLE:
        if n <= max_n and k <= round(max_density * n):
            return method
    return "radix"


def topk_abs(x, k, *, scratch=None, rng=None, method: str = "auto", reuse: bool = False):
    """Exact top-k by magnitude: exactly ``k`` distinct indices, any order.

    ``method``: ``"auto"`` (:func:`auto_method`: the :data:`AUTO_TABLE` band
    of ``n`` and ``k / n``), ``"sample"``, ``"radix"`` or ``"radix2"``
    (:mod:`.cupy_radix`: about two reads of ``x``, no host round trip); all return the
    same value set.  ``rng`` (a ``np.random.Generator``, a seed, or ``None``)
    drives the sample and only affects speed.  ``reuse=True``: the sampled
    and radix2 paths return its workspace's output (no allocation; overwritten by the
    next call of the same ``n`` and ``k``), else a copy.
    """
    cp = _cupy()
    x = _as_1d_float(x)
    n = x.shape[0]
    k = _nk._check_k(k, n)
    if method not in _METHODS:
        raise ValueError(f"method must be one of {', '.join(_METHODS)}, got {method!r}")
    idt = index_dtype(n)
    _check_scratch(x, scratch)
    if k == 0:
        return cp.empty(0, dtype=idt)
    if k == n:
        return cp.arange(n, dtype=idt)
    w = _work(x)
    if method == "auto":
        method = auto_method(n, k)
    if method == "radix":
        return _radix_topk(w, k, idt)
    if method == "radix2":
        return _radix2.topk(w, k, idt, reuse)
    return _sampled_topk(w, k, idt, _nk._get_rng(rng), reuse)



def estimate_threshold(x, k, *, sample=0.01, rng=None) -> float:
    """DGC-style estimate of the k-th largest ``|x|`` (the NumPy kernel's contract).

    ``m = round(sample * n)`` magnitudes at random positions (with
    replacement; all of ``x`` exactly when ``m >= n``), then the
    ``round(k m / n)``-th largest of them.  ``k == 0`` gives ``inf``.
    """
    cp = _cupy()
    x = _as_1d_float(x)
    n = x.shape[0]
    k = _nk._check_k(k, n)
    if not 0.0 < sample <= 1.0:
        raise ValueError(f"sample must be in (0, 1], got {sample}")
    if k == 0:
        return math.inf
    w = _work(x)
    m = max(1, int(round(sample * n)))
    if m >= n:
        m, a = n, w
    else:
        keys = cp.empty(m, dtype=_key_dtype(w.dtype))
        seed = np.uint64(int(_nk._get_rng(rng).integers(0, 2**63)))
        _kernel("select.cu", f"sample_keys_{_tn(w.dtype)}")(_grid(m), (BLOCK,),
                                                            (w, np.int64(n), seed, np.int64(m), keys))
        a = keys.view(w.dtype)  # the key is the bit pattern of |x|
    ks = min(m, max(1, int(round(k * m / n))))
    if ks == m:
        return float(cp.abs(a).min())
    found = cp.empty(3, dtype=np.uint64)
    _kth(a.view(_key_dtype(w.dtype)), w.dtype, ks, found)  # the sign bit lies outside the key's digits
    key = found[:1].get()[0]
    return float(np.array([key], dtype=_key_dtype(w.dtype)).view(w.dtype)[0])


def randomk(n, k, rng):
    """``k`` distinct indices uniform in ``[0, n)``, ascending: the NumPy kernel's set, on the device.

    Drawn on the host from ``rng`` (so CPU and GPU ranks with the same
    generator state agree), then copied (``k`` indices).
    """
    cp = _cupy()
    return cp.asarray(_nk.randomk(n, k, rng))


def rowwise_topk_mask(X, k):
    """Boolean mask of ``X``'s shape: per row exactly ``k`` of the largest ``|X|`` (one block per row)."""
    cp = _cupy()
    X = cp.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"expected a 2-D array, got shape {X.shape}")
    rows, cols = X.shape
    k = _nk._check_k(k, cols)
    if k == 0:
        return cp.zeros(X.shape, dtype=cp.bool_)
    if k == cols:
        return cp.ones(X.shape, dtype=cp.bool_)
    if X.dtype.kind != "f":
        X = X.astype(np.float64)
    W = _work(X)
    mask = cp.empty(X.shape, dtype=cp.bool_)
    if rows:
        _kernel("rowwise.cu", f"rowwise_topk_{_tn(W.dtype)}")((rows,), (BLOCK,), (W, np.int64(cols), np.int64(k),
                                                                                mask))
    return mask

