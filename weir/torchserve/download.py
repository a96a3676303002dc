"""Archives registered by URL: fetched into the model store first, as TorchServe does.

``POST /models?url=https://host/path/name.mar`` (or ``--models``, ``load_models``) saves
the archive as ``name.mar`` in the model store and registers that file; unregistering the
version removes it again, and so does a new ``weir up``, which forgets every registration
(TorchServe leaves the file, and the next registration of the same URL fails). The URL must
match one of ``allowed_urls``' regular expressions whole, in any case; only HTTP(S) URLs are
fetched, and a redirect is followed only to an allowed URL. A download is bounded in size
and in its wait for the next bytes, and written aside, so neither a half-written archive
nor one another registration is writing is ever registered.
"""

from __future__ import annotations

import os
import re
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

from weir.torchserve.store_errors import StoreError, StoreNotFound

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_CHUNK_BYTES = 1 << 20


class StoreExists(StoreError):
    """The archive a URL names is in the model store already (TorchServe's 500)."""

    http_status = 500


@dataclass(frozen=True)
class Downloads:
    """Which URLs may be fetched, and the bounds on each download."""

    allowed: tuple[str, ...]
    max_bytes: int
    timeout_s: float

    @classmethod
    def of(cls, allowed_urls: str, max_bytes: int, timeout_s: float) -> Downloads:
        """From ``allowed_urls`` as TorchServe writes it: patterns separated by commas."""
        patterns = tuple(p.strip() for p in allowed_urls.split(",") if p.strip())
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                message = f"allowed_urls: {pattern!r} is no regular expression: {exc}"
                raise StoreError(message) from None
        return cls(patterns, max_bytes, timeout_s)


def is_url(url: str) -> bool:
    """``url`` names a scheme (``https://...``), not a file of the model store."""
    return _SCHEME.match(url) is not None


def file_name(url: str) -> str:
    """The name the archive at ``url`` is saved under: its path's last part."""
    return urlsplit(url).path.rsplit("/", 1)[-1]


def fetch(url: str, store_dir: Path, downloads: Downloads) -> str:
    """Save the archive at ``url`` in ``store_dir``; its file name there.

    Raises:
        StoreNotFound: ``url`` matches none of the allowed patterns.
        StoreExists: The store holds a file of that name already.
        StoreError: Not an HTTP(S) URL, no file name, or the download failed.
    """
    if not _allowed(url, downloads.allowed):
        raise StoreNotFound(f"Given URL {url} does not match any allowed URL(s)")
    if urlsplit(url).scheme.lower() not in ("http", "https"):
        raise StoreError(
            f"Weir downloads archives by HTTP(S) only, not {url}: put the archive in the "
            f"model store {store_dir} and register it by its file name"
        )
    name = file_name(url)
    if not name or name.startswith(".") or "\\" in name:
        raise StoreError(f"{url} names no archive file to save in the model store")
    target = store_dir / name
    if target.exists():
        raise StoreExists(f"Model file already exists {name}")
    with tempfile.NamedTemporaryFile(dir=store_dir, prefix=f".{name}.", delete=False) as part:
        try:
            _copy(url, part, downloads)
            part.close()
            os.chmod(part.name, 0o644)  # workers may run as another user
            os.link(part.name, target)  # never over an archive written meanwhile
        except FileExistsError:
            raise StoreExists(f"Model file already exists {name}") from None
        finally:
            os.unlink(part.name)
    return name


def _allowed(url: str, patterns: tuple[str, ...]) -> bool:
    return any(re.fullmatch(p, url, re.IGNORECASE) for p in patterns)


class _AllowedRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to a URL that is allowed too."""

    def __init__(self, allowed: tuple[str, ...]) -> None:
        self.allowed = allowed

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        if not _allowed(newurl, self.allowed):
            fp.close()
            raise urllib.error.URLError(f"redirected to {newurl}, which matches no allowed URL")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _copy(url: str, out: IO[bytes], downloads: Downloads) -> None:
    request = urllib.request.Request(url, headers={"User-Agent": "weir"})
    opener = urllib.request.build_opener(_AllowedRedirects(downloads.allowed))
    try:
        with opener.open(request, timeout=downloads.timeout_s) as response:
            declared = response.headers.get("Content-Length")
            if declared is not None and declared.isdigit():
                _check_size(url, int(declared), downloads.max_bytes)
            received = 0
            while chunk := response.read(_CHUNK_BYTES):
                received += len(chunk)
                _check_size(url, received, downloads.max_bytes)
                out.write(chunk)
    except urllib.error.HTTPError as exc:
        exc.close()
        raise StoreError(f"Failed to download archive from: {url}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise StoreError(f"Failed to download archive from: {url}: {reason}") from None


def _check_size(url: str, size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise StoreError(
            f"Failed to download archive from: {url}: it is over {max_bytes} bytes "
            "(WEIR_GATEWAY_TS_MAX_DOWNLOAD_BYTES)"
        )


def remove_fetched(store_dir: Path, urls: list[str], used: set[str]) -> None:
    """Remove the archives fetched for these ``urls``, but those ``used`` by a registration."""
    for url in urls:
        name = file_name(url) if is_url(url) else ""
        if name and not name.startswith(".") and name not in used:
            (store_dir / name).unlink(missing_ok=True)
