"""Scheme interface, option declarations and the registry.

A scheme turns each rank's gradient vector (the fusion buffer) into the
same aggregated update on every rank.  It is built from three parts:

* a **memory** (:mod:`mpisparse.memory`): error feedback around the step;
* a **selector**: which entries this rank offers (backend kernels);
* an **exchange**: the collective pattern that combines the ranks' offers
  (through :class:`mpisparse.comm.Communicator`, which counts and times).

:meth:`Scheme.step` returns the *mean* over ranks of what was sent, as a
dense vector owned by the scheme (overwritten by the next step).  Phases
are timed with the shared vocabulary of :mod:`mpisparse.timing`.  Statistics
that cost extra work (distinct selected indices) are computed lazily by
:meth:`Scheme.selected_global`, outside the timed step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..fusion import FusionLayout
from ..memory import Memory, make_memory
from ..timing import PhaseTimer

SCHEMES: dict[str, type["Scheme"]] = {}


def register(name: str):
    """Class decorator: make a scheme available as ``--scheme name``."""

    def deco(cls: type[Scheme]) -> type[Scheme]:
        if name in SCHEMES:
            raise ValueError(f"scheme {name!r} is registered twice")
        cls.name = name
        SCHEMES[name] = cls
        return cls

    return deco


def scheme_class(name: str) -> type["Scheme"]:
    try:
        return SCHEMES[name]
    except KeyError:
        raise ValueError(
            f"unknown scheme {name!r}; choose one of: {', '.join(sorted(SCHEMES))}"
        ) from None


@dataclass(frozen=True)
class SchemeOption:
    """A scheme's own command-line option (``--name``), declared once.

    ``kind`` is ``int``, ``float`` or ``bool`` (a flag), or ``str`` with
    ``choices`` (the allowed values).  ``low``/``high`` bound numeric values
    (inclusive unless ``low_open``).
    """

    name: str
    kind: type
    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    choices: tuple[str, ...] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def validate(self, value: Any) -> Any:
        if value is None or self.kind is bool:
            return value
        if self.choices is not None:
            if value not in self.choices:
                raise ValueError(f"{self.flag} is {value!r}; allowed values are {', '.join(self.choices)}")
            return value
        try:
            value = self.kind(value)
        except (TypeError, ValueError):
            raise ValueError(f"{self.flag} must be a {self.kind.__name__}, got {value!r}") from None
        lo_ok = self.low is None or (value > self.low if self.low_open else value >= self.low)
        hi_ok = self.high is None or value <= self.high
        if not (lo_ok and hi_ok and np.isfinite(value)):
            lo = "-inf" if self.low is None else f"{self.low:g}"
            hi = "inf" if self.high is None else f"{self.high:g}"
            bracket = "(" if self.low_open else "["
            raise ValueError(f"{self.flag} is {value!r}; allowed range is {bracket}{lo}, {hi}]")
        return value


def validate_density(density: Any) -> float:
    try:
        d = float(density)
    except (TypeError, ValueError):
        raise ValueError(f"--density must be a number in (0, 1], got {density!r}") from None
    if not (0.0 < d <= 1.0):
        raise ValueError(f"--density is {density!r}; allowed range is (0, 1]")
    return d


def k_for(density: float, n: int) -> int:
    """Number of entries a density keeps out of ``n``: at least 1, at most ``n``."""
    return max(1, min(n, int(round(density * n))))


class Scheme:
    """Base of all schemes; subclasses implement :meth:`_step`."""

    name: ClassVar[str] = "abstract"
    options: ClassVar[tuple[SchemeOption, ...]] = ()
    #: ranks the scheme needs at least (e.g. a parameter server needs 2)
    min_world_size: ClassVar[int] = 1
    #: how the scheme runs: "collective" (every rank steps the same way, the
    #: Scheme.step contract below), "ps" (parameter server: mpisparse.ps) or
    #: "mp" (model parallel: mpisparse.mp); the front ends dispatch on it
    family: ClassVar[str] = "collective"
    #: whether error feedback applies (False for dense)
    uses_memory: ClassVar[bool] = True
    #: the scheme applies momentum itself (DGC's momentum correction): the
    #: optimizer then runs without momentum
    provides_momentum: ClassVar[bool] = False

    def __init__(self, comm, layout: FusionLayout, density: float, *, memory: bool = True,
                 timer: PhaseTimer | None = None, seed: int = 0, **options: Any):
        self.comm = comm
        self.layout = layout
        self.n = layout.n
        self.density = validate_density(density)
        self.k = k_for(self.density, self.n)
        self.seed = int(seed)
        self.timer = timer if timer is not None else PhaseTimer(enabled=False)
        self.memory: Memory = make_memory(memory and self.uses_memory)
        self.iteration = 0
        self.opts = self.validate_options(options)
        if comm.size < self.min_world_size:
            raise ValueError(
                f"scheme {self.name!r} needs at least {self.min_world_size} ranks, "
                f"got a world of {comm.size}"
            )
        self._out = None

    # ----------------------------------------------------------- options
    @classmethod
    def validate_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        known = {o.name: o for o in cls.options}
        unknown = set(options) - set(known)
        if unknown:
            names = ", ".join("--" + u.replace("_", "-") for u in sorted(unknown))
            allowed = ", ".join(o.flag for o in cls.options) or "none"
            raise ValueError(f"scheme {cls.name!r} has no option {names}; its options: {allowed}")
        return {name: o.validate(options.get(name, o.default)) for name, o in known.items()}

    # -------------------------------------------------------------- step
    def phase(self, name: str):
        return self.timer.phase(name)

    def output(self):
        """The scheme's reusable dense output vector."""
        if self._out is None:
            self._out = self.layout.zeros()
        return self._out

    def step(self, grad) -> np.ndarray:
        """Aggregate one step: returns the mean over ranks of what was sent."""
        if grad.shape != (self.n,):
            raise ValueError(f"gradient vector has shape {grad.shape}; expected ({self.n},)")
        out = self._step(grad)
        self.iteration += 1
        return out

    def _step(self, grad):
        raise NotImplementedError

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
        local = 0.0 if resid is None else float(np.linalg.norm(resid))
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
        self.memory.load_state_dict(state.get("memory", {}))
        self._load_extra_state(state.get("extra", {}))

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        pass


