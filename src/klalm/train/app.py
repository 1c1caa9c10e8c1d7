"""What `klalm-train` runs: one training run from a composed config (model × data × optim × scheduler × trainer ×
logger × callbacks). The console script itself (composition, checks, `--help`) is `klalm.cli.train`.

    klalm-train experiment=smoke                      tiny KLA on the CPU, under a minute
    klalm-train experiment=kla_45m                    one GPU
    klalm-train -m experiment=kla_45m,gpt_45m optim.lr=3e-4,1e-3     sweep, one run dir per job + summary table
    klalm-train experiment=kla_45m resume=auto        continue from the newest checkpoint of this run name

A run leaves in its directory: `.hydra/` (the composed config), `checkpoints/`, `csv/metrics.csv`, `tokenizer/`,
`hf/` (Hugging Face export), `samples.txt`, `loss.png` and `summary.json` (final numbers, read by sweep tables).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hydra
import lightning.pytorch as pl
import torch
from hydra.errors import InstantiationException
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from klalm.config_checks import ConfigError, check_target_arguments, check_train_config, resolve_target
from klalm.data.loader import LoaderStateError, NoDocumentsError
from klalm.data.records import BadRecordError, DataFileError
from klalm.fileio import write_atomic
from klalm.models.checkpoint import HF_DIR, TOKENIZER_DIR, CheckpointError, list_checkpoints, load_checkpoint_file
from klalm.models.export import ExportTargetError, check_export_target
from klalm.train.budget import derive_budget
from klalm.train.callbacks import StepMetrics, skipped_records
from klalm.train.checkpoint import STOP_SIGNALS, RollingCheckpoint, export_hf, remove_stale_temporaries
from klalm.train.csv_logger import ContinuingCSVLogger
from klalm.train.module import LMModule, NonFiniteLossError
from klalm.train.plots import plot_losses
from klalm.train.resume import check_model, check_settings, check_tokenizer, resolve_resume, resume_settings
from klalm.train.rundir import (
    RunDirTakenError,
    check_run_dir_free,
    in_sweep,
    is_global_rank_zero,
    lock_run_dir,
    unlock_run_dir,
)

log = logging.getLogger(__name__)


def _quiet_lightning() -> None:
    """Silences two known, content-free Lightning messages where they are made.

    - `import lightning` gives the "lightning" logger a console handler of its own while its records also reach the
      root logger, which Hydra (or any application that configured logging) prints: every Lightning line came twice.
    - Lightning 2.6 advertises LitLogger each time a Trainer is built.
    """
    if logging.getLogger().handlers:
        lightning_logger = logging.getLogger("lightning")
        for handler in [h for h in lightning_logger.handlers if isinstance(h, logging.StreamHandler)]:
            lightning_logger.removeHandler(handler)
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(lambda r: "litlogger" not in r.getMessage())


_quiet_lightning()

STOP_EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}  # 128 + the signal: what schedulers and shells expect


def _instantiate_dict(group: DictConfig | None) -> list[Any]:
    """Instantiates every entry of a {name: {_target_: ...}} group (callbacks, loggers); null entries are off."""
    return [hydra.utils.instantiate(entry) for entry in (group or {}).values() if entry is not None]


def build_trainer(cfg: DictConfig) -> pl.Trainer:
    """The Lightning Trainer with klalm's callbacks and loggers; max_steps is set later from the token budget."""
    # The checkpoint runs last at each step, after the metrics row and the sample of the step it saves.
    callbacks = sorted(_instantiate_dict(cfg.callbacks), key=lambda c: isinstance(c, RollingCheckpoint))
    if not any(isinstance(c, StepMetrics) for c in callbacks):
        raise ValueError("callbacks.metrics (klalm.train.callbacks.StepMetrics) is required: it logs the loss")
    if not any(isinstance(c, RollingCheckpoint) for c in callbacks):
        log.warning("callbacks.checkpoint is off: this run writes no checkpoint and cannot be resumed")
    return instantiate_group(cfg, "trainer", callbacks=callbacks, logger=_instantiate_dict(cfg.logger))


