"""Run a synthetic plan in blocks of GPU time, resuming from the results folder and the paused units' states: the
work of `klalm-synthetic`, whose command line (its --help, with examples of every verb) is klalm.cli.synthetic_args.

A block first resumes the units paused in the state folder (plan order), then walks the plan's other units in
order (klalm.tasks.plans) and starts each that is ready: its (cell, seed)s have no row yet; for A5, every shallower
depth of its (arch, length) listed before it has finished without solving the cell, and no depth up to its own
has solved it. A unit starts while its estimated overhead (klalm.tasks.estimates) plus MIN_TRAIN_S of training fit
before the deadline; one that cannot finish in time pauses at the deadline, its state saved in the state folder
(klalm.tasks.units), and the next block resumes it exactly. States of units that finished or were solved meanwhile
(rows merged from elsewhere) are removed when a block starts. Slots run units side by side: `procs_per_gpu` child
processes on each GPU, each training `members` seeds in one CUDA graph; a finished unit's rows are appended at once.

States live outside git (46 MiB for a pack of three KLA units) and are lost with the machine that holds them, so at
its end a block also appends every paused unit's evaluations so far to progress.jsonl (`klalm-synthetic progress`
does the same for a state folder that came back). A block run with `--finish-only` starts only units whose
estimate ends before the deadline: the last block before the states would be lost. A block run with
`--checkpoint-every-s N` also saves each running unit's state at an evaluation every N seconds, so a block killed
before its deadline (a machine taken back early) resumes from there; `pack` packs a state folder into the pieces
`merge --state` unpacks (with `--every-s`, again whenever it changes, until killed: run it beside such a block).
Those two verbs, which only move files, are klalm.tasks.folders', which imports no torch.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from klalm.errors import one_line
from klalm.provenance import git_commit
from klalm.tasks.cells import CELL_FIELDS, Unit, row_key
from klalm.tasks.estimates import estimate_s
from klalm.tasks.folders import (
    PREFIX,
    Terminated,
    check_folder,
    check_plot,
    check_results_folder,
    one_writer,
    read_results,
    refuse_input,
)
from klalm.tasks.plans import RunPlan, apply_args, load_plan, plan_units
from klalm.tasks.results import Results, UnitOutcome
from klalm.tasks.states import check_states, locked, remove_state, saved_states
from klalm.tasks.units import (
    Execution,
    evaluate_saved,
    pack_key,
    pack_tokens,
    paused_rows,
    run_units,
    state_mib,
    state_name,
)

log = logging.getLogger("klalm.synthetic")

MARGIN_S = 15.0  # units must end this long before the deadline (rows or state written, processes gone)
PACK_MAX_TOKENS = 2**19  # a pack trains at most this many tokens per step over all its members: packing pays for
# small, launch-bound steps, and MQAR's long cell (256 x 2048 tokens per member) would run out of GPU memory packed
MIN_TRAIN_S = 60.0  # a unit starts only with its estimated overhead plus this many seconds of training left


def _depth_group(unit: Unit) -> str:
    """A5: the unit's cell without its depth (the column of the minimum-depth figure)."""
    return json.dumps({k: v for k, v in unit.cell().items() if k != "n_layers"}, sort_keys=True)


def _row_depth_group(row: dict) -> str:
    return json.dumps({k: row[k] for k in CELL_FIELDS if k != "n_layers"}, sort_keys=True)


def _solved(unit: Unit, solved: dict[str, set[int]]) -> bool:
    """A5: whether a depth up to the unit's own has solved its cell."""
    return unit.family == "a5" and any(d <= unit.n_layers for d in solved.get(_depth_group(unit), ()))


class NotStarted(RuntimeError):
    """A unit's process not started because the block was stopping: not a failure of the unit."""


def _seed_cells(unit: Unit, seeds: list[int]) -> set[str]:
    """The keys of `unit`'s `seeds` (`Unit.key`) without the step count: where a unit saved under other --steps or
    --members meets the plan's."""
    cell = unit.cell()
    del cell["train"]["steps"]
    return {json.dumps({**cell, "seed": seed}, sort_keys=True) for seed in seeds}


def solved_depths(rows: list[dict]) -> dict[str, set[int]]:
    """A5 rows -> depth group -> depths at which some seed reached its stop threshold."""
    solved: dict[str, set[int]] = {}
    for row in rows:
        if row["stop"] is not None and row[row["stop"]["metric"]] >= row["stop"]["threshold"]:
            solved.setdefault(_row_depth_group(row), set()).add(row["n_layers"])
    return solved


