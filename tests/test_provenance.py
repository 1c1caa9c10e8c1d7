"""klalm.provenance: the commit a results file records, and the tree of the code that ran when it differs."""

import os
import subprocess

from klalm.provenance import TREE_DIGITS, git_commit


def _git(*args: str) -> str:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    return subprocess.run([*git, *args], capture_output=True, text=True, check=True).stdout.strip()


def test_the_recorded_commit_names_the_tree_that_ran_when_it_differs_from_head(tmp_path, monkeypatch):
    from klalm import provenance

    monkeypatch.delenv("KLALM_COMMIT", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(provenance, "SOURCE", tmp_path)
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


def test_untracked_files_past_the_limit_are_left_out_and_said_so(tmp_path, monkeypatch):
    from klalm import provenance

    monkeypatch.delenv("KLALM_COMMIT", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(provenance, "SOURCE", tmp_path)
    _git("init", "-q")
    (tmp_path / "f.txt").write_text("a")
    _git("add", "f.txt")
    _git("commit", "-qm", "x")
    head = _git("rev-parse", "--short", "HEAD")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "data.bin").write_bytes(b"x" * 100)
    monkeypatch.setattr(provenance, "UNTRACKED_LIMIT_BYTES", 99)
    monkeypatch.setattr(provenance, "SOURCE", tmp_path / "sub")  # code in a subfolder: the whole checkout is read
    assert git_commit() == head + " (untracked files too large to hash were left out)"
    (tmp_path / "f.txt").write_text("b")
    tracked_only = git_commit()
    assert tracked_only.startswith(head + "-dirty (tree ") and tracked_only.endswith(", untracked files left out)")
    monkeypatch.setattr(provenance, "UNTRACKED_LIMIT_BYTES", 100)
    assert git_commit() != tracked_only and git_commit().endswith(")") and "left out" not in git_commit()


def test_the_commit_is_that_of_the_checkout_klalm_runs_from_not_of_the_current_folder(tmp_path, monkeypatch):
    """A command run from inside another git repository (a user's project) records klalm's commit, not that
    repository's, and writes nothing there; klalm inside an ignored folder of a checkout (a virtual environment)
    records "unknown"."""
    from klalm import provenance

    monkeypatch.delenv("KLALM_COMMIT", raising=False)
    code, other = tmp_path / "code", tmp_path / "other"
    for repo in (code, other):
        repo.mkdir()
        monkeypatch.chdir(repo)
        _git("init", "-q")
        (repo / ".gitignore").write_text("venv/\n")
        (repo / "f.txt").write_text(repo.name)
        _git("add", ".gitignore", "f.txt")
        _git("commit", "-qm", repo.name)
    code_head = _git("-C", str(code), "rev-parse", "--short", "HEAD")
    (other / "untracked.txt").write_text("the other repository's own work")
    objects = sorted(p.name for p in (other / ".git" / "objects").rglob("*"))
    monkeypatch.chdir(other)
    monkeypatch.setattr(provenance, "SOURCE", code)
    assert git_commit() == code_head
    assert sorted(p.name for p in (other / ".git" / "objects").rglob("*")) == objects  # nothing hashed into it
    (code / "venv" / "klalm").mkdir(parents=True)
    monkeypatch.setattr(provenance, "SOURCE", code / "venv" / "klalm")
    assert git_commit() == "unknown"


def test_a_file_rewritten_in_the_index_s_last_tick_is_hashed_not_trusted(tmp_path, monkeypatch):
    """A file rewritten to the same size within the time stamp of the index that staged it has the stat data git
    stored for its old content: git checks such "racily clean" entries by content, knowing them by the index file's own
    time, which the copy of the index lost (a plain copy is newer than every entry): the recorded tree then held the
    old content (seen in CI, where the test above writes and commits within one second)."""
    from klalm import provenance

    monkeypatch.delenv("KLALM_COMMIT", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(provenance, "SOURCE", tmp_path)
    _git("init", "-q")
    (tmp_path / "f.txt").write_text("a")
    tick = (os.stat(tmp_path / "f.txt").st_mtime_ns // 10**9 - 10) * 10**9  # a whole second, 10 s ago
    os.utime(tmp_path / "f.txt", ns=(tick, tick))
    _git("add", "f.txt")  # the index stores that time with "a"
    _git("commit", "-qm", "x")
    (tmp_path / "f.txt").write_text("b")  # the same size, and (below) the same time as the staged "a"
    for path in (tmp_path / "f.txt", tmp_path / ".git" / "index"):  # the index written in the same tick
        os.utime(path, ns=(tick, tick))
    recorded = git_commit()
    _git("add", "f.txt")
    _git("commit", "-qm", "y")
    assert recorded.endswith(f"(tree {_git('rev-parse', 'HEAD^{tree}')[: provenance.TREE_DIGITS]})")
