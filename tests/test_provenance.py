"""klalm.provenance: the commit a results file records, and the tree of the code that ran when it differs."""

import subprocess

from klalm.provenance import TREE_DIGITS, git_commit


def _git(*args: str) -> str:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    return subprocess.run([*git, *args], capture_output=True, text=True, check=True).stdout.strip()


def test_the_recorded_commit_names_the_tree_that_ran_when_it_differs_from_head(tmp_path, monkeypatch):
    monkeypatch.delenv("KLALM_COMMIT", raising=False)
    monkeypatch.chdir(tmp_path)
    assert git_commit() == "unknown"  # not a git checkout
    _git("init", "-q")
    (tmp_path / ".gitignore").write_text("ignored/\n")
    (tmp_path / "f.txt").write_text("a")
    _git("add", ".gitignore", "f.txt")
    _git("commit", "-qm", "x")
    head = _git("rev-parse", "--short", "HEAD")
    (tmp_path / "ignored").mkdir()
    (tmp_path / "ignored" / "state.pt").write_text("ignored files do not count")
    assert git_commit() == head
    (tmp_path / "f.txt").write_text("b")
    (tmp_path / "new.txt").write_text("untracked files do count: they are code that ran")
    recorded = git_commit()
    assert recorded.startswith(head + "-dirty (tree ") and recorded.endswith(")")
    assert _git("status", "--porcelain") == "M f.txt\n?? new.txt"  # the index (what is staged) untouched
    # once committed, the recorded tree is that commit's tree
    _git("add", "--all")
    _git("commit", "-qm", "y")
    assert _git("rev-parse", "HEAD^{tree}")[:TREE_DIGITS] == recorded.rsplit(" ", 1)[1].rstrip(")")
    assert git_commit() == _git("rev-parse", "--short", "HEAD")


def test_an_environment_value_wins(monkeypatch):
    monkeypatch.setenv("KLALM_COMMIT", "abc1234")
    assert git_commit() == "abc1234"
