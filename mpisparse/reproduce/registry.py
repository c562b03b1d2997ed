"""The reproduce targets by name (``mpisparse reproduce --list``)."""

from __future__ import annotations

from typing import Callable

from .base import Target

__all__ = ["TARGETS", "register", "get_target"]

#: name -> target instance, in registration order
TARGETS: dict[str, Target] = {}


def register(name: str, *, paper: str, sources: str, title: str, schemes: tuple[str, ...] = (),
             modules: tuple[str, ...] = ()) -> Callable[[type[Target]], type[Target]]:
    """Class decorator: describe a target (its paper, the figures/tables, what it needs) and add it under ``name``."""
    def deco(cls: type[Target]) -> type[Target]:
        if name in TARGETS:
            raise ValueError(f"reproduce target {name!r} is registered twice")
        cls.name, cls.seed, cls.sources, cls.title = name, paper, sources, title
        cls.requires_schemes, cls.requires_modules = tuple(schemes), tuple(modules)
        TARGETS[name] = cls()
        return cls

    return deco


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"no reproduce target {name!r}; targets: {', '.join(TARGETS)}") from None
