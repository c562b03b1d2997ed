"""Row-sparse exchange of embedding gradients in :func:`mpisparse.torch.DistributedOptimizer`.

A batch looks up a few rows of each embedding table, so a table's gradient
is non-zero on those rows only: it is sparse before any scheme selects
anything.  The tables go beside the scheme, exactly:

1. at the end of backward each rank takes, per table, the rows it touched:
   an ``nn.Embedding(sparse=True)`` gradient (sparse COO) coalesced, or the
   non-zero rows of a dense table's gradient (a row whose gradient is all
   zero adds nothing to the sum);
2. one Allgatherv of the row indices (all tables in one index space, each
   table's rows offset by the rows before it; the per-rank counts are its
   first step), one Allgatherv of the rows (their lengths follow from the
   gathered indices: no second count exchange);
3. every rank sums the gathered rows in rank order (the same order on every
   rank, and a NumPy reference's), divides by the world size (op Average;
   ``gradient_predivide_factor`` as for the dense layers) and writes the
   aggregate into ``.grad``: a coalesced sparse COO tensor for a table whose
   module is ``sparse=True``, a dense one otherwise.  Untouched rows stay zero.

Only touched rows cross the wire: a rank sends about ``(W - 1) / W * sum_r
k_r (b_i + 4 d)`` bytes for ``k_r`` rows touched by rank ``r`` (``b_i``: 4-byte
indices while the tables hold fewer than 2**31 rows), plus ``8 (W - 1)`` for
the counts (:func:`row_exchange_bytes`, what the communicator counts).

No selection, no error feedback on the rows (a decision): the rows are
already sparse, and their exchange scales with the batch, not the table;
error feedback would keep a residual as large as every table on every rank
and send the residual's rows with each step's, so the rows sent would grow
to every row ever touched (the sparsity it works for would be lost); and
the exact sum keeps an embedding run equal to its dense-table run.  The
dense layers go through the scheme (its selection and error feedback) as
before; ``density_actual`` and ``selected_global()`` count them alone.

Which parameters are tables (``sparse_rows=``, a keyword of
:func:`DistributedOptimizer`): None (the default) the weights of the model's
``nn.Embedding``/``nn.EmbeddingBag`` modules built with ``sparse=True``;
True every such module's weight (dense tables too); False none (a sparse
gradient then cannot pass: ValueError); or a collection of parameter names.
A parameter-free model (``named_parameters`` without ``model``) has no
modules to look at: name its tables.  A local-update scheme (``localsgd``)
takes no tables.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from .. import backend

__all__ = ["RowExchange", "RowTable", "RowsMixin", "rank_order_sum", "row_exchange_bytes", "sparse_mean",
           "split_tables"]

#: the modules whose weight is a table of rows looked up by id
EMBEDDINGS = (torch.nn.Embedding, torch.nn.EmbeddingBag)


@dataclass
class RowTable:
    """One table: its parameter, its gradient's layout (``sparse``: the module's flag; None: as it arrives), its
    rows, row length and the offset of its first row in the exchange's index space."""

    name: str
    param: torch.nn.Parameter
    sparse: bool | None
    rows: int
    dim: int
    offset: int = 0


