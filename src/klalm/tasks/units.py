"""Running a unit of synthetic work (klalm.tasks.cells.Unit: one cell trained with one or more seeds side by side), in
the runner's process or in a child (`python -m klalm.tasks.units`), and saving and loading its paused state.

A unit that reaches its deadline unfinished pauses: it saves its state into a state folder and returns no rows,
only its measured rate; run again with the same folder, it resumes exactly where it paused (see klalm.tasks.train)
and removes its state once it finishes. The folder's files, how a save writes them and the lock its readers take:
klalm.tasks.states. With `checkpoint_every_s`, a unit also saves that state at an evaluation while it trains
(`Checkpoints`): a process killed before its deadline resumes from the last one.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import math
import os
import pickle
import signal
import sys
import textwrap
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from klalm.errors import one_line
from klalm.fileio import atomic_path, write_atomic
from klalm.ops.backends import recording
from klalm.tasks.base import SyntheticTask, materialize
from klalm.tasks.cells import Unit
from klalm.tasks.readouts import wrap_readout
from klalm.tasks.registry import make_task
from klalm.tasks.results import UnitOutcome, compact_evals
from klalm.tasks.states import check_weights, locked, read_info, remove_state, saved_states, weights_file, weights_names
from klalm.tasks.streams import FreshStream, SplitStream
from klalm.tasks.train import (
    GroupResult,
    GroupTrainer,
    Member,
    StopRule,
    deterministic_algorithms,
    evaluate,
    train_group,
)

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 60.0  # a running unit logs its progress at most this often (ProgressLog)
DATA_SEED = 0  # every arch and seed trains (split tasks) and is tested on the same fixed splits
MAIN_STREAM, AUX_STREAM = 0, 1  # stream ids of FreshStream under a seed


@dataclasses.dataclass
class Execution:
    """How a unit is run (recorded with its rows and rate, and matched by the time estimates)."""

    procs_per_gpu: int = 1  # units running at once on each GPU (one process each)
    commit: str = "unknown"
    compile_backend: str | None = None  # torch.compile backend of the training step on CUDA (None: eager)
    deterministic: bool = False  # deterministic kernels only (`train.deterministic_algorithms`; estimates ignore it)


def build_member(unit: Unit, seed: int, device: torch.device, split: tuple | None,
                 compile_backend: str | None = None) -> Member:  # fmt: skip
    """The model (initialised on the CPU under `seed`, so the same on every device) and its data streams.

    compile_backend: passed to `Member` (trains through torch.compile; the grid runner's `Execution`).
    """
    from klalm.models import build_model  # lazy: the model zoo is heavy to import

    task, settings = make_task(**unit.task), unit.train
    torch.manual_seed(seed)
    model = build_model(unit.arch, d_model=unit.d_model, n_layers=unit.n_layers, vocab_size=task.vocab_size,
                        **unit.model_overrides)  # fmt: skip
    if split is None:
        streams = [FreshStream(task, settings.batch_size, seed, MAIN_STREAM, settings.steps, device)]
    else:
        streams = [SplitStream(*split, settings.batch_size, seed, settings.steps, task.scored_per_row)]
    if unit.aux_task is not None and settings.aux_batch_size > 0:
        aux = make_task(**unit.aux_task)
        streams.append(FreshStream(aux, settings.aux_batch_size, seed, AUX_STREAM, settings.steps, device))
    return Member(wrap_readout(model, task, unit.d_model), streams, settings, device, seed, compile_backend)


def mixer_settings(module: torch.nn.Module) -> dict[str, Any]:
    """What ran, read from the built model: for KLA layers the block and state size."""
    from klalm.models.mixers.kla import KLAMixer

    kla = [m for m in module.modules() if isinstance(m, KLAMixer)]
    return {"kla": {"block": kla[0].block, "d_state": kla[0].d_state}} if kla else {}


def run_record(device: torch.device, captured: bool, members: int, execution: Execution,
               backends: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """How and where a unit ran (part of its rows and its rate); `backends`: which backend each op call ran
    ("<op> <device> <dtype>" -> name, from klalm.ops.backends.recording)."""
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "captured": captured,
        "members": members,
        "backends": backends or {},
        **dataclasses.asdict(execution),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
    }


def rate_record(unit: Unit, run: dict[str, Any], step_s: float, train_s: float, overhead_s: float,
                ended: str) -> dict[str, Any]:  # fmt: skip
    """One line of rates.jsonl (one per unit run, so one per block of a unit that pauses): what
    klalm.tasks.estimates.estimate_s reads."""
    return {
        **run,
        **{name: getattr(unit, name) for name in ("family", "arch", "n_layers", "d_model")},
        "kla_d_state": unit.kla_d_state(),  # None: the layer's default (as in rows from before it was recorded)
        "tokens_per_step": unit.tokens_per_step(),
        "step_s": step_s,
        "train_s": train_s,
        "overhead_s": overhead_s,  # the runner replaces it with its own measure (process start included)
        "ended": ended,
    }


def state_name(unit: Unit) -> str:
    """The file stem of `unit`'s saved state: a digest of its cell and seeds."""
    return hashlib.sha256(json.dumps({**unit.cell(), "seeds": unit.seeds}, sort_keys=True).encode()).hexdigest()[:16]


def _save_state(folder: Path, unit: Unit, members: list[Member], evals: list[list[dict]], spent: dict) -> None:
    name, step = state_name(unit), int(members[0].step)
    state = {"members": [m.state_dict() for m in members], "evals": evals, "spent": spent}
    info = {"unit": dataclasses.asdict(unit), "label": unit.label(), "step": step, "spent": spent}
    with locked(folder):
        try:  # the .pt of the last save, kept until the new pair is whole (module doc)
            last = weights_file(folder, name, read_info(folder / f"{name}.json")).name
        except (OSError, ValueError):  # none yet (or a damaged .json, replaced here)
            last = None
        first, second = weights_names(name)
        weights, other = (second, first) if last == first else (first, second)
        with atomic_path(folder / weights) as temporary:
            torch.save(state, temporary)
        write_atomic(folder / f"{name}.json", json.dumps({**info, "weights": weights}))
        (folder / other).unlink(missing_ok=True)


def _load_state(folder: Path, unit: Unit, device: torch.device) -> dict[str, Any] | None:
    """The state of `unit` saved in `folder` (None when there is none); raises ValueError naming a file that is not
    this unit's or cannot be read."""
    name = state_name(unit)
    if not (folder / f"{name}.json").is_file():
        return None
    info = read_info(folder / f"{name}.json")
    if info["unit"] != json.loads(json.dumps(dataclasses.asdict(unit))):
        raise ValueError(f"{folder / name}.json holds another unit than {unit.label()}; remove it")
    weights = weights_file(folder, name, info)
    check_weights(weights)  # torch.load would take damaged bytes as weights
    try:
        state = torch.load(weights, map_location=device, weights_only=True)
    except (RuntimeError, OSError, EOFError, pickle.UnpicklingError) as err:  # cut short, damaged, missing
        reason = one_line(err).split(". ")[0]  # torch adds sentences of advice
        raise ValueError(f"state file {weights} cannot be loaded: {reason}") from err
    seeds = len(unit.seeds)  # another .pt in its place (torch.save of something else) held no members or evals
    if not (isinstance(state, dict) and {"members", "evals", "spent"} <= state.keys()
            and all(isinstance(state[k], list) and len(state[k]) == seeds for k in ("members", "evals"))):  # fmt: skip
        raise ValueError(f"state file {weights} is not a paused unit's state (members and evals of its {seeds} "
                         "seed(s), spent)")  # fmt: skip
    return state


def _saved_unit(path: Path, info: dict[str, Any]) -> Unit:
    """The unit of the state whose .json (`info`) is `path`; ValueError naming it where this code's Unit is not the
    one that saved it (a field added or removed since): its fields make no Unit, or one named otherwise."""
    try:
        unit = Unit.from_dict(info["unit"])
    except (TypeError, KeyError) as err:  # a field this code's Unit lacks or does not know
        raise ValueError(f"state file {path} holds no unit this code knows (saved by other code?): "
                         f"{one_line(err)}") from err  # fmt: skip
    if state_name(unit) != path.stem:  # a field with a default added since: the same fields name another state
        raise ValueError(f"state file {path} holds a unit that this code saves as {state_name(unit)}.json (saved by "
                         "other code?)")  # fmt: skip
    return unit


def _load_states(folder: Path) -> list[tuple[Unit, dict[str, Any], dict[str, Any]]]:
    """The unit, the .json and the state (on the CPU) of every unit paused in `folder` ([] when the folder does not
    exist), read under the folder's lock: a save meanwhile (a block pausing or checkpointing into it) had removed the
    .pt a .json named between the two reads, and the state was refused as missing. ValueError names a file that is
    not a state this code can read."""
    if not folder.is_dir():
        return []
    with locked(folder, reading=True):
        units = [(_saved_unit(folder / f"{name}.json", info), info) for name, info in saved_states(folder).items()]
        return [(unit, info, _load_state(folder, unit, torch.device("cpu"))) for unit, info in units]


def paused_rows(folder: Path, commit: str) -> list[dict[str, Any]]:
    """One progress row per seed of every unit paused in `folder`: its cell and seed, the step it paused at, its
    evaluations so far (as a result row's `evals`), the last one's accuracies, and `commit` (the code that ran it).
    States are not committed and do not outlive the machine that holds them; these rows are what a lost one leaves
    behind (klalm.tasks.results, progress.jsonl)."""
    rows = []
    for unit, saved, state in _load_states(folder):
        for seed, seed_evals in zip(unit.seeds, state["evals"], strict=True):
            last = seed_evals[-1] if seed_evals else {}
            rows.append({**unit.cell(), "seed": seed, "steps": saved["step"], "planned_steps": unit.train.steps,
                         "ended": "paused", "token_acc": last.get("token_acc"), "seq_acc": last.get("seq_acc"),
                         "position_acc": last.get("position_acc"),
                         "evals": compact_evals(seed_evals), "spent": saved["spent"], "commit": commit})  # fmt: skip
    return rows


def evaluate_saved(folder: Path, device: torch.device) -> list[dict[str, Any]]:
    """Every seed of every unit paused in `folder`, its weights loaded from the state and evaluated on the unit's
    held-out split (`train.evaluate`, so with per-position accuracy): one row per seed with the unit's label, arch,
    task, depth, seed, step, and the accuracy its last evaluation in training recorded (`recorded_token_acc`)."""
    rows = []
    for unit, saved, state in _load_states(folder):
        task = make_task(**unit.task)
        test = materialize(task, unit.num_test, DATA_SEED, "test")
        weights = weights_file(folder, state_name(unit), saved)
        for seed, member_state, evals in zip(unit.seeds, state["members"], state["evals"], strict=True):
            if not (isinstance(member_state, dict) and isinstance(member_state.get("module"), dict)):
                raise ValueError(f"state file {weights} holds a member without its model's weights (a \"module\" "
                                 "state dict; saved by other code?)")  # fmt: skip
            member = build_member(unit, seed, device, None)
            try:
                member.module.load_state_dict(member_state["module"])
            except RuntimeError as err:  # missing or unexpected weights, other shapes: another model's
                raise ValueError(f"state file {weights} holds weights that do not fit its unit's model (saved by "
                                 f"other code?): {textwrap.shorten(str(err), 160)}") from err  # fmt: skip
            rows.append({"unit": unit.label(), "arch": unit.arch, "task": unit.task, "n_layers": unit.n_layers,
                         "seed": seed, "steps": saved["step"],
                         "recorded_token_acc": evals[-1]["token_acc"] if evals else None,
                         **evaluate(member.module, *test, unit.train.eval_batch_size, device,
                                    task.scored_per_row)})  # fmt: skip
    return rows


def state_mib(unit: Unit) -> float:
    """MiB of the unit's paused state: per seed the fp32 weights and both AdamW moments, and its loss log (the model
    is built on the meta device to count its parameters)."""
    from klalm.models import build_model  # lazy: the model zoo is heavy to import

    task = make_task(**unit.task)
    with torch.device("meta"):
        model = build_model(unit.arch, d_model=unit.d_model, n_layers=unit.n_layers, vocab_size=task.vocab_size,
                            **unit.model_overrides)  # fmt: skip
        params = sum(p.numel() for p in wrap_readout(model, task, unit.d_model).parameters())
    return len(unit.seeds) * (3 * 4 * params + 4 * unit.train.steps) / 2**20


def pack_key(unit: Unit) -> str:
    """Units with the same key may train side by side in one process (a pack): the same family, arch, depth, width,
    model, step count, evaluation and stop rule; the task (A5's length, MQAR's cell), learning rate and weight decay
    may differ."""
    cell = unit.cell()
    del cell["task"], cell["num_test"], cell["num_train"]
    cell["train"] = {k: v for k, v in cell["train"].items() if k not in ("lr", "min_lr", "weight_decay")}
    return json.dumps(cell, sort_keys=True)


def pack_tokens(units: list[Unit]) -> int:
    """Tokens per step of one member of a pack, averaged over its members (A5 packs mix lengths): what its rate line
    records and its estimate reads."""
    return round(sum(len(u.seeds) * u.tokens_per_step() for u in units) / sum(len(u.seeds) for u in units))


def run_unit(unit: Unit, device: torch.device, execution: Execution, deadline: float | None = None,
             state: Path | None = None, checkpoint_every_s: float | None = None) -> UnitOutcome:  # fmt: skip
    """Build, train and evaluate every seed of `unit` side by side (see klalm.tasks.train.train_group); resume it
    from its saved state in the folder `state` if there is one, pause into that folder at `deadline`, and save its
    state there at an evaluation at most every `checkpoint_every_s` seconds (`Checkpoints`; None: only to pause)."""
    return run_units([unit], device, execution, deadline, state, checkpoint_every_s)


def run_units(units: list[Unit], device: torch.device, execution: Execution, deadline: float | None = None,
              state: Path | None = None, checkpoint_every_s: float | None = None) -> UnitOutcome:  # fmt: skip
    """`run_unit` for a pack: units of one `pack_key`, all their seeds side by side in one group (one CUDA graph),
    each unit with its own data, all fresh or all paused at the same step. When the seeds of one unit reach its stop
    rule, that unit ends there and the others train on in the same process (`train.train_group`). The outcome holds
    the rows of every unit that ended and one rate for the pack (`members`: seeds of all its units; `units`: how
    many; `step_s`: with all of them training)."""
    if deadline is not None and state is None:
        raise ValueError("a unit with a deadline needs a state folder to pause into")
    if checkpoint_every_s is not None and state is None:
        raise ValueError("a unit with checkpoints needs a state folder to save them into")
    if len({pack_key(u) for u in units}) != 1:
        raise ValueError(f"these units cannot share a process: {[u.label() for u in units]}")
    with deterministic_algorithms(execution.deterministic):
        return _train_pack(units, device, execution, deadline, state, checkpoint_every_s)


def _train_pack(units: list[Unit], device: torch.device, execution: Execution, deadline: float | None,
                state: Path | None, checkpoint_every_s: float | None) -> UnitOutcome:  # fmt: skip
    """`run_units`' work, its arguments checked."""
    started = time.perf_counter()
    if device.type != "cuda":  # compiling pays for the launch-bound captured step only (docs/synthetic.md)
        execution = dataclasses.replace(execution, compile_backend=None)
    tests, groups, splits = [], [], {}
    for unit in units:
        task = make_task(**unit.task)
        tests.append(_split(splits, task, unit.num_test, "test", device))
        split = None if unit.num_train is None else _split(splits, task, unit.num_train, "train", device)
        groups.append([build_member(unit, seed, device, split, execution.compile_backend) for seed in unit.seeds])
    built = time.perf_counter()
    saved = [None if state is None else _load_state(state, unit, device) for unit in units]
    if len({None if s is None else int(s["members"][0]["step"]) for s in saved}) > 1:
        raise ValueError(f"the units of a pack must all start at the same step: {[u.label() for u in units]}")
    spent = [{"train_s": 0.0, "wall_s": 0.0, "blocks": 0} if s is None else s["spent"] for s in saved]
    for members, unit_state in zip(groups, saved, strict=True):
        if unit_state is not None:
            for member, member_state in zip(members, unit_state["members"], strict=True):
                member.load_state_dict(member_state)
    loaded = time.perf_counter()
    members = [member for group in groups for member in group]
    cells = [i for i, group in enumerate(groups) for _ in group]
    trainer = GroupTrainer(members, device)
    stop = None if units[0].stop is None else StopRule(**units[0].stop)
    evals = None if saved[0] is None else [log for unit_state in saved for log in unit_state["evals"]]
    checkpoint = None
    if checkpoint_every_s is not None:
        checkpoint = Checkpoints(state, units, groups, spent, checkpoint_every_s, started)
    with recording() as used:
        result = train_group(trainer, tests, eval_every=units[0].eval_every, stop=stop, deadline=deadline,
                             evals=evals, cells=cells, progress=ProgressLog(units), checkpoint=checkpoint)  # fmt: skip
    wall_s = time.perf_counter() - started
    common = run_record(device, trainer.graph is not None, len(members), execution, dict(sorted(used.items())))
    rate = rate_record(units[0], common, result.step_s, result.train_s, wall_s - result.train_s, result.ended)
    rate["steps"] = result.steps  # the step count of the units that trained longest in this run
    rate["eval_s"] = round(result.eval_s, 2)  # of train_s: the held-out evaluations
    rate["units"] = len(units)
    rate["tokens_per_step"] = pack_tokens(units)
    rows, first = [], 0
    for index, (unit, group, unit_spent) in enumerate(zip(units, groups, spent, strict=True)):
        part = slice(first, first + len(group))
        first = part.stop
        unit_spent = {"train_s": unit_spent["train_s"] + result.train_s, "wall_s": unit_spent["wall_s"] + wall_s,
                      "blocks": unit_spent["blocks"] + 1}  # fmt: skip
        solved_at = result.solved.get(index)
        unit_result = dataclasses.replace(
            result, evals=result.evals[part], final_loss=result.final_loss[part],
            steps=result.steps if solved_at is None else solved_at,
            ended=result.ended if solved_at is None else "threshold",
        )  # fmt: skip
        if unit_result.ended == "paused":
            _save_state(state, unit, group, unit_result.evals, unit_spent)
            continue
        if state is not None:  # the state it resumed from, or a checkpoint of this run
            remove_state(state, state_name(unit))
        params = sum(p.numel() for p in group[0].module.parameters())
        rows += [_row(unit, member, unit_result, i, params, common, unit_spent) for i, member in enumerate(group)]
    # where the time outside the training loop went in this process (the runner's overhead_s adds the process's
    # start and imports): the splits and models, the paused states, the warm-up and capture (compilation
    # included), the rows and the states saved
    phases = (built - started, loaded - built, result.setup_s, time.perf_counter() - started - wall_s)
    rate["phases_s"] = dict(zip(("build", "load", "setup", "finish"), (round(x, 2) for x in phases), strict=True))
    return UnitOutcome(rows, rate)


class Checkpoints:
    """`train_group`'s checkpoint callback for a pack: at an evaluation, once `every_s` seconds have passed since
    the last save (or the start), every unit whose seeds all still train saves into `folder` what a pause would
    save there (its `spent` counting this run so far as a block). A process killed before its deadline (a lease or
    job ended early) then resumes from the last save, losing at most `every_s` seconds and one evaluation's stretch
    of steps; the saves cost a torch.save each (counted in the run's step time)."""

    def __init__(self, folder: Path, units: list[Unit], groups: list[list[Member]], spent: list[dict],
                 every_s: float, started: float) -> None:  # fmt: skip
        self.folder, self.units, self.groups, self.spent = folder, units, groups, spent
        self.every_s, self.started, self.last = every_s, started, time.perf_counter()

    def __call__(self, step: int, evals: list[list[dict]], active: list[int], train_s: float) -> None:
        now = time.perf_counter()
        if now - self.last < self.every_s:
            return
        first, saved = 0, 0
        for unit, group, spent in zip(self.units, self.groups, self.spent, strict=True):
            members = range(first, first + len(group))
            first = members.stop
            if all(i in active for i in members):
                so_far = {"train_s": spent["train_s"] + train_s, "wall_s": spent["wall_s"] + now - self.started,
                          "blocks": spent["blocks"] + 1}  # fmt: skip
                _save_state(self.folder, unit, group, evals[members.start : members.stop], so_far)
                saved += 1
        self.last = time.perf_counter()
        if saved:
            log.info("checkpoint at step %d: %d unit(s) saved in %.1f s", step, saved, self.last - now)


class ProgressLog:
    """`train_group`'s progress callback for a pack: one log line at most every PROGRESS_EVERY_S seconds (the first
    after the first evaluation), with the step, the time a step takes and what is left to the step cap at that
    rate, and each unit's best held-out token accuracy so far, so a long block shows where it is."""

    def __init__(self, units: list[Unit]) -> None:
        self.units, self.last = units, -math.inf

    def __call__(self, step: int, total: int, step_s: float, best: dict[int, float]) -> None:
        now = time.monotonic()
        if now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        left = (total - step) * step_s
        accs = ", ".join(f"{self.units[cell].label()}: {acc:.1%}" for cell, acc in sorted(best.items()))
        log.info("step %d/%d (%.1f ms a step, %s to the step cap): token acc %s", step, total, step_s * 1e3,
                 _duration(left), accs)  # fmt: skip


def _duration(seconds: float) -> str:
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _split(splits: dict, task: SyntheticTask, num_examples: int, name: str, device: torch.device) -> tuple:
    """`materialize(task, num_examples, DATA_SEED, name)` on `device`, drawn once per pack: the units of an MQAR
    pack share their cell and differ only in learning rate, and drawing 100,000 MQAR examples takes seconds of CPU
    (12.5 s for the (64, 4) cell on a 2-core machine). `splits` holds what this pack drew; the members only read it."""
    key = (task, num_examples, name)
    if key not in splits:
        splits[key] = tuple(t.to(device) for t in materialize(task, num_examples, DATA_SEED, name))
    return splits[key]


def _row(unit: Unit, member: Member, result: GroupResult, index: int, params: int, common: dict, spent: dict):
    """One result row; its timing sums every block the unit ran in (`blocks` of them)."""
    evals = result.evals[index]
    timing = {"setup_s": result.setup_s, "step_s": result.step_s, **spent}
    return {
        **unit.cell(),
        "seed": member.seed,
        "steps": result.steps,
        "planned_steps": unit.train.steps,
        "ended": result.ended,
        "token_acc": evals[-1]["token_acc"],
        "seq_acc": evals[-1]["seq_acc"],
        "position_acc": evals[-1].get("position_acc"),  # absent from evaluations restored from an older state
        "final_loss": result.final_loss[index],
        "evals": compact_evals(evals),
        "params": params,
        "mixers": mixer_settings(member.module),
        "run": {**common, **timing},
    }


def exit_with_runner(runner_pid: int, every_s: float = 1.0) -> threading.Thread:
    """End this process (within `every_s`) once its parent is no longer the process `runner_pid`: the runner starts
    each unit's process in a session of its own, so a signal that kills the runner outright (SIGKILL: `timeout -k`, a
    machine's limit) does not reach the unit, and the runner, dead, cannot pass one on. A watching thread, not
    prctl(PR_SET_PDEATHSIG): no preexec_fn in a runner with threads, not Linux-only, and not tied to the runner's
    thread that started the process. Its parent gone, this process is reparented, so getppid() changes for good."""

    def watch() -> None:
        while os.getppid() == runner_pid:
            time.sleep(every_s)
        log.warning("the runner (pid %d) is gone: this unit's process ends", runner_pid)  # stderr: flushed
        os._exit(1)  # from a thread: sys.exit would end the thread only

    thread = threading.Thread(target=watch, name="runner-watch", daemon=True)
    thread.start()
    return thread


def main(argv: list[str] | None = None) -> None:
    """Child-process entry: run one unit (JSON file) and write its outcome (JSON file)."""
    p = argparse.ArgumentParser(description="Run one unit of synthetic work (used by the grid runner).")
    p.add_argument("--unit", type=Path, required=True, help="JSON: the Unit, or a list of units of one pack_key")
    p.add_argument("--out", type=Path, required=True, help="JSON written: {'rows': [...], 'rate': {...}}")
    p.add_argument("--device", default="cuda", help="torch device (the runner sets CUDA_VISIBLE_DEVICES)")
    p.add_argument("--deadline", type=float, help="time.time() at which the unit pauses (needs --state)")
    p.add_argument("--state", type=Path, help="folder of paused units: resume from it, pause into it")
    p.add_argument("--checkpoint-every-s", type=float, help="also save the state this often while training")
    p.add_argument("--execution", default="{}", help="JSON of Execution's fields")
    p.add_argument("--spawned-at", type=float, help="time.time() when the runner started this process")
    p.add_argument("--runner-pid", type=int, help="the runner's pid: end this process once the runner is gone")
    args = p.parse_args(argv)
    entered = time.time()
    logging.basicConfig(level=logging.INFO, format="[unit %(asctime)s] %(message)s", datefmt="%H:%M:%S")
    if args.runner_pid is not None:
        exit_with_runner(args.runner_pid)
        # the runner passes on its Ctrl-C as one SIGINT: heard even when the runner was started with SIGINT ignored
        # (`cmd &` in a script), which its processes inherit
        signal.signal(signal.SIGINT, signal.default_int_handler)
    values = json.loads(args.unit.read_text())
    units = [Unit.from_dict(v) for v in (values if isinstance(values, list) else [values])]
    execution = Execution(**json.loads(args.execution))
    try:
        outcome = run_units(units, torch.device(args.device), execution, args.deadline, args.state,
                            args.checkpoint_every_s)  # fmt: skip
    except KeyboardInterrupt:  # Ctrl-C: the runner says what is kept; no traceback of where training was
        log.info("interrupted: %s", " + ".join(unit.label() for unit in units))
        raise SystemExit(130) from None
    if args.spawned_at is not None:  # the process's start and imports, before run_units' own phases
        outcome.rate["phases_s"] = {"start": round(max(0.0, entered - args.spawned_at), 2), **outcome.rate["phases_s"]}
    args.out.write_text(json.dumps(dataclasses.asdict(outcome)))


if __name__ == "__main__":
    sys.exit(main())
