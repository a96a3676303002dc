"""A real HTTP server on 127.0.0.1 serving a directory's files, for archives fetched by URL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

AWAY = "/away/"  # a path under it redirects to a host no test allows


class _Handler(SimpleHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith(AWAY):
            self.send_response(302)
            self.send_header("Location", "http://localhost:1/" + self.path.removeprefix(AWAY))
            self.end_headers()
            return
        super().do_GET()

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def serving(directory: Path) -> Iterator[str]:
    """Serve ``directory``'s files; yields the server's base URL."""

    def handler(*args: Any) -> _Handler:
        return _Handler(*args, directory=str(directory))

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
