"""A unit of synthetic work: one cell (task, arch, depth, width, recipe) trained with one or more seeds side by side,
and the function that runs it (in the runner's process, or in a child: `python -m klalm.tasks.units`).

Every seed of a unit gives one result row: the cell's fields, the seed, the held-out accuracies and how the run
went. A row's key (`row_key`) is its cell plus its seed, so a finished (task, arch, length, depth, seed) is found
again whatever unit it ran in.

A unit that reaches its deadline unfinished pauses: it saves its state into a state folder and returns no rows,
only its measured rate; run again with the same folder, it resumes exactly where it paused (see klalm.tasks.train)
and removes its state once it finishes. In the folder, unit X is `X.json` (the unit, the step reached, the time
spent: what the runner reads) and the .pt it names (`weights`: every member's `Member.state_dict`, the evaluations so
far, the time spent), X a digest of the unit's cell and seeds (`state_name`). A save writes the .pt under the other
of its two names (`X.pt`, `X.1.pt`), then the .json naming it, each to a temporary name and renamed, then removes
the last save's .pt, all under the folder's lock (`.lock`): a process killed between the two leaves the last pair
whole (its .pt was not overwritten), and a reader that takes the lock (`pack_states`, `paused_rows`,
`evaluate_saved`) finds the .pt its .json names; `swap_in_states` (`merge --state`) replaces the states under it
too, so a save meanwhile waits and lands beside the new states. With `checkpoint_every_s`, a unit also
saves that state at an evaluation while it trains (`Checkpoints`): a process killed before its deadline resumes
from the last one.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import math
import os
import pickle
import re
import signal
import sys
import threading
import time
import zipfile
import zlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from klalm.errors import one_line
from klalm.fileio import atomic_path, flocked, write_atomic
from klalm.ops.backends import recording
from klalm.tasks import make_task, materialize
from klalm.tasks.base import SyntheticTask
from klalm.tasks.readouts import wrap_readout
from klalm.tasks.streams import FreshStream, SplitStream
from klalm.tasks.train import (
    GroupResult,
    GroupTrainer,
    Member,
    StopRule,
    TrainSettings,
    deterministic_algorithms,
    evaluate,
    train_group,
)

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 60.0  # a running unit logs its progress at most this often (ProgressLog)
DATA_SEED = 0  # every arch and seed trains (split tasks) and is tested on the same fixed splits
MAIN_STREAM, AUX_STREAM = 0, 1  # stream ids of FreshStream under a seed


def kla_d_state(model_overrides: dict[str, Any]) -> int | None:
    """The KLA mixer's d_state set in an arch's build_model overrides (a unit's or a results row's), else None."""
    return model_overrides.get("mixer_options", {}).get("kla", {}).get("d_state")


@dataclasses.dataclass
class Unit:
    """One cell and the seeds trained together on it.

    Args:
        family: "a5", "mqar" or "mad" (which results file its rows go to).
        task: make_task's name and settings, e.g. {"name": "a5", "length": 12}.
        arch: build_model's arch.
        n_layers: blocks (the depth of the A5 figure).
        d_model: width.
        model_overrides: further build_model keyword arguments of this arch (e.g. the KLA block).
        train: optimisation settings.
        seeds: one member per seed (model init and data order).
        num_test: held-out examples (split "test" under DATA_SEED).
        num_train: size of the fixed training split (under DATA_SEED); None: fresh batches at every step (A5).
        aux_task: A5: make_task spec of the auxiliary batch (length 2), train.aux_batch_size sequences per step.
        eval_every: steps between held-out evaluations (None: at the end only).
        stop: stop early when a member's metric reaches a threshold: {"metric": ..., "threshold": ...}.
    """

    family: str
    task: dict[str, Any]
    arch: str
    n_layers: int
    d_model: int
    model_overrides: dict[str, Any]
    train: TrainSettings
    seeds: list[int]
    num_test: int
    num_train: int | None = None
    aux_task: dict[str, Any] | None = None
    eval_every: int | None = None
    stop: dict[str, Any] | None = None

    def cell(self) -> dict[str, Any]:
        """The unit without its seeds, as JSON values."""
        fields = json.loads(json.dumps(dataclasses.asdict(self)))
        del fields["seeds"]
        return fields

    def key(self, seed: int) -> str:
        return row_key({**self.cell(), "seed": seed})

    def tokens_per_step(self) -> int:
        """Tokens one member trains on per step (the main batch and the auxiliary one)."""
        main = min(self.train.batch_size, self.num_train or self.train.batch_size) * make_task(**self.task).seq_len
        aux = self.train.aux_batch_size * make_task(**self.aux_task).seq_len if self.aux_task else 0
        return main + aux

    def kla_d_state(self) -> int | None:
        """The KLA mixer's d_state where the unit sets it (`model_overrides`), else None (the layer's default)."""
        return kla_d_state(self.model_overrides)

    def label(self) -> str:
        settings = " ".join(f"{k}={v}" for k, v in self.task.items() if k != "name")
        seeds = ",".join(map(str, self.seeds))
        width = f"d={self.d_model}" + (f" S={self.kla_d_state()}" if self.kla_d_state() is not None else "")
        return f"{self.task['name']} {settings} {self.arch} depth={self.n_layers} {width} " \
               f"lr={self.train.lr:g} wd={self.train.weight_decay:g} seeds={seeds}"  # fmt: skip

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Unit:
        return cls(**{**values, "train": TrainSettings(**values["train"])})


CELL_FIELDS = tuple(f.name for f in dataclasses.fields(Unit) if f.name != "seeds")


def row_key(row: dict[str, Any]) -> str:
    """The identity of a result row: its cell's fields and its seed, as canonical JSON."""
    return json.dumps({name: row[name] for name in (*CELL_FIELDS, "seed")}, sort_keys=True)


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
    klalm.tasks.results.estimate_s reads."""
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


@dataclasses.dataclass
class UnitOutcome:
    """Rows of a finished unit (none when it paused at the deadline) and the rate it measured."""

    rows: list[dict[str, Any]]
    rate: dict[str, Any]


def state_name(unit: Unit) -> str:
    """The file stem of `unit`'s saved state: a digest of its cell and seeds."""
    return hashlib.sha256(json.dumps({**unit.cell(), "seeds": unit.seeds}, sort_keys=True).encode()).hexdigest()[:16]


