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
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from mrcnn.exits import UsageError

ENV = "MRCNN_TRUSTED_PACKAGES"


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
    with allow.open("a", encoding="utf-8") as f:
        f.write(f"{digest}  {Path(path).resolve()}\n")


def _listed() -> set[str]:
    """The SHA-256 digests on the allow-list."""
    allow = allow_list_path()
    lines = allow.read_text(encoding="utf-8").splitlines() if allow.is_file() else []
    return {line.split(maxsplit=1)[0] for line in lines if line.strip()}


def is_trusted(path: str | os.PathLike) -> bool:
    return sha256(path) in _listed()


def check_trusted(path: str | os.PathLike, trusted: bool = False) -> None:
    """UntrustedPackageError unless ``trusted`` or the package is on the allow-list, before it is opened
    by any loader."""
    if trusted or is_trusted(path):
        return
    raise UntrustedPackageError(
        f"{path} was not built by mrcnn export for this user (its SHA-256 is not in {allow_list_path()}): a .pt2 "
        "package runs code when loaded; if you trust whoever built it, pass --trust-package (trust=True)"
    )
