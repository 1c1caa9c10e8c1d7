"""Run the study's cells in blocks of GPU time: plan, sweep, train, each block finishing whole cells.

A cell is one `klalm-train` process (one GPU for sweep cells, DDP over every GPU for runs) followed, on one GPU, by
the whole validation shard (`klalm.study.validate`) and, for runs, zero-shot HellaSwag and PIQA (`klalm-eval`) of its
`hf/` export, once the run folder passes klalm-eval's check that it holds no checkpoint beyond the export.
Before a cell starts, its GPU time is estimated from this study's measured tokens/s (or the spec's prior until a
run of that model has finished); a cell that would not end inside the block is left for the next one. Finished
cells (their run.json exists in the results folder) are skipped, so the same command continues a study. A cell that
trained but whose evaluation failed (or was cut off) keeps its run folder, where `trained.json` records the training:
the next block runs only its evaluation, unless the cell would now be launched with other overrides (another lr, more
staged data), which trains it again.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from klalm.errors import one_line
from klalm.fileio import write_atomic
from klalm.study import results
from klalm.study.files import read_json
from klalm.study.spec import CELL_KEYS, Cell, Spec

log = logging.getLogger("klalm.study")

TRAINED_FILE = "trained.json"  # in a run folder whose training finished: its wall seconds, {"train": s}
_VERSIONED = ("klalm", "torch", "triton", "transformers", "lightning", "lm_eval", "flash-linear-attention")


@dataclass(frozen=True)
class Recipe:
    """What every cell shares, read from the composed experiment and the staged shards."""

    seq_len: int
    global_batch_tokens: int
    max_tokens: int  # one pass over the staged train tokens, whole global batches
    full_max_tokens: int  # one pass over the whole packed train split (what the sweep's fraction is of)
    data: dict[str, Any]  # the staged train split: tokens present, of the full pack, partial, shard files


def read_recipe(spec: Spec, shards: Path) -> Recipe:
    """Sequence length and global batch from the experiment; the one-pass budget from the shards that arrived.

    Raises:
        ValueError: the experiment and the spec's overrides do not compose or pass klalm-train's checks (the run
            length with the token budget of the runs and of the sweep cells, not with the experiment's own
            `train.max_tokens`, which every cell replaces), the train split's index.json does not parse, or its tokens
            make no whole global batch.
    """
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException

    from klalm.config_checks import check_train_config

    overrides = [f"experiment={spec.experiment}", *spec.overrides]
    try:
        with initialize_config_module("klalm.configs", version_base="1.3"):
            cfg = compose("train", overrides=overrides)
        check_train_config(cfg, check_paths=False, check_length=False)  # the length: each cell's, below
    except (HydraException, ValueError) as err:  # no such experiment, an override that does not compose or check
        raise ValueError(f"study {spec.name}: klalm-train {' '.join(overrides)}: {one_line(err)}") from None
    seq_len, batch = int(cfg.data.seq_len), int(cfg.train.global_batch_tokens)
    index_file = shards / "train" / "index.json"
    index = read_json(index_file)

    def one_pass(tokens: int) -> int:
        return tokens // (seq_len + 1) // (batch // seq_len) * batch

    data = {
        "train_tokens": index["total_tokens"],
        "partial": bool(index.get("partial", False)),
        "shards": [s["file"] for s in index["shards"]],
        "configured_max_tokens": int(cfg.train.max_tokens),
    }
    full = one_pass(index.get("pack_total_tokens", index["total_tokens"]))
    max_tokens = one_pass(index["total_tokens"])
    if max_tokens == 0:
        windows = f"{batch // seq_len} windows of {seq_len + 1}"
        raise ValueError(f"{index_file}: its {index['total_tokens']:,} tokens make no whole global batch of {batch:,} "
                         f"tokens ({windows}): stage more of the train split")  # fmt: skip
    recipe = Recipe(seq_len, batch, max_tokens=max_tokens, full_max_tokens=full, data=data)
    for cell in [*spec.sweep_cells()[:1], *spec.run_cells()[:1]]:  # their budgets: a warmup in steps may outlast one
        cfg.train.max_tokens = cell_tokens(spec, recipe, cell)
        try:
            check_train_config(cfg, check_paths=False)
        except ValueError as err:  # every such cell would fail as it started, on its GPU
            what = "sweep cell" if cell.sweep else "run"
            raise ValueError(f"study {spec.name}: each {what} trains {cfg.train.max_tokens:,} tokens, and "
                             f"{one_line(err)}") from None  # fmt: skip
    return recipe


def cell_tokens(spec: Spec, recipe: Recipe, cell: Cell) -> int:
    """Training tokens of a cell: the one-pass budget, or the sweep's fraction of it in whole global batches."""
    if not cell.sweep:
        return recipe.max_tokens
    steps = int(spec.sweep["fraction"] * recipe.full_max_tokens) // recipe.global_batch_tokens
    return max(steps, 1) * recipe.global_batch_tokens