class GridBlock:
    """One invocation's work: which units run, in which slot, until the deadline.

    Args:
        plan: the plan (after command-line knobs).
        results: the results folder.
        state: the folder of paused units' states (None: units cannot pause, so a deadline is refused).
        device: "cuda" or "cpu".
        gpus: GPUs to use (0 on the CPU).
        in_process: run units in this process (one slot only; a CUDA error then ends the block).
        time_budget_s: this block's wall-clock budget from now (None: no deadline).
        commit: recorded with every row.
        gpu_name: estimate for this GPU model (as rates.jsonl names it) instead of the device's own (`plan` only).
        finish_only: start only units (and packs) whose estimate ends before the deadline.
        checkpoint_every_s: running units also save their state this often, at an evaluation (None: only to pause).
        read_only: touch nothing, not even the saved states of units finished or solved meanwhile (`plan`).
    """

    def __init__(self, plan: RunPlan, results: Results, state: Path | None, device: str, gpus: int, in_process: bool,
                 time_budget_s: float | None, commit: str, gpu_name: str | None = None,
                 finish_only: bool = False, checkpoint_every_s: float | None = None,
                 read_only: bool = False) -> None:  # fmt: skip
        if time_budget_s is not None and state is None:
            raise ValueError("a block with a time budget needs --state (the folder its unfinished units pause into)")
        if checkpoint_every_s is not None and state is None:
            raise ValueError("a block with --checkpoint-every-s needs --state (the folder its checkpoints go to)")
        if checkpoint_every_s is not None and not checkpoint_every_s > 0:  # nan too: it saved at every evaluation
            raise ValueError(f"--checkpoint-every-s must be > 0, got {checkpoint_every_s}")
        if finish_only and time_budget_s is None:  # a block without a deadline pauses no unit anyway
            raise ValueError("--finish-only needs a deadline (--time-budget-s, or the plan's time_budget_s): without "
                             "one no unit pauses, so it changes nothing")  # fmt: skip
        self.checkpoint_every_s = checkpoint_every_s
        self.plan, self.results, self.state, self.device, self.gpus = plan, results, state, device, gpus
        self.slots = max(gpus, 1) * plan.procs_per_gpu
        if in_process and self.slots > 1:
            raise ValueError(f"--in-process runs one unit at a time, but {self.slots} slots were asked for")
        self.in_process = in_process
        self.device_name = gpu_name or (torch.cuda.get_device_name(0) if device == "cuda" else "cpu")
        self.deadline = None if time_budget_s is None else time.time() + time_budget_s
        self.finish_only = finish_only
        on_gpu = device == "cuda" or gpu_name is not None  # `plan --gpu-name`: estimate as that GPU would run
        self.execution = Execution(procs_per_gpu=plan.procs_per_gpu, commit=commit,
                                   compile_backend=plan.compile_backend if on_gpu else None,
                                   deterministic=plan.deterministic)  # fmt: skip
        self.units = plan_units(plan)
        self.running: list[Unit] = []
        self.failed: list[tuple[Unit, str]] = []
        self._busy: set[str] = set()  # keys of the (cell, seed)s running or failed in this block
        self._failed: set[str] = set()
        self.finished_rows = 0
        self._cond = threading.Condition()
        self._stopping = False  # Ctrl-C or SIGTERM: start nothing more
        self._children: set[subprocess.Popen] = set()  # the units' processes running now
        self._signalled: set[subprocess.Popen] = set()  # those sent their one SIGINT by `stop`
        if state is not None and state.is_dir():  # a damaged state is refused now, not met by its unit mid-block
            with locked(state, reading=True):  # and again at its end; read under the lock, as a save meanwhile
                check_states(state)  # (a block checkpointing beside `plan`) removes the .pt a .json named
        for unit in {u.arch: u for u in self.units if self.free_seeds(u)}.values():
            self.estimate(unit, steps=0)  # an arch with no rates here and no prior fails now (KeyError), not mid-block
        if not read_only:
            self._drop_stale_states()

    # -- choosing ---------------------------------------------------------------------------------------------------

    def free_seeds(self, unit: Unit) -> list[int]:
        """Seeds of `unit` with no row, not running and not failed in this block."""
        return [s for s in unit.seeds if not self.results.finished(unit, s) and unit.key(s) not in self._busy]

    def saved(self) -> dict[str, dict]:
        """state_name -> saved state (.json) of every unit paused in the state folder."""
        return {} if self.state is None else saved_states(self.state)

    def lost_pauses(self) -> list[tuple[Unit, int]]:
        """Units of the plan with a seed that progress.jsonl records as paused (and no row has finished) but that no
        state in the state folder holds, each with the last step recorded: they start again from step 0. Empty
        without a state folder, where no unit can have resumed anyway."""
        if self.state is None:
            return []
        held = set()
        for saved in self.saved().values():
            unit = Unit.from_dict(saved["unit"])
            held.update(unit.key(seed) for seed in unit.seeds)
        paused = {row_key(row): row["steps"] for row in self.results.progress}  # the step recorded last
        lost = []
        for unit in self.units:
            keys = [unit.key(s) for s in unit.seeds if not self.results.finished(unit, s)]
            steps = [paused[key] for key in keys if key in paused and key not in held]
            if steps:
                lost.append((unit, max(steps)))
        return lost

    def orphaned_states(self) -> list[str]:
        """One line per state in the state folder that no unit of the plan resumes though the plan runs some of its
        seeds on its cell but for the step count: saved under other --members or --steps (or before rows of some of
        its seeds came), it is ignored and those seeds start again from step 0. States of other cells (another
        stage's or family's) are not named."""
        planned = [(unit, self.free_seeds(unit)) for unit in self.units]
        resumed = {state_name(dataclasses.replace(unit, seeds=seeds)) for unit, seeds in planned}
        cells = [_seed_cells(unit, seeds) for unit, seeds in planned]
        lines = []
        for name, saved in self.saved().items():
            paused = Unit.from_dict(saved["unit"])
            sharing = [planned[i] for i, held in enumerate(cells) if held & _seed_cells(paused, paused.seeds)]
            if name in resumed or not sharing:
                continue
            differs = []
            steps = sorted({unit.train.steps for unit, _ in sharing} - {paused.train.steps})
            if steps:
                differs.append(f"{paused.train.steps} steps there, {', '.join(map(str, steps))} in the plan (--steps)")
            if [seeds for _, seeds in sharing] != [paused.seeds]:
                groups = " and ".join(str(seeds) for _, seeds in sharing)
                differs.append(f"seeds {paused.seeds} side by side there, {groups} in the plan (--members, or rows "
                               "of some seeds since)")  # fmt: skip
            lines.append(f"{self.state / name}.json ({saved['label']}, paused at step {saved['step']}) is resumed by "
                         f"no unit of this plan: {'; '.join(differs)}; its seeds start again from step 0")  # fmt: skip
        return lines

    def _drop_stale_states(self) -> None:
        """Remove the states of units whose seeds all have rows, or whose A5 cell was solved at a lower depth."""
        solved = solved_depths(self.results.rows.get("a5", []))
        for name, saved in self.saved().items():
            unit = Unit.from_dict(saved["unit"])
            if all(self.results.finished(unit, s) for s in unit.seeds) or _solved(unit, solved):
                remove_state(self.state, name)
                log.info("%s: finished or solved elsewhere; its saved state (step %d) is removed", saved["label"],
                         saved["step"])  # fmt: skip

    def states(self) -> list[tuple[Unit, str]]:
        """Every unit with its state: done, solved (A5, skipped), running, failed, waits, resumes (ready, with a
        saved state for its free seeds) or ready."""
        solved = solved_depths(self.results.rows.get("a5", []))
        saved = self.saved()
        unfinished: dict[str, set[int]] = {}
        out = []
        for unit in self.units:
            group = _depth_group(unit) if unit.family == "a5" else None
            left = [s for s in unit.seeds if not self.results.finished(unit, s)]
            if not left:
                state = "done"
            elif _solved(unit, solved):
                state = "solved"
            elif not self.free_seeds(unit):
                state = "failed" if any(unit.key(s) in self._failed for s in left) else "running"
            elif group is not None and any(d < unit.n_layers for d in unfinished.get(group, ())):
                state = "waits"
            elif state_name(dataclasses.replace(unit, seeds=self.free_seeds(unit))) in saved:
                state = "resumes"
            else:
                state = "ready"
            if group is not None and state not in ("done", "solved"):
                unfinished.setdefault(group, set()).add(unit.n_layers)
            out.append((unit, state))
        return out

    def steps_left(self, unit: Unit) -> int:
        """Steps the unit still has to run: all of them, or those after its saved state."""
        saved = self.saved().get(state_name(unit))
        return unit.train.steps - (saved["step"] if saved else 0)

    def estimate(self, unit: Unit, steps: int | None = None, pack: list[Unit] | None = None) -> tuple[float, str]:
        """Estimated seconds of `steps` steps of the unit (default: those it has left) plus its overhead; `pack`: the
        units it runs beside, itself included (their seeds side by side, their mean tokens per member)."""
        steps = self.steps_left(unit) if steps is None else steps
        pack = pack or [unit]
        shaped = dataclasses.replace(unit, seeds=list(range(sum(len(u.seeds) for u in pack))))
        return estimate_s(shaped, self.results.rates, self.device_name, self.plan.procs_per_gpu, self.plan.estimate,
                          steps, compile_backend=self.execution.compile_backend,
                          tokens_per_step=pack_tokens(pack))  # fmt: skip

    def needs_s(self, unit: Unit, pack: list[Unit] | None = None) -> float:
        """Seconds the unit (in `pack`) needs before the deadline's margin to start: its estimated overhead and
        MIN_TRAIN_S of training (a unit that cannot finish pauses at the deadline); with finish_only, all its steps."""
        if self.finish_only:
            return self.estimate(unit, pack=pack)[0]
        return self.estimate(unit, steps=0)[0] + MIN_TRAIN_S

    def fits(self, unit: Unit, pack: list[Unit] | None = None) -> bool:
        """Whether the unit (in `pack`) may start now: what it `needs_s` ends before the deadline less MARGIN_S."""
        return self.deadline is None or self.needs_s(unit, pack) <= self.deadline - MARGIN_S - time.time()

    def too_short(self) -> str | None:
        """Why the block starts nothing although units are ready: the time left is below what the cheapest of them
        needs (`fits`). None when one fits, none is ready, or there is no deadline."""
        if self.deadline is None:
            return None
        ready = [dataclasses.replace(unit, seeds=self.free_seeds(unit)) for unit, state in self.states()
                 if state in ("resumes", "ready")]  # fmt: skip
        if not ready or any(self.fits(unit) for unit in ready):
            return None
        need = min(self.needs_s(unit) for unit in ready)
        what = "its whole estimate (--finish-only)" if self.finish_only else f"overhead + {MIN_TRAIN_S:.0f} s training"
        return (f"the time budget leaves {self.deadline - time.time():.0f} s, below the {need + MARGIN_S:.0f} s that "
                f"the cheapest ready unit needs to start ({what}: {need:.0f} s, + a {MARGIN_S:.0f} s margin): the "
                "block starts nothing")  # fmt: skip

    def _claim(self) -> list[Unit] | None:
        """The next units to start with their free seeds, paused ones first: one unit, or a pack of up to
        `units_per_process` units of its pack_key in the same state (all fresh, or all paused at the same step);
        None when nothing can start any more."""
        with self._cond:
            while not self._stopping:
                states = self.states()
                for wanted in ("resumes", "ready"):
                    for unit, state in states:
                        part = dataclasses.replace(unit, seeds=self.free_seeds(unit))
                        if state == wanted and self.fits(part):
                            pack = [part, *self._pack_mates(part, state, states)]
                            while len(pack) > 1 and not self.fits(part, pack):  # a bigger pack steps slower
                                pack.pop()
                            self.running.extend(pack)
                            self._busy.update(u.key(s) for u in pack for s in u.seeds)
                            return pack
                if not self.running:
                    return None
                self._cond.wait()
            return None

    def _pack_mates(self, first: Unit, state: str, states: list[tuple[Unit, str]]) -> list[Unit]:
        """Units (with their free seeds) that can share `first`'s process."""
        if self.plan.units_per_process == 1:
            return []
        key, step = pack_key(first), self.steps_left(first)
        tokens, mib = len(first.seeds) * first.tokens_per_step(), state_mib(first)
        max_mib = math.inf if self.plan.max_state_mib is None else self.plan.max_state_mib
        mates = []
        for unit, other_state in states:
            part = dataclasses.replace(unit, seeds=self.free_seeds(unit))
            if other_state != state or part.cell() == first.cell() or pack_key(part) != key:
                continue
            more_tokens, more_mib = len(part.seeds) * part.tokens_per_step(), state_mib(part)
            if self.steps_left(part) == step and tokens + more_tokens <= PACK_MAX_TOKENS and mib + more_mib <= max_mib:
                mates.append(part)
                tokens, mib = tokens + more_tokens, mib + more_mib
            if len(mates) == self.plan.units_per_process - 1:
                break
        return mates

    # -- running ----------------------------------------------------------------------------------------------------

    def _execute(self, pack: list[Unit], slot: int) -> UnitOutcome:
        deadline = None if self.deadline is None else self.deadline - MARGIN_S
        if self.in_process:
            # each pack compiles afresh, as in its own process: torch.compile's caches would otherwise collect every
            # pack's recompilations of the same step function, and past its recompile limit it runs eager
            torch._dynamo.reset()
            return run_units(pack, torch.device(self.device), self.execution, deadline, self.state,
                             self.checkpoint_every_s)  # fmt: skip
        env = dict(os.environ)
        if self.device == "cpu" and self.slots > 1:  # the slots share the cores instead of each spinning on all
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // self.slots))
        if self.device == "cuda":
            visible = env.get("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(self.gpus)))).split(",")
            env["CUDA_VISIBLE_DEVICES"] = visible[slot // self.plan.procs_per_gpu]
        with tempfile.TemporaryDirectory() as tmp:
            unit_file, out_file = Path(tmp) / "unit.json", Path(tmp) / "outcome.json"
            unit_file.write_text(json.dumps([dataclasses.asdict(unit) for unit in pack]))
            execution = json.dumps(dataclasses.asdict(self.execution))
            command = [sys.executable, "-m", "klalm.tasks.units", "--unit", str(unit_file), "--out", str(out_file),
                       "--device", self.device, "--execution", execution]  # fmt: skip
            if deadline is not None:
                command += ["--deadline", repr(deadline)]
            if self.state is not None:
                command += ["--state", str(self.state)]
            if self.checkpoint_every_s is not None:
                command += ["--checkpoint-every-s", repr(self.checkpoint_every_s)]
            command += ["--runner-pid", str(os.getpid()), "--spawned-at", repr(time.time())]
            with self._cond:  # `stop` either finds the process among the children or it is never started
                if self._stopping:
                    raise NotStarted("the block was stopping (Ctrl-C or SIGTERM): its process was not started")
                # a session of its own: a terminal's Ctrl-C reaches the runner alone, which passes on one SIGINT
                process = subprocess.Popen(command, env=env, start_new_session=True)
                self._children.add(process)
            try:
                code = process.wait()
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM on the main thread (one slot): the process ends first
                self.stop()
                raise
            finally:
                with self._cond:
                    self._children.discard(process)
            if code != 0:
                raise RuntimeError(f"the unit's process exited with code {code}")
            outcome = UnitOutcome(**json.loads(out_file.read_text()))
            # the child's phases_s start with its process start and imports; add its exit after writing the outcome
            outcome.rate["phases_s"]["exit"] = round(max(0.0, time.time() - out_file.stat().st_mtime), 2)
            return outcome

    def _slot(self, slot: int, ended: threading.Event | None = None) -> None:
        try:
            self._slot_units(slot)
        finally:
            if ended is not None:
                ended.set()

    def _slot_units(self, slot: int) -> None:
        while (pack := self._claim()) is not None:
            unit, label = pack[0], " + ".join(u.label() for u in pack)
            seconds, source = self.estimate(unit, pack=pack)
            left, steps = self.steps_left(unit), unit.train.steps
            in_time = self.deadline is None or time.time() + seconds < self.deadline - MARGIN_S
            ends = "ends in this block" if in_time else "pauses at the deadline"
            verb = ("resume" if left < steps else "start") + ("s" if len(pack) == 1 else "")
            start = f"{verb} at step {steps - left}" if left < steps else verb
            log.info("slot %d: %s %s (%d steps left, est. %.0f s: %s): %s", slot, label, start, left, seconds,
                     source, ends)  # fmt: skip
            started = time.perf_counter()
            try:
                outcome = self._execute(pack, slot)
                wall_s = time.perf_counter() - started
                outcome.rate["wall_s"] = wall_s
                outcome.rate["overhead_s"] = wall_s - outcome.rate["train_s"]
                self.results.record(outcome)
                log.info("slot %d: %s: %s in %.0f s", slot, label, _summary(outcome), wall_s)
            except Exception as err:  # one broken unit must not end the block; main exits non-zero
                if self._stopping:  # its process was interrupted (Ctrl-C), or not started: not a failure of the unit
                    log.info("slot %d: %s %s", slot, label, "not started" if isinstance(err, NotStarted) else
                             "interrupted")  # fmt: skip
                else:
                    log.exception("slot %d: %s failed", slot, label)
                outcome, failure = None, f"{type(err).__name__}: {err}"
            with self._cond:
                keys = {u.key(s) for u in pack for s in u.seeds}
                for member in pack:
                    self.running.remove(member)
                    if outcome is None and not self._stopping:
                        self.failed.append((member, failure))
                if outcome is None:
                    self._failed |= keys
                else:
                    self._busy -= keys
                    self.finished_rows += len(outcome.rows)
                self._cond.notify_all()

    def run(self) -> None:
        """Run units until none can start; then log what is left."""
        log.info("%d units in the plan, %d slot(s) on %s (%s), deadline in %s", len(self.units), self.slots,
                 self.device, self.device_name,
                 "none" if self.deadline is None else f"{self.deadline - time.time():.0f} s")  # fmt: skip
        for unit, step in self.lost_pauses():
            log.warning("%s: progress.jsonl records it paused at step %d, but %s holds no state for it: it starts "
                        "again from step 0", unit.label(), step, self.state)  # fmt: skip
        for line in self.orphaned_states():
            log.warning(line)
        if self.deadline is not None and self.deadline <= time.time():
            log.info("no time left (a time budget <= 0 s less the time taken so far): the block starts nothing")
        elif (reason := self.too_short()) is not None:  # a stage given less than a unit needs: skipped, not failed
            log.info(reason)
        slots = range(self.slots if self.slots > 1 else 0)
        ended = [threading.Event() for _ in slots]  # set as each slot's thread returns (waited on after a Ctrl-C)
        threads = [threading.Thread(target=self._slot, args=(i, ended[i])) for i in slots]
        on_main = threading.current_thread() is threading.main_thread()
        default = on_main and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # not one ignored or handled above
        if default:
            signal.signal(signal.SIGTERM, self._terminated)
        try:
            if not threads:  # on the main thread: in-process units capture CUDA graphs and compile where scripts do
                self._slot(0)
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: start nothing more, end the units' processes, keep their rows
            self.stop()
            for thread, slot_ended in zip(threads, ended):
                if thread.ident is not None:  # started before the Ctrl-C. Not thread.join(): after a join the
                    slot_ended.wait()  # signal cut short, a slot's last log line came after the runner's (1 run in 8)
            self._record_paused()
            raise
        finally:
            if default:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        counts: dict[str, int] = {}
        for _, state in self.states():
            counts[state] = counts.get(state, 0) + 1
        log.info("block done: %d rows written; units by state: %s", self.finished_rows, counts)
        self._record_paused()

    def _terminated(self, signum: int, frame: object) -> None:
        """SIGTERM (`timeout`, a scheduler): handled as Ctrl-C, once; a later one while the block stops is ignored."""
        if not self._stopping:
            self._stopping = True  # at once: a second SIGTERM (timeout sends one to the group too) is then ignored
            raise Terminated

    def stop(self, wait_s: float = 30.0) -> None:
        """Start nothing more, pass one SIGINT to every unit's process running now (each quits with exit code 130,
        keeping what it wrote), and wait for all of them together, killing those not ended after `wait_s`. A second
        Ctrl-C while it waits kills them at once. Each process is signalled once, however often this is called."""
        with self._cond:
            self._stopping = True
            children = [child for child in self._children if child not in self._signalled]
            self._signalled.update(children)
            self._cond.notify_all()
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGINT)
        until = time.monotonic() + wait_s
        try:
            for child in children:
                try:
                    child.wait(timeout=max(0.0, until - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning("unit process %d has not ended %.0f s after SIGINT: killed", child.pid, wait_s)
                    child.kill()
                    child.wait()
        except KeyboardInterrupt:
            for child in children:
                if child.poll() is None:
                    child.kill()
                    child.wait()
            raise

    def _record_paused(self) -> None:
        """Log the states left in the state folder and record their evaluations in progress.jsonl."""
        if self.state is not None:
            size = sum(path.stat().st_size for path in self.state.glob("*") if path.is_file()) / 2**20
            log.info("saved states: %d unit(s), %.1f MiB in %s", len(self.saved()), size, self.state)
            recorded = self.results.record_progress(paused_rows(self.state, self.execution.commit))
            log.info("progress.jsonl: %d row(s) of paused seeds recorded", recorded)


def _summary(outcome: UnitOutcome) -> str:
    if not outcome.rows:
        return f"paused at step {outcome.rate['steps']} ({outcome.rate['step_s'] * 1e3:.2f} ms/step), state saved"
    packed = outcome.rate.get("units", 1) > 1  # name each row's cell and where it ended
    accs = " ".join(
        (f"{_cell_label(r)} ({r['steps']} steps, {r['ended']}):" if packed else "")
        + f"s{r['seed']}={r['token_acc']:.3f}/{r['seq_acc']:.3f}"
        for r in outcome.rows
    )
    ended = len({json.dumps(r["task"], sort_keys=True) + json.dumps(r["train"], sort_keys=True) for r in outcome.rows})
    paused = outcome.rate.get("units", 1) - ended
    others = f"; {paused} unit(s) of the pack paused there, state saved" if paused else ""
    return f"{outcome.rate['steps']} steps ({outcome.rate['ended']}), token/seq acc {accs}{others}"


def _cell_label(row: dict) -> str:
    task = ",".join(f"{k}={v}" for k, v in row["task"].items() if k not in ("name", "vocab"))
    return f"{task},lr={row['train']['lr']:g},wd={row['train']['weight_decay']:g}"


def plan_table(block: GridBlock) -> str:
    """Markdown: every unit with its state and estimated seconds, their unit-minutes per (family, state), and the
    pending units' (ready, resumes or waits) seconds summed over all of them: unit time, not the wall time of the
    block's slots running side by side."""
    lines = ["| unit | state | est. s | rate from |", "| --- | --- | ---: | --- |"]
    pending = 0.0
    by_family: dict[tuple[str, str], list[float]] = {}  # (family, state) -> estimated seconds of its units
    for unit, state in block.states():
        seconds, source = block.estimate(dataclasses.replace(unit, seeds=block.free_seeds(unit) or unit.seeds))
        if state in ("ready", "resumes", "waits"):
            pending += seconds
        by_family.setdefault((unit.family, state), []).append(seconds)
        lines.append(f"| {unit.label()} | {state} | {seconds:.0f} | {source} |")
    lines += ["", "| family | state | units | unit-minutes |", "| --- | --- | ---: | ---: |"]
    for (family, state), seconds in sorted(by_family.items()):
        lines.append(f"| {family} | {state} | {len(seconds)} | {sum(seconds) / 60:,.1f} |")
    lines.append("")
    lines.append(
        f"pending (ready, resumes or waits): {pending / 60:.1f} unit-minutes at these estimates, at most (A5 depths"
    )
    lines.append("that a shallower solve makes unnecessary are dropped as the grid goes)")
    for unit, step in block.lost_pauses():
        lines.append(f"{unit.label()}: paused at step {step} by progress.jsonl, but its state is not in {block.state}: "
                     "it starts again from step 0")  # fmt: skip
    lines += block.orphaned_states()
    if block.plan.units_per_process > 1:
        lines.append(f"each unit is estimated alone; packs of up to {block.plan.units_per_process} units run side by "
                     "side in one process and take less GPU time than the sum")  # fmt: skip
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- command line


def _resolve_device(plan: RunPlan) -> str:
    if plan.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if plan.device not in ("cuda", "cpu"):
        raise ValueError(f"device={plan.device!r}: valid are auto, cuda, cpu (pick GPUs with CUDA_VISIBLE_DEVICES)")
    if plan.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but torch sees no CUDA device here (to see a GPU's estimates on this "
                         "machine: `plan --gpu-name NAME`)")  # fmt: skip
    return plan.device


def _block(args: argparse.Namespace, plan: RunPlan) -> GridBlock:
    """The block of `run` or `plan`; raises KeyError, ValueError or OSError on input it cannot use. The results folder
    is not created here (`run` creates it once the block is set up; `plan` writes nothing)."""
    device = _resolve_device(plan)
    visible = torch.cuda.device_count() if device == "cuda" else 0
    if args.gpus is not None and args.gpus < 0:
        raise ValueError(f"--gpus must be >= 0, got {args.gpus}")
    if device == "cpu" and args.gpus:  # it had made that many CPU slots
        why = "torch sees no CUDA device" if plan.device == "auto" else "device='cpu'"
        raise ValueError(f"--gpus {args.gpus}: units run on the CPU here ({why}), where --procs-per-gpu alone sets "
                         "the slots")  # fmt: skip
    if device == "cuda" and args.gpus is not None and not 1 <= args.gpus <= visible:
        raise ValueError(f"--gpus {args.gpus}: give 1 to {visible} (the GPUs torch sees here)")
    gpus = args.gpus if args.gpus is not None else visible
    budget = None  # plan lists units and estimates: no deadline (its --time-budget-s is ignored), no state folder
    if args.verb == "run":
        budget = args.time_budget_s if args.time_budget_s is not None else plan.time_budget_s
    if budget is not None and math.isnan(budget):  # 0 or below: no time left (a late stage), nothing starts
        raise ValueError(f"--time-budget-s {budget} must be a number of seconds (inf: no deadline)")
    if budget == math.inf:
        budget = None
    results = Results(args.results, plan.families, create=False)
    return GridBlock(plan, results, args.state, device, gpus, getattr(args, "in_process", False), budget,
                     git_commit(), getattr(args, "gpu_name", None), getattr(args, "finish_only", False),
                     getattr(args, "checkpoint_every_s", None), read_only=args.verb == "plan")  # fmt: skip


def _check_report(args: argparse.Namespace, plan: RunPlan) -> None:
    """`report`: a results folder with rows of the plan's families (else every table would read 'not run', over
    what the document held) and a document with their markers, or an --out folder: before anything is written."""
    from klalm.markdown import fill_sections

    results = read_results(args.results, plan.families)
    rows = [row for family in plan.families for row in results.rows[family]]
    rows += [row for row in results.progress if row["family"] in plan.families]
    planned = {unit.key(seed) for unit in plan_units(plan) for seed in unit.seeds}
    if not any(row_key(row) in planned for row in rows):  # rows of another plan or other knobs show as 'not run' too
        files = ", ".join(f"{family}.jsonl" for family in plan.families)
        held, unplanned = "no row", ""
        if rows:
            held = f"{len(rows)} row(s)"
            unplanned = f" but none of a unit of plan {args.plan!r} with these knobs (give those they ran with)"
        refuse_input(f"results folder {args.results} holds {held} of {', '.join(plan.families)} ({files}, "
                     f"progress.jsonl){unplanned}: nothing to report, and the tables would all read "
                     "'not run'")  # fmt: skip
    if args.doc is None:
        check_folder(args.out, "--out folder", exists=False)
        return
    if not args.doc.is_file():
        refuse_input(f"--doc {args.doc} " + ("is a folder, not a file" if args.doc.is_dir() else "does not exist"))
    try:
        fill_sections(args.doc.read_text(encoding="utf-8"), dict.fromkeys(plan.families, ""), "synthetic")
    except ValueError as err:  # a marker is missing
        refuse_input(f"--doc {args.doc}: {err}")
    check_folder(args.doc.parent / "img", "--doc's plot folder", exists=False)


def run(args: argparse.Namespace) -> None:
    """`klalm-synthetic` (and scripts/run_synthetic.py) with its arguments parsed (`klalm.cli.synthetic_args`), for
    every verb but those of `klalm.tasks.folders.run` (merge, pack, positions, curves).

    Input it cannot use (flags, plan, folders, files) ends it with one line on stderr before anything is written;
    Ctrl-C ends a block with one line too (exit code 130; SIGTERM: 143), after the units that failed before it,
    keeping every row written and recording its checkpoints' progress.
    """
    from klalm.tasks.report import write_doc, write_folder

    if args.verb == "evaluate":
        from klalm.tasks.report import plot_positions, positions_markdown

        check_plot(args.plot)
        check_folder(args.state, "--state folder", exists=False)
        try:
            device = torch.device(args.device)
        except RuntimeError as err:  # "gpu"
            refuse_input(f"--device {args.device!r}: {one_line(err).split(' device type')[0]}")
        if device.type == "cuda" and not torch.cuda.is_available():
            refuse_input(f"--device {args.device!r}: torch sees no CUDA device here")
        try:
            rows = evaluate_saved(args.state, device) if args.state.is_dir() else []
        except (ValueError, OSError) as err:  # a damaged state, or one of another code; a file it cannot read
            refuse_input(one_line(err))
        if not rows:
            refuse_input(f"no paused unit in {args.state}")
        print(positions_markdown(rows))
        if args.plot is not None:  # a paused unit's rows: coloured in their own order
            plot_positions(rows, args.plot)
        return
    if args.verb == "progress":
        check_folder(args.state, "state folder", exists=True)
        check_folder(args.results, "--results folder", exists=False)  # created when missing: a folder to merge later
        check_results_folder(args.results)
        with contextlib.ExitStack() as held:
            try:  # the states read first: a damaged one leaves no --results folder behind
                rows = paused_rows(args.state, args.commit or git_commit())
                args.results.mkdir(parents=True, exist_ok=True)
                held.enter_context(one_writer(args.results))
                results = Results(args.results, [])
            except (ValueError, OSError) as err:  # a damaged state, a progress.jsonl not JSON lines, no folder made
                refuse_input(one_line(err))
            print(json.dumps({"progress.jsonl": results.record_progress(rows)}))
        return
    if getattr(args, "state", None) is not None:
        check_folder(args.state, "--state folder", exists=False)
    if args.verb in ("run", "plan"):  # a missing one is a new grid's: `run` makes it, `plan` lists every unit ready
        check_folder(args.results, "--results folder", exists=False)
        check_results_folder(args.results, args.state)
    held = contextlib.ExitStack()  # `run`: the --results folder's lock (`one_writer`), until the block ends
    try:
        plan = apply_args(load_plan(args.plan), args)
        if args.verb == "report":
            _check_report(args, plan)
            print(write_doc(plan, args.results, args.doc) if args.doc else write_folder(plan, args.results, args.out))
            return
        if args.verb == "run" and args.results.is_dir():  # before the block reads its rows or drops a state
            held.enter_context(one_writer(args.results))
        block = _block(args, plan)
        if args.verb == "plan":
            print(plan_table(block))
            return
        if not args.results.is_dir():  # a new folder: made once the block is set up
            args.results.mkdir(parents=True, exist_ok=True)
            held.enter_context(one_writer(args.results))
    except BrokenPipeError:  # the table's reader has gone (`plan ... | head`): not bad input; ended quietly above
        raise
    except (KeyError, ValueError, OSError) as err:  # a bad plan, knob, results folder or file, device
        held.close()
        refuse_input(one_line(err))
    with held:
        try:
            block.run()
        except KeyboardInterrupt as err:
            if block.failed:  # units that failed before the Ctrl-C, not those it interrupted
                print(_failures(block), file=sys.stderr)
            terminated = isinstance(err, Terminated)
            how, code = ("terminated (SIGTERM)", 128 + signal.SIGTERM) if terminated else ("interrupted", 130)
            print(f"{PREFIX}: {how}: {block.finished_rows} row(s) written in this block are kept in {args.results}; "
                  "the units that were running start again in the next block, from their last checkpoint in --state "
                  "(--checkpoint-every-s) or else from step 0", file=sys.stderr)  # fmt: skip
            sys.exit(code)
    if block.failed:
        sys.exit(_failures(block))


def _failures(block: GridBlock) -> str:
    lines = "\n".join(f"  {unit.label()}: {error}" for unit, error in block.failed)
    return f"[synthetic] {len(block.failed)} unit(s) failed:\n{lines}"
