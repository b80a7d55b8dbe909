"""A typed reference to code in a package above the engine: `Ref[T]("module:attribute")`. The registries
(ortlab.engine.backends, ortlab.engine.collectors) name backends, adapters and checks that live in the timing,
account, activations, stacks and other packages, which import the engine; importing them from here would run the
arrows upward and load ORTModule or torch.compile when nothing asked for them. A Ref imports its module on first use
(`resolve`), and `T` is the contract it must satisfy (a Protocol of ortlab.engine.types, a Callable): the type
checker holds every registered reference to it (tests/test_types.py writes one line per reference of every
registry entry and runs mypy over them), so a reference that points nowhere or at the wrong thing fails a test
rather than a burst. A leaf: it imports nothing of ortlab but its errors."""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from ortlab.errors import OrtlabError

T = TypeVar("T")
_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


class RefError(OrtlabError):
    """A registered reference that does not resolve: its module is missing or has no such attribute (a broken
    registry entry or install, not a user's input)."""


@dataclass(frozen=True)
class Ref(Generic[T]):
    """"module:attribute", resolved on first use to a `T`."""

    path: str

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not _PATH.match(self.path):
            raise RefError(f"reference {self.path!r} is not allowed; allowed: 'package.module:attribute'")

    @property
    def module(self) -> str:
        return self.path.partition(":")[0]

    @property
    def attribute(self) -> str:
        return self.path.partition(":")[2]

    def resolve(self) -> T:
        """What the reference names, its module imported now (once per process: Python keeps it). A module that
        is not there, or lacks the attribute, raises a RefError naming the reference; an error inside the module
        (a library it needs is missing) is raised as it is."""
        try:
            module = importlib.import_module(self.module)
        except ModuleNotFoundError as e:
            if e.name is None or not (self.module == e.name or self.module.startswith(e.name + ".")):
                raise
            raise RefError(f"reference {self.path!r} does not resolve: no module {e.name!r}") from None
        try:
            value: Any = getattr(module, self.attribute)
        except AttributeError:
            raise RefError(f"reference {self.path!r} does not resolve: module {self.module!r} has no "
                           f"{self.attribute!r}") from None
        return cast(T, value)

    def __str__(self) -> str:
        return self.path
