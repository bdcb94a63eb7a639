"""Name -> constructor registries for models, benchmarks, methods and pruners."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from espn.errors import EspnError

T = TypeVar("T")


class UnknownNameError(EspnError, ValueError):
    """Raised when a name is not in a registry; the message lists what is accepted."""


class Registry(Generic[T]):
    """A small ordered mapping from names to objects, filled by a decorator; with ``names``,
    of classes, each given the name it is filed under as its ``name``."""

    def __init__(self, kind: str, names: bool = False) -> None:
        self.kind = kind
        self.names_classes = names
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that files ``obj`` under ``name``."""

        def wrap(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            if self.names_classes:
                obj.name = name  # type: ignore[attr-defined]
            self._items[name] = obj
            return obj

        return wrap

    @contextmanager
    def temporarily(self, name: str, obj: T) -> Iterator[T]:
        """File ``obj`` under ``name`` for the duration of a ``with`` block (tests, one-off
        experiments), then restore what the name held before (nothing, or the object it
        shadowed), even if the block raises."""
        shadowed = [self._items[name]] if name in self._items else []
        self._items[name] = obj
        try:
            yield obj
        finally:
            if shadowed:
                self._items[name] = shadowed[0]  # back in its place in the order
            else:
                self._items.pop(name, None)

    def get(self, name: str) -> T:
        """Return the object for ``name`` or raise with the accepted names."""
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; choose one of: {', '.join(self._items)}"
            ) from None

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)
