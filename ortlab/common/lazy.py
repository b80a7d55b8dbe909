"""Names a package exports but loads on first use, so that `import ortlab` (or one of its packages) imports neither
torch nor onnxruntime until a name that needs them is touched (PEP 562's module `__getattr__`)."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy(package: str, exports: dict[str, str], namespace: dict[str, Any],
         packages: tuple[str, ...] = ()) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package` (its globals: `namespace`): `exports` maps a name to the module
    that defines it ("module", or "module:attribute" under another name); `packages` are subpackages reached as
    attributes. A loaded name is kept in the namespace, so it is looked up once."""

    def __getattr__(name: str) -> Any:
        if name in packages:
            return import_module(f"{package}.{name}")
        if name in exports:
            module, _, attribute = exports[name].partition(":")
            value = getattr(import_module(module), attribute or name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return __getattr__, __dir__


def named(target: str) -> Any:
    """What "module:attribute" names, its module imported on first use (a registry's adapter, a task sent by
    reference)."""
    module, _, attribute = target.partition(":")
    if not attribute:
        raise ValueError(f"{target!r} is not 'module:attribute'")
    return getattr(import_module(module), attribute)
