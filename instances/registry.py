"""One registry mechanism for every pluggable kind: policies, solver backends, objective
terms, performance models, truth oracles.

A ``Registry`` maps names to factories. Its plug-ins are discovered, not listed by hand:
``Registry(kind, package="engine.decide.objectives")`` imports every module of that package the
first time a name is looked up, and each module registers what it defines with
``@registry.register("name")``. Adding a plug-in is therefore one new module in the
package. An unknown name raises the project's ``InputError`` listing the known names.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, Generic, Iterator, TypeVar

from .errors import InputError

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    def __init__(self, kind: str, *, package: str | None = None, field: str | None = None):
        self.kind = kind                    # "policy", "solver backend", ... (for messages)
        self.package = package              # plug-in package whose modules are imported
        self.field = field or kind.replace(" ", "_")
        self._items: dict[str, F] = {}
        self._origins: dict[str, str] = {}     # name -> the plug-in that registered it (its file or module)
        self._discovered = package is None

    def register(self, name: str) -> Callable[[F], F]:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def wrap(factory: F) -> F:
            if not callable(factory):       # refused here, naming it, not at its first use
                raise TypeError(f"{self.kind} {name!r} must be a class or a function that builds one, "
                                f"got {factory!r}")
            if name in self._items and self._items[name] is not factory:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._items[name] = factory
            return factory
        return wrap

    def unregister(self, name: str) -> None:
        """Forget ``name`` (a plug-in that failed half-way is taken back out: instances/plugins.py)."""
        self._items.pop(name, None)
        self._origins.pop(name, None)

    def set_origin(self, name: str, origin: str) -> None:
        """Record that the plug-in ``origin`` (its file, or its module) registered ``name``."""
        if name in self._items:
            self._origins[name] = origin

    def origin(self, name: str) -> str | None:
        """The plug-in that registered ``name`` (None: a built-in, or registered in-process)."""
        return self._origins.get(name)

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        assert self.package is not None
        pkg = importlib.import_module(self.package)
        for mod in pkgutil.iter_modules(pkg.__path__):
            if not mod.name.startswith("_"):
                importlib.import_module(f"{self.package}.{mod.name}")

    def names(self) -> list[str]:
        self._discover()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        self._discover()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def get(self, name: str) -> F:
        """The factory registered as ``name``; ``InputError`` listing the known names if none."""
        self._discover()
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise InputError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}",
                             field=self.field) from None
