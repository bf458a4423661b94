"""A throwaway git repository of empty commits, for tests that read a line of commits."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_line(repo: Path, n: int) -> list[str]:
    """A repository of ``n`` empty commits at ``repo`` (made here); their hashes, oldest first."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout

    repo.mkdir()
    git("init", "-q")
    for k in range(n):
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", f"c{k}")
    return git("rev-list", "--reverse", "HEAD").split()
