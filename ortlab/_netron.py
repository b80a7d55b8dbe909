"""The one adapter to netron's internals: nothing else in ortlab names `netron.server` or its private classes.

ortlab serves a file with netron's own request handler in a server of its own (netron's `serve` keeps the
served file on a class shared by every server it starts and cannot add a header), and reads netron's build
date from its bundled page (netron refuses to render once its build is old). Both reach past netron's public
API, so an upgrade of netron touches this file only; when something moved, `NetronInternalsError` names what
is missing and which versions ortlab supports.
"""

from __future__ import annotations

import datetime as dt
import importlib
import re
from pathlib import Path
from types import ModuleType

from ortlab.errors import OrtlabError

SUPPORTED = "netron 9.x (tested with 9.3.3)"
_NEEDED = ("_HTTPRequestHandler", "_ContentProvider")  # the handler ortlab subclasses, what serves a file


class NetronInternalsError(OrtlabError, RuntimeError):
    """netron is installed but its server is not built the way ortlab expects (another netron version)."""


def version() -> str | None:
    """netron's version, None when it is not installed (or cannot be imported)."""
    try:
        netron = importlib.import_module("netron")
    except ImportError:
        return None
    return getattr(netron, "__version__", "?")


def _server() -> ModuleType:
    try:
        module = importlib.import_module("netron.server")
    except ImportError:
        raise NetronInternalsError(f"netron {version()} has no netron.server; ortlab supports "
                                   f"{SUPPORTED}") from None
    missing = [name for name in _NEEDED if not hasattr(module, name)]
    if missing:
        raise NetronInternalsError(f"netron {version()} has no netron.server.{', '.join(missing)}; "
                                   f"ortlab supports {SUPPORTED}")
    return module


def check() -> None:
    """Raise NetronInternalsError when the installed netron cannot be served by ortlab."""
    _server()


def build_date() -> dt.date | None:
    """The date netron's page was built (its `<meta name="date">`), None when it cannot be read."""
    try:
        index = Path(_server().__file__).with_name("index.html")
        text = index.read_text(encoding="utf-8", errors="replace")
    except (OSError, NetronInternalsError):
        return None
    m = re.search(r'<meta name="date" content="(\d{4}-\d{2}-\d{2})', text)
    return dt.date.fromisoformat(m.group(1)) if m else None


def handler_class(path: Path) -> type:
    """A subclass of netron's request handler (an `http.server.BaseHTTPRequestHandler`) that serves `path`
    and netron's page. A class per file: netron keeps the served content on a class attribute."""
    server = _server()
    content = server._ContentProvider(None, str(path), str(path), path.name)
    return type("NetronFileHandler", (server._HTTPRequestHandler,), {"content": content})
