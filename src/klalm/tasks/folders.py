"""`klalm-synthetic merge` and `pack`, the verbs that only move files between a results or state folder and the
copies a device call takes and brings back; `positions` and `curves`, which only read a results folder; and what
every verb shares: its one-line refusals, the checks of its folder and file arguments, the --results folder's one
writer, SIGTERM taken as Ctrl-C.

Nothing here imports torch (klalm.tasks.results and klalm.tasks.states read and write the files, klalm.tasks.report
draws the tables and plots): merge and pack run after and beside every device call, on a machine whose time is
budgeted, where torch and the model zoo took seconds to import before any file was touched, and positions and curves
are looked at again and again. The other verbs are klalm.tasks.runner's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import shutil
import signal
import threading
from pathlib import Path
from typing import Any, NoReturn

from klalm.errors import one_line, refuse
from klalm.fileio import flocked, image_name_problem
from klalm.provenance import git_commit
from klalm.tasks.results import PROGRESS_FILE, RESULTS_FILES, Results, is_results_folder, merge, read_jsonl
from klalm.tasks.states import (
    pack_states,
    saved_states,
    staged_problem,
    state_files,
    state_parts,
    swap_in_states,
    unpack_states,
    watch_states,
)

log = logging.getLogger("klalm.synthetic")

VERBS = ("merge", "pack", "positions", "curves")  # those `run` does; klalm.tasks.runner.run does the others


def run(args: argparse.Namespace) -> None:
    """`klalm-synthetic merge`, `pack`, `positions` or `curves` with its arguments parsed (`klalm.cli.synthetic_args`).
    Input it cannot use ends it with one line on stderr before anything is written."""
    {"merge": _merge, "pack": _pack, "positions": _positions, "curves": _curves}[args.verb](args)


PREFIX = "klalm-synthetic"


def refuse_input(message: str) -> NoReturn:
    """End the command in one line of stderr (exit code 1), before it writes."""
    refuse(PREFIX, message)


def check_folder(path: Path, what: str, exists: bool) -> None:
    """Refuse a folder argument (`what`: "--results folder") that is a file or lies under one, or (`exists`) that
    does not exist."""
    if path.exists() and not path.is_dir():
        refuse_input(f"{what} {path} is a file, not a folder")
    above = next((parent for parent in path.parents if parent.exists()), None)
    if above is not None and not above.is_dir():
        refuse_input(f"{what} {path}: {above} is a file, not a folder")
    if exists and not path.is_dir():
        refuse_input(f"{what} {path} does not exist")


def check_plot(path: Path | None) -> None:
    """Refuse a --plot file whose folder does not exist, or whose name names no image format (`image_name_problem`),
    before the table is computed."""
    if path is None:
        return
    if path.is_dir() or not path.parent.is_dir():
        refuse_input(f"--plot {path}: " + ("is a folder" if path.is_dir() else f"folder {path.parent} does not exist"))
    if (why := image_name_problem(path)) is not None:
        refuse_input(f"--plot {path}: {why}")


def read_results(folder: Path, families: list[str]) -> Results:
    """An existing results folder's rows; a file in it that is not JSON lines is refused, naming file and line."""
    check_folder(folder, "--results folder", exists=True)
    try:
        return Results(folder, families, create=False)
    except (ValueError, OSError) as err:
        refuse_input(one_line(err))


class Terminated(KeyboardInterrupt):
    """SIGTERM on a block (klalm.tasks.runner) or on `pack`: ends it as Ctrl-C does (exit code 143)."""


def _raise_terminated(signum: int, frame: object) -> NoReturn:
    """SIGTERM on `pack`: ends it as Ctrl-C does."""
    raise Terminated


def _merge(args: argparse.Namespace) -> None:
    # a call whose results files did not come back returns no synthetic/ folder, only its states' parts beside where it
    # would be: a --from named synthetic, missing or empty, still restores them; any other missing --from is a typo
    parts = state_parts(args.source.resolve().parent) if args.state is not None else []
    check_folder(args.source, "--from folder", exists=not (parts and args.source.name == "synthetic"))
    if not any(args.source.glob("*.jsonl")) and not parts:
        beside = " and no state.tar.* parts lie beside it" if args.state is not None else ""
        refuse_input(f"--from {args.source} holds no results file (*.jsonl){beside}: nothing to merge (a call's rows "
                     "come back in its synthetic/ folder, its states' parts beside it)")  # fmt: skip
    check_folder(args.results, "--results folder", exists=True)
    check_results_folder(args.results)
    if args.state is not None:
        check_folder(args.state, "--state folder", exists=False)
    with one_writer(args.results):
        _merge_into(args, parts)


def _merge_into(args: argparse.Namespace, parts: list[Path]) -> None:
    """`merge`'s writes, its folders checked and --results held (`one_writer`)."""
    commit = args.commit or git_commit()
    staged = None  # the parts unpacked beside --state and read before any row is merged: a bad archive merges none
    if args.state is not None and parts:
        try:
            staged = unpack_states(parts, args.state)
        except ValueError as err:
            refuse_input(f"{err} (kept {args.state})")
        from klalm.tasks.units import paused_rows  # lazy: reading the states' evaluations loads them with torch

        try:  # a call killed before its block's end recorded no progress: its checkpoints' evaluations
            rows = paused_rows(staged, commit)
        except (ValueError, OSError) as err:  # a state of other code (as `progress` and `evaluate` refuse it)
            shutil.rmtree(staged)
            refuse_input(f"{staged_problem(parts, staged, 'a state this code cannot read', err)} (kept {args.state})")
    try:
        if staged is not None:  # the progress.jsonl the states' rows go to, read now: not after the merge and swap
            read_jsonl(args.results / PROGRESS_FILE)
        added: dict[str, Any] = merge(args.source, args.results, commit)
    except ValueError as err:  # a file of either folder that is not JSON lines: nothing was appended
        if staged is not None:
            shutil.rmtree(staged)
        refuse_input(one_line(err))
    if args.state is not None:
        added["state"] = swap_in_states(staged, args.state) if staged else f"none came back: kept {args.state}"
        if staged:
            added["progress.jsonl from the state"] = Results(args.results, []).record_progress(rows)
    print(json.dumps(added))


