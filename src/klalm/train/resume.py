"""What `resume=` resolves to: a checkpoint that passed verification (or a fresh start), and the run folder.

    resume=null         a fresh run
    resume=auto         the newest valid checkpoint of the run folder itself (a launcher's `$KLALM_RUN_ID` folder,
                        requeued), else of the earlier run with this run_name (`paths.resume_glob`) that wrote a
                        checkpoint last, or a fresh run when there is none; in a sweep's job only its own folder
                        (hydra.sweep.dir/<num>_<run_name>): the single runs of its run_name are other runs
    resume=<run dir>    the newest valid checkpoint in that folder
    resume=<file>       that checkpoint; if it fails verification the run stops, naming the file and why

"Valid" is `klalm.models.checkpoint.verify_checkpoint`: the sha256 written at save time and a safe load. A newer
checkpoint that fails (truncated by a full disk, corrupted, not a trusted klalm checkpoint) is skipped with a warning
that names it and the reason, so a damaged newest file never makes every restart crash.

A resume keeps the settings that fix the lr schedule and the data order (`RESUME_KEYS`, stored in every checkpoint):
a changed token budget, global batch, optimiser, schedule or data setting is refused with one line naming the keys
(`check_settings`), unless `resume_allow_changes=true`. Silently accepting them would stretch or cut the schedule
mid-run or replay other data, and the optimiser's own values (lr, betas, weight decay) would come back from the
checkpoint anyway, ignoring the new ones. `FREE_KEYS` (`optim.fused`: how AdamW runs, not what it computes) may
change freely.

resume=auto and resume=<run dir> continue in the run folder of the checkpoint they resume from
(`klalm.train.rundir.run_dir_for`, the resolver behind `hydra.run.dir`), so one run keeps one metrics.csv, loss.png
and samples.txt however often it is restarted; the config of each restart goes to `.hydra/resume-<time>_<hex>/`,
next to the first start's `.hydra/`.
"""

from __future__ import annotations

import logging
from glob import glob
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from klalm.config_checks import ConfigError
from klalm.models.checkpoint import TOKENIZER_DIR, CheckpointError, newest_valid, verify_checkpoint
from klalm.models.config import ARCH_LAYOUTS
from klalm.models.export import weight_mismatch
from klalm.models.presets import preset_fields

log = logging.getLogger(__name__)

# Config subtrees a resume must keep: the step count and tokens per step, the lr schedule, and the data order.
RESUME_KEYS = (
    "train.max_tokens",
    "train.global_batch_tokens",
    "train.dynamics_lr_scale",
    "optim",
    "scheduler",
    "data.source",
    "data.train",  # data=files: its training files and the field read from them
    "data.field",
    "data.tokenizer",
    "data.seq_len",
    "data.seed",
    "data.shuffle",
    "data.block_docs",
    "data.vocab_size",
)
# Keys inside RESUME_KEYS that choose how the same maths runs, not what it computes: a resume may change them.
# (Fused and foreach AdamW keep the same state dict; the loaded state moves to the kernel's device and dtype.)
FREE_KEYS = ("optim.fused",)
MAX_NAMED = 5  # model settings a refused resume names


def resolve_resume(resume: str | None, search_glob: str | None, run_dir: Path) -> Path | None:
    """The verified checkpoint to resume from (None: a fresh run); see the module docstring. With resume=auto,
    the newest valid checkpoint of `run_dir` (the run folder `klalm.train.rundir.run_dir_for` chose) comes first,
    then those of the runs `search_glob` matches; None (a sweep's job) looks in `run_dir` only.

    Raises:
        CheckpointError: an explicit file, or every checkpoint of an explicit run folder, fails verification.
        FileNotFoundError: an explicit run folder holds no checkpoint.
    """
    if resume is None:
        return None
    if resume == "auto":
        own, skipped = newest_valid([run_dir])
        if own is not None or search_glob is None:
            return _logged("resume=auto (this run's folder)", own, skipped)
        runs = sorted(Path(p) for p in glob(search_glob))
        return _logged(f"resume=auto (over {search_glob})", *newest_valid(runs))
    path = Path(resume)
    if path.is_file():
        verify_checkpoint(path)
        return path
    latest, skipped = newest_valid([path])
    if latest is None:
        why = f" ({'; '.join(skipped)})" if skipped else ""
        raise FileNotFoundError(f"resume={resume!r}: the folder holds no valid checkpoints/step-*.ckpt{why}")
    return _logged(f"resume={resume}", latest, skipped)


def _logged(what: str, latest: Path | None, skipped: list[str]) -> Path | None:
    """`latest`, the choice of `newest_valid`, after logging each checkpoint skipped on the way and the choice."""
    for reason in skipped:
        log.warning("%s: skipped %s", what, reason)
    log.info("%s: %s", what, f"resuming from {latest}" if latest else "no valid checkpoint, starting fresh")
    return latest


def resume_settings(cfg: DictConfig) -> dict[str, Any]:
    """The `RESUME_KEYS` of a config as flat `{"optim.lr": 0.001, ...}` plain data (absent keys: None)."""
    flat: dict[str, Any] = {}
    for key in RESUME_KEYS:
        node = OmegaConf.select(cfg, key, default=None)
        value = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
        _flatten(key, value, flat)
    return {key: value for key, value in flat.items() if key not in FREE_KEYS}


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            _flatten(f"{prefix}.{key}", item, out)
    else:
        out[prefix] = value


