"""The data-parallel scheme interface (runtime ``collective``).

A scheme turns each rank's gradient vector (the fusion buffer) into the
same aggregated update on every rank.  It is built from three parts:

* a **memory** (:mod:`mpisparse.schemes.memory`): error feedback around the step;
* a **selector**: which entries this rank offers (backend kernels);
* an **exchange**: the collective pattern that combines the ranks' offers
  (through :class:`mpisparse.mpi.comm.Communicator`, which counts and times).

:meth:`CollectiveScheme.step` returns the *mean* over ranks of what was sent, as a
dense vector owned by the scheme (overwritten by the next step), or written into
a vector the caller names (``step(grad, out=grad)``: the update replaces the
gradient, and the scheme holds no output buffer of its own).  Phases
are timed with the shared vocabulary of :mod:`mpisparse.results.timing`.  Statistics
that cost extra work (distinct selected indices) are computed lazily by
:meth:`CollectiveScheme.selected_global`, outside the timed step.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import numpy as np

from .. import backend
from ..backend.fusion import FusionLayout
from .memory import Memory, make_memory
from ..registry import SCHEMES, SchemeBase, SchemeOption, k_for, register, scheme_class, validate_density
from ..mpi import wire
from ..mpi.wire import WIRE_DTYPES
from ..results.timing import PhaseTimer

__all__ = ["CollectiveScheme", "SCHEMES", "SELECT_KERNEL", "Scheme", "SchemeOption", "SparseGatherScheme", "WIRE_DTYPE",
           "k_for", "register", "scatter_sum", "scheme_class", "validate_density"]

#: the selection primitive of the schemes that declare it (:mod:`mpisparse.backend.reference`)
SELECT_KERNEL = SchemeOption(
    "select_kernel", str, "native",
    "topk, cltk, deft, dct: the selection primitive; native = this toolkit's linear-time kernels, "
    "torch = torch.topk (the DEFT reference's), sort = copy-and-sort (DCT's); the others reproduce the "
    "papers' timings", choices=("native", "torch", "sort"))

#: the values' type on the wire (:mod:`mpisparse.mpi.wire`); a scheme that declares it sends 16-bit values where
#: asked and keeps their rounding error in its memory
WIRE_DTYPE = SchemeOption(
    "wire_dtype", str, "float32",
    "dense, topk, threshold, randomk, cltk, deft, dgc, dct: the values' type on the wire (indices stay 32-bit); "
    "float16 divides by the world size before a sum (no overflow), bfloat16 keeps float32's range; sums are "
    "float32 (a reduce-scatter), the rounding error stays in the error feedback", choices=WIRE_DTYPES)


class CollectiveScheme(SchemeBase):
    """Base of the data-parallel schemes (runtime ``collective``); subclasses implement :meth:`_step`.

    Every rank calls :meth:`step` with its gradient vector in the same
    order; the scheme's exchange combines them.
    """

    runtime: ClassVar[str] = "collective"
    #: whether error feedback applies (False for dense)
    uses_memory: ClassVar[bool] = True
    #: the scheme applies momentum itself (DGC's momentum correction): the
    #: optimizer then runs without momentum
    provides_momentum: ClassVar[bool] = False
    #: exchanges only through Allreduce, Bcast and Allgatherv, whose two-level forms give the same result
    hierarchical: ClassVar[bool] = True
    #: the scheme averages parameters every few steps (``localsgd``): its step returns the rank's own gradient,
    #: and the optimizer calls its ``after_step`` with the parameters; drivers that see gradients only refuse it
    local_update: ClassVar[bool] = False
    #: the compiled loops a host step calls (names of :data:`mpisparse.backend.compiled.KERNELS`), loaded by
    #: :meth:`warm_up` before the full-size buffers exist
    compiled_kernels: ClassVar[tuple[str, ...]] = ()

    #: why the scheme sends float32 values only, for the one-line refusal of another ``--wire-dtype`` (a
    #: scheme that can carry 16-bit values declares :data:`WIRE_DTYPE` among its options instead)
    wire_refusal: ClassVar[str] = "its exchange is not written for 16-bit values"

    @classmethod
    def validate_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """As :meth:`SchemeBase.validate_options`; a ``wire_dtype`` other than float32 for a scheme without
        the option is refused in one line naming the scheme and the allowed value."""
        if "wire_dtype" in options and not any(o.name == "wire_dtype" for o in cls.options):
            options = dict(options)
            value = options.pop("wire_dtype")
            if value not in (None, "float32"):
                raise ValueError(f"--wire-dtype is {value!r}; scheme {cls.name!r} sends float32 values only "
                                 f"({cls.wire_refusal}); allowed values are float32")
        return super().validate_options(options)

    @classmethod
    def bucket_reason(cls, options: dict[str, Any]) -> str | None:
        """Why this scheme (with ``options``) cannot run bucket by bucket (None: it can).

        Bucket-wise (``DistributedOptimizer(overlap=True)``) each bucket of
        layers is exchanged by its own instance of the scheme; that equals
        one step over the whole vector only when every decision is per
        element or per layer.  Most schemes select over the whole vector
        (a global top-k, a leader's index set, DEFT's layer allocation).
        """
        return "its selection spans the whole vector (a global top-k or threshold, or an allocation over all layers)"

    def __init__(self, comm, layout: FusionLayout, density: float, *, memory: bool = True,
                 timer: PhaseTimer | None = None, seed: int = 0, **options: Any):
        super().__init__(comm, layout, density, timer=timer, seed=seed, **options)
        self.memory: Memory = make_memory(memory and self.uses_memory)
        self.iteration = 0
        from ..backend.reference import check_kernel

        #: the selection primitive (``--select-kernel``; "native" for schemes without the option)
        self.select_kernel = check_kernel(self.opts.get("select_kernel") or "native")
        #: the values' type on the wire (``--wire-dtype``; float32 for schemes without the option)
        self.wire = self.opts.get("wire_dtype") or "float32"
        self._out = None
        #: where this step writes its update: the caller's ``out``, or None (the scheme's own vector)
        self._target = None
        #: the array module of the gradients (NumPy, or CuPy for device gradients): outputs and state live there
        self.xp = np

    # -------------------------------------------------------------- step
    def phase(self, name: str):
        return self.timer.phase(name)

    def output(self):
        """The vector this step writes: the caller's ``out``, else the scheme's own reusable dense vector
        (on the gradients' array module)."""
        if self._target is not None:
            return self._target
        if self._out is None:
            if self.xp is np:  # written out: a calloc'd vector maps its pages lazily, and a sparse step's
                # scattered writes would then fault a page at a time over the first steps
                self._out = np.empty(self.n, dtype=np.float32)
                self._out.fill(0)
            else:
                self._out = self.layout.zeros(xp=self.xp)
        return self._out

    def output_to_clear(self, last):
        """``(out, clear)``: the vector this step writes (:meth:`output`) and what of it must be zeroed
        first.  The scheme's own vector is reused step to step, so only the previous step's set ``last``
        (all of it when ``last`` is None, nothing when the vector was just made: an empty index set);
        the caller's ``out`` holds anything, so all of it (None)."""
        if self._target is not None:
            return self._target, None
        fresh = self._out is None
        out = self.output()
        return out, (self.xp.empty(0, dtype=backend.index_dtype(self.n)) if fresh else last)

    def write_output(self, idx, vals, scale: float, last):
        """The output vector holding ``vals * scale`` at ``idx`` and zero elsewhere (``last``: the set the
        previous step wrote, see :meth:`output_to_clear`); ``idx`` must not repeat (a scheme whose
        gathered sets overlap sums them with :func:`scatter_sum`)."""
        out, clear = self.output_to_clear(last)
        if clear is None:
            out.fill(0)
        elif len(clear):
            out[clear] = 0
        out[idx] = vals * out.dtype.type(scale)
        return out

    def warm_up(self) -> tuple[str, ...]:
        """Load the compiled loops a host step will call (:attr:`compiled_kernels`) on tiny arrays, so that
        numba's loading of them (about 56 MiB; 22 of it kept after :func:`mpisparse.backend.pages.settle`) happens
        before the first step allocates the full-size buffers rather than on top of them.  Nothing of the
        scheme's state changes.  Returns the loops called (none on a device or with the loops off)."""
        if self.xp is not np or not self.compiled_kernels:
            return ()
        from ..backend import compiled

        return compiled.warm_up(self.compiled_kernels, backend.index_dtype(self.n))

    def use_array_module(self, xp) -> None:
        """Keep outputs and state on array module ``xp`` from now on (memories moved: explicit copies)."""
        if xp is not self.xp:
            self.xp = xp
            self._out = None
            self._place_state()
        self.memory.to(xp)

    def _place_state(self) -> None:
        """Drop scratch buffers made on the previous array module (they are made again on first use)."""
        for name in ("_scratch", "_idx_buf"):
            if getattr(self, name, None) is not None:
                setattr(self, name, None)

    def step(self, grad, out=None) -> np.ndarray:
        """Aggregate one step: returns the mean over ranks of what was sent.

        Works on ``grad``'s array module (host or device) and allocates
        there; nothing goes through host memory but what the communicator
        stages and the few explicit scalar reads a scheme documents.

        ``out``: a vector of the gradient's length, dtype and array module to
        write the update into (``grad`` itself included: every scheme reads
        the gradient only before it writes its output), returned.  It is
        zeroed in full before the sparse update is written: one pass more
        than the scheme's own output, whose only last set is cleared, and one
        full buffer less.  None: the scheme's own vector, overwritten by the
        next step.
        """
        if grad.shape != (self.n,):
            raise ValueError(f"gradient vector has shape {grad.shape}; expected ({self.n},)")
        xp = backend.array_module(grad)
        if out is not None and (out.shape != grad.shape or out.dtype != grad.dtype
                                or backend.array_module(out) is not xp):
            raise ValueError(f"out must be like the gradient ({grad.dtype}, ({self.n},), {xp.__name__}); "
                             f"got {out.dtype}, {out.shape}, {backend.array_module(out).__name__}")
        if xp is not self.xp:
            self.use_array_module(xp)
        if out is not None:
            self._out = None  # not kept beside the caller's vector (and its last set would be stale)
        self._target = out
        try:
            result = self._step(grad)
        finally:
            self._target = None
        self.iteration += 1
        return result

    def _step(self, grad):
        raise NotImplementedError

    # -------------------------------------------------------------- the wire's values
    def sum_values(self, vals):
        """The sum over ranks of this rank's float32 ``vals``, in place, sent as :attr:`wire` values
        (:func:`mpisparse.mpi.wire.allreduce_sum`).  Returns what the wire lost of them (``vals - sent``;
        None for float32), for :meth:`keep_lost` after the memory's update."""
        lost = None if self.wire == "float32" else vals - wire.sent_values(vals, self.wire, self.comm.size)
        wire.allreduce_sum(self.comm, vals, self.wire)
        return lost

    def gather_values(self, vals, counts):
        """``(every rank's vals as float32, what the wire lost of this rank's: None for float32)``, the
        values sent as :attr:`wire` values with an Allgatherv (``counts`` from the indices' call)."""
        lost = None if self.wire == "float32" else vals - wire.round_trip(vals, self.wire)
        return wire.allgather_values(self.comm, vals, counts, self.wire), lost

    def keep_lost(self, idx, lost) -> None:
        """What the wire lost at ``idx`` back into the memory (nothing for float32 or without a memory)."""
        if lost is not None:
            self.memory.keep(idx, lost)

    def fused_residual(self, grad):
        """The residual a compiled pass may compensate in place (``e += g`` inside its own pass), made on
        first use; None where none may: no residual error feedback, not a host float array, or the
        compiled loops off (:func:`mpisparse.backend.compiled.enabled`).  The one place that decides it."""
        from ..backend import compiled

        mem = self.memory
        if not (mem.in_place and isinstance(grad, np.ndarray) and grad.dtype.kind == "f" and compiled.enabled()):
            return None
        if mem.residual is None:
            mem.residual = np.zeros_like(grad)
        return mem.residual

    def compensate_topk(self, grad, k: int, *, ascending: bool = False):
        """``acc`` (the compensated vector) and the indices of its ``k`` largest magnitudes, timed as
        ``compensate`` and ``select``.

        With residual error feedback on host float arrays and numba installed,
        compensation and the candidate search are one fused pass over memory
        (:mod:`mpisparse.backend.fused`; ``compensate`` then also holds the
        candidate search, ``select`` the exact pick among the candidates).
        Otherwise the two plain steps.  The same index set and residual either way; ``ascending``:
        the indices sorted.  A ``select_kernel`` other than native selects with that primitive, unfused.
        """
        from ..backend import fused, reference

        mem = self.memory
        residual = self.fused_residual(grad) if self.select_kernel == "native" else None
        if residual is not None:
            with self.phase("compensate"):
                cand = fused.compensate_candidates(residual, grad, k)
            with self.phase("select"):  # (no full-size scratch: a missed estimate uses a chunk buffer)
                return residual, fused.topk_from_candidates(residual, cand, k, ascending=ascending)
        if self._scratch is None:
            self._scratch = self.xp.empty(self.n, dtype=grad.dtype)
        with self.phase("compensate"):
            acc = mem.compensate(grad)
        with self.phase("select"):
            idx = reference.topk_abs(acc, k, self.select_kernel, scratch=self._scratch)
            return acc, (backend.array_module(idx).sort(idx) if ascending else idx)

    def selected_global(self) -> int:
        """Distinct indices selected over all ranks in the last step."""
        raise NotImplementedError

    def diagnostics(self) -> dict[str, float]:
        """Extra measurements of the last step (``--diagnostics``).

        Called on every rank after :meth:`step`, outside the timed step; it
        may communicate (so it is off by default).  The base reports the
        error norm of DEFT eq. 2, ``||e_t|| = (1/W) sum_i ||e_i,t||``;
        schemes add their own keys.
        """
        resid = getattr(self.memory, "residual", None)
        local = 0.0 if resid is None else backend.norm(resid)
        total = self.comm.allreduce(np.array([local]))
        return {"error_norm": float(total[0]) / self.comm.size}

    # -------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Checkpointable state; the communicator is left out."""
        return {"scheme": self.name, "iteration": self.iteration, "density": self.density,
                "options": dict(self.opts), "memory": self.memory.state_dict(),
                "extra": self._extra_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("scheme") != self.name:
            raise ValueError(f"state is for scheme {state.get('scheme')!r}, not {self.name!r}")
        self.iteration = int(state["iteration"])
        self.memory.load_state_dict(state.get("memory", {}))  # host arrays ...
        self.memory.to(self.xp)  # ... back on the gradients' array module (the device)
        self._load_extra_state(state.get("extra", {}))

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        pass


#: the name this base had before the runtimes had their own bases
Scheme = CollectiveScheme


class Offer(NamedTuple):
    """What a rank offers in a :class:`SparseGatherScheme` step."""

    #: the compensated vector (the residual itself where error feedback compensates in place)
    acc: Any
    #: this rank's selected indices
    indices: Any
    #: ``acc[indices]`` where already known (a fused pass collected them), else None: read from ``acc``
    values: Any = None
    #: whether the memory's update is done (the fused pass zeroed the residual at ``indices``)
    sent: bool = False


class SparseGatherScheme(CollectiveScheme):
    """Each rank offers its own (index, value) set; sets are gathered and summed.

    The exchange of the classic Top-k sparsifier: Allgatherv of indices,
    then of values, then every rank scatter-adds all sets (gradient build-up:
    up to ``W k`` distinct indices).  Subclasses implement :meth:`select`.
    """

    def select(self, acc) -> np.ndarray:
        raise NotImplementedError

    def compensate_select(self, grad) -> Offer:
        """This rank's :class:`Offer`, timed as ``compensate`` and ``select``."""
        with self.phase("compensate"):
            acc = self.memory.compensate(grad)
        with self.phase("select"):
            return Offer(acc, self.select(acc))

    def _step(self, grad):
        acc, idx, vals, sent = self.compensate_select(grad)
        with self.phase("select"):
            if vals is None:
                vals = acc[idx]
        with self.phase("exchange_indices"):
            all_idx, counts = self.comm.allgatherv(idx)
        with self.phase("exchange_values"):
            all_vals, lost = self.gather_values(vals, counts)
        with self.phase("update"):
            if not sent:
                self.memory.update(acc, idx)
            self.keep_lost(idx, lost)
            out, clear = self.output_to_clear(getattr(self, "_last_indices", None))
            scatter_sum(out, all_idx, all_vals, counts, 1.0 / self.comm.size, clear=clear)
        self._last_indices = all_idx
        return out

    def selected_global(self) -> int:
        return backend.unique_count(self._last_indices)


#: the scatter-add of the sparse exchanges, dispatched on the output's array module
scatter_sum = backend.scatter_sum
