"""The state folder of paused units, as files: what `klalm-synthetic pack` packs into pieces and `merge --state`
unpacks, checks and swaps in, without torch (klalm.tasks.units saves and loads the states themselves).

In a state folder, unit X is `X.json` (the unit, the step reached, the time spent: what the runner reads) and the
.pt it names (`weights`: every member's `Member.state_dict`, the evaluations so far, the time spent), X a digest of
the unit's cell and seeds (`units.state_name`). A save writes the .pt under the other of its two names (`X.pt`,
`X.1.pt`), then the .json naming it, each to a temporary name and renamed, then removes the last save's .pt, all
under the folder's lock (`locked`: `.lock`): a process killed between the two leaves the last pair whole (its .pt
was not overwritten), and a reader that takes the lock (`pack_states`, `units.paused_rows`, `units.evaluate_saved`,
a block's `check_states` in klalm.tasks.runner) finds the .pt its .json names; `swap_in_states` (`merge --state`)
replaces the states under it too, so a save meanwhile waits and lands beside the new states.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shutil
import tarfile
import time
import zipfile
import zlib
from pathlib import Path
from typing import Any

from klalm.errors import one_line
from klalm.fileio import flocked, write_atomic

log = logging.getLogger(__name__)


STATE_KEYS = ("unit", "label", "step", "spent")  # what `units._save_state` writes in a state's .json, with `weights`


def saved_states(folder: Path) -> dict[str, dict[str, Any]]:
    """units.state_name -> the .json of every unit paused in `folder` ({} when the folder does not exist).

    Raises:
        ValueError: naming the file, for a .json that is not JSON (cut short, damaged) or not a state's.
    """
    return {path.stem: read_info(path) for path in sorted(folder.glob("*.json"))}


def read_info(path: Path) -> dict[str, Any]:
    """A state's .json (`units._save_state`); ValueError naming it when it is not one."""
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
    """The two names the .pt of state `name` alternates between (`units._save_state`)."""
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
    The caller holds the folder's lock (`locked`) where a save may come meanwhile.

    Raises:
        ValueError: naming the first file that is not so.
    """
    for name, info in saved_states(folder).items():
        check_weights(weights_file(folder, name, info))


def check_weights(weights: Path) -> None:
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
    folder = Path(folder)
    staging = folder.with_name(folder.name + ".restoring")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(_unsqueezed(b"".join(p.read_bytes() for p in parts)))) as archive:
            archive.extractall(staging, filter="data")
        check_states(staging)
    except (tarfile.TarError, OSError, zlib.error) as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise ValueError(f"state archive {_archive_name(parts)} cannot be unpacked: {err}") from err
    except ValueError as err:  # from check_states
        shutil.rmtree(staging, ignore_errors=True)
        raise ValueError(staged_problem(parts, staging, "a damaged state", err)) from err
    return staging


def staged_problem(parts: list[Path], staging: Path, what: str, err: Exception) -> str:
    """The refusal of a state in the staging folder `unpack_states` unpacked `parts` into (`what`: "a damaged
    state"), `err` naming its file: the file named as the archive's member (the staging folder is removed)."""
    member = one_line(err).replace(str(staging) + os.sep, "")
    return f"state archive {_archive_name(parts)} holds {what}: {member}"


def _archive_name(parts: list[Path]) -> str:
    """How a refusal names the archive of state parts: their file names."""
    return ", ".join(p.name for p in parts)


def swap_in_states(staging: Path, folder: Path) -> dict[str, Any]:
    """Replace what `folder` holds by what the staging folder `unpack_states` filled holds, and remove that; returns
    the units and MiB now paused in it. In place and under the folder's lock, which stays: a block saving into the
    folder meanwhile waits, then saves beside the new states (replacing the folder itself had removed the save under
    way, or the save had made the folder anew and the swap failed: "Directory not empty")."""
    with locked(folder):
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
    buffer = io.BytesIO()
    with locked(Path(folder), reading=True), tarfile.open(fileobj=buffer, mode="w") as archive:
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
            with locked(folder, reading=True):
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
    with locked(folder):
        for file in (f"{name}.json", *weights_names(name)):
            (folder / file).unlink(missing_ok=True)


LOCK_FILE = ".lock"  # in a state folder: the file `locked` holds an flock on


def locked(folder: Path, reading: bool = False) -> contextlib.AbstractContextManager[None]:
    """Hold the state folder's lock (an flock on `folder/.lock`, waited for): one process writes, reads, packs or
    replaces its states at a time. Where there is no flock (Windows) or it does not work (a file system without
    locks: warned once a folder), nothing is locked: run no `pack --every-s`, `progress` or `evaluate` beside a block
    there. `reading`: the caller only reads the states (`pack`, `progress`, `evaluate`), so a folder it cannot write
    (a read-only mount, another user's folder), where the lock file cannot be opened to write as flock needs on NFS,
    is read unlocked, warned once, as those verbs read it before they took the lock."""
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / LOCK_FILE

    def unsupported(err: OSError) -> None:
        if folder not in _UNLOCKED:
            _UNLOCKED.add(folder)
            log.warning("state folder %s: file locks unsupported here (%s); its readers and writers are not kept "
                        "apart", folder, err)  # fmt: skip

    if reading and not os.access(lock if lock.exists() else folder, os.W_OK):
        if folder not in _UNLOCKED:
            _UNLOCKED.add(folder)
            log.warning("state folder %s is read-only here: read without its lock (a save there meanwhile is not "
                        "waited for)", folder)  # fmt: skip
        return contextlib.nullcontext()
    return flocked(lock, os.O_CREAT | os.O_WRONLY, wait=True, unsupported=unsupported)


_UNLOCKED: set[Path] = set()  # state folders warned about by `locked`
