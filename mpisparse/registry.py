"""The scheme registry: every ``--scheme NAME`` of every runtime, by name.

A scheme is a class registered with :func:`register`; the base it derives
from decides its runtime (``runtime`` class attribute, read only by
:mod:`mpisparse.runtimes`):

* ``collective`` -- :class:`mpisparse.schemes.base.CollectiveScheme`, one file per scheme in ``mpisparse/schemes/``;
* ``ps`` -- :class:`mpisparse.ps.scheme.PSScheme`, registered in :mod:`mpisparse.ps.schemes`;
* ``mp`` -- :class:`mpisparse.mp.scheme.MPScheme`, registered in :mod:`mpisparse.mp.schemes`.

Every base derives from :class:`SchemeBase`, which holds only what all
runtimes share: the name, the declared options and their validation, the
smallest world the scheme runs on.  :data:`SCHEMES` loads the scheme
modules of all runtimes on first use (:func:`load_schemes`), so importing
this module imports nothing but NumPy.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["SCHEMES", "SCHEME_MODULES", "SchemeBase", "SchemeOption", "all_options", "create", "k_for",
           "load_schemes", "register", "scheme_class", "validate_density"]

#: the modules whose import registers every scheme (a package imports its own scheme modules)
SCHEME_MODULES = ("mpisparse.schemes", "mpisparse.ps.schemes", "mpisparse.mp.schemes")


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
        if not (lo_ok and hi_ok and math.isfinite(value)):
            lo = "-inf" if self.low is None else f"{self.low:g}"
            hi = "inf" if self.high is None else f"{self.high:g}"
            bracket = "(" if self.low_open else "["
            raise ValueError(f"{self.flag} is {value!r}; allowed range is {bracket}{lo}, {hi}]")
        return value


def validate_density(density: Any, flag: str = "--density") -> float:
    """``density`` as a float in (0, 1] (the fraction of elements sent); ValueError naming it otherwise.

    The one check of a density: configurations, schemes and the commands
    without a configuration all call it.
    """
    try:
        d = float(density)
    except (TypeError, ValueError):
        raise ValueError(f"{flag} {density!r} is not a number in the allowed range (0, 1]") from None
    if not (math.isfinite(d) and 0.0 < d <= 1.0):
        raise ValueError(f"{flag} {density!r} is not in the allowed range (0, 1]")
    return d


def k_for(density: float, n: int) -> int:
    """Number of entries a density keeps out of ``n``: at least 1, at most ``n``."""
    return max(1, min(n, int(round(density * n))))


class SchemeBase:
    """What every scheme declares, whatever its runtime."""

    name: ClassVar[str] = "abstract"
    options: ClassVar[tuple[SchemeOption, ...]] = ()
    #: ranks the scheme needs at least (e.g. a parameter server needs 2)
    min_world_size: ClassVar[int] = 1
    #: whether ``--hierarchical`` (two-level collectives, :mod:`mpisparse.mpi.hierarchy`) keeps this scheme's math
    hierarchical: ClassVar[bool] = False
    #: the runtime that runs it (a key of :data:`mpisparse.runtimes.RUNTIMES`), set by each runtime's base class
    runtime: ClassVar[str] = ""

    @classmethod
    def validate_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Every declared option's value (its default when not given); ValueError for unknown or invalid ones."""
        known = {o.name: o for o in cls.options}
        unknown = set(options) - set(known)
        if unknown:
            names = ", ".join("--" + u.replace("_", "-") for u in sorted(unknown))
            allowed = ", ".join(o.flag for o in cls.options) or "none"
            raise ValueError(f"scheme {cls.name!r} has no option {names}; its options: {allowed}")
        return {name: o.validate(options.get(name, o.default)) for name, o in known.items()}

    @classmethod
    def check_world(cls, world: int) -> None:
        """ValueError when ``world`` ranks are too few for this scheme."""
        if world < cls.min_world_size:
            raise ValueError(f"scheme {cls.name!r} needs at least {cls.min_world_size} ranks, "
                             f"got a world of {world}")

    def __init__(self, comm, layout, density: float, *, timer=None, seed: int = 0, **options: Any):
        """What a scheme of every runtime holds: its ranks, the gradient layout, density and ``k``,
        seed, phase timer and validated options (ValueError for a bad value or too few ranks)."""
        from .results.timing import PhaseTimer

        self.comm = comm
        self.layout = layout
        self.n = layout.n
        self.density = validate_density(density)
        self.k = k_for(self.density, self.n)
        self.seed = int(seed)
        self.timer = timer if timer is not None else PhaseTimer(enabled=False)
        self.opts = self.validate_options(options)
        self.check_world(comm.size)


class _Registry(Mapping):
    """``name -> class``; the scheme modules are imported on the first lookup."""

    def __init__(self) -> None:
        self._classes: dict[str, type[SchemeBase]] = {}
        self._state = "empty"  # -> "loading" -> "loaded"

    def add(self, name: str, cls: type[SchemeBase]) -> None:
        if name in self._classes:
            raise ValueError(f"scheme {name!r} is registered twice")
        self._classes[name] = cls

    def _load(self) -> None:
        if self._state == "empty":
            self._state = "loading"
            try:
                for module in SCHEME_MODULES:
                    importlib.import_module(module)
            except BaseException:
                self._state = "empty"
                raise
            self._state = "loaded"

    def __getitem__(self, name: str) -> type[SchemeBase]:
        self._load()
        return self._classes[name]

    def __iter__(self) -> Iterator[str]:
        self._load()
        return iter(dict(self._classes))

    def __len__(self) -> int:
        self._load()
        return len(self._classes)

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._classes

    def __repr__(self) -> str:
        return f"SCHEMES({sorted(self)})"


SCHEMES = _Registry()


def load_schemes() -> None:
    """Import the scheme modules of every runtime (done by the first lookup in :data:`SCHEMES`)."""
    SCHEMES._load()


def register(name: str):
    """Class decorator: make a scheme available as ``--scheme name``."""

    def deco(cls):
        SCHEMES.add(name, cls)
        cls.name = name
        return cls

    return deco


def scheme_class(name: str) -> type[SchemeBase]:
    """The class registered as ``name``; ValueError naming the known schemes otherwise."""
    try:
        return SCHEMES[name]
    except KeyError:
        raise ValueError(f"unknown scheme {name!r}; choose one of: {', '.join(sorted(SCHEMES))}") from None


def create(name: str, comm, layout, density: float, **kw):
    """Instantiate scheme ``name``; invalid hyperparameters raise ValueError."""
    return scheme_class(name)(comm, layout, density, **kw)


def all_options() -> dict[str, tuple[SchemeOption, list[str]]]:
    """Every scheme option by name, with the schemes that declare it."""
    out: dict[str, tuple[SchemeOption, list[str]]] = {}
    for sname in sorted(SCHEMES):
        for opt in SCHEMES[sname].options:
            if opt.name in out:
                out[opt.name][1].append(sname)
            else:
                out[opt.name] = (opt, [sname])
    return out
