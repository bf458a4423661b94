"""mrcnn_bench.base.vcs: a ref from outside is data for git, never an option."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from mrcnn_bench.base import vcs


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path_factory.mktemp("repo")
    subprocess.run(["git", "-C", str(root), "init", "-q"], check=True)
    for message in ("one", "two"):
        (root / "f.txt").write_text(message)
        for args in (["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message]):
            subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)
    return root


@pytest.mark.parametrize("ref", ["-x", "--output=/tmp/x", "a b", "a\nb", "", "a\\b", "\x1b[31m"])
def test_text_git_would_read_as_an_option_or_no_ref_holds_is_refused(ref):
    with pytest.raises(vcs.GitError):
        vcs.check_ref(ref, "--revs")


@pytest.mark.parametrize("ref", ["main", "HEAD~2", "a1b2c3d", "v1.0^{commit}", "asv-steps~29^..asv-steps", "origin/x"])
def test_refs_and_ranges_pass(ref):
    assert vcs.check_ref(ref) == ref


def test_an_option_as_revs_writes_nothing(repo, tmp_path):
    target = tmp_path / "written"
    with pytest.raises(vcs.GitError, match="cannot start with '-'"):
        vcs.rev_list(repo, f"--output={target}")
    assert not target.exists()


def test_rev_list_and_commit_of(repo):
    assert len(vcs.rev_list(repo, "HEAD")) == 2
    oldest, newest = vcs.rev_list(repo, "HEAD", reverse=True)
    assert vcs.commit_of(repo, "HEAD") == newest and vcs.commit_of(repo, "HEAD~1") == oldest
    assert vcs.commit_of(repo, "no-such-ref") is None and vcs.commit_of(repo, "--all") is None
    with pytest.raises(vcs.GitError, match="failed in"):
        vcs.rev_list(repo, "no-such-ref")
    assert vcs.output(repo, "rev-parse", "no-such-ref") is None
