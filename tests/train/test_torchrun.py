"""`klalm.train.torchrun` (what scripts/launch_torchrun.sh runs): after a stop signal the agent exits 143 / 130 when
every rank stopped as designed, 1 when one did not; torchrun alone exits 1 either way. Ranks here are small scripts
(no torch), so the agent's start is most of each test; tests/train/test_ddp.py stops real 2-rank runs."""

import os
import signal
import subprocess
import sys
import time

import pytest

from klalm.train.torchrun import STOPPED, exit_code, stopped_code

# A rank: stops as klalm-train does (exit 128 + the signal) or, "ignores" on local rank 1, lets torchrun kill it after
# its shutdown timeout; "fails" on local rank 1: exits 3 at once, no signal.
RANK = """import os, pathlib, signal, sys, time
how, folder = sys.argv[1], pathlib.Path(sys.argv[2])
rank = int(os.environ["LOCAL_RANK"])
if how == "fails" and rank == 1:
    sys.exit(3)
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, signal.SIG_IGN if how == "ignores" and rank == 1 else lambda s, _: sys.exit(128 + s))
(folder / f"pid{rank}").write_text(str(os.getpid()))
(folder / f"ready{rank}").touch()
time.sleep(120)
"""


def test_exit_code_of_the_ranks_exit_codes():
    from klalm.train.app import STOP_EXIT_CODES

    assert set(STOP_EXIT_CODES.values()) == STOPPED  # what the ranks exit with, as the agent expects it
    assert exit_code(signal.SIGTERM, {0: 143, 1: 143}) == 143
    assert exit_code(signal.SIGINT, {0: 130, 1: 130}) == 130
    assert exit_code(signal.SIGINT, {0: 143, 1: 130}) == 130  # rank 1 stopped for rank 0's signal: 143
    assert exit_code(signal.SIGTERM, {0: 143, 1: 0}) == 143  # one had finished: stopped all the same
    assert exit_code(signal.SIGTERM, {0: 0, 1: 0}) == 0  # the signal came after the run
    assert exit_code(signal.SIGTERM, {0: 143, 1: -9}) == 1  # killed after the shutdown timeout: maybe unsaved
    assert exit_code(signal.SIGTERM, {0: 143, 1: 1}) == 1  # failed
    assert exit_code(signal.SIGTERM, {0: 143, 1: None}) == 1  # still running (stuck)
    assert exit_code(signal.SIGTERM, {}) == 143  # before any rank started (a rendezvous): nothing to lose
    assert exit_code(signal.SIGTERM, None) == 1  # the ranks cannot be told
    assert stopped_code({0: 143, 1: 143}) == 143 and stopped_code({0: 0, 1: 130}) == 130
    assert stopped_code({0: 143, 1: 1}) is None and stopped_code({0: 1, 1: 1}) is None and stopped_code(None) is None
    assert stopped_code({0: 0, 1: 0}) is None  # (no failure to explain)


def _agent(tmp_path, how: str) -> subprocess.Popen:
    """`python -m klalm.train.torchrun` over 2 ranks of RANK, started once both ranks are ready (or one failed)."""
    (tmp_path / "rank.py").write_text(RANK)
    env = {**os.environ, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "1"}  # torch < 2.12: 30 s, the same outcome
    cmd = [sys.executable, "-m", "klalm.train.torchrun", "--standalone", "--nnodes", "1", "--nproc_per_node", "2",
           str(tmp_path / "rank.py"), how, str(tmp_path)]  # fmt: skip
    with (tmp_path / "agent.txt").open("w") as out:
        agent = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 120
    while how != "fails" and not all((tmp_path / f"ready{rank}").exists() for rank in (0, 1)):
        assert agent.poll() is None and time.time() < deadline, (tmp_path / "agent.txt").read_text()[-3000:]
        time.sleep(0.05)
    return agent


def _ended(agent: subprocess.Popen, tmp_path) -> tuple[int, str]:
    try:
        code = agent.wait(timeout=120)
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
    return code, (tmp_path / "agent.txt").read_text()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_that_every_rank_made_exits_with_the_signal(tmp_path, sig, code):
    agent = _agent(tmp_path, "stops")
    os.killpg(agent.pid, sig)  # as a terminal's Ctrl-C does: the agent's group; the ranks have sessions of their own
    got, out = _ended(agent, tmp_path)
    assert got == code, out[-3000:]
    assert f"ranks' exit codes {{0: {code}, 1: {code}}}; exit code {code}" in out
    assert "Traceback" not in out


def test_a_stop_signal_sent_to_the_ranks_exits_with_their_code(tmp_path):
    """SIGTERM to the ranks, not the agent (as a scheduler that signals every process, or a stop agreed with another
    node's ranks): torchrun sees ranks that failed with 143; the agent says they stopped and exits 143."""
    agent = _agent(tmp_path, "stops")
    for rank in (0, 1):
        os.kill(int((tmp_path / f"pid{rank}").read_text()), signal.SIGTERM)
    got, out = _ended(agent, tmp_path)
    assert got == 143, out[-3000:]
    assert "every rank saved and stopped; ranks' exit codes {0: 143, 1: 143}; exit code 143" in out


def test_a_rank_killed_after_the_shutdown_timeout_exits_1(tmp_path):
    agent = _agent(tmp_path, "ignores")
    agent.send_signal(signal.SIGTERM)
    got, out = _ended(agent, tmp_path)
    assert got == 1, out[-3000:]
    assert "not every rank stopped as designed" in out and "ranks' exit codes {0: 143, 1: -9}; exit code 1" in out


def test_a_failure_without_a_signal_keeps_torchruns_exit_code(tmp_path):
    got, out = _ended(_agent(tmp_path, "fails"), tmp_path)
    assert got == 1 and "ChildFailedError" in out, out[-3000:]