STATE_KEYS = ("unit", "label", "step", "spent")  # what `_save_state` writes in a state's .json, with `weights`


def saved_states(folder: Path) -> dict[str, dict[str, Any]]:
    """state_name -> the .json of every unit paused in `folder` ({} when the folder does not exist).

    Raises:
        ValueError: naming the file, for a .json that is not JSON (cut short, damaged) or not a state's.
    """
    return {path.stem: _read_info(path) for path in sorted(folder.glob("*.json"))}


def _read_info(path: Path) -> dict[str, Any]:
    """A state's .json (`_save_state`); ValueError naming it when it is not one."""
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"state file {path} is not JSON: {one_line(err)}") from err
    if not isinstance(info, dict) or not set(STATE_KEYS) <= info.keys():
        raise ValueError(f"state file {path} is not a paused unit's state (a JSON object with {', '.join(STATE_KEYS)})")
    if info.get("weights", f"{path.stem}.pt") not in weights_names(path.stem):
        raise ValueError(f"state file {path} names weights {info['weights']!r}, not one of {weights_names(path.stem)}")
    return info


def weights_names(name: str) -> tuple[str, str]:
    """The two names the .pt of state `name` alternates between (`_save_state`)."""
    return f"{name}.pt", f"{name}.1.pt"


def weights_file(folder: Path, name: str, info: dict[str, Any]) -> Path:
    """The .pt of state `name` in `folder`: the one its .json (`info`) names; `X.pt` in states saved before the .json
    named it."""
    return folder / info.get("weights", f"{name}.pt")


def state_files(folder: Path) -> list[Path]:
    """Every state's .json in `folder` and the .pt each names: what `pack_states` packs (a .pt that no .json names, of
    a save cut short, stays out)."""
    states = saved_states(folder)
    weights = [weights_file(folder, name, info) for name, info in states.items()]
    return [folder / f"{name}.json" for name in states] + weights