def cell_lr(spec: Spec, cell: Cell) -> float | None:
    """The sweep point's lr, or the best swept lr of the model this run takes its lr from (None: not swept yet)."""
    return cell.lr if cell.sweep else results.best_lr(spec, spec.lr_source(cell.model))


def estimate_s(spec: Spec, recipe: Recipe, cell: Cell, gpus: int) -> tuple[float, str]:
    """Estimated GPU-seconds of wall time of one cell and the rate it was computed from."""
    rate, source = results.tokens_per_s_per_gpu(spec, cell.model)
    efficiency = 1.0 if gpus == 1 else spec.estimate["ddp_efficiency"]
    seconds = cell_tokens(spec, recipe, cell) / (rate * gpus * efficiency) + spec.estimate["overhead_s"]
    return seconds + (0.0 if cell.sweep else spec.estimate["eval_s"]), f"{rate:,.0f} tokens/s/GPU, {source}"


def train_overrides(spec: Spec, recipe: Recipe, cell: Cell, lr: float, run_dir: Path) -> list[str]:
    """The Hydra overrides of one cell (all of them: run.json records this list): its `CELL_KEYS`, then the spec's."""
    scale = spec.models[cell.model]["dynamics_lr_scale"]
    values = [spec.experiment, cell.model, f"{lr:g}", f"{scale:g}", cell_tokens(spec, recipe, cell), cell.seed,
              cell.name, run_dir]  # fmt: skip
    return [*(f"{key}={value}" for key, value in zip(CELL_KEYS, values, strict=True)), *spec.overrides]


def train_command(overrides: list[str], gpus: int) -> list[str]:
    """`python -m klalm.train` on one GPU, or under torchrun (`klalm.train.torchrun`) with DDP over `gpus` GPUs of this
    node: `trainer=ddp` after the overrides, so that a spec's one-device trainer (`trainer=cpu`, `trainer=gpu`) does
    not replace it (of two choices of a Hydra group the later wins)."""
    if gpus == 1:
        return [sys.executable, "-m", "klalm.train", *overrides]
    launcher = [sys.executable, "-m", "klalm.train.torchrun", "--standalone", "--nnodes", "1"]
    return [*launcher, "--nproc_per_node", str(gpus), "-m", "klalm.train", *overrides, "trainer=ddp",
            f"trainer.devices={gpus}"]  # fmt: skip


def _run_logged(command: list[str], log_path: Path, env: dict[str, str]) -> tuple[int, float]:
    """Runs a command with its output appended to a log file; returns (exit code, wall seconds)."""
    started = time.perf_counter()
    with open(log_path, "a", encoding="utf-8") as handle:
        handle.write(f"$ {' '.join(command)}\n")
        handle.flush()
        code = subprocess.call(command, stdout=handle, stderr=subprocess.STDOUT, env=env)
    return code, time.perf_counter() - started


def versions() -> dict[str, str]:
    found = {}
    for name in _VERSIONED:
        try:
            found[name] = version(name.replace("_", "-"))
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


