"""Which packages this machine loads: a ``.pt2`` package is code, not data.

Loading an exported package unpickles it inside torch (``torch.export.load`` does not restrict
what runs), and an AOTInductor package is a shared library that the loader runs. So
:func:`mrcnn.export.load_exported` (and ``mrcnn-bench export-time``) load only a package whose
SHA-256 is on this user's allow-list, which :func:`mrcnn.export.build_packages` (``mrcnn export``)
appends to for every package it writes, or one the caller says to trust (``trust=True``,
``--trust-package``). A hash stored inside or beside a package would prove nothing: whoever
supplies the package controls it. The list is local: ``$MRCNN_TRUSTED_PACKAGES``, else
``$XDG_STATE_HOME/mrcnn/trusted_packages.txt`` (``~/.local/state/...``), one ``<sha256>  <path>``
line per package.

The bytes that are checked are the bytes that are loaded: :func:`trusted_copy` hashes the package
while copying it into a private folder and the loaders open the copy, so a package renamed over
the checked one between the check and the load is never run.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mrcnn.exits import UsageError

ENV = "MRCNN_TRUSTED_PACKAGES"
DIGEST = re.compile(rb"[0-9a-f]{64}")


class UntrustedPackageError(UsageError):
    """A package that is neither on the allow-list nor trusted by the caller."""


def allow_list_path() -> Path:
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "mrcnn" / "trusted_packages.txt"


def sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def trust(path: str | os.PathLike) -> None:
    """Add the package at ``path``, as it is now, to the allow-list (called for the packages this
    machine builds)."""
    digest = sha256(path)
    if digest in _listed():
        return  # the same bytes built again (each harness run rebuilds its packages): listed once
    allow = allow_list_path()
    allow.parent.mkdir(parents=True, exist_ok=True)
    where = os.fsencode(Path(path).resolve()).replace(b"\n", b"?")  # bytes on Linux; one line per package
    with allow.open("ab") as f:
        f.write(digest.encode() + b"  " + where + b"\n")


def check_writable() -> None:
    """UsageError naming the allow-list unless this user can append to it: checked before a package is
    built, so that a read-only state folder costs no export."""
    allow = allow_list_path()
    try:
        allow.parent.mkdir(parents=True, exist_ok=True)
        with allow.open("ab"):
            pass
    except OSError as e:
        raise UsageError(f"cannot write the package allow-list {allow}: {e.strerror or e} (each package built is "
                         f"listed there; set {ENV} to a file you can write)") from None


def _listed() -> set[str]:
    """The SHA-256 digests on the allow-list; UsageError naming the file and line for a line that is not
    ``<sha256>  <path>`` (a damaged list is not read as an empty one)."""
    allow = allow_list_path()
    try:
        lines = allow.read_bytes().splitlines() if allow.is_file() else []
    except OSError as e:
        raise UsageError(f"cannot read the package allow-list {allow}: {e.strerror or e}") from None
    digests = set()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        first = line.split(maxsplit=1)[0]
        if not DIGEST.fullmatch(first):
            raise UsageError(f"{allow} line {number} is not '<sha256>  <path>' (64 lower-case hex digits first): "
                             f"mend or delete that line ({ENV} names another list)")
        digests.add(first.decode("ascii"))
    return digests


def is_trusted(path: str | os.PathLike) -> bool:
    return sha256(path) in _listed()


def _refusal(path: str | os.PathLike) -> UntrustedPackageError:
    return UntrustedPackageError(
        f"{path} was not built by mrcnn export for this user (its SHA-256 is not in {allow_list_path()}): a .pt2 "
        "package runs code when loaded; if you trust whoever built it, pass --trust-package (trust=True)"
    )


def check_trusted(path: str | os.PathLike, trusted: bool = False) -> None:
    """UntrustedPackageError unless ``trusted`` or the package is on the allow-list: a check before
    anything is built. A loader opens :func:`trusted_copy`, never ``path`` itself."""
    if trusted or is_trusted(path):
        return
    raise _refusal(path)


@contextmanager
def trusted_copy(path: str | os.PathLike, trusted: bool = False) -> Iterator[Path]:
    """A private copy of the package at ``path`` (a folder only this user can enter, removed on exit),
    hashed while it is copied; UntrustedPackageError before it is yielded unless ``trusted`` or those
    bytes are on the allow-list. Whatever happens to ``path`` after the copy, the loader reads the
    bytes that were checked."""
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory(prefix="mrcnn-package-") as private:  # mode 0700
        copy = Path(private) / "package.pt2"
        try:
            with open(path, "rb") as src, open(copy, "xb") as dst:
                for block in iter(lambda: src.read(1 << 20), b""):
                    digest.update(block)
                    dst.write(block)
        except OSError as e:
            raise UsageError(f"cannot copy the package {path}: {e.strerror or e}") from None
        if not trusted and digest.hexdigest() not in _listed():
            raise _refusal(path)
        yield copy
