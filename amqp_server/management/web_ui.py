"""The management web UI's files: `/` is the page, `/ui/...` its scripts, styles and vendored
libraries, all shipped inside the package (amqp_server/management/ui/) and read from the
package at start: a broker on a closed network needs no CDN.

The page is a client of the API (/api/...), nothing more: every figure it shows and every
change it makes goes through the same routes, authorization and checks as rabbitmqadmin's.
Only files that exist under ui/ when the broker starts are served (WebUi keeps their table), so no
path in a URL can reach another file. Every answer forbids framing (clickjacking) and content
sniffing; the page's Content-Security-Policy lets it load scripts, styles and data only from
the broker itself, so an injected `<script>` or a foreign script URL does not run.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path

from aiohttp import web

from amqp_server.management import api_errors

UI_DIR = Path(__file__).parent / "ui"
STATIC_PREFIX = "/ui/"
INDEX = "index.html"
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    # The page and scripts change with the broker version; the browser asks again (a 304 is cheap).
    "Cache-Control": "no-cache",
}
_CONTENT_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                  ".html": "text/html; charset=utf-8", ".txt": "text/plain; charset=utf-8", ".png": "image/png",
                  ".svg": "image/svg+xml"}


def ui_files(root: Path = UI_DIR) -> dict[str, Path]:
    """Every servable file under `root`, by its path relative to it ("js/main.js")."""
    if not root.is_dir():
        return {}
    return {path.relative_to(root).as_posix(): path for path in sorted(root.rglob("*")) if path.is_file()}


class WebUi:
    """Serves the files found under `root` at construction."""

    def __init__(self, root: Path = UI_DIR) -> None:
        self._files = ui_files(root)

    async def index(self, request: web.Request) -> web.StreamResponse:
        return self._serve(INDEX)

    async def asset(self, request: web.Request) -> web.StreamResponse:
        return self._serve(request.match_info["path"])

    def _serve(self, name: str) -> web.StreamResponse:
        path = self._files.get(name)
        if path is None:
            raise api_errors.not_found()
        content_type = _CONTENT_TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        return web.FileResponse(path, headers={**SECURITY_HEADERS, "Content-Type": content_type})

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/", self.index)
        router.add_get(STATIC_PREFIX + "{path:.+}", self.asset)