def launch_record(
    spec: Spec, recipe: Recipe, cell: Cell, lr: float, overrides: list[str], command: list[str], gpus: int, commit: str
) -> dict[str, Any]:
    """What a cell was launched with (the run folder's cell.json; run.json starts from it)."""
    import torch

    return {
        "cell": cell.name,
        **asdict(cell),
        "lr": lr,
        "dynamics_lr_scale": spec.models[cell.model]["dynamics_lr_scale"],
        "experiment": spec.experiment,
        "overrides": overrides,
        "command": " ".join(["python", *command[1:]]),
        "gpus": gpus,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "data": recipe.data,
        "versions": versions(),
        "commit": commit,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


class StudyRunner:
    """Runs cells of one study spec on this machine's GPUs (see the module docstring).

    Args:
        spec: the loaded study spec.
        recipe: what every cell shares (`read_recipe` of these shards).
        shards: the staged shard folder (train/, val/, tokenizer/).
        work: where run folders (checkpoints, exports) go; not part of the results.
        eval_data: folder holding hellaswag/ and piqa/ (layout of ../shared/data) for offline zero-shot tasks.
        gpus: GPUs to use (0 .. gpus-1).
        minutes: this block's wall-clock budget; cells that would end after it are left for the next block.
        commit: the source revision recorded in run.json.
    """

    def __init__(
        self,
        spec: Spec,
        recipe: Recipe,
        shards: Path,
        work: Path,
        eval_data: Path,
        gpus: int,
        minutes: float,
        commit: str,
    ) -> None:
        self.spec, self.recipe, self.shards, self.work = spec, recipe, shards.resolve(), work.resolve()
        self.eval_data, self.gpus, self.deadline, self.commit = eval_data, gpus, time.monotonic() + 60 * minutes, commit
        self._lock = threading.Lock()
        if self.recipe.data["partial"]:
            log.warning("only part of the train split is staged (%s tokens): every run trains one pass over it",
                        f"{self.recipe.data['train_tokens']:,}")  # fmt: skip

    # -- planning ----------------------------------------------------------------------------------------------

    def pending(self, sweep: bool) -> list[Cell]:
        cells = self.spec.sweep_cells() if sweep else self.spec.run_cells()
        return [c for c in cells if results.load_run(self.spec, c) is None]

    def fits(self, cell: Cell, gpus: int) -> bool:
        if self.trained_before(cell) is not None:
            seconds, source = self.spec.estimate["eval_s"], "trained in an earlier block: its evaluation only"
        else:
            seconds, source = estimate_s(self.spec, self.recipe, cell, gpus)
        left = self.deadline - time.monotonic()
        verdict = "starts" if seconds <= left else "left for the next block"
        log.info("%s: estimated %.1f min on %d GPU(s) (%s), %.1f min left: %s",
                 cell.name, seconds / 60, gpus, source, left / 60, verdict)  # fmt: skip
        return seconds <= left

    # -- one cell ------------------------------------------------------------------------------------------------

    def env(self, devices: list[int]) -> dict[str, str]:
        env = dict(os.environ, KLALM_SHARDS=str(self.shards), PYTHONUNBUFFERED="1")
        env.update(CUDA_VISIBLE_DEVICES=",".join(map(str, devices)), NCCL_NVLS_ENABLE="0")
        return env

    def run_cell(self, cell: Cell, devices: list[int]) -> dict[str, Any] | None:
        """Trains, validates and (runs) evaluates one cell, then writes its results folder; None when it failed."""
        trained = self.train_cell(cell, devices)
        return None if trained is None else self.finish_cell(cell, *trained, devices[:1])

    def run_dir(self, cell: Cell) -> Path:
        return self.work / ("sweep" if cell.sweep else "runs") / cell.name

    def trained_before(self, cell: Cell) -> dict[str, float] | None:
        """The timing (`TRAINED_FILE`) of a cell whose training an earlier block finished, as the cell would be
        launched now (the overrides its cell.json records); None for any other cell."""
        run_dir = self.run_dir(cell)
        if not (run_dir / TRAINED_FILE).is_file() or not (run_dir / results.CELL_FILE).is_file():
            return None
        try:
            launched, trained = read_json(run_dir / results.CELL_FILE), read_json(run_dir / TRAINED_FILE)
        except ValueError as err:  # damaged: the cell is trained again, as before the record
            log.warning("%s: %s; training it again", cell.name, one_line(err))
            return None
        if not isinstance(trained, dict) or not isinstance(trained.get("train"), (int, float)):
            log.warning('%s: %s holds no training seconds ({"train": s}); training it again',
                        cell.name, run_dir / TRAINED_FILE)  # fmt: skip
            return None
        lr = cell_lr(self.spec, cell)
        if lr is None or launched.get("overrides") != train_overrides(self.spec, self.recipe, cell, lr, run_dir):
            return None
        return trained

    def train_cell(self, cell: Cell, devices: list[int]) -> tuple[Path, dict[str, float]] | None:
        """The training process of one cell; returns its run folder and timing, or None when it failed. A cell an
        earlier block trained (`trained_before`) is not trained again: its run folder and training time are returned.

        The run folder keeps what the results are made from: cell.json (what was launched) and, once the cell is
        finished, timing.json (wall seconds of each phase), so `collect` can rebuild the results from it alone.
        """
        run_dir = self.run_dir(cell)
        trained = self.trained_before(cell)
        if trained is not None:
            log.info("%s: trained in an earlier block (%s); evaluating it (delete that file to train it again)",
                     cell.name, run_dir / TRAINED_FILE)  # fmt: skip
            return run_dir, trained
        lr = cell_lr(self.spec, cell)
        if run_dir.exists():
            shutil.rmtree(run_dir)  # an unfinished earlier attempt: start the cell again
        run_dir.mkdir(parents=True)
        overrides = train_overrides(self.spec, self.recipe, cell, lr, run_dir)
        command = train_command(overrides, len(devices))
        launch = launch_record(self.spec, self.recipe, cell, lr, overrides, command, len(devices), self.commit)
        (run_dir / results.CELL_FILE).write_text(json.dumps(launch, indent=1) + "\n")
        log.info("%s: training on GPU %s (lr %g)", cell.name, devices, lr)
        code, seconds = _run_logged(command, run_dir / "train.log", self.env(devices))
        if code != 0:
            log.error("%s: training failed (exit %d); see %s", cell.name, code, run_dir / "train.log")
            return None
        write_atomic(run_dir / TRAINED_FILE, json.dumps({"train": seconds}) + "\n")
        return run_dir, {"train": seconds}

    def finish_cell(self, cell: Cell, run_dir: Path, timing: dict[str, float], devices: list[int]) -> dict | None:
        """Whole-shard validation and (runs) zero-shot evaluation of a trained cell's export, then its results folder.
        An export the run has checkpoints beyond (resumed for more steps, stopped before it exported again) is not
        evaluated: klalm-eval's check of a run folder (`check_export_current`) refuses it, in one line of the log."""
        from klalm.models.checkpoint import CheckpointError, check_export_current

        try:
            check_export_current(run_dir)
        except (CheckpointError, OSError) as err:  # (OSError: neither a summary.json nor an export to date it by)
            log.error("%s: %s", cell.name, one_line(err))
            return None
        ok = self.validate(run_dir, devices, timing) and (cell.sweep or self.evaluate(run_dir, devices, timing))
        if not ok:
            log.error("%s: evaluation failed; see %s", cell.name, run_dir / "eval.log")
            return None
        write_atomic(run_dir / results.TIMING_FILE, json.dumps(timing, indent=1) + "\n")
        record = results.collect(self.spec, run_dir)
        val, rate = record["val"], record["throughput"]["tokens_per_s"]
        log.info("%s: val loss %.4f (ppl %.2f), %.0f tokens/s, %.1f GPU-min", cell.name, val["loss"], val["ppl"], rate,
                 record["gpu_minutes"]["total"])  # fmt: skip
        return record

    def validate(self, run_dir: Path, devices: list[int], timing: dict[str, float]) -> bool:
        command = [sys.executable, "-m", "klalm.study.validate", "--checkpoint", str(run_dir / "hf"),
                   "--shards", str(self.shards / "val"), "--batch-size", str(self.spec.eval["val_batch_size"]),
                   "--seq-len", str(self.recipe.seq_len), "--out", str(run_dir / results.VAL_FILE)]  # fmt: skip
        code, timing["validate"] = _run_logged(command, run_dir / "eval.log", self.env(devices))
        return code == 0

    def evaluate(self, run_dir: Path, devices: list[int], timing: dict[str, float]) -> bool:
        out = run_dir / results.ZERO_SHOT_DIR
        tasks = ",".join(self.spec.eval["tasks"])
        command = [sys.executable, "-m", "klalm.eval", f"checkpoint={run_dir / 'hf'}", f"tasks=[{tasks}]",
                   f"data_dir={self.eval_data}", f"batch_size={self.spec.eval['batch_size']}", f"output_dir={out}",
                   f"hydra.run.dir={out}", f"limit={self.spec.eval.get('limit') or 'null'}"]  # fmt: skip
        code, timing["zero_shot"] = _run_logged(command, run_dir / "eval.log", self.env(devices))
        return code == 0

    # -- blocks --------------------------------------------------------------------------------------------------

    def sweep(self) -> int:
        """Pending sweep cells, one GPU each, `gpus` at a time; returns the number finished."""
        queue, done = list(self.pending(sweep=True)), []

        def slot(device: int) -> None:
            while True:
                with self._lock:
                    cell = next((c for c in queue if self.fits(c, 1)), None)
                    if cell is None:
                        return
                    queue.remove(cell)
                if self.run_cell(cell, [device]) is not None:
                    done.append(cell)

        threads = [threading.Thread(target=slot, args=(d,)) for d in range(self.gpus)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for cell in queue:
            log.info("%s: not run in this block", cell.name)
        return len(done)

    def train(self, models: list[str] | None = None) -> int:
        """Pending runs in the spec's order, each DDP over every GPU; returns the number finished.

        A run's validation and zero-shot evaluation (one GPU) run in the background while the next run trains, so
        the GPUs do not wait for lm-eval; the estimate of each run still counts its evaluation.
        """
        finishing: list[threading.Thread] = []
        done: list[Cell] = []

        def finish(cell: Cell, run_dir: Path, timing: dict[str, float]) -> None:
            if self.finish_cell(cell, run_dir, timing, [0]) is not None:
                done.append(cell)

        for cell in self.pending(sweep=False):
            if models and cell.model not in models:
                continue
            if cell_lr(self.spec, cell) is None:
                log.info("%s: waits for the sweep of %s", cell.name, self.spec.lr_source(cell.model))
                continue
            if not self.fits(cell, self.gpus):
                continue
            trained = self.train_cell(cell, list(range(self.gpus)))
            if trained is not None:
                finishing.append(threading.Thread(target=finish, args=(cell, *trained)))
                finishing[-1].start()
        for thread in finishing:
            thread.join()
        return len(done)


def plan(spec: Spec, recipe: Recipe, gpus: int) -> str:
    """A Markdown table of every cell: done or pending, its lr, and its estimated GPU wall minutes."""
    lines = [
        f"study {spec.name}: {recipe.max_tokens:,} tokens per run ({recipe.data['train_tokens']:,} staged"
        f"{', PARTIAL' if recipe.data['partial'] else ''}), sweep at {spec.sweep['fraction']:g} of it",
        "",
        "| cell | state | lr | GPUs | est. minutes | rate used |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    total = 0.0
    for cell in [*spec.sweep_cells(), *spec.run_cells()]:
        n = 1 if cell.sweep else gpus
        done = results.load_run(spec, cell)
        lr = cell_lr(spec, cell)
        seconds, source = estimate_s(spec, recipe, cell, n)
        if done is None:
            total += seconds * n
        state = f"done ({done['gpu_minutes']['total']:.1f} GPU-min)" if done else "pending"
        lines.append(f"| {cell.name} | {state} | {'—' if lr is None else f'{lr:g}'} | {n} | {seconds / 60:.1f} | "
                     f"{source} |")  # fmt: skip
    lines.append("")
    lines.append(f"pending: {total / 60:.1f} GPU-minutes in all")
    return "\n".join(lines)
