"""`GET /`: the web page, for people (in the spirit of LibreTranslate's): static files of the package
(nmt_cli/serve/static: index.html, app.js, style.css, favicon.svg), served by nmt itself; nothing comes from
another site, so the page works on a server without internet. The page speaks the public API (`/frontend/settings`,
`/languages`, `/translate`, `/translate_file`, `/suggest`), by relative URLs, so it also works behind a reverse
proxy's path prefix.
"""

from __future__ import annotations

from importlib import resources

from nmt_cli.serve.service import RequestError

ASSETS = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
          "style.css": "text/css; charset=utf-8", "favicon.svg": "image/svg+xml"}
# the page loads nothing from elsewhere, and runs no inline script
POLICY = ("default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
          "frame-ancestors 'none'; base-uri 'self'; form-action 'self'")


class Page:
    def __init__(self):
        folder = resources.files("nmt_cli.serve") / "static"
        self.assets = {name: (folder / name).read_bytes() for name in ASSETS}

    def asset(self, name: str) -> tuple[bytes, str, dict[str, str]]:
        """A file of the page -> (its bytes, media type, headers); a 404 for any other name."""
        if name not in self.assets:
            raise RequestError(404, f"no file {name[:80]} in the page's assets")
        return self.assets[name], ASSETS[name], {"Content-Security-Policy": POLICY, "X-Content-Type-Options": "nosniff",
                                                 "Cache-Control": "no-cache"}