def instantiate_group(cfg: DictConfig, key: str, **kwargs: Any) -> Any:
    """`hydra.utils.instantiate(cfg.<key>)`, with the input errors it meets as one-line ConfigErrors naming the key.

    A target that cannot be located or is no callable is refused naming it (`resolve_target`); a key its target takes
    no argument for (`+optim.foo=1`; targets without `**kwargs` only) is refused with the nearest argument (a partial
    target, such as the optimiser, as soon as Hydra has located it, before it is called); a missing file or folder
    the target names passes through as it is; a value the target refuses while it is built
    (TypeError, ValueError, KeyError, Lightning's refusal of a trainer setting, e.g. `trainer.accelerator=gpu`
    without a GPU, or another OSError, e.g. a folder where files belong), which Hydra wraps, becomes
    `<key>: <its message> (<its type>; ...)`.
    """
    node = cfg[key]
    try:
        built = hydra.utils.instantiate(node, **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        if cause is None or isinstance(cause, (ImportError, ValueError)):  # perhaps a target Hydra could not locate
            resolve_target(key, node)  # (or no callable): refused in one line; a target that resolves goes on below
        if isinstance(cause, (FileNotFoundError, ConfigError)):
            raise cause from err
        if isinstance(cause, TypeError) and "unexpected keyword argument" in str(cause):
            check_target_arguments(key, node, resolve_target(key, node))  # located and authorised by Hydra
        if isinstance(cause, (TypeError, ValueError, KeyError, MisconfigurationException, OSError)):
            text = cause.args[0] if isinstance(cause, KeyError) and cause.args else str(cause)
            raise ConfigError(f"{key}: {text} ({type(cause).__name__}; HYDRA_FULL_ERROR=1 shows where)") from err
        raise
    if isinstance(built, functools.partial):  # called later (the optimiser with the parameters): check it now
        check_target_arguments(key, node, built.func)
    return built


def check_wandb_credentials(cfg: DictConfig) -> None:
    """Refuses a logger that streams to W&B online (`logger.wandb.offline=false`) when wandb finds no credentials,
    before anything is built: `wandb.init` would otherwise end the run with a traceback (or prompt for a key) when
    training starts. Nothing to refuse where wandb runs offline or disabled anyway (`WANDB_MODE=offline`, a `mode`
    argument) or is given a key.

    wandb is imported only for such a logger (the run would import it anyway) and decides as `wandb.init` does,
    without network and without prompting: a key from WANDB_API_KEY, an identity token file, the netrc file or a
    settings file counts. An invalid key (WANDB_API_KEY=abc) is refused with wandb's reason. A wandb without the
    functions this uses is not checked here.
    """
    for name, entry in (cfg.logger or {}).items():
        if entry is None or entry.get("offline", False) or "_target_" not in entry:
            continue
        try:
            target = hydra.utils.get_class(entry._target_)
        except Exception:  # a target that cannot be located: instantiating it says so
            continue
        if not (isinstance(target, type) and issubclass(target, pl.loggers.WandbLogger)):
            continue
        settings = entry.get("settings")
        settings = OmegaConf.to_container(settings, resolve=True) if isinstance(settings, DictConfig) else None
        try:
            missing = _wandb_login_missing(entry.get("mode"), settings)
        except ImportError:  # wandb not installed: WandbLogger says so when it is built
            continue
        except Exception as err:  # wandb refused the lookup (an invalid key) or lacks what it uses
            from wandb.errors import AuthenticationError

            if isinstance(err, AuthenticationError):
                raise ConfigError(f"logger.{name}: {err}") from err
            continue  # anything else: left to wandb.init
        if missing:
            raise ConfigError(
                f"logger.{name}.offline=false needs wandb credentials: set WANDB_API_KEY or run `wandb login`, or keep "
                f"logger.{name}.offline=true (sync later with `wandb sync`)"
            )


def _wandb_login_missing(mode: str | None, settings: dict[str, Any] | None) -> bool:
    """Whether `wandb.init(mode=mode, settings=settings)`, as an online WandbLogger calls it, would have to log in and
    find no credentials: the decision of wandb's `_WandbInit.maybe_login` (wandb 0.31), without network or prompt."""
    import wandb
    from wandb.sdk import wandb_setup
    from wandb.sdk.lib import wbauth

    init_settings = wandb.Settings(**(settings or {}))
    if mode is not None:
        init_settings.mode = mode
    run_settings = wandb_setup.singleton().settings.model_copy()  # env vars (WANDB_MODE) and settings files
    run_settings.update_from_settings(init_settings)
    if run_settings._noop or run_settings._offline or init_settings.api_key:
        return False
    auth = wbauth.authenticate_session(host=run_settings.base_url, source="klalm-train", prompt=False,
                                       update_session=False)  # fmt: skip
    return auth is None


def build_module(
    cfg: DictConfig, model: torch.nn.Module, vocab_size: int, world_size: int, done: tuple[int, int] = (0, 0)
) -> LMModule:
    """The LightningModule, with the step count and accumulation derived from the token budget and `done`, the
    (steps, tokens) the checkpoint a run resumes from has trained."""
    budget = derive_budget(
        max_tokens=cfg.train.max_tokens,
        global_batch_tokens=cfg.train.global_batch_tokens,
        micro_batch_size=cfg.data.batch_size,
        seq_len=cfg.data.seq_len,
        world_size=world_size,
        steps_done=done[0],
        tokens_seen=done[1],
    )
    log.info(
        "budget: %d steps × %d tokens (accumulate %d × micro-batch %d×%d × %d ranks)",
        budget.max_steps, budget.tokens_per_step, budget.accumulate, budget.micro_batch_size, budget.seq_len,
        budget.world_size,
    )  # fmt: skip
    meta = {
        "model_config": OmegaConf.to_container(cfg.model, resolve=True),
        "vocab_size": vocab_size,
        "resume_settings": resume_settings(cfg),
    }
    return LMModule(
        model,
        optimizer=instantiate_group(cfg, "optim"),
        scheduler=instantiate_group(cfg, "scheduler"),
        budget=budget,
        grad_clip=cfg.train.grad_clip,
        max_bad_steps=cfg.train.max_bad_steps,
        dynamics_lr_scale=cfg.train.dynamics_lr_scale,
        compile=cfg.train.compile,
        activation_checkpointing=cfg.train.activation_checkpointing,
        meta=meta,
    )


# What a run raises when its input is wrong rather than its code, which `klalm-train` prints as one line (besides the
# config checks' ConfigError, which `instantiate_group` also raises for what a config group's target refuses): a
# checkpoint it will not load, a bad record in a data file, a data file or shard folder it cannot read, a data
# position it cannot take up, a missing file, an export folder holding other files, a run folder holding another run,
# and a divergence (its message names the learning rate to lower).
USER_ERRORS = (CheckpointError, BadRecordError, DataFileError, NoDocumentsError, LoaderStateError, FileNotFoundError,
               ExportTargetError, RunDirTakenError, NonFiniteLossError)  # fmt: skip


def run(cfg: DictConfig) -> dict[str, Any]:
    """Trains one run as configured and returns its summary (also written to `<run_dir>/summary.json`).

    The run holds its folder's lock throughout (`klalm.train.rundir`): a second run aimed at the same folder refuses
    to start, and so does one in a folder holding a run it does not continue; the temporary files of a save that a
    kill cut short are removed under that lock.
    """
    check_train_config(cfg)
    check_wandb_credentials(cfg)  # before the lock, the data and the model
    run_dir = Path(cfg.paths.run_dir)
    lock_run_dir(run_dir)
    try:
        search_glob = None if in_sweep() else cfg.paths.resume_glob  # a sweep's job: its own folder only
        ckpt_path = resolve_resume(cfg.resume, search_glob, run_dir)  # verified: safe and intact
        check_run_dir_free(run_dir, ckpt_path)
        if is_global_rank_zero():
            remove_stale_temporaries(run_dir)
        return train(cfg, run_dir, ckpt_path)
    finally:
        unlock_run_dir(run_dir)


def train(cfg: DictConfig, run_dir: Path, ckpt_path: Path | None) -> dict[str, Any]:
    """Builds data, model, trainer and module, fits (from `ckpt_path`, when resuming) and finishes the run."""
    started = time.time()
    if cfg.train.export_hf:  # refused now, not after training
        check_export_target(run_dir / HF_DIR)
    saved = None if ckpt_path is None else load_checkpoint_file(ckpt_path, mmap=True)  # read once for both checks
    if saved is not None:  # before anything is built or written
        check_settings(ckpt_path, saved, resume_settings(cfg), cfg.resume_allow_changes)
    pl.seed_everything(cfg.seed, workers=True)
    datamodule = instantiate_group(cfg, "data")
    tokenizer = datamodule.tokenizer
    if ckpt_path is not None:
        check_tokenizer(ckpt_path, tokenizer)
    vocab_size = len(tokenizer) if tokenizer is not None else datamodule.vocab_size
    model = instantiate_group(cfg, "model", vocab_size=vocab_size)
    trainer = build_trainer(cfg)
    done = (0, 0) if saved is None else (saved["global_step"], saved["klalm"]["tokens_seen"])
    module = build_module(cfg, model, vocab_size, trainer.world_size, done)
    if saved is not None and done[0] >= module.budget.max_steps:
        log.warning(
            "resume from %s: its run is at the end of its budget (step %d of %d), so there is nothing to train; a new "
            "run needs resume=null or another run_name, more steps a larger train.max_tokens with resume_allow_changes"
            "=true", ckpt_path, done[0], module.budget.max_steps,
        )  # fmt: skip
    if saved is not None:  # the model the config builds must be the one the checkpoint holds
        shapes = {name: tuple(value.shape) for name, value in module.state_dict().items()}
        check_model(ckpt_path, saved, OmegaConf.to_container(cfg.model, resolve=True), shapes)
        del saved
    module.save_hyperparameters(OmegaConf.to_container(cfg, resolve=True))  # Lightning hands them to every logger
    trainer.fit_loop.epoch_loop.max_steps = module.budget.max_steps  # the token budget decides the length
    if trainer.is_global_zero and tokenizer is not None:
        tokenizer.save_pretrained(run_dir / TOKENIZER_DIR)
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    except SIGTERMException:  # a stop signal on some rank (RollingCheckpoint saved at the step it stopped after)
        stop = next((c.stop_signal for c in trainer.callbacks if isinstance(c, RollingCheckpoint)), None)
        stop = stop or signal.SIGTERM  # another rank's signal, or Lightning's own handler (no checkpoint callback)
        hint = f"resume with resume={run_dir}" if list_checkpoints(run_dir) else "no checkpoint was written"
        log.warning("stopped by %s after step %d; %s", STOP_SIGNALS[stop], trainer.global_step, hint)
        sys.exit(STOP_EXIT_CODES[stop])
    return finish(cfg, trainer, module, datamodule, started)


def finish(cfg: DictConfig, trainer: pl.Trainer, module: LMModule, datamodule: Any, started: float) -> dict[str, Any]:
    """After training: held-out evaluation, HF export, loss plot and `summary.json`.

    A start that continues a run which had already written its summary (a resume of a finished run, perhaps for more
    steps) keeps that summary's last logged train/loss and perf/* values where it logged no step itself, and adds
    its wall time to the summary's: the summary describes the whole run, not the last start.

    A SIGTERM during the finish (once the fit has put back the handler it found, which ended the process at once, or
    in the evaluation, which Lightning ended with exit status 0) stops what it arrives in and skips the rest, but the
    summary of the trained run is still written (without the evaluation's numbers where it was cut short, and with
    `exported` false where the export was: its `steps` then date no export); the run then exits 143, as a stop during
    training does.
    """
    run_dir = Path(cfg.paths.run_dir)
    skipped = skipped_records(trainer)  # every rank takes part: first, so that no rank a stop ends waits in it
    exported = False  # summary.json's `exported`: only then do its steps date an export without source.json
    earlier = _read_summary(run_dir / "summary.json")  # an earlier start's: read before this start writes its own
    try:
        with _sigterm_raises():
            if cfg.train.final_eval and module.last_val_step != trainer.global_step:  # not run at the last step yet
                for logger in trainer.loggers:  # an earlier start's final validation, which the checkpoint lacks
                    if isinstance(logger, ContinuingCSVLogger):
                        logger.drop_validation_rows_at(trainer.global_step)
                trainer.validate(module, datamodule=datamodule, verbose=False)
            if cfg.train.export_hf:
                export_hf(trainer, run_dir / HF_DIR, datamodule.tokenizer, max_length=cfg.data.seq_len)
                exported = True
            csv_path = run_dir / "csv" / "metrics.csv"
            if trainer.is_global_zero and cfg.train.plot and csv_path.is_file():
                plot_losses({cfg.run_name: csv_path}, run_dir / "loss.png", title=f"{cfg.run_name}: loss")
            return _write_summary(cfg, trainer, module, skipped, started, exported, earlier)
    except SIGTERMException:  # (written again where it came once the summary was: from the same earlier summary)
        _write_summary(cfg, trainer, module, skipped, started, exported, earlier)
        log.warning("stopped by SIGTERM after the last step (%d); wrote the run's summary", trainer.global_step)
        sys.exit(STOP_EXIT_CODES[signal.SIGTERM])


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM raises SIGTERMException where it arrives instead of ending the process at once (its default action,
    the one handler replaced: not one that ignores or handles it); handlers are set in the main thread only."""
    on_main = threading.current_thread() is threading.main_thread()
    replace = on_main and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    previous = signal.signal(signal.SIGTERM, _raise_sigterm) if replace else None
    try:
        yield
    finally:
        if replace:
            signal.signal(signal.SIGTERM, previous)


def _raise_sigterm(signum: int, frame: Any) -> None:
    raise SIGTERMException


def _write_summary(
    cfg: DictConfig,
    trainer: pl.Trainer,
    module: LMModule,
    skipped: dict[str, int] | None,
    started: float,
    exported: bool,
    earlier: dict[str, Any],
) -> dict[str, Any]:
    """Writes `<run_dir>/summary.json` (rank 0; other ranks return {}): the run's final numbers, the final
    evaluation's where it ran at the last step (`finish`), and whether this start exported `hf/` at its last step
    (`exported`: false with train.export_hf=false or where a SIGTERM came first; an export that records no step, an
    earlier start's, is dated by `steps` only where it is true, `klalm.models.checkpoint.check_export_current`).
    `earlier` is the summary the run's earlier starts wrote (`_read_summary`), whose wall time this start's adds to."""
    if not trainer.is_global_zero:
        return {}
    run_dir = Path(cfg.paths.run_dir)
    evaluated = cfg.train.final_eval and module.last_val_step == trainer.global_step
    val = module.last_val if evaluated else {}
    metrics = next(c for c in trainer.callbacks if isinstance(c, StepMetrics))
    logged = metrics.last_row or earlier  # no step logged in this start: the run's last logged values
    earlier_wall_s = earlier["wall_s"] if isinstance(earlier.get("wall_s"), (int, float)) else 0
    summary = {
        "run_name": cfg.run_name,
        "run_dir": str(run_dir),
        "params": sum(p.numel() for p in module.model.parameters()),
        "steps": trainer.global_step,
        "exported": exported,
        "tokens_seen": module.tokens_seen,
        "skipped_steps": module.bad_steps_total,
        "skipped_records": skipped,
        "val_loss": float(val["val/loss"]) if val else None,
        "val_ppl": float(val["val/ppl"]) if val else None,
        **{k: v for k, v in logged.items() if k.startswith(("train/loss", "perf/"))},
        "wall_s": round(earlier_wall_s + time.time() - started, 1),
    }
    write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    log.info("summary: %s", json.dumps(summary))
    return summary


def _read_summary(path: Path) -> dict[str, Any]:
    """The summary an earlier start of this run wrote; {} if there is none (or it is unreadable: it is replaced)."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}
