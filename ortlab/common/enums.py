"""`StrEnum`: the closed sets of names ortlab keeps as strings (backends, optimizers, run statuses, fix kinds).

`enum.StrEnum` is Python 3.11's; on 3.10, which ortlab supports too, the same class is written here: members are
strings, `str()` and `format()` give the value."""

from __future__ import annotations

import enum
import sys

if sys.version_info >= (3, 11):
    from enum import StrEnum  # novermin: the class below on 3.10
else:
    class StrEnum(str, enum.Enum):
        """A member is its value as a string (Python 3.11's enum.StrEnum)."""

        def __str__(self) -> str:
            return str(self.value)

__all__ = ["StrEnum"]
