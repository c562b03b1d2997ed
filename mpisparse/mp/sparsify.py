"""DCT-MP's activation sparsification and its wire format (pure NumPy, no MPI).

Gupta et al., "Fast Distributed Training of Deep Neural Networks: Dynamic
Communication Thresholding for Model and Data Parallelism" (Gupta et al.),
Sec. 2.2 and Algorithm 2 (DCT-MP).  With mini-batch size ``B`` and ``d``
output features before the split, the activation matrix ``X_act`` and its
gradient ``X_grad`` are ``B x d``; with sparsity factor ``eta`` (here
``--density``, the kept fraction):

Forward pass

1. (l.1-2) input: ``eta`` and ``X_act`` (one row per sample);
2. (l.3-9) per row ``i``: sort ``|X_act,i|`` (descending), ``tau_i`` = the
   ``floor(d eta)``-th largest, mask ``m_i = I(|X_act,i| >= tau_i)``;
   ``M = [m_1; ...; m_B]``;
3. (l.10) sparse matrix ``X_act * M``;
4. (l.11) send ``X_act * M`` and the mask ``M`` across the network.

Backward pass

5. (l.12) input: ``X_grad`` (the gradient of the loss with respect to the
   activation the next stage received);
6. (l.13) sparse matrix ``X_grad * M`` (the same ``M``);
7. (l.14) send ``X_grad * M`` across the network.

Decisions where the paper leaves room:

* **Exactly ``k`` per row.**  ``k = floor(d eta)`` (at least 1, as in
  DCT-DP's l.5; :func:`mpisparse.schemes.dct.layer_rank`), and the mask keeps
  exactly the ``k`` largest magnitudes of each row (the backend's
  ``rowwise_topk_mask``; ties at ``tau_i`` broken arbitrarily).  Taken
  literally, ``|x| >= tau_i`` keeps every tied entry: after a ReLU a row
  with fewer than ``k`` non-zeros has ``tau_i = 0`` and the mask would keep
  the whole row.  Exactly ``k`` keeps the bytes on the wire predictable.
* **Laplace estimate** (Sec. 2.2 "Reducing compression overhead", Appendix
  B; ``--mp-threshold laplace``): one ``tau`` for the whole (micro-)batch
  from the mean and variance of its entries, through the Laplace quantile
  function (two-sided: ``P(|R| >= tau) = eta``,
  :func:`mpisparse.schemes.dct.laplace_fit_threshold`); mask
  ``I(|X_act| >= tau)``.  O(Bd), no sort, but the kept fraction differs
  from ``eta`` (the paper's Fig. 6b), so it is measured and reported.  In
  evaluation the ``tau`` of the last training step is used, as the paper
  suggests for serving.
* **The mask on the wire.**  Either a bitmap (``ceil(B d / 8)`` bytes) or
  the flat positions of the kept entries in the smallest unsigned integer
  type that holds ``B d - 1`` (:func:`mask_index_dtype`); whichever is
  smaller is sent (a tie goes to the bitmap), :func:`choose_encoding`.  With
  4-byte positions the bitmap wins above a kept fraction of 1/32.  A mask
  that keeps everything is not sent at all: the message is then the dense
  matrix, exactly what an uncompressed pipeline sends.
* **Message layout.**  One message per (micro-)batch and split.  Sparse:
  a 24-byte header (int64 rows, kept count, encoding), the kept values
  (float32, row-major order), the mask.  Dense: the float32 matrix alone.
  The backward message is the float32 values of ``X_grad`` under the mask,
  in the same order, with no header (the receiver holds the mask).
  So, per message, ``bytes_forward = 24 + 4 nnz + mask_bytes`` (or
  ``4 B d`` when dense) and ``bytes_backward = 4 nnz``: :func:`forward_bytes`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import backend
from ..schemes.dct import laplace_fit_threshold, layer_rank

__all__ = ["THRESHOLDS", "ENCODINGS", "HEADER_BYTES", "row_keep_count", "topk_row_mask", "laplace_mask",
           "mask_index_dtype", "choose_encoding", "encode", "decode", "densify", "forward_bytes",
           "backward_bytes", "ActivationSparsifier"]

#: ways to choose the per-row threshold: exact per-row top-k, or the Laplace fit
THRESHOLDS = ("topk", "laplace")
#: mask encodings on the wire (the header stores the position in this tuple)
ENCODINGS = ("dense", "bitmap", "indices")
#: rows, kept count, encoding (three int64)
HEADER_BYTES = 24
_VALUE_DTYPE = np.dtype(np.float32)


# --------------------------------------------------------------------------- the masks (Alg. 2 l.3-9)

def row_keep_count(d: int, density: float) -> int:
    """Alg. 2 l.6: entries kept per row, ``floor(d eta)`` clamped to ``[1, d]`` (0 when ``d = 0``)."""
    return layer_rank(d, density)


def _as_rows(x) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"the activation matrix must be 2-D (rows = samples), got shape {x.shape}")
    return x


def topk_row_mask(x, density: float) -> np.ndarray:
    """Alg. 2 l.3-9: per row, a boolean mask of the ``floor(d eta)`` largest ``|x|`` (exactly that many)."""
    x = _as_rows(x)
    k = row_keep_count(x.shape[1], density)
    return backend.rowwise_topk_mask(x, k)


def laplace_mask(x, density: float, tau: float | None = None) -> tuple[np.ndarray, float]:
    """Sec. 2.2 / App. B: mask ``|x| >= tau`` with ``tau`` from a Laplace fit of all of ``x``.

    ``tau`` given (evaluation) is used as is.  Returns ``(mask, tau)``.
    """
    x = _as_rows(x)
    if tau is None:
        tau = laplace_fit_threshold(x, density, two_sided=True)
    return np.abs(x) >= np.float32(tau), float(tau)


# --------------------------------------------------------------------------- the wire format (Alg. 2 l.10-11, 13-14)

def mask_index_dtype(n: int) -> np.dtype:
    """The smallest unsigned integer type that holds the flat positions ``0 .. n - 1``."""
    for dt in (np.uint8, np.uint16, np.uint32):
        if n <= np.iinfo(dt).max + 1:
            return np.dtype(dt)
    return np.dtype(np.uint64)


def choose_encoding(rows: int, d: int, nnz: int) -> tuple[str, int]:
    """``(encoding, mask bytes)`` of a ``rows x d`` mask keeping ``nnz`` entries.

    ``"dense"`` (0 bytes) when everything is kept; otherwise the smaller of
    ``"bitmap"`` (``ceil(rows d / 8)``) and ``"indices"`` (``nnz`` positions of
    :func:`mask_index_dtype`); a tie goes to the bitmap.
    """
    n = int(rows) * int(d)
    nnz = int(nnz)
    if not 0 <= nnz <= n:
        raise ValueError(f"kept count {nnz} is not in [0, {n}]")
    if nnz == n:
        return "dense", 0
    bitmap = (n + 7) // 8
    indices = nnz * mask_index_dtype(n).itemsize
    return ("bitmap", bitmap) if bitmap <= indices else ("indices", indices)


def forward_bytes(rows: int, d: int, nnz: int) -> int:
    """Bytes of one forward message: ``4 rows d`` dense, else ``24 + 4 nnz + mask bytes``."""
    enc, mask_bytes = choose_encoding(rows, d, nnz)
    if enc == "dense":
        return _VALUE_DTYPE.itemsize * int(rows) * int(d)
    return HEADER_BYTES + _VALUE_DTYPE.itemsize * int(nnz) + mask_bytes


def backward_bytes(nnz: int) -> int:
    """Bytes of one backward message: the kept gradient values (float32)."""
    return _VALUE_DTYPE.itemsize * int(nnz)


def encode(x, mask: np.ndarray | None) -> tuple[str, np.ndarray]:
    """Alg. 2 l.10-11: the message carrying ``x * mask`` and ``mask``.

    Returns ``(encoding, buffer)``: for ``"dense"`` (``mask`` None or all
    True) the float32 matrix itself, otherwise a uint8 buffer: header,
    values ``x[mask]`` (row-major), mask (bitmap or positions).
    """
    x = np.ascontiguousarray(_as_rows(x), dtype=_VALUE_DTYPE)
    rows, d = x.shape
    if mask is None:
        return "dense", x.reshape(-1)
    if mask.shape != x.shape or mask.dtype != np.bool_:
        raise ValueError(f"mask must be a boolean array of shape {x.shape}, got {mask.dtype} {mask.shape}")
    flat = mask.reshape(-1)
    nnz = int(np.count_nonzero(flat))
    enc, mask_bytes = choose_encoding(rows, d, nnz)
    if enc == "dense":
        return "dense", x.reshape(-1)
    nv = _VALUE_DTYPE.itemsize * nnz
    buf = np.empty(HEADER_BYTES + nv + mask_bytes, dtype=np.uint8)
    buf[:HEADER_BYTES].view(np.int64)[:] = (rows, nnz, ENCODINGS.index(enc))
    buf[HEADER_BYTES:HEADER_BYTES + nv].view(_VALUE_DTYPE)[:] = x.reshape(-1)[flat]
    tail = buf[HEADER_BYTES + nv:]
    if enc == "bitmap":
        tail[:] = np.packbits(flat)
    else:
        tail.view(mask_index_dtype(rows * d))[:] = np.flatnonzero(flat)
    return enc, buf


def decode(buf: np.ndarray, d: int, *, dense: bool) -> tuple[np.ndarray | None, np.ndarray, str]:
    """Inverse of :func:`encode`: ``(mask or None, values, encoding)``.

    ``dense``: ``buf`` is a float32 matrix of ``d`` columns (``mask`` None,
    ``values`` the ``rows x d`` matrix); otherwise a uint8 sparse message.
    """
    d = int(d)
    if dense:
        vals = np.asarray(buf, dtype=_VALUE_DTYPE)
        if d <= 0 or vals.size % d:
            raise ValueError(f"a dense message of {vals.size} values is not a whole number of rows of {d}")
        return None, vals.reshape(-1, d), "dense"
    buf = np.asarray(buf, dtype=np.uint8)
    if buf.size < HEADER_BYTES:
        raise ValueError(f"a sparse message needs a {HEADER_BYTES}-byte header, got {buf.size} bytes")
    rows, nnz, code = (int(v) for v in buf[:HEADER_BYTES].view(np.int64))
    if not 0 < code < len(ENCODINGS):
        raise ValueError(f"unknown mask encoding {code} in a sparse message")
    enc = ENCODINGS[code]
    n = rows * d
    expect_enc, mask_bytes = choose_encoding(rows, d, nnz)
    nv = _VALUE_DTYPE.itemsize * nnz
    if enc != expect_enc or buf.size != HEADER_BYTES + nv + mask_bytes:
        raise ValueError(f"sparse message of {buf.size} bytes does not match its header "
                         f"({rows} rows x {d}, {nnz} kept, {enc})")
    vals = buf[HEADER_BYTES:HEADER_BYTES + nv].view(_VALUE_DTYPE).copy()
    tail = buf[HEADER_BYTES + nv:]
    if enc == "bitmap":
        flat = np.unpackbits(tail, count=n).view(np.bool_)
    else:
        flat = np.zeros(n, dtype=np.bool_)
        flat[tail.view(mask_index_dtype(n))] = True
    if int(np.count_nonzero(flat)) != nnz:
        raise ValueError(f"sparse message: the mask keeps {int(np.count_nonzero(flat))} entries, the header says {nnz}")
    return flat.reshape(rows, d), vals, enc


def densify(mask: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The ``rows x d`` float32 matrix with ``values`` under ``mask`` (row-major) and zeros elsewhere."""
    out = np.zeros(mask.shape, dtype=_VALUE_DTYPE)
    out[mask] = values
    return out