def split_tables(named: Sequence[tuple[str, torch.nn.Parameter]], model, sparse_rows, scheme_cls=None
                 ) -> tuple[list[tuple[str, torch.nn.Parameter]], list[RowTable]]:
    """``(the parameters the scheme exchanges, the tables)`` for ``sparse_rows`` (module docstring).  ValueError
    (one line, naming the parameter) for a sparse gradient the scheme would have to take, a named table that is
    not a 2-D parameter, or tables with a local-update scheme."""
    mods = [m for m in model.modules() if isinstance(m, EMBEDDINGS)] if model is not None else []
    flags = {id(m.weight): bool(m.sparse) for m in mods}
    names = {id(p): n for n, p in named}
    if sparse_rows is None or isinstance(sparse_rows, bool):
        chosen = {i for i, sparse in flags.items() if sparse_rows or (sparse_rows is None and sparse)}
        if sparse_rows is False and any(flags.values()):
            bad = next(names.get(i, "?") for i, s in flags.items() if s)
            raise ValueError(f"parameter {bad!r} gets a sparse gradient (nn.Embedding(sparse=True)) and sparse_rows "
                             "is False: the scheme takes dense gradients only; allowed: sparse_rows=None or True, or "
                             "the module built with sparse=False")
    else:
        wanted = set(sparse_rows)
        unknown = sorted(wanted - set(names.values()))
        if unknown:
            raise ValueError(f"sparse_rows names {unknown[0]!r}, which is not a trainable parameter; allowed: names "
                             "of named_parameters")
        chosen = {id(p) for n, p in named if n in wanted}
    dense, tables, offset = [], [], 0
    for n, p in named:
        if id(p) not in chosen:
            dense.append((n, p))
            continue
        if p.dim() != 2:
            raise ValueError(f"sparse_rows: parameter {n!r} has shape {tuple(p.shape)}; allowed: a 2-D table (rows, "
                             "dim)")
        tables.append(RowTable(n, p, flags.get(id(p)), int(p.shape[0]), int(p.shape[1]), offset))
        offset += int(p.shape[0])
    if tables and scheme_cls is not None and getattr(scheme_cls, "local_update", False):
        raise ValueError(f"scheme {scheme_cls.name!r} updates each rank's parameters locally between "
                         f"synchronizations; parameter {tables[0].name!r} would be exchanged row-sparse every step: "
                         "allowed: sparse_rows=False with tables built sparse=False")
    if tables and not dense:
        raise ValueError(f"every trainable parameter is an embedding table (e.g. {tables[0].name!r}); the scheme "
                         "needs at least one dense parameter, or pass sparse_rows=False")
    return dense, tables


def row_exchange_bytes(rows: Sequence[int], elements: Sequence[int], rank: int, index_bytes: int = 4,
                       value_bytes: int = 4) -> int:
    """Bytes ``rank`` sends in the row exchange (the ring byte model of the communicator): the counts (8 bytes a
    rank, W - 1 forwarded), then every rank's ``rows`` indices and ``elements`` values but those it receives
    last (the next rank's)."""
    world = len(rows)
    if world <= 1:
        return 0
    nxt = (rank + 1) % world
    return (8 * (world - 1) + index_bytes * (int(sum(rows)) - int(rows[nxt]))
            + value_bytes * (int(sum(elements)) - int(elements[nxt])))


def rank_order_sum(ids: torch.Tensor, rows: torch.Tensor, counts) -> tuple[torch.Tensor, torch.Tensor]:
    """``(union, sums)``: the distinct ``ids`` (sorted) and, per id, the sum of its ``rows`` (``(n, dim)``, every
    rank's block in rank order, ``counts`` rows each) added in rank order.  A rank's ids are distinct, so each
    ``index_add_`` is free of collisions: the same sums on every rank and device, and NumPy's for that order."""
    union = torch.unique(ids)
    agg = torch.zeros(union.numel(), rows.shape[1], dtype=torch.float32, device=rows.device)
    pos = torch.searchsorted(union, ids)
    start = 0
    for c in (int(c) for c in counts):
        if c:
            agg.index_add_(0, pos[start:start + c], rows[start:start + c])
        start += c
    return union, agg