def check_states(folder: Path) -> None:
    """Check, without loading any tensor, that every unit paused in `folder` has a readable .json (`saved_states`)
    and a whole .pt: a zip archive (torch.save's format), whose directory is at its end, so a copy cut short is not
    one, and whose members match their CRC-32s (torch.load does not check them: it loads damaged bytes as weights).

    Raises:
        ValueError: naming the first file that is not so.
    """
    for name, info in saved_states(folder).items():
        _check_weights(weights_file(folder, name, info))


def _check_weights(weights: Path) -> None:
    """Raises ValueError naming `weights` unless it is a whole zip archive whose members match their CRC-32s."""
    if not zipfile.is_zipfile(weights):  # also False for a missing file
        raise ValueError(f"state file {weights} " + ("is missing" if not weights.exists() else
                         "is not a whole torch.save archive (cut short or damaged)"))  # fmt: skip
    try:
        with zipfile.ZipFile(weights) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as err:
        raise ValueError(f"state file {weights} is damaged: {one_line(err)}") from err
    if damaged is not None:
        raise ValueError(f"state file {weights} is damaged: its member {damaged} fails its CRC-32 check")


def unpack_states(parts: list[Path], folder: Path) -> Path:
    """Unpack the state folder packed in `parts` beside `folder` (regular files only, no path outside it: tarfile's
    "data" filter) and check its states (`check_states`); returns that staging folder, for `swap_in_states`. `parts`:
    the pieces, in order, of what `pack_states` writes (a tar archive with its bytes sorted into planes and deflated),
    or of a plain tar archive (what calls before the thirty-sixth session sent back: `tar -cf - -C STATE . | split -b
    15M -d - state.tar.`).

    Raises:
        ValueError: naming the archive, when it is not a readable tar, holds a member the filter refuses, or holds a
            state `check_states` refuses (the staging folder is then removed).
    """
    import shutil
    import tarfile

    folder = Path(folder)
    staging = folder.with_name(folder.name + ".restoring")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    names = ", ".join(p.name for p in parts)
    try:
        with tarfile.open(fileobj=io.BytesIO(_unsqueezed(b"".join(p.read_bytes() for p in parts)))) as archive:
            archive.extractall(staging, filter="data")
        check_states(staging)
    except (tarfile.TarError, OSError, zlib.error) as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise ValueError(f"state archive {names} cannot be unpacked: {err}") from err
    except ValueError as err:  # from check_states: the file named as the archive holds it
        shutil.rmtree(staging, ignore_errors=True)
        damaged = str(err).replace(str(staging) + os.sep, "")
        raise ValueError(f"state archive {names} holds a damaged state: {damaged}") from err
    return staging


def swap_in_states(staging: Path, folder: Path) -> dict[str, Any]:
    """Replace what `folder` holds by what the staging folder `unpack_states` filled holds, and remove that; returns
    the units and MiB now paused in it. In place and under the folder's lock, which stays: a block saving into the
    folder meanwhile waits, then saves beside the new states (replacing the folder itself had removed the save under
    way, or the save had made the folder anew and the swap failed: "Directory not empty")."""
    import shutil

    with _locked(folder):
        for path in folder.iterdir():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.name != LOCK_FILE:
                path.unlink()
        for path in staging.iterdir():
            if path.name != LOCK_FILE:  # one a plain tar of a whole folder holds (`unpack_states`): not the one held
                os.replace(path, folder / path.name)
        shutil.rmtree(staging)
        mib = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) / 2**20
        return {"units": len(saved_states(folder)), "mib": round(mib, 1)}


STATE_PART = re.compile(r"state\.tar\.\d+")  # the name of one piece of a packed state folder
# A packed state is mostly fp32 tensors, whose low mantissa bytes are noise that no compressor shrinks; their sign and
# exponent bytes repeat. Sorting the archive's bytes into four planes (byte 0 of every 4-byte word, then byte 1, ...;
# tensor data starts 4-byte aligned in both torch's zip format and tar) lets deflate find those repeats: a
# d_model-256 MQAR unit's 58.6 MiB state packs to 49.4 MiB in a few seconds (plain: 54.3; results/cpu_2026-12-05b),
# small enough to carry to the GPU machine beside the 9.9 MB tree (a call carries 64 MiB). Level 6: 0.7 MiB less than
# level 1 for 2.6 s more; level 9 saves 0.1 MiB more in 4× the time.
SQUEEZED = b"klalm state: tar in 4 byte planes, deflated\n"