def check_settings(ckpt_path: Path, checkpoint: dict[str, Any], current: dict[str, Any], allow_changes: bool) -> None:
    """Refuses a resume whose `RESUME_KEYS` differ from those stored in the checkpoint (module docstring).

    `checkpoint` is the file's content (`load_checkpoint_file(ckpt_path, mmap=True)`), `ckpt_path` names it.

    Raises:
        ConfigError (a ValueError): one line naming each changed key with its old and new value, unless
            `allow_changes` (then the changes are logged as a warning).
    """
    saved = checkpoint["klalm"].get("resume_settings")
    if saved is None:
        if allow_changes:
            return
        raise CheckpointError(
            f"{ckpt_path} records no resume settings (written by an older klalm), so its schedule and data order "
            "cannot be checked; pass resume_allow_changes=true to resume it anyway"
        )
    absent = "(absent)"
    saved = {key: value for key, value in saved.items() if key not in FREE_KEYS}  # checkpoints that recorded them
    # a RESUME_KEYS entry newer than the checkpoint (data.train of data=files) is not recorded there: not checked
    recorded = {_root(key) for key in saved}
    keys = saved.keys() | {key for key in current if _root(key) in recorded}
    changes = [
        f"{key} {saved.get(key, absent)!r} -> {current.get(key, absent)!r}"
        for key in sorted(keys)
        if saved.get(key, absent) != current.get(key, absent)
    ]
    if not changes:
        return
    if allow_changes:
        log.warning("resume_allow_changes=true: resuming %s with changed settings: %s", ckpt_path, "; ".join(changes))
        return
    raise ConfigError(
        f"resume from {ckpt_path} changes {'; '.join(changes)}: that would silently change the lr schedule or the "
        "data order of the run; keep the checkpoint's values, or pass resume_allow_changes=true to accept the change"
    )


def _root(key: str) -> str | None:
    """The `RESUME_KEYS` entry a flattened key belongs to ("optim.betas" -> "optim"), or None."""
    return next((root for root in RESUME_KEYS if key == root or key.startswith(f"{root}.")), None)


def check_tokenizer(ckpt_path: Path, tokenizer: Any) -> None:
    """Refuses a resume whose tokenizer has another vocabulary than the one the checkpoint's run saved
    (`<run>/tokenizer`): a BPE retrained on training files edited since (its cache follows the files) would give the
    learnt embeddings other ids. Not checked without a saved tokenizer or without one built (random tokens).

    Raises:
        ConfigError: naming both tokenizers.
    """
    saved_dir = Path(ckpt_path).parent.parent / TOKENIZER_DIR
    if tokenizer is None or not saved_dir.is_dir():
        return
    from transformers import AutoTokenizer

    if AutoTokenizer.from_pretrained(str(saved_dir)).get_vocab() != tokenizer.get_vocab():
        raise ConfigError(
            f"resume from {ckpt_path}: the tokenizer this config builds has another vocabulary than the run's own "
            f"({saved_dir}): were its training files edited since (a trained BPE follows them)? Restore them, or "
            "start a new run"
        )


def check_model(ckpt_path: Path, checkpoint: dict[str, Any], model_config: dict[str, Any],
                shapes: dict[str, tuple[int, ...]]) -> None:  # fmt: skip
    """Refuses a resume whose config builds another model than the checkpoint holds (its state would not load).

    Args:
        checkpoint: the file's content (`load_checkpoint_file(ckpt_path, mmap=True)`); `ckpt_path` names it.
        model_config: the config's `model` group, resolved (what the checkpoint stores as "model_config").
        shapes: parameter and buffer name -> shape of the module as built (`LMModule.state_dict()`).

    Raises:
        ConfigError: one line naming the model settings that differ (or, when the stored config does not show it,
            the first tensors missing, unexpected or of another shape: `weight_mismatch`), whatever
            `resume_allow_changes` says.
    """
    saved = {_plain_name(k): tuple(v.shape) for k, v in checkpoint["state_dict"].items() if hasattr(v, "shape")}
    built = {_plain_name(k): shape for k, shape in shapes.items()}
    if saved == built:
        return
    before, after = {}, {}
    _flatten("model", _with_preset_values(checkpoint["klalm"].get("model_config")), before)
    _flatten("model", _with_preset_values(model_config), after)
    # a null model key keeps the preset's value, as an absent one does (the mixers' option groups differ by arch)
    keys = [k for k in sorted(before.keys() | after.keys()) if before.get(k) != after.get(k)]
    changes = [f"{k} {before.get(k)!r} -> {after.get(k)!r}" for k in keys[:MAX_NAMED]]
    changes += [f"and {len(keys) - MAX_NAMED} more"] if len(keys) > MAX_NAMED else []
    if not changes:
        shaped = [(k, saved[k], built[k]) for k in saved.keys() & built.keys() if saved[k] != built[k]]
        changes = weight_mismatch(built.keys() - saved.keys(), saved.keys() - built.keys(), shaped)
    raise ConfigError(
        f"resume from {ckpt_path}: the checkpoint holds another model than this config builds ({'; '.join(changes)}); "
        "resume with the checkpoint's model settings, or start a new run_name"
    )


def _with_preset_values(model_config: dict[str, Any] | None) -> dict[str, Any] | None:
    """The model config with its preset's sizes where it leaves them null (`model.d_model 64 -> 48`, where the
    stored config reads None for a preset's d_model)."""
    if not model_config or model_config.get("preset") is None or model_config.get("arch") not in ARCH_LAYOUTS:
        return model_config
    try:
        fields = preset_fields(model_config["arch"], model_config["preset"])
    except KeyError:  # an unknown preset: its sizes are not known here
        return model_config
    return {**model_config, **{k: v for k, v in fields.items() if model_config.get(k) is None}}


def _plain_name(name: str) -> str:
    """A state-dict name without what torch.compile inserts (`_orig_mod.`), so a compiled and an eager module match."""
    return name.replace("_orig_mod.", "")
