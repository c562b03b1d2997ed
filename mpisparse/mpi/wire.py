"""16-bit values on the wire: float16 and bfloat16 codecs, and a sum over ranks that MPI cannot do itself.

A scheme keeps its vectors in float32; what crosses the network may be
16-bit (``--wire-dtype``, :data:`WIRE_DTYPES`):

``float16``
    IEEE half: 10-bit mantissa, largest finite value 65504.  A sum of
    float16 values can overflow where each value does not, so a sum over
    ranks carries ``x / W`` (the world size divided out first, as PyTorch's
    ``fp16_compress_hook`` and Horovod's ``gradient_predivide_factor`` do):
    the rounded result is the mean, which is no larger than the largest
    input.
``bfloat16``
    the upper half of a float32 (8-bit mantissa, float32's range), rounded
    to nearest even.  NumPy has no bfloat16, so its values travel as the
    ``uint16`` bit patterns (:func:`encode`; float16 too: MPICH moves an
    MPI float16 datatype several times slower than 16-bit integers); no
    reduction of MPI's may see them (a sum of bit patterns is not a sum of
    values).

Neither is summed by MPI here (:func:`allreduce_sum`): a reduce-scatter
moves every rank's 16-bit block ``r`` to rank ``r`` (Alltoallv), rank
``r`` sums its block in float32 (exact to float32, in rank order, one
rounding to the wire type at the end), and an Allgatherv of the 16-bit
block sums gives every rank the same bits.  Bytes per rank: ``(n - b_r) 2
+ (n - b_{r+1}) 2`` with blocks ``b`` of ``n / W``: half of a float32 ring
Allreduce's ``2 (W-1)/W 4 n`` (:func:`allreduce_bytes`).

Error feedback needs to know what was sent: :func:`round_trip` gives the
float32 value a rank's 16-bit value stands for, so that ``residual = acc -
sent`` keeps the rounding error.  Every function works on NumPy and CuPy
arrays alike (only bit operations and casts both have).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .. import backend

__all__ = ["WIRE_DTYPES", "allgather_values", "allreduce_bytes", "allreduce_sum", "blocks", "check", "decode",
           "encode", "itemsize", "predivides", "round_trip", "sent_values", "wire_numpy_dtype"]

#: the values' types a scheme may put on the wire (``--wire-dtype``)
WIRE_DTYPES = ("float32", "float16", "bfloat16")


def check(wire: str) -> str:
    if wire not in WIRE_DTYPES:
        raise ValueError(f"wire dtype {wire!r}; allowed values are {', '.join(WIRE_DTYPES)}")
    return wire


def itemsize(wire: str) -> int:
    """Bytes per value on the wire."""
    return 4 if check(wire) == "float32" else 2


def wire_numpy_dtype(wire: str):
    """The array dtype of encoded values (16-bit: their bit patterns, ``uint16``)."""
    return {"float32": np.float32, "float16": np.uint16, "bfloat16": np.uint16}[check(wire)]


def predivides(wire: str) -> bool:
    """Whether a sum over ranks carries ``x / W`` (float16: so that the sum cannot overflow)."""
    return wire == "float16"


def encode(x, wire: str):
    """``x`` (float32) as the wire carries it: a new array of 16-bit patterns (``uint16``: MPI only moves them,
    it never sees a float16 datatype), float16 or bfloat16 rounded to nearest even (a NaN stays a NaN,
    float16 beyond 65504 becomes an infinity, which the finite checks then skip).  float32: ``x`` itself.
    Host arrays convert with torch's vectorised casts when torch is already loaded (the same bits)."""
    if check(wire) == "float32":
        return x
    xp = backend.array_module(x)
    torch = sys.modules.get("torch")
    if xp is np and torch is not None and x.dtype == np.float32:
        t = torch.from_numpy(np.ascontiguousarray(x))
        return t.to(torch.float16 if wire == "float16" else torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    if wire == "float16":
        if xp is np:
            with np.errstate(over="ignore"):
                return x.astype(np.float16).view(np.uint16)
        return x.astype(xp.float16).view(xp.uint16)
    u = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    r = (u >> 16) & 1  # round to nearest, ties to even: add 0x7FFF plus the lowest kept bit
    r += 0x7FFF
    r += u
    bits = (r >> 16).astype(xp.uint16)
    nan = x != x
    if nan.any():  # the rounding carry could turn a NaN's low payload into an infinity
        bits[nan] = 0x7FC0
    return bits


def decode(w, wire: str, out=None):
    """The float32 values of encoded ``w`` (into ``out`` when given; returned)."""
    xp = backend.array_module(w)
    if out is None:
        out = xp.empty(w.shape, dtype=xp.float32)
    t = _torch_view(w, wire) if xp is np and out.flags.c_contiguous else None
    if t is not None:  # one vectorised pass (NumPy's float16 casts and the bfloat16 shift are several)
        sys.modules["torch"].from_numpy(out).copy_(t)
        return out
    if check(wire) == "bfloat16":
        u = out.view(xp.uint32)
        u[...] = w
        u <<= 16
    elif wire == "float16":
        out[...] = w.view(xp.float16)
    else:
        out[...] = w
    return out


def round_trip(x, wire: str):
    """The float32 values that ``x`` arrives as (a new array; ``x`` itself for float32)."""
    return x if wire == "float32" else decode(encode(x, wire), wire)


def blocks(n: int, world: int) -> np.ndarray:
    """The reduce-scatter's blocks: ``n`` split into ``world`` near-equal parts, the larger ones first."""
    sizes = np.full(world, n // world, dtype=np.int64)
    sizes[: n % world] += 1
    return sizes


def allreduce_bytes(n: int, world: int, rank: int, wire: str) -> int:
    """Bytes ``rank`` sends in :func:`allreduce_sum` of ``n`` values (float32: the ring Allreduce's)."""
    if world == 1:
        return 0
    if wire == "float32":
        return 2 * (world - 1) * n * 4 // world
    b = blocks(n, world)
    return int((n - b[rank]) + (n - b[(rank + 1) % world])) * itemsize(wire)


def allreduce_sum(comm, x, wire: str, out=None):
    """The sum over ranks of float32 ``x`` with ``wire`` values on the wire, as float32 in ``out`` (default:
    ``x`` itself, in place).

    float32: one Allreduce.  16-bit: reduce-scatter (Alltoallv of the
    encoded blocks, float32 sums of each block in rank order) and an
    Allgatherv of the encoded block sums (see the module docstring); float16
    carries ``x / W`` and the result is multiplied back.  Every rank
    receives the same bits.
    """
    if out is None:
        out = x
    if check(wire) == "float32":
        return comm.allreduce(x, out)
    xp = backend.array_module(x)
    W = comm.size
    if W == 1:
        return decode(encode(x, wire), wire, out=out)
    scale = W if predivides(wire) else None
    w = _encode_divided(x, wire, scale)
    b = blocks(int(x.size), W)
    mine = int(b[comm.rank])
    recv, _ = comm.alltoallv(w, b, recvcounts=np.full(W, mine, dtype=np.int64))
    part = _sum_blocks(recv, wire, W, mine)
    summed, _ = comm.allgatherv(encode(part, wire), b)
    decode(summed, wire, out=out)
    if scale is not None:
        out *= xp.float32(scale)
    return out


def _torch_view(w, wire: str):
    """Host 16-bit patterns ``w`` as a torch float16 / bfloat16 tensor sharing their memory (None: not a host
    array, a 32-bit wire, or torch not loaded)."""
    torch = sys.modules.get("torch")
    if torch is None or check(wire) == "float32" or not isinstance(w, np.ndarray):
        return None
    t = torch.from_numpy(np.ascontiguousarray(w).view(np.int16))
    return t.view(torch.float16 if wire == "float16" else torch.bfloat16)


#: elements of one cache-sized piece of the host passes below (256 KiB of float32): torch's casts are
#: vectorised but its arithmetic into a 16-bit output, or between a float32 and a 16-bit operand, is not, so
#: the arithmetic runs in float32 on a piece that stays in cache and a vectorised cast follows it
_PIECE = 1 << 16


def _pieces(n: int):
    for i in range(0, n, _PIECE):
        yield slice(i, min(i + _PIECE, n))


def _encode_divided(x, wire: str, scale: int | None):
    """``encode(x / scale, wire)`` (``scale`` None: ``encode(x, wire)``).  Host float32 ``x`` with torch
    loaded: piece by piece, the float32 quotient in a cache-sized buffer then one rounding to the wire type
    (the same bits as dividing all of ``x`` first, without allocating and writing a float32 quotient of
    it)."""
    torch = sys.modules.get("torch")
    if scale is None or torch is None or not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 1:
        return encode(x / backend.array_module(x).float32(scale) if scale is not None else x, wire)
    bits = np.empty(x.shape, dtype=np.uint16)
    src, dst = torch.from_numpy(np.ascontiguousarray(x)), _torch_view(bits, wire)
    tmp = torch.empty(min(_PIECE, x.size), dtype=torch.float32)
    for p in _pieces(x.size):
        q = tmp[: p.stop - p.start]
        torch.div(src[p], scale, out=q)
        dst[p].copy_(q)
    return bits


def _sum_blocks(recv, wire: str, world: int, mine: int):
    """The float32 sum of the ``world`` 16-bit blocks of ``mine`` values each in ``recv``, added in rank order
    (one rounding to float32 an addition: the values of ``decode(recv).reshape(world, mine).sum(axis=0)``; only
    a sum of negative zeros differs, -0.0 here against NumPy's +0.0).
    Host blocks with torch loaded: piece by piece, each block's piece decoded into a cache-sized buffer and
    added, without decoding all of ``recv`` first."""
    xp = backend.array_module(recv)
    if not mine:
        return xp.empty(0, xp.float32)
    t = _torch_view(recv, wire)
    if t is None:
        return decode(recv, wire).reshape(world, mine).sum(axis=0, dtype=xp.float32)
    torch = sys.modules["torch"]
    part = np.empty(mine, dtype=np.float32)
    acc, tmp = torch.from_numpy(part), torch.empty(min(_PIECE, mine), dtype=torch.float32)
    rows = t.reshape(world, mine)
    for p in _pieces(mine):
        a, q = acc[p], tmp[: p.stop - p.start]
        a.copy_(rows[0, p])
        for r in range(1, world):
            q.copy_(rows[r, p])
            a.add_(q)
    return part


def allgather_values(comm, vals, counts, wire: str):
    """Every rank's float32 ``vals`` (``counts`` from an earlier Allgatherv), sent as ``wire`` values and
    returned as float32 (the same bits on every rank)."""
    if check(wire) == "float32":
        return comm.allgatherv(vals, counts)[0]
    got, _ = comm.allgatherv(encode(vals, wire), counts)
    return decode(got, wire)


def sent_values(vals, wire: str, world: int) -> Any:
    """What :func:`allreduce_sum` counts as rank's contribution of ``vals``: float16 ``W round(vals / W)``,
    bfloat16 ``round(vals)``; float32 ``vals`` itself."""
    if not predivides(wire):
        return round_trip(vals, wire)
    xp = backend.array_module(vals)
    s = round_trip(vals / xp.float32(world), wire)
    s *= xp.float32(world)
    return s
