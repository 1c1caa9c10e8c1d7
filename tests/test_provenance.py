"""klalm.provenance: the commit a results file records, marked when the tree differs from it."""

import subprocess

from klalm.provenance import git_commit


def test_the_recorded_commit_says_when_the_tree_differs_from_it(tmp_path, monkeypatch):
    monkeypatch.delenv("KLALM_COMMIT", raising=False)
    monkeypatch.chdir(tmp_path)
    assert git_commit() == "unknown"  # not a git checkout
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], check=True)
    (tmp_path / "f.txt").write_text("a")
    subprocess.run(["git", "add", "f.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    (tmp_path / "new.txt").write_text("untracked files do not count")
    assert git_commit() == head
    (tmp_path / "f.txt").write_text("b")
    assert git_commit() == head + "-dirty"