def _pack(args: argparse.Namespace) -> None:
    """`pack`: the state folder into the pieces `merge --state` unpacks, once or (`--every-s`) until stopped."""
    check_folder(args.state, "state folder", exists=True)
    check_folder(args.out, "--out folder", exists=False)
    if args.every_s is not None and not 0 < args.every_s < math.inf:
        refuse_input(f"--every-s must be > 0, got {args.every_s}")
    on_main = threading.current_thread() is threading.main_thread()
    default = on_main and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # not one ignored or handled above
    if default:  # `kill $watcher` as Ctrl-C: the piece being written is removed, not left as a temporary in --out
        signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        if args.every_s is not None:
            watch_states(args.state, args.out, args.every_s)  # returns only when stopped
            return
        parts = pack_states(args.state, args.out)
    except ValueError as err:  # a damaged state: refused before any piece is written
        refuse_input(one_line(err))
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM
        terminated = isinstance(err, Terminated)
        how, code = ("terminated (SIGTERM)", 128 + signal.SIGTERM) if terminated else ("interrupted", 130)
        refuse(PREFIX, f"pack {how}: {args.out} holds the pieces packed last", code)
    finally:
        if default:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    mib = {"state_mib": _mib(state_files(args.state)), "packed_mib": _mib(parts)}
    print(json.dumps({"parts": [p.name for p in parts], "units": len(saved_states(args.state)), **mib}))


def _positions(args: argparse.Namespace) -> None:
    """`positions`: the recorded runs' held-out accuracy by position (finished rows, paused runs' progress rows)."""
    from klalm.tasks.report import plot_positions, positions_markdown, run_colours, run_positions, training_curves

    check_plot(args.plot)
    family, results = args.family, read_results(args.results, [args.family])
    rows = run_positions(results.rows[family], results.progress, family, args.archs, args.lengths, args.depths)
    if not rows:
        refuse_input(f"no {family.upper()} row with accuracy by position in {args.results} matches")
    print(positions_markdown(rows))
    if args.plot is not None:  # each run in the colour `curves` gives it, paused runs counted
        runs = training_curves(results.rows[family], results.progress, family, args.archs, args.lengths, args.depths)
        plot_positions(rows, args.plot, run_colours(runs))


def _curves(args: argparse.Namespace) -> None:
    """`curves`: the recorded runs' held-out accuracy by step (finished rows, paused runs' progress rows)."""
    from klalm.tasks.report import curve_steps, curves_markdown, plot_curves, training_curves

    check_plot(args.plot)
    if any(step < 0 for step in args.steps):
        refuse_input(f"--steps: steps must be >= 0, got {args.steps}")
    family, results = args.family, read_results(args.results, [args.family])
    rows = training_curves(results.rows[family], results.progress, family, args.archs, args.lengths, args.depths)
    if not rows:
        refuse_input(f"no {family.upper()} run with evaluations in {args.results} matches")
    print(curves_markdown(rows, args.steps or curve_steps(rows)))
    if args.plot is not None:
        plot_curves(rows, args.plot)


def _mib(paths) -> float:
    return round(sum(path.stat().st_size for path in paths) / 2**20, 1)


@contextlib.contextmanager
def one_writer(folder: Path):
    """Hold an flock on the --results folder itself while a run, merge or progress writes into it: another of them
    into it meanwhile is refused. The holder is not named: the lock is the folder's own (no lock file, which could
    record it, in a committed results folder). Where there is no flock (Windows), nothing is held; on a file system
    without working locks (`NO_LOCKS`) a warning says so and nothing is held, as merge and progress took no lock
    before and klalm-train's run folders do."""

    def unsupported(err: OSError) -> None:
        log.warning("--results folder %s: file locks unsupported here (%s); one writer is not enforced", folder, err)

    with contextlib.ExitStack() as held:
        try:  # the descriptor is not inherited by the units' processes
            held.enter_context(flocked(folder, unsupported=unsupported))
        except BlockingIOError:
            refuse_input(f"--results folder {folder} is in use by another klalm-synthetic command (a run, merge or "
                         "progress): try again once it has ended (two at once would write rows twice, a block "
                         "training the units whose rows come meanwhile)")  # fmt: skip
        yield


def check_results_folder(folder: Path, state: Path | None = None) -> None:
    """Refuse an existing --results folder that writing rows into would spoil, or whose rows `plan` would read as
    none: one with none of the results files but other things in it (`merge --results results` had put a5.jsonl
    beside the results folders, and `plan --results results` listed every unit as ready). `state`, the --state folder
    of `run` or `plan`, is not counted: the CPU example keeps it in its results folder, where a block killed before
    its first rate line leaves it alone."""
    beside = [] if state is None else [state.resolve()]
    if folder.is_dir() and not is_results_folder(folder) and any(p.resolve() not in beside for p in folder.iterdir()):
        but = "" if state is None else " but for the --state folder"
        refuse_input(f"--results folder {folder} is not a results folder: it holds none of "
                     f"{', '.join(RESULTS_FILES)} and is not empty{but} (a new one must be)")  # fmt: skip