# --------------------------------------------------------------------------- the state object

class ActivationSparsifier:
    """DCT-MP's selector for one split (Gupta et al., Alg. 2 l.3-9), with its statistics.

    ``threshold="topk"``: exact per-row top-``floor(d eta)``;
    ``threshold="laplace"``: one ``tau`` per (micro-)batch from a Laplace fit.
    :meth:`state_dict` holds the hyperparameters, the last Laplace ``tau``
    and the running kept / total counts.
    """

    def __init__(self, density: float, threshold: str = "topk"):
        if not (isinstance(density, (int, float)) and math.isfinite(density) and 0.0 < density <= 1.0):
            raise ValueError(f"--density is {density!r}; allowed range is (0, 1]")
        if threshold not in THRESHOLDS:
            raise ValueError(f"--mp-threshold is {threshold!r}; allowed values are {', '.join(THRESHOLDS)}")
        self.density = float(density)
        self.threshold = threshold
        #: the last Laplace threshold fitted in training (used in evaluation)
        self.tau: float | None = None
        #: entries kept and offered in training, summed over calls
        self.kept = 0
        self.total = 0

    def select(self, x, *, training: bool = True) -> np.ndarray:
        """The mask ``M`` of the activation matrix ``x`` (rows = samples)."""
        x = _as_rows(x)
        if self.threshold == "topk":
            mask = topk_row_mask(x, self.density)  # Alg. 2 l.3-9
        else:
            mask, tau = laplace_mask(x, self.density, None if training else self.tau)  # Sec. 2.2
            if training:
                self.tau = tau
        if training:
            self.kept += int(np.count_nonzero(mask))
            self.total += int(mask.size)
        return mask

    @property
    def occupancy(self) -> float:
        """Kept fraction over every training call so far."""
        return self.kept / self.total if self.total else 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"density": self.density, "threshold": self.threshold, "tau": self.tau,
                "kept": self.kept, "total": self.total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("threshold") != self.threshold:
            raise ValueError(f"state is for --mp-threshold {state.get('threshold')!r}, not {self.threshold!r}")
        self.tau = None if state.get("tau") is None else float(state["tau"])
        self.kept = int(state.get("kept", 0))
        self.total = int(state.get("total", 0))