def _squeezed(data: bytes) -> bytes:
    planes = b"".join(data[offset::4] for offset in range(4))
    return SQUEEZED + len(data).to_bytes(8, "little") + zlib.compress(planes, 6)


def _unsqueezed(blob: bytes) -> bytes:
    """The tar archive in `blob`: unpacked from `_squeezed`'s form, or `blob` itself (a plain tar)."""
    if not blob.startswith(SQUEEZED):
        return blob
    size = int.from_bytes(blob[len(SQUEEZED) : len(SQUEEZED) + 8], "little")
    stream = zlib.decompressobj()
    planes = stream.decompress(blob[len(SQUEEZED) + 8 :])
    if not stream.eof or stream.unused_data or len(planes) != size:  # cut short, a stray piece after it, or damaged
        raise zlib.error(f"{len(planes)} bytes unpacked of {size}, {len(stream.unused_data)} left over")
    data, start = bytearray(size), 0
    for offset in range(4):
        count = len(range(offset, size, 4))
        data[offset::4] = planes[start : start + count]
        start += count
    return bytes(data)


def state_parts(folder: Path) -> list[Path]:
    """The pieces of a packed state folder in `folder`, in order (unfinished ones, `.state.tar.NN.tmp-*`, left out)."""
    return sorted(path for path in Path(folder).glob("state.tar.*") if STATE_PART.fullmatch(path.name))


def pack_states(folder: Path, out: Path, part_bytes: int = 15 * 2**20) -> list[Path]:
    """Pack the paused units' states in `folder` (`state_files`, under its lock) into `out` as the pieces
    `unpack_states` reads (a tar archive, its bytes in planes and deflated: `SQUEEZED`): `state.tar.00`,
    `state.tar.01`, ... of at most `part_bytes` each (a device call sends
    back files of up to 16 MiB). Each piece is written to a temporary name and renamed, and pieces left from a larger
    earlier pack are removed, so `out` holds one whole pack but for the moment between two renames. Returns the
    pieces."""
    import tarfile

    buffer = io.BytesIO()
    with _locked(Path(folder)), tarfile.open(fileobj=buffer, mode="w") as archive:
        check_states(Path(folder))  # before any piece is written: a damaged state is refused, not shipped
        for path in state_files(Path(folder)):
            archive.add(path, arcname=path.name)
    data = _squeezed(buffer.getvalue())
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    for index, start in enumerate(range(0, len(data), part_bytes)):
        part = out / f"state.tar.{index:02d}"
        write_atomic(part, data[start : start + part_bytes])
        parts.append(part)
    for stale in state_parts(out)[len(parts) :]:
        stale.unlink()
    return parts


def watch_states(folder: Path, out: Path, every_s: float) -> None:
    """Pack `folder` into `out` (`pack_states`) whenever its states change, looking every `every_s` seconds, until
    killed: beside a run on a machine that may be taken back before the run pauses, so the last checkpoint comes
    back with the call's files."""
    packed = None
    while True:
        try:
            with _locked(folder):
                seen = sorted((p.name, p.stat().st_mtime_ns) for p in folder.glob("*.json"))
            if seen != packed:  # a new checkpoint or pause, or a state removed (its unit finished)
                pack_states(folder, out)
                packed = seen
        except (OSError, ValueError) as err:  # a full disk, a damaged state: the run goes on, the next look tries again
            log.warning("could not pack %s into %s: %s", folder, out, err)
        time.sleep(every_s)


def remove_state(folder: Path, name: str) -> None:
    if not folder.is_dir():
        return
    with _locked(folder):
        for file in (f"{name}.json", *weights_names(name)):
            (folder / file).unlink(missing_ok=True)


LOCK_FILE = ".lock"  # in a state folder: the file `_locked` holds an flock on


