"""`python -m klalm.train.torchrun <torchrun arguments>`: torchrun (`torch.distributed.run`) with an exit code that
tells a stop from a crash. `scripts/launch_torchrun.sh` runs it.

On SIGTERM or SIGINT, torchrun forwards the signal to its ranks, waits for them (`TORCH_ELASTIC_SHUTDOWN_TIMEOUT`;
then SIGKILL) and raises its `SignalException`: a traceback and exit code 1, as after a crash. Here that exception
ends the agent with 128 + the signal (143 for SIGTERM, 130 for SIGINT) when every rank of this node stopped as
designed (exit code 143 or 130: saved a checkpoint, then stopped; 0 for a rank that had finished), with 0 when every
rank had finished the run, and with 1 otherwise (a rank killed after the timeout, one that failed): a requeue script
resumes on 143 and looks at the logs on 1. A signal that came before any rank started (a wait for the other nodes)
ends it with 128 + the signal too: nothing was trained, nothing lost. A signal sent to the ranks rather than to the
agent (or a stop agreed with another node's ranks) reaches torchrun as its `ChildFailedError`: when every rank ended
143 or 130 (or 0), the agent ends with that code as well. Everything else (a rank's failure: exit code 1) is
torchrun's own.
"""

from __future__ import annotations

import signal
import sys
from subprocess import Popen

# what klalm-train exits with after a stop signal (klalm.train.app.STOP_EXIT_CODES; not imported: Lightning is heavy)
STOPPED = frozenset({128 + signal.SIGTERM, 128 + signal.SIGINT})


def exit_code(sig: int, ranks: dict[int, int | None] | None) -> int:
    """The agent's exit code after stop signal `sig`, from its ranks' exit codes by local rank (None: still running,
    or unknown; {}: no rank started yet; None for `ranks`: this torch's ranks cannot be told)."""
    if ranks is None:
        return 1
    codes = list(ranks.values())
    if codes and all(code == 0 for code in codes):
        return 0
    if all(code == 0 or code in STOPPED for code in codes):
        return 128 + sig
    return 1


def stopped_code(ranks: dict[int, int | None] | None) -> int | None:
    """After ranks failed without a signal to the agent: the stop code (143 or 130) they ended with when every rank
    stopped as designed or had finished (the first stopped rank's code), else None (a failure)."""
    codes = list((ranks or {}).values())
    stops = [code for code in codes if code in STOPPED]
    return stops[0] if stops and all(code == 0 or code in STOPPED for code in codes) else None


def _track_ranks() -> dict[int, Popen] | None:
    """The rank processes torchrun starts on this node (`SubprocessHandler.proc`), by local rank, filled as it starts
    them (a restart replaces them). None when this torch starts them otherwise."""
    ranks: dict[int, Popen] = {}
    try:
        from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler
    except ImportError:
        return None
    start = SubprocessHandler.__init__

    def tracked(self, *args, **kwargs) -> None:
        start(self, *args, **kwargs)
        ranks[getattr(self, "local_rank_id", len(ranks))] = self.proc

    SubprocessHandler.__init__ = tracked
    return ranks


def _codes(ranks: dict[int, Popen] | None) -> dict[int, int | None] | None:
    return None if ranks is None else {rank: proc.poll() for rank, proc in sorted(ranks.items())}


def main() -> None:
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    ranks = _track_ranks()
    try:
        run.main()
    except SignalException as stop:  # raised after torchrun's shutdown: the ranks have ended (or were killed)
        sig = signal.Signals(stop.sigval)
        codes = _codes(ranks)
        code = exit_code(sig, codes)
        said = {0: "every rank had finished", 128 + sig: "every rank saved and stopped"}.get(
            code, "not every rank stopped as designed (-9: killed after TORCH_ELASTIC_SHUTDOWN_TIMEOUT)"
        )
        if code == 128 + sig and not codes:
            said = "no rank had started"
        known = codes or "unknown"
        print(f"torchrun: {sig.name}: {said}; ranks' exit codes {known}; exit code {code}", file=sys.stderr)
        sys.exit(code)
    except ChildFailedError:  # the ranks' own stop (a signal sent to them, a stop agreed with another node's ranks)
        codes = _codes(ranks)
        code = stopped_code(codes)
        if code is None:
            raise
        print(f"torchrun: every rank saved and stopped; ranks' exit codes {codes}; exit code {code}", file=sys.stderr)
        sys.exit(code)


if __name__ == "__main__":
    main()
