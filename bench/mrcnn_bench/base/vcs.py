"""The one way the harness runs git: refs from outside checked, and git's options ended before them.

A ref, a range or a path that a user, a file or the environment gives is data, never an option:
:func:`check_ref` refuses text git would read as one (a leading ``-``) or that no ref can hold, and
every call that passes such text puts ``--end-of-options`` (and ``--`` before paths) in front of it.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from mrcnn_bench.base.errors import UsageError

TIMEOUT_S = 60.0  # a local git command; a hung one (a lock, a prompt) must not hang a measurement
# What no ref, range (A..B, A...B) or revision expression (HEAD~2, v1^{commit}, @{u}) needs.
_NOT_IN_A_REF = re.compile(r"[\x00-\x20\x7f\\]")


class GitError(UsageError):
    """git refused, failed or is missing: one line with git's own first line of complaint."""


def check_ref(text: str, what: str = "ref") -> str:
    """``text`` when it can only be read as a ref or range; GitError naming ``what`` otherwise."""
    if not isinstance(text, str) or not text:
        raise GitError(f"{what}: an empty ref")
    if text.startswith("-"):
        raise GitError(f"{what} {text!r}: a ref cannot start with '-' (git would read it as an option)")
    if _NOT_IN_A_REF.search(text):
        raise GitError(f"{what} {text!r}: whitespace, control characters and backslashes are in no ref")
    return text


def run(repo: str | Path, *args: str, check: bool = True, env: Mapping[str, str] | None = None,
        input: bytes | None = None, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[bytes]:
    """``git -C REPO ARGS``, its output as bytes; GitError with git's first line when ``check`` and it fails."""
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, input=input,
                              env=None if env is None else dict(env), timeout=timeout, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        raise GitError(f"git {args[0] if args else ''} in {repo}: {e}") from None
    if check and done.returncode != 0:
        first = (done.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[0]
        raise GitError(f"git {' '.join(args[:2])} failed in {repo}: {first}")
    return done


def output(repo: str | Path, *args: str) -> str | None:
    """``git ARGS``'s stdout, stripped, or None when git fails or is absent (for what is nice to have)."""
    try:
        return run(repo, *args).stdout.decode(errors="replace").strip()
    except GitError:
        return None


def rev_list(repo: str | Path, revs: str, paths: Sequence[str] = (), reverse: bool = False) -> list[str]:
    """Full hashes of ``git rev-list [--reverse] REVS [-- PATHS]``; GitError when git cannot."""
    args = ["rev-list", *(["--reverse"] if reverse else []), "--end-of-options", check_ref(revs, "revs")]
    return run(repo, *args, "--", *paths).stdout.decode().split()


def commit_of(repo: str | Path, ref: str) -> str | None:
    """The full hash of the commit ``ref`` names, or None when it names none (or is no ref at all)."""
    try:
        check_ref(ref)
    except GitError:
        return None
    return output(repo, "rev-parse", "--verify", "--end-of-options", f"{ref}^{{commit}}")