def sparse_mean(comm, grad: torch.Tensor) -> torch.Tensor:
    """The mean over ranks of a sparse COO gradient (one table's, e.g. a DDP bucket of an
    ``nn.Embedding(sparse=True)``), coalesced: its rows gathered (indices, then rows) and summed in rank order."""
    g = grad.coalesce()
    ids, vals = g.indices()[0], g.values()
    row = int(np.prod(vals.shape[1:], dtype=np.int64))
    wide = np.int64 if backend.index_dtype(int(g.shape[0])) == np.int64 else np.int32
    got, counts = comm.allgatherv(backend.as_array(ids.to(torch.int64 if wide == np.int64 else torch.int32)))
    rows, _ = comm.allgatherv(backend.as_array(vals.to(torch.float32).reshape(-1).contiguous()),
                              np.asarray(counts) * row)
    union, agg = rank_order_sum(backend.to_torch(got).to(torch.int64).to(g.device),
                                backend.to_torch(rows).to(g.device).view(-1, row), counts)
    agg = (agg / comm.size).to(g.dtype).view(-1, *vals.shape[1:])
    return torch.sparse_coo_tensor(union.unsqueeze(0), agg, tuple(g.shape), is_coalesced=True,
                                   check_invariants=False)


@dataclass
class _Log:
    """Per exchange: this rank's rows, the union's rows, the bytes sent (measured) and the byte model's."""

    rows: list[int] = field(default_factory=list)
    union: list[int] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)
    model: list[int] = field(default_factory=list)