def _locked(folder: Path) -> contextlib.AbstractContextManager[None]:
    """Hold the state folder's lock (an flock on `folder/.lock`, waited for): one process writes, reads, packs or
    replaces its states at a time. Where there is no flock (Windows) or it does not work (a file system without
    locks: warned once a folder), nothing is locked: run no `pack --every-s`, `progress` or `evaluate` beside a block
    there."""
    folder.mkdir(parents=True, exist_ok=True)

    def unsupported(err: OSError) -> None:
        if folder not in _UNLOCKED:
            _UNLOCKED.add(folder)
            log.warning("state folder %s: file locks unsupported here (%s); its readers and writers are not kept "
                        "apart", folder, err)  # fmt: skip

    return flocked(folder / LOCK_FILE, os.O_CREAT | os.O_WRONLY, wait=True, unsupported=unsupported)


_UNLOCKED: set[Path] = set()  # state folders warned about by `_locked`


def _save_state(folder: Path, unit: Unit, members: list[Member], evals: list[list[dict]], spent: dict) -> None:
    name, step = state_name(unit), int(members[0].step)
    state = {"members": [m.state_dict() for m in members], "evals": evals, "spent": spent}
    info = {"unit": dataclasses.asdict(unit), "label": unit.label(), "step": step, "spent": spent}
    with _locked(folder):
        try:  # the .pt of the last save, kept until the new pair is whole (module doc)
            last = weights_file(folder, name, _read_info(folder / f"{name}.json")).name
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
    info = _read_info(folder / f"{name}.json")
    if info["unit"] != json.loads(json.dumps(dataclasses.asdict(unit))):
        raise ValueError(f"{folder / name}.json holds another unit than {unit.label()}; remove it")
    weights = weights_file(folder, name, info)
    _check_weights(weights)  # torch.load would take damaged bytes as weights
    try:
        return torch.load(weights, map_location=device, weights_only=True)
    except (RuntimeError, OSError, EOFError, pickle.UnpicklingError) as err:  # cut short, damaged, missing
        reason = one_line(err).split(". ")[0]  # torch adds sentences of advice
        raise ValueError(f"state file {weights} cannot be loaded: {reason}") from err


def _load_states(folder: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The .json and the state (on the CPU) of every unit paused in `folder` ([] when the folder does not exist),
    read under the folder's lock: a save meanwhile (a block pausing or checkpointing into it) had removed the .pt a
    .json named between the two reads, and the state was refused as missing."""
    if not folder.is_dir():
        return []
    with _locked(folder):
        saved = saved_states(folder).values()
        return [(info, _load_state(folder, Unit.from_dict(info["unit"]), torch.device("cpu"))) for info in saved]


def paused_rows(folder: Path, commit: str) -> list[dict[str, Any]]:
    """One progress row per seed of every unit paused in `folder`: its cell and seed, the step it paused at, its
    evaluations so far (as a result row's `evals`), the last one's accuracies, and `commit` (the code that ran it).
    States are not committed and do not outlive the machine that holds them; these rows are what a lost one leaves
    behind (klalm.tasks.results, progress.jsonl)."""
    rows = []
    for saved, state in _load_states(folder):
        unit = Unit.from_dict(saved["unit"])
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
    for saved, state in _load_states(folder):
        unit = Unit.from_dict(saved["unit"])
        task = make_task(**unit.task)
        test = materialize(task, unit.num_test, DATA_SEED, "test")
        for seed, member_state, evals in zip(unit.seeds, state["members"], state["evals"], strict=True):
            member = build_member(unit, seed, device, None)
            member.module.load_state_dict(member_state["module"])
            rows.append({"unit": unit.label(), "arch": unit.arch, "task": unit.task, "n_layers": unit.n_layers,
                         "seed": seed, "steps": saved["step"],
                         "recorded_token_acc": evals[-1]["token_acc"] if evals else None,
                         **evaluate(member.module, *test, unit.train.eval_batch_size, device,
                                    task.scored_per_row)})  # fmt: skip
    return rows


EVAL_COLUMNS = {"token_acc": 2, "seq_acc": 3}  # where `compact_evals` puts each accuracy


def compact_evals(evals: list[dict[str, float]]) -> list[list[float]]:
    """A seed's evaluations as [step, loss, token accuracy, sequence accuracy] lists (result and progress rows)."""
    return [[e["step"], round(e["loss"], 5), e["token_acc"], e["seq_acc"]] for e in evals]


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