class SparseGatherScheme(Scheme):
    """Each rank offers its own (index, value) set; sets are gathered and summed.

    The exchange of the classic Top-k sparsifier: Allgatherv of indices,
    then of values, then every rank scatter-adds all sets (gradient build-up:
    up to ``W k`` distinct indices).  Subclasses implement :meth:`select`.
    """

    def select(self, acc) -> np.ndarray:
        raise NotImplementedError

    def _step(self, grad):
        with self.phase("compensate"):
            acc = self.memory.compensate(grad)
        with self.phase("select"):
            idx = self.select(acc)
            vals = acc[idx]
        with self.phase("exchange_indices"):
            all_idx, counts = self.comm.allgatherv(idx)
        with self.phase("exchange_values"):
            all_vals, _ = self.comm.allgatherv(vals, counts)
        with self.phase("update"):
            self.memory.update(acc, idx)
            out = self.output()
            scatter_sum(out, all_idx, all_vals, counts, 1.0 / self.comm.size)
        self._last_indices = all_idx
        return out

    def selected_global(self) -> int:
        return int(np.unique(self._last_indices).size)


def scatter_sum(out, indices, values, counts, scale: float) -> None:
    """``out = scale * sum_r sparse(indices_r, values_r)``.

    Indices within one rank's block are distinct, so each block is a plain
    fancy-index add; blocks of different ranks may overlap.
    """
    out.fill(0)
    start = 0
    for c in counts:
        c = int(c)
        if c:
            block = slice(start, start + c)
            out[indices[block]] += values[block]
        start += c
    if scale != 1.0:
        # sum first, then scale (as a reference computes it); duplicates in
        # ``indices`` read and write the same value, so the in-place form is safe
        if 2 * len(indices) < out.size:
            out[indices] *= np.float32(scale)
        else:
            out *= np.float32(scale)
