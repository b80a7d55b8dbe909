"""netron for one graph file: served on 127.0.0.1 on a free port until stopped, embeddable in a notebook.

Each server has a handler class of its own (two stages at once show two files) and sets netron's `consent`
cookie on the page, so that netron's first-load prompt ("This app uses cookies to report errors and anonymous
usage information") does not block the view. netron's internals are reached through ortlab._netron only.
"""

from __future__ import annotations

import atexit
import datetime as dt
import html
import os
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from ortlab import _netron
from ortlab.errors import OrtlabError
from ortlab.graphs.errors import GraphsError

MAX_AGE_DAYS = 180  # netron's page refuses to render ("Please update to the newest version") past this age
COOKIE_DAYS = 30  # what netron itself gives its consent cookie
_FALLBACK = "showing ortlab's own graph view instead"


class NetronError(OrtlabError, RuntimeError):
    """netron cannot show the file here (missing, too old, unknown build, no port); the message is one line
    that says why and what to do."""


def netron_status(today: dt.date | None = None) -> tuple[bool, str]:
    """(usable, one line): whether netron is installed, recent enough to render, and servable by ortlab."""
    version = _netron.version()
    if version is None:
        return False, f"netron is not installed (pip install netron): {_FALLBACK}"
    try:
        _netron.check()
    except _netron.NetronInternalsError as e:
        return False, f"{e}: {_FALLBACK}"
    built = _netron.build_date()
    if built is not None:
        age = ((today or dt.date.today()) - built).days
        if age > MAX_AGE_DAYS:
            return False, (f"netron {version} was built on {built} ({age} days ago) and refuses to render "
                           f"builds older than {MAX_AGE_DAYS} days (pip install -U netron): {_FALLBACK}")
    return True, f"netron {version}" + (f" (built {built})" if built else "")


def browser_url(port: int, host: str = "127.0.0.1") -> str:
    """Where the notebook's browser reaches a server on this machine's `port`: through jupyter-server-proxy
    under JupyterHub or Binder (JUPYTERHUB_SERVICE_PREFIX), through ORTLAB_NETRON_URL (a template with
    `{port}`, for other remote setups) when set, else directly."""
    template = os.environ.get("ORTLAB_NETRON_URL")
    if template:
        return template.format(port=port)
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX")
    if prefix:
        return f"{prefix.rstrip('/')}/proxy/{port}/"
    return f"http://{host}:{port}/"


@dataclass(eq=False)
class NetronServer:
    """One file served by netron. `url` is the server's own address, `browser_url` what a notebook embeds."""

    file: Path
    host: str
    port: int
    _server: object = field(repr=False, default=None)
    _thread: threading.Thread | None = field(repr=False, default=None)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    @property
    def model_url(self) -> str:
        """The file itself, as netron's page fetches it."""
        return f"{self.url}data/{urllib.parse.quote(self.file.name)}"

    @property
    def browser_url(self) -> str:
        return browser_url(self.port, self.host)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Stop serving and free the port (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        _live.discard(self)

    def iframe_html(self, height: int = 600) -> str:
        return (f'<iframe src="{html.escape(self.browser_url)}" '
                f'title="netron: {html.escape(self.file.name)}" '
                f'style="width:100%;height:{int(height)}px;border:1px solid #ddd"></iframe>')

    def _repr_html_(self) -> str:
        return self.iframe_html()

    def __enter__(self) -> NetronServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"NetronServer({self.file.name!r}, {'serving' if self.alive else 'stopped'})"


_live: set[NetronServer] = set()


def serve(path: str | Path, host: str = "127.0.0.1", port: int = 0, consent: bool = True) -> NetronServer:
    """Serve `path` with netron on `host` (a free port unless `port` is given). `consent=True` sets netron's
    consent cookie on the page, so its first-load prompt does not appear (netron may then report anonymous
    usage information, as its prompt says). Raises GraphsError when `path` is not a file and NetronError (one
    line) when netron cannot be used."""
    import http.server

    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise GraphsError(f"{path} is not a file: give an .onnx stage file")
    usable, message = netron_status()
    if not usable:
        raise NetronError(message)
    # Partitioned (and so SameSite=None; Secure): a notebook at localhost and netron at 127.0.0.1 are
    # different sites, and a browser keeps an unpartitioned cookie out of such an iframe
    cookie = (f"consent={int(time.time() * 1000)}; Path=/; Max-Age={COOKIE_DAYS * 86400}; SameSite=None; "
              "Secure; Partitioned")

    class Handler(_netron.handler_class(path)):
        def end_headers(self):
            if consent and urllib.parse.urlparse(self.path).path in ("/", "/index.html"):
                self.send_header("Set-Cookie", cookie)
            super().end_headers()

        def log_message(self, format, *args):  # netron logs every request
            pass

    try:
        server = http.server.ThreadingHTTPServer((host, port), Handler)
    except OSError as e:
        raise NetronError(f"netron cannot listen on {host}:{port}: {e.strerror or e}") from None
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                              name=f"ortlab-netron-{path.name}", daemon=True)
    thread.start()
    handle = NetronServer(path, host, server.server_address[1], server, thread)
    _live.add(handle)
    return handle


def stop_all() -> None:
    """Stop every server ortlab started in this process (also run at interpreter exit)."""
    for handle in list(_live):
        handle.stop()


atexit.register(stop_all)