class RowExchange:
    """The tables' exchange (module docstring): :meth:`gather` (local), :meth:`exchange` (collective)."""

    def __init__(self, comm, tables: list[RowTable], timer):
        self.comm, self.tables, self.timer = comm, tables, timer
        total = sum(t.rows for t in tables)
        self.index_dtype = backend.index_dtype(total)
        dev = tables[0].param.device
        self._offsets = torch.tensor([t.offset for t in tables] + [total], dtype=torch.int64, device=dev)
        self._dims = torch.tensor([t.dim for t in tables], dtype=torch.int64, device=dev)
        self._idx: torch.Tensor | None = None
        self._val: torch.Tensor | None = None
        self.amax = 0.0
        self.log = _Log()

    # ------------------------------------------------------------ local
    def _rows_of(self, t: RowTable, active: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's touched rows of table ``t``: (row ids, rows as float32)."""
        g = t.param.grad
        if g is None or not active:
            return (torch.zeros(0, dtype=torch.int64, device=t.param.device),
                    torch.zeros(0, t.dim, dtype=torch.float32, device=t.param.device))
        if g.is_sparse:
            g = g.coalesce()
            return g.indices()[0], g.values().to(torch.float32).reshape(-1, t.dim)
        idx = g.detach().ne(0).any(dim=1).nonzero().squeeze(1)
        return idx, g.detach()[idx].to(torch.float32)

    def gather(self, *, active: bool = True, predivide: float = 1.0) -> bool:
        """Collect this rank's touched rows (all tables, one index space); True when one is not finite."""
        parts = [self._rows_of(t, active) for t in self.tables]
        self._idx = torch.cat([i + t.offset for (i, _), t in zip(parts, self.tables)])
        self._val = torch.cat([v.reshape(-1) for _, v in parts])
        if predivide != 1.0:
            self._val = self._val / predivide
        return not np.isfinite(backend.abs_max(self._val)) if self._val.numel() else False

    # ------------------------------------------------------------ collective
    def exchange(self, *, average: bool, predivide: float = 1.0) -> bool:
        """Gather every rank's rows, sum them in rank order and write each table's aggregate into ``.grad``.
        Returns False when the aggregate is not finite (the same on every rank: the same sums)."""
        comm = self.comm
        before = comm.bytes_sent
        idx = self._idx.to(torch.int64 if self.index_dtype == np.int64 else torch.int32)
        with self.timer.phase("exchange_indices"):
            got, counts = comm.allgatherv(backend.as_array(idx))
        got = backend.to_torch(got).to(torch.int64)
        table = torch.bucketize(got, self._offsets[1:], right=True)  # each gathered row's table
        sizes = self._dims[table]
        rank_of = torch.repeat_interleave(torch.arange(comm.size, device=got.device),
                                          torch.as_tensor(counts, device=got.device))
        elements = torch.zeros(comm.size, dtype=torch.int64, device=got.device).index_add_(0, rank_of, sizes)
        elements = elements.cpu().numpy()
        with self.timer.phase("exchange_values"):
            vals, _ = comm.allgatherv(backend.as_array(self._val.contiguous()), elements)
        vals = backend.to_torch(vals)
        self.log.sent.append(comm.bytes_sent - before)
        self.log.model.append(row_exchange_bytes(counts, elements, comm.rank, np.dtype(self.index_dtype).itemsize))
        self.log.rows.append(int(self._idx.numel()))
        with self.timer.phase("update"):
            scale = predivide / (comm.size if average else 1)
            union, amax = 0, 0.0
            offsets = torch.cumsum(sizes, 0) - sizes  # where each gathered row's values start
            for k, t in enumerate(self.tables):
                mine = (table == k).nonzero().squeeze(1)
                block = vals[offsets[mine].unsqueeze(1) + torch.arange(t.dim, device=got.device)]
                rows, agg = rank_order_sum(got[mine] - t.offset, block, torch.bincount(rank_of[mine],
                                                                                     minlength=comm.size))
                if scale != 1.0:
                    agg.mul_(scale)
                union += int(rows.numel())
                amax = max(amax, backend.abs_max(agg) if agg.numel() else 0.0)
                self._write(t, rows, agg)
            self.log.union.append(union)
            self.amax = amax
        self._idx = self._val = None
        return bool(np.isfinite(amax))

    @staticmethod
    def _write(t: RowTable, rows: torch.Tensor, agg: torch.Tensor) -> None:
        p = t.param
        sparse = t.sparse if t.sparse is not None else (p.grad is not None and p.grad.is_sparse)
        agg = agg.to(p.dtype)
        if sparse:
            p.grad = torch.sparse_coo_tensor(rows.unsqueeze(0), agg, tuple(p.shape), is_coalesced=True,
                                             check_invariants=False)
            return
        if p.grad is None or p.grad.is_sparse:
            p.grad = torch.zeros_like(p)
        else:
            p.grad.zero_()
        p.grad.index_copy_(0, rows, agg)

    def nan(self) -> None:
        """A skipped step: every table's ``.grad`` NaN (dense), as the dense layers'."""
        for t in self.tables:
            t.param.grad = torch.full_like(t.param, float("nan"))
        self._idx = self._val = None

    @torch.no_grad()
    def broadcast(self, root: int = 0) -> None:
        for t in self.tables:
            flat = t.param.detach().to(torch.float32).reshape(-1).clone()
            self.comm.bcast(backend.as_array(flat), root)
            t.param.copy_(flat.view(t.param.shape))

    def report(self, comm, total_bytes: float | None = None) -> dict[str, Any]:
        """The tables' summary for a result (a collective over ``comm``): rows touched by a rank and by all per
        step, bytes per step measured and by the byte model (means over exchanges, max over ranks), the dense
        tables' size; with ``total_bytes`` (this rank's mean bytes per step) the rest of the step's bytes."""
        log = self.log
        mean = (lambda xs: float(np.mean(xs)) if xs else 0.0)
        mine = {"rows": mean(log.rows), "union": mean(log.union), "sent": mean(log.sent), "model": mean(log.model),
                "rest": None if total_bytes is None else float(total_bytes) - mean(log.sent)}
        everyone = comm.allgather_obj(mine)
        out = {"tables": len(self.tables), "rows": [t.rows for t in self.tables], "dims": [t.dim for t in self.tables],
               "table_bytes": 4 * sum(t.rows * t.dim for t in self.tables), "exchanges": len(log.sent),
               "rows_touched_per_step": max(e["rows"] for e in everyone),
               "rows_union_per_step": max(e["union"] for e in everyone),
               "bytes_per_step": max(e["sent"] for e in everyone),
               "model_bytes_per_step": max(e["model"] for e in everyone)}
        if total_bytes is not None:
            out["dense_bytes_per_step"] = max(e["rest"] for e in everyone)
        return out


class RowsMixin:
    """Mixed into :func:`DistributedOptimizer`'s class before the exchange mixin: the tables beside the scheme.

    It splits the tables off the parameters the scheme exchanges (``_setup``), gathers their rows when the
    exchange starts (``_synchronize``; a non-finite row skips the step on every rank through the same
    4-byte agreement, ``_all_finite``), exchanges them before the dense update is written back
    (``_finish_sync``), and keeps them in the skip, the overflow guard's check and snapshot, and the broadcast.
    """

    rows: RowExchange | None = None
    _rows_bad = False

    def _setup(self, optimizer, named, model, scheme, density, comm, timer, memory, seed, broadcast, compression,
               backward_passes_per_step, op, gradient_predivide_factor, scheme_options, *rest):
        from ..registry import scheme_class

        options = dict(scheme_options)
        dense, tables = split_tables(named, model, options.pop("sparse_rows", None), scheme_class(scheme))
        super()._setup(optimizer, dense, model, scheme, density, comm, timer, memory, seed, broadcast, compression,
                       backward_passes_per_step, op, gradient_predivide_factor, options, *rest)
        if not tables:
            return
        self.rows = RowExchange(self.comm, tables, self.timer)
        ref = weakref.ref(self)

        def queue(param, ref=ref):  # a table's gradient arrived: the exchange runs at the end of backward too
            owner = ref()
            if owner is not None and not owner._queued:
                owner._queued = True
                torch.autograd.Variable._execution_engine.queue_callback(owner._end_of_backward)

        self._hooks += [t.param.register_post_accumulate_grad_hook(queue) for t in tables]
        if broadcast:
            self.rows.broadcast(0)

    def _synchronize(self) -> bool:
        _refuse_sparse(self)
        if self.rows is not None:
            with self.timer.phase("compensate"):
                self._rows_bad = self.rows.gather(active=bool(self._active), predivide=self.gradient_predivide_factor)
        return super()._synchronize()

    def _all_finite(self) -> bool:
        if self._rows_bad:
            self._flag[0] = 1
            self._rows_bad = False
        return super()._all_finite()

    def _finish_sync(self, out) -> bool:
        if self.rows is not None and not self.rows.exchange(average=self.op != "sum",
                                                            predivide=self.gradient_predivide_factor):
            return self._skip()
        ok = super()._finish_sync(out)
        if ok and self.rows is not None:
            self._update_amax = max(self._update_amax, self.rows.amax)
        return ok

    def _skip(self) -> bool:
        if self.rows is not None:
            self.rows.nan()
        return super()._skip()

    def broadcast_parameters(self, root: int = 0) -> None:
        super().broadcast_parameters(root)
        if self.rows is not None:
            self.rows.broadcast(root)

    def _parameters_finite(self) -> bool:
        ok = super()._parameters_finite()
        if self.rows is not None:
            amax = backend.abs_max([t.param for t in self.rows.tables])
            self._param_amax = max(self._param_amax, amax) if np.isfinite(amax) else float("inf")
            ok = ok and bool(np.isfinite(amax))
        return ok

    def _snapshot_parameters(self) -> None:
        super()._snapshot_parameters()
        if self.rows is not None:
            self._saved_rows = [t.param.detach().clone() for t in self.rows.tables]

    def _restore_parameters(self) -> None:
        super()._restore_parameters()
        if self.rows is not None:
            for t, saved in zip(self.rows.tables, self._saved_rows):
                t.param.detach().copy_(saved)


def _refuse_sparse(opt) -> None:
    """A sparse gradient on a parameter the scheme exchanges (a table nobody named): ValueError naming it."""
    for s, p in zip(opt.layout.layers, opt.params):
        if p.grad is not None and p.grad.is_sparse:
            raise ValueError(f"parameter {s.name!r} has a sparse gradient but goes through scheme "
                             f"{opt.scheme.name!r}, which takes dense gradients only; allowed: pass model= (its "
                             "nn.Embedding(sparse=True) tables are exchanged row-sparse) or sparse_rows=[names]")
