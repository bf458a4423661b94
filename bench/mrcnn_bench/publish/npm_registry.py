"""The npm registry as a source of CDN files: records and tarballs fetched, verified and cached.

:func:`npm_tarball` returns a package's tarball only after checking it against the registry's
``dist.integrity`` (sha512); both the record and the tarball are cached, so a second use needs no
network. :func:`sri_matches` checks bytes against a tag's Subresource Integrity value. Used by
:mod:`mrcnn_bench.publish.offline_html`.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import re
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from io import BytesIO
from pathlib import Path

from mrcnn_bench.base.files import atomic_write

REGISTRY = "https://registry.npmjs.org"
FETCH_TIMEOUT_S = 60
Fetch = Callable[[str], bytes]
REMOTE = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.IGNORECASE)  # any scheme, or protocol-relative
_CSS_URL = re.compile(r"""url\(\s*(['"]?)([^'")]+)\1\s*\)""")


class VendorError(Exception):
    """A reference that cannot be made local: unknown URL, network failure, integrity mismatch."""


# --- integrity --------------------------------------------------------------------------------------

_SRI_STRENGTH = {"sha256": 1, "sha384": 2, "sha512": 3}


def _sri_hashes(sri: str) -> dict[str, list[str]]:
    hashes: dict[str, list[str]] = {}
    for token in sri.split():
        algorithm, _, digest = token.partition("-")
        if algorithm in _SRI_STRENGTH and digest:
            hashes.setdefault(algorithm, []).append(digest.split("?")[0])
    return hashes


def sri_matches(data: bytes, sri: str) -> bool:
    """Whether ``data`` matches a Subresource Integrity string (its strongest algorithm, as browsers do).

    An SRI string with no sha256/384/512 token matches nothing, so a missing hash never passes.
    """
    hashes = _sri_hashes(sri)
    if not hashes:
        return False
    algorithm = max(hashes, key=_SRI_STRENGTH.__getitem__)
    digest = base64.b64encode(hashlib.new(algorithm, data).digest()).decode()
    return digest in hashes[algorithm]


# --- the npm registry and the cache -----------------------------------------------------------------


def fetch_url(url: str) -> bytes:
    """GET ``url`` with urllib: the default ``fetch`` of :func:`vendor_assets`."""
    request = urllib.request.Request(url, headers={"User-Agent": "mrcnn-bench offline_html (urllib)"})
    with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as response:
        return response.read()


def _get(fetch: Fetch, url: str) -> bytes:
    try:
        return fetch(url)
    except (OSError, urllib.error.URLError, http.client.HTTPException) as e:  # HTTPError, timeouts, DNS included
        raise VendorError(f"cannot fetch {url}: {getattr(e, 'reason', None) or e}") from e


def _cache_name(package: str, version: str) -> str:
    return f"{package.replace('/', '+')}@{version}"


def _registry_record(package: str, version: str, cache_dir: Path, fetch: Fetch) -> dict:
    """The registry's record for ``package@version`` (name, version, dist), from the cache or the registry."""
    cached = cache_dir / f"{_cache_name(package, version)}.json"
    url = f"{REGISTRY}/{package.replace('/', '%2F')}/{version}"
    raw = cached.read_bytes() if cached.is_file() else _get(fetch, url)
    try:
        record = json.loads(raw)
        dist = record["dist"]
        keep = {"name": record.get("name", package), "version": record.get("version", version),
                "dist": {"tarball": str(dist["tarball"]), "integrity": str(dist.get("integrity") or "")}}
    except (ValueError, KeyError, TypeError) as e:
        where = f"cached file {cached}" if cached.is_file() else f"the npm registry's answer ({url})"
        raise VendorError(f"{where} for {package}@{version} has no dist.tarball") from e
    if keep["version"] != version:
        raise VendorError(f"the npm registry answered version {keep['version']} for {package}@{version}")
    if not cached.is_file():
        atomic_write(cached, json.dumps(keep, indent=1).encode())
    return keep


def npm_tarball(package: str, version: str, cache_dir: Path, fetch: Fetch) -> bytes:
    """The verified .tgz of ``package@version``: cached, else downloaded; checked against ``dist.integrity``.

    The check runs on every use, cached or not, so a damaged cache fails as loudly as a bad download.
    """
    record = _registry_record(package, version, cache_dir, fetch)
    integrity = record["dist"]["integrity"]
    if "sha512-" not in integrity:
        raise VendorError(f"the npm registry gives no sha512 integrity for {package}@{version}; not trusting it")
    cached = cache_dir / f"{_cache_name(package, version)}.tgz"
    data = cached.read_bytes() if cached.is_file() else _get(fetch, record["dist"]["tarball"])
    if not sri_matches(data, integrity):
        where = f"cached file {cached} (delete it to download again)" if cached.is_file() else record["dist"]["tarball"]
        raise VendorError(f"integrity mismatch for {package}@{version}: {where} does not match the "
                          f"registry's dist.integrity {integrity[:24]}...")
    if not cached.is_file():
        atomic_write(cached, data)
    return data


def package_files(tarball: bytes, what: str) -> dict[str, bytes]:
    """Regular files of an npm tarball by path inside the package (its top folder, ``package/``, stripped)."""
    files = {}
    try:
        with tarfile.open(fileobj=BytesIO(tarball), mode="r:gz") as tar:
            for member in tar:
                if member.isfile() and "/" in member.name:
                    f = tar.extractfile(member)
                    if f is not None:
                        files[member.name.split("/", 1)[1]] = f.read()
    except (tarfile.TarError, OSError, EOFError) as e:
        raise VendorError(f"unreadable npm tarball of {what}: {e}") from e
    return files


def safe_relative(path: str, what: str) -> str:
    parts = path.replace("\\", "/").split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise VendorError(f"refusing {what} path {path!r}: it must stay inside the package")
    return "/".join(parts)


def css_dependencies(css_path: str, css: bytes) -> list[str]:
    """Package paths of the files a stylesheet's relative ``url(...)``\\ s name (fonts, images)."""
    found = []
    for _, url in _CSS_URL.findall(css.decode("utf-8", "replace")):
        if url.lower().startswith("data:"):
            continue
        if REMOTE.match(url) or url.startswith("/"):
            raise VendorError(f"stylesheet {css_path} loads {url}, which is not in its package")
        target = os.path.normpath(os.path.join(os.path.dirname(css_path), re.split(r"[?#]", url, maxsplit=1)[0]))
        found.append(target.replace(os.sep, "/"))
    return sorted(set(found))
