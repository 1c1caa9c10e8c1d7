"""What a composed `klalm-train` / `klalm-eval` config must satisfy, checked before anything heavy is imported.

Hydra's struct mode already rejects unknown keys (`unknown_key_message` says so in one line, with the nearest key).
This module adds the rest, in one table per app: the type of every key klalm itself reads (`optim.lr=abc` is an
error naming `optim.lr`, not a TypeError deep inside torch) and the values that cannot work (`optim.lr=-1`). Keys a
group option does not have (`scheduler.decay_frac` under the cosine schedule) or whose parent is switched off
(`callbacks.checkpoint=null`) are not checked. Arguments that go straight to Lightning's Trainer
(`trainer.devices=auto`, `trainer.limit_val_batches=0.5`) are Lightning's to check.

Importing it costs only omegaconf: the console scripts (`klalm.cli`) run these checks first.
"""

from __future__ import annotations

import difflib
import inspect
import math
import os
import re
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from typing import Any, NamedTuple

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

# One name per knob across the mixers: an old option name -> its name now. Old names are refused with the new one.
RENAMED_MIXER_OPTIONS = {"conv_kernel": "d_conv", "scan_backend": "backend", "impl": "backend", "num_heads": "n_heads"}

SUPPORTED_PRECISIONS = ("32-true", "32", "64-true", "bf16-mixed", "bf16-true")
# The decay curves of the WSD schedule (scheduler.shape; klalm.train.optim.DECAY_SHAPES implements them).
WSD_SHAPES = ("linear", "1-sqrt", "cosine")


class ConfigError(ValueError):
    """A config value of the wrong type or out of range; the message names the key."""


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    """A finite int or float (`optim.lr=inf` once trained a run to NaN weights and checkpointed them)."""
    return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and math.isfinite(v))


def _is_str_list(v: Any) -> bool:
    return isinstance(v, (list, ListConfig)) and all(isinstance(item, str) for item in v)


# A type: (test, how the message names it).
INT = (is_int, "an integer")
NUMBER = (is_number, "a finite number")
BOOL = (lambda v: isinstance(v, bool), "true or false")
COMPILE = (lambda v: isinstance(v, bool) or v == "blocks", "true, false or blocks")  # train.compile
STR = (lambda v: isinstance(v, str), "a string")
STR_OR_LIST = (lambda v: isinstance(v, str) or _is_str_list(v), "a path or a list of paths")
BETAS = (
    lambda v: isinstance(v, (list, ListConfig)) and len(v) == 2 and all(is_number(b) and 0 <= b < 1 for b in v),
    "a list of two numbers in [0, 1), e.g. [0.9, 0.95]",
)


class Rule(NamedTuple):
    """One key: its type, whether null is allowed, and a value check with what it demands."""

    key: str
    type: tuple[Callable[[Any], bool], str]
    nullable: bool = False
    check: Callable[[Any], bool] | None = None
    demand: str = ""


def positive(v: float) -> bool:
    return v > 0


def non_negative(v: float) -> bool:
    return v >= 0


def non_empty(v: str | list) -> bool:
    return len(v) > 0


def fraction(v: float) -> bool:
    return 0 <= v <= 1


TRAIN_RULES: tuple[Rule, ...] = (
    Rule("run_name", STR),
    Rule("seed", INT),
    Rule("resume", STR, nullable=True),
    Rule("resume_allow_changes", BOOL),
    Rule("train.max_tokens", INT, check=positive, demand="> 0"),
    Rule("train.global_batch_tokens", INT, check=positive, demand="> 0"),
    Rule("train.grad_clip", NUMBER, check=non_negative, demand="≥ 0 (0 disables clipping)"),
    Rule("train.max_bad_steps", INT, check=lambda v: v >= 1, demand="≥ 1"),
    Rule("train.dynamics_lr_scale", NUMBER, check=positive, demand="> 0"),
    Rule("train.compile", COMPILE),
    Rule("train.activation_checkpointing", BOOL),
    Rule("train.val_every_n_steps", INT, check=lambda v: v >= 1, demand="≥ 1"),
    Rule("train.final_eval", BOOL),
    Rule("train.export_hf", BOOL),
    Rule("train.plot", BOOL),
    Rule("model.vocab_size", INT, nullable=True, check=positive, demand="> 0"),
    Rule("model.d_model", INT, nullable=True, check=positive, demand="> 0"),
    Rule("model.n_layers", INT, nullable=True, check=positive, demand="> 0"),
    Rule("model.d_ff", INT, nullable=True, check=positive, demand="> 0"),
    Rule("model.n_heads", INT, nullable=True, check=positive, demand="> 0"),
    Rule("data.train", STR_OR_LIST, check=non_empty, demand="a path or a non-empty list of paths"),  # data=files
    Rule("data.val", STR_OR_LIST, nullable=True, check=non_empty, demand="a path or a non-empty list (null: none)"),
    Rule("data.bpe_vocab_size", INT, check=lambda v: v > 256, demand="> 256 (the 256 bytes and EOS)"),
    Rule("data.seq_len", INT, check=positive, demand="> 0"),
    Rule("data.batch_size", INT, check=positive, demand="> 0"),
    Rule("data.num_workers", INT, check=non_negative, demand="≥ 0"),
    Rule("data.val_batches", INT, nullable=True, check=positive, demand="> 0"),
    Rule("data.seed", INT),
    Rule("data.shuffle", BOOL),
    Rule("data.block_docs", INT, check=positive, demand="> 0"),
    Rule("optim.lr", NUMBER, check=positive, demand="> 0"),
    Rule("optim.weight_decay", NUMBER, check=non_negative, demand="≥ 0"),
    Rule("optim.betas", BETAS),
    Rule("optim.eps", NUMBER, check=positive, demand="> 0"),
    Rule("optim.fused", BOOL, nullable=True),
    Rule("data.on_bad_record", (lambda v: v in ("raise", "skip"), "raise or skip")),
    Rule("scheduler.warmup", NUMBER, check=non_negative, demand="≥ 0 (< 1: a fraction of the run, else steps)"),
    Rule("scheduler.min_lr_ratio", NUMBER, check=fraction, demand="in [0, 1]"),
    Rule("scheduler.decay_frac", NUMBER, check=lambda v: 0 < v <= 1, demand="in (0, 1]"),
    Rule("scheduler.shape", (lambda v: v in WSD_SHAPES, ", ".join(WSD_SHAPES[:-1]) + f" or {WSD_SHAPES[-1]}")),
    Rule("trainer.precision", (lambda v: str(v) in SUPPORTED_PRECISIONS, f"one of {SUPPORTED_PRECISIONS}")),
    Rule("trainer.log_every_n_steps", INT, check=positive, demand="> 0"),
    Rule("callbacks.metrics.peak_flops_per_device", NUMBER, nullable=True, check=positive, demand="> 0 (null: by GPU)"),
    Rule("callbacks.checkpoint.every_n_steps", INT, check=non_negative, demand="≥ 0 (0: only at the end)"),
    Rule("callbacks.checkpoint.keep_last", INT, check=positive, demand="> 0"),
    Rule("callbacks.sampler.every_n_steps", INT, check=non_negative, demand="≥ 0 (0: only at the end)"),
    Rule("callbacks.sampler.max_new_tokens", INT, check=positive, demand="> 0"),
    Rule("callbacks.sampler.temperature", NUMBER, check=non_negative, demand="≥ 0 (0: greedy)"),
    Rule("callbacks.sampler.top_k", INT, check=non_negative, demand="≥ 0 (0: all tokens)"),
)

EVAL_DEVICE = (
    lambda v: isinstance(v, str) and re.fullmatch(r"auto|cpu|mps|(cuda|xpu)(:\d+)?", v) is not None,
    "auto, cpu, cuda, cuda:N (or mps, xpu, xpu:N)",
)

# The weight dtypes klalm-eval and klalm-generate load a checkpoint in (klalm.eval.checkpoint.DTYPES: as torch dtypes).
EVAL_DTYPES = ("float32", "bfloat16", "float16", "float64")


def distinct_paths(v: str | list[str]) -> bool:
    """One non-empty path, or a non-empty list of them naming distinct files or folders (`a/` and `./a` are one)."""
    paths = [v] if isinstance(v, str) else list(v)
    resolved = [os.path.realpath(os.path.expanduser(p)) for p in paths if p]
    return len(resolved) == len(paths) > 0 and len(set(resolved)) == len(resolved)


EVAL_RULES: tuple[Rule, ...] = (
    Rule("checkpoint", STR_OR_LIST, check=distinct_paths, demand="one path or a list of distinct paths"),
    Rule("tasks", (lambda v: isinstance(v, str) or _is_str_list(v), "a task name or a list of them")),
    Rule("data_dir", STR, nullable=True),
    Rule("limit", INT, nullable=True, check=positive, demand="> 0 (null: every example)"),
    Rule("batch_size", INT, check=positive, demand="> 0"),
    Rule("max_length", INT, check=positive, demand="> 0"),
    Rule("device", EVAL_DEVICE),
    Rule("dtype", STR),
    Rule("tokenizer", STR, nullable=True),
    Rule("log_samples", BOOL),
    Rule("output_dir", STR, nullable=True, check=lambda v: v.strip() != "", demand="a folder (not empty)"),
)

# The splits klalm-prepare-data writes -> the key of a data config (configs/data/*.yaml) holding each one's source
# (klalm.data.prepare).
SPLIT_KEYS = {"train": "source", "val": "val_source"}

# The six MAD-Lab tasks of klalm-synthetic, as its plans (klalm.tasks.plans) and command line name them; the registry
# klalm.tasks.registry.TASKS pairs them, in this order, with their classes.
MAD_TASKS = (
    "mad_in_context_recall",
    "mad_noisy_recall",
    "mad_fuzzy_recall",
    "mad_selective_copy",
    "mad_compression",
    "mad_memorization",
)

# klalm-synthetic's A5 "solved" criterion (a plan's a5.criterion) -> the key of the evaluation it reads.
A5_CRITERIA = {"token": "token_acc", "sequence": "seq_acc"}

_ABSENT = object()


def _value(cfg: DictConfig, key: str) -> Any:
    """The resolved value at `key`; _ABSENT when the key (or a parent) is not in this config or is null."""
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    if not isinstance(parent, DictConfig) or leaf not in parent.keys():  # noqa: SIM118 (`in` skips ??? keys)
        return _ABSENT
    if OmegaConf.is_missing(parent, leaf):
        raise ConfigError(f"{key} is required (it is ??? in the config): set {key}=...")
    try:
        return OmegaConf.select(cfg, key, throw_on_missing=True)
    except Exception as err:  # an interpolation that cannot resolve
        raise ConfigError(f"{key}: {err}".splitlines()[0]) from err


def check(cfg: DictConfig, rules: tuple[Rule, ...]) -> None:
    """Raises ConfigError naming the first key of `rules` whose value has the wrong type or an invalid value."""
    for rule in rules:
        value = _value(cfg, rule.key)
        if value is _ABSENT or (value is None and rule.nullable):
            continue
        test, type_name = rule.type
        if not test(value):
            raise ConfigError(f"{rule.key}={value!r} is invalid: must be {type_name}")
        if rule.check is not None and not rule.check(value):
            raise ConfigError(f"{rule.key}={value!r} is invalid: must be {rule.demand}")


def renamed_option_message(key: str) -> str | None:
    """For a dotted key whose last part is an old mixer option name (`model.mixer_options.kla.conv_kernel`), the
    one-line refusal that names the new key; None for any other key."""
    head, _, leaf = key.rpartition(".")
    if "mixer_options" not in key.split(".") or leaf not in RENAMED_MIXER_OPTIONS:
        return None
    return f"{key} was renamed: use {head}.{RENAMED_MIXER_OPTIONS[leaf]}"


# Command-line arguments that add config folders to Hydra's search path: their options are not klalm's to list.
SEARCH_PATH_ARGUMENTS = ("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn", "hydra.searchpath")


def check_overrides(overrides: list[str]) -> None:
    """Refuses a command-line override of a renamed key (Hydra would only say the key is not in the config), or one
    that picks a config group option that does not exist (`model=kla_45`: Hydra prints every option, private ones and
    its search path included, over 30 lines; this names the nearest option in one), or a value with a bare comma
    without -m (`sweep_value_message`), or one that sets a key the composed config lacks (`unknown_key_message`).
    Options and keys are looked for only in klalm's configs, so those two checks are left to Hydra when the command
    line adds folders to the search path."""
    message = override_syntax_message(overrides)
    if message is not None:
        raise ConfigError(message)
    own_configs_only = not _adds_config_folders(overrides)
    for override in overrides:
        if override.startswith("-") or "=" not in override:
            continue
        message = renamed_option_message(override.split("=", 1)[0].lstrip("+~"))
        if message is None and own_configs_only:
            message = unknown_group_option_message(override)
        if message is not None:
            raise ConfigError(message)
    message = sweep_value_message(overrides, sweeps="klalm-train")
    if message is not None:
        raise ConfigError(message)
    if own_configs_only:
        message = unknown_key_message("train", overrides)
        if message is not None:
            raise ConfigError(message)


def override_syntax_message(arguments: list[str]) -> str | None:
    """For a command line with an override Hydra's grammar cannot read (`trainer.max_steps=[1,2`, an unquoted `[` or
    `]` in a text value), the one-line refusal naming that override: Hydra says only "no viable alternative at input
    '[1,2'" and where its grammar is documented, in four lines. None when every override reads."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for argument in get_args_parser().parse_known_args(arguments)[0].overrides:  # not a flag's value (`--cfg job`)
        try:
            parser.parse_overrides([argument])
        except OverrideParseException as err:
            reason = str(err).strip().splitlines()[0]
            return (
                f"cannot read the override {argument!r} ({reason}); a value with brackets, braces, commas or spaces"
                f" that is meant as text goes in quotes inside the shell's: key='\"text\"'"
            )
    return None


def sweep_value_message(arguments: list[str], sweeps: str | None = None) -> str | None:
    """For `key=a,b` in a command line without --multirun (`checkpoint=runs/a,runs/b` meant as a list), the one-line
    refusal naming the override and how to write a list or a text: Hydra reads a bare comma as a sweep's values and
    says so in five lines. `sweeps`: the command, where it runs Hydra's sweeps (`klalm-train`), so that the line also
    says a sweep needs -m. None when no override is such a value, or the command line sweeps: with -m, or through an
    override that sets Hydra's multirun mode (`sweep=archs_45m`, `hydra.mode=MULTIRUN`: `_multirun_by_overrides`)."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType
    from hydra.errors import OverrideParseException

    args = get_args_parser().parse_known_args(arguments)[0]
    if args.multirun or _multirun_by_overrides(args.overrides):
        return None
    parser = OverridesParser.create()
    for argument in args.overrides:
        try:
            [override] = parser.parse_overrides([argument])
        except OverrideParseException:
            continue  # (override_syntax_message's to say)
        if override.value_type == ValueType.SIMPLE_CHOICE_SWEEP:
            key, value = argument.split("=", 1)
            sweep = f", which needs -m (`{sweeps} -m ... {argument}` runs one job per value)" if sweeps else ""
            return (f"{argument}: Hydra reads a comma outside brackets and quotes as a sweep over values{sweep}; a "
                    f"list is written '{key}=[{value}]', a text with commas {key}='\"{value}\"'")  # fmt: skip
    return None


def _adds_config_folders(arguments: list[str]) -> bool:
    """Whether the command line adds config folders (`--config-dir`, `hydra.searchpath=...`) or names another config."""
    return any(arg.lstrip("+").startswith(SEARCH_PATH_ARGUMENTS) for arg in arguments)


def _multirun_by_overrides(overrides: list[str]) -> bool:
    """Whether an override puts Hydra in multirun mode without -m: `hydra.mode=MULTIRUN`, or a config group option of
    klalm's configs that sets it (`sweep=archs_45m`: configs/sweep/*.yaml, documented without -m). Hydra then sweeps
    every `key=a,b` of the command line too."""
    for override in overrides:
        if "=" not in override:
            continue
        key, value = override.split("=", 1)
        key = key.lstrip("+~")
        if key == "hydra.mode":
            if value.strip() == "MULTIRUN":
                return True
            continue
        group = key.split("@")[0]
        if not re.fullmatch(r"\w+", group) or not files("klalm.configs").joinpath(group).is_dir():
            continue
        for option in value.split(","):
            config = files("klalm.configs").joinpath(group).joinpath(f"{option.strip()}.yaml")
            if config.is_file() and OmegaConf.select(OmegaConf.create(config.read_text()), "hydra.mode") == "MULTIRUN":
                return True
    return False


def unknown_key_message(config_name: str, arguments: list[str]) -> str | None:
    """For a command line whose `key=value` override names a key the composed config lacks (`model.d_modle=64`), the
    one-line refusal naming the nearest key there: Hydra says it in six lines and suggests `+model.d_modle=64`, which
    would add a key nothing reads. None when the config composes, fails for another reason (Hydra's to report), or
    the command line has flags (`-m`, `--cfg`, a config folder: left to Hydra; a sweep's jobs get this check from
    `klalm.train.sweep`). Composes the config (about 0.2 s) only when some override sets a key, not a config group's
    option."""
    if not _key_overrides(arguments) or _adds_config_folders(arguments) or any(a.startswith("-") for a in arguments):
        return None
    from hydra import compose, initialize_config_module

    with initialize_config_module("klalm.configs", version_base="1.3"):
        return missing_key_message(config_name, arguments, lambda overrides: compose(config_name, overrides=overrides))


def _key_overrides(arguments: list[str]) -> dict[str, str]:
    """The overrides that set a key, not a config group's option: override -> its key."""
    keys = {a: a.split("=", 1)[0] for a in arguments if "=" in a and re.fullmatch(r"[\w.]+", a.split("=", 1)[0])}
    return {a: key for a, key in keys.items() if "." in key or not files("klalm.configs").joinpath(key).is_dir()}


def missing_key_message(
    config_name: str, arguments: list[str], compose: Callable[[list[str]], DictConfig]
) -> str | None:
    """`unknown_key_message`'s refusal for overrides that `compose` (overrides -> the composed config, raising
    Hydra's exception) composes, as the running Hydra does for a sweep's job; None when they compose, or fail for
    another reason."""
    from hydra.errors import HydraException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    candidates = _key_overrides(arguments)
    try:
        compose(arguments)
        return None
    except HydraException as err:  # (a bad override's syntax too: Hydra's to report)
        missing = err.__cause__
    if not isinstance(missing, (ConfigAttributeError, ConfigKeyError)) or "not in struct" not in str(missing):
        return None
    bad = next((a for a, key in candidates.items() if f"{key}.".startswith(f"{missing.full_key}.")), None)
    if bad is None:
        return None
    try:  # without every key it sets: another unknown one would fail this too
        config = compose([a for a in arguments if a not in candidates])
    except HydraException:
        return None
    parent, _, key = missing.full_key.rpartition(".")
    try:
        node = OmegaConf.select(config, parent) if parent else config
    except OmegaConfBaseException:  # a value that resolves only in a run (`${hydra:runtime.output_dir}`)
        node = None
    if not isinstance(node, DictConfig):
        return f"{bad}: {parent} is a value, not a group of keys"
    near = difflib.get_close_matches(key, [str(k) for k in node], n=1)
    hint = f" (did you mean {parent + '.' if parent else ''}{near[0]}?)" if near else ""
    return f"{bad}: {parent or 'the config'} has no key {key!r}{hint}; `klalm-{config_name} --help` lists the keys"


def config_group_options(group: str) -> list[str]:
    """The options of a config group of klalm's configs (configs/<group>/*.yaml), private ones (`_kla`) included."""
    folder = files("klalm.configs").joinpath(group)
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def unknown_group_option_message(override: str) -> str | None:
    """For `group=option` (or a sweep `group=a,b`) naming a group of configs/ with no such option, the one-line
    refusal with the nearest option and the public ones (names not starting with `_`), and for `group=null` the way to
    leave a group out (`~group`); None for anything else, which Hydra checks (a dotted key, a function such as
    `glob(...)`, a quoted value)."""
    key, value = override.split("=", 1)
    group = key.lstrip("+").split("@")[0]  # (`~group=value` deletes; Hydra checks the value)
    folder = files("klalm.configs").joinpath(group)
    if not re.fullmatch(r"\w+", group) or not folder.is_dir() or not re.fullmatch(r"[\w.-]+(,[\w.-]+)*", value):
        return None
    if value == "null":  # Hydra 1.3 ends `logger=null` with a ValueError traceback
        return f"{override}: a config group cannot be set to null; leave it out with ~{group}"
    options = config_group_options(group)
    for option in value.split(","):
        if option not in options:
            public = [name for name in options if not name.startswith("_")]
            near = difflib.get_close_matches(option, public, n=1)
            hint = f" (did you mean {group}={near[0]}?)" if near else ""
            return f"{group}={option}: configs/{group} has no option {option!r}{hint}; its options: {', '.join(public)}"
    return None


# Groups whose keys klalm itself reads: a key added with `+` that the base config does not have is a typo (Hydra's
# struct mode stops `train.max_tokns=5` but suggests `+train.max_tokns=5`, which would then be ignored).
CLOSED_GROUPS = ("train",)


def _base_train_config() -> DictConfig:
    return OmegaConf.load(files("klalm.configs").joinpath("train.yaml"))


def check_known_keys(cfg: DictConfig) -> None:
    """Refuses a key of a `CLOSED_GROUPS` group, or a top-level key, that the base config (configs/train.yaml) lacks,
    naming the nearest known key."""
    base = _base_train_config()
    groups = {name for entry in base.defaults if isinstance(entry, DictConfig) for name in entry}  # model, data, ...
    places = [("", (set(base.keys()) - {"defaults"}) | groups, cfg.keys())]
    places += [(f"{group}.", set(base[group].keys()), (cfg.get(group) or {}).keys()) for group in CLOSED_GROUPS]
    for prefix, known, keys in places:
        for key in sorted(set(keys) - known):
            near = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {prefix}{near[0]}?)" if near else ""
            raise ConfigError(f"{prefix}{key} is not a klalm-train key{hint}: nothing reads it")


# The `klalm-train` groups whose target is a `_partial_` one, called only once the run has built its data and model
# (the optimiser with the parameters, the schedule with the optimiser).
PARTIAL_GROUPS = ("optim", "scheduler")


def check_target_arguments(key: str, node: DictConfig, target: Any) -> None:
    """Refuses the first key of `node` (the config at `key`) that `target` takes no argument for, naming the nearest
    (no check for a target with `**kwargs` or without a signature)."""
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    names = sorted(p.name for p in params)
    for name in (n for n in node if not n.startswith("_") and n not in names):
        near = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {key}.{near[0]}?)" if near else ""
        raise ConfigError(f"{key}.{name} is not an argument of {node._target_}{hint}")


def resolve_target(key: str, node: DictConfig) -> Any:
    """The callable that `node._target_` (the config at `key`) names, located and authorised as Hydra's instantiate
    locates and authorises it: Hydra's target policy checks the name before anything is imported (a blocklisted target
    such as `os.remove` or `shutil.rmtree`, or one that lets config data run code, is refused without importing its
    module), and the identity of what the name resolves to after. A target that cannot be (no dotted path, refused by
    the policy, a missing module or name, a module that raises as it is imported, not a callable) is refused in one
    line naming the key and the target, where Hydra printed four lines as each job built it.

    Raises:
        ConfigError: naming `<key>._target_`, the target and why (for an import, the error the import raised)."""
    from hydra._internal.target_policy import (  # the calls and their order of Hydra's instantiate (_resolve_target)
        _EXPECTED_TARGET_POLICY_DIGEST,
        _authorize_resolved_target_identity,
        _authorize_target_name,
        _target_policy_context,
        _validated_target_policy,
    )
    from hydra._internal.utils import _locate  # (hydra.utils.get_object logs its failure as an error first)
    from hydra.errors import InstantiationException

    target = node._target_
    if not isinstance(target, str):
        raise ConfigError(f"{key}._target_={target!r} is invalid: must be a dotted path such as torch.optim.AdamW")
    try:
        with _target_policy_context(_validated_target_policy(_EXPECTED_TARGET_POLICY_DIGEST)):
            _authorize_target_name(target, target, "")
            try:
                found = _locate(target)
            except Exception as err:  # a relative path's ValueError, or whatever the import raised, in ImportError
                cause = err.__cause__ if isinstance(err.__cause__, Exception) else err  # (its repr: one line)
                raise ConfigError(f"{key}._target_={target} cannot be imported: {cause!r}") from err
            _authorize_resolved_target_identity(found, target, "")
    except InstantiationException as err:  # Hydra's refusal, in several lines
        reason = " ".join(str(err).split())
        raise ConfigError(f"{key}._target_={target} is refused by Hydra's target policy: {reason}") from err
    if not callable(found):
        raise ConfigError(f"{key}._target_={target} is not a callable but of type {type(found).__name__}")
    return found


def check_partial_targets(cfg: DictConfig) -> None:
    """`resolve_target` and `check_target_arguments` for each of `PARTIAL_GROUPS` (`+optim.llr=1e-3`: AdamW takes no
    `llr`), for a sweep's check of its jobs before the first one trains (`klalm.train.sweep`); a single run checks
    each as it instantiates it (`klalm.train.app.instantiate_group`). Unlike the rest of this module, this imports
    the targets (the optimiser's: torch)."""
    for key in PARTIAL_GROUPS:
        node = OmegaConf.select(cfg, key)
        if isinstance(node, DictConfig) and "_target_" in node:
            check_target_arguments(key, node, resolve_target(key, node))


def _check_kernel_backends(cfg: DictConfig) -> None:
    """A mixer forced onto the Triton kernels needs a GPU: refused on `trainer.accelerator=cpu` (unless the Triton
    interpreter is on, as in the kernel tests) before any model is built."""
    if str(OmegaConf.select(cfg, "trainer.accelerator", default="")) != "cpu" or os.environ.get("TRITON_INTERPRET"):
        return
    for mixer, values in (OmegaConf.select(cfg, "model.mixer_options") or {}).items():
        if (values or {}).get("backend") == "triton":
            raise ConfigError(
                f"model.mixer_options.{mixer}.backend=triton needs a CUDA GPU, and trainer.accelerator=cpu here: "
                "use backend=auto (Triton on a GPU, torch elsewhere) or torch"
            )


def warmup_steps_of(warmup: float, total_steps: int) -> int:
    """`warmup` < 1 is a fraction of the run, ≥ 1 a step count."""
    return int(round(warmup * total_steps)) if warmup < 1 else int(warmup)


def check_schedule(
    total_steps: int, warmup_steps: int, min_lr_ratio: float, warmup_key: str = "scheduler.warmup"
) -> None:
    """Raise ConfigError (a ValueError; `klalm-train` refuses it in one line) naming the scheduler key that is out of
    range (`warmup_key`: the warmup's key as the caller's config names it): found once the run knows its length."""
    if total_steps <= 0:
        raise ConfigError(f"scheduler total_steps must be positive, got {total_steps}")
    if not 0 <= warmup_steps < total_steps:
        raise ConfigError(f"{warmup_key} gives {warmup_steps} warmup steps: must be in [0, {total_steps}), the run's "
                          f"steps")  # fmt: skip
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ConfigError(f"scheduler.min_lr_ratio={min_lr_ratio} must be in [0, 1]")


def check_takes_a_step(max_tokens: int, global_batch_tokens: int) -> None:
    """Raises ConfigError when a budget of `max_tokens` holds no global batch (the fresh run's check here, a resumed
    run's in `klalm.train.budget.derive_budget`)."""
    if max_tokens < global_batch_tokens:
        raise ConfigError(
            f"train.max_tokens={max_tokens} is smaller than one global batch (train.global_batch_tokens="
            f"{global_batch_tokens}): the run would take no step"
        )


def _check_run_length(cfg: DictConfig) -> None:
    """A fresh run's length, `train.max_tokens // train.global_batch_tokens` steps, must hold a step and more steps
    than its warmup (`scheduler.warmup`, where the scheduler has one), whose lr would otherwise never reach
    `optim.lr`: the run refused either only once it had loaded its data and built its model, and a sweep's job only
    as it started, after the jobs before it had trained. A resume counts from its checkpoint's steps and tokens, so
    its length is checked as the checkpoint is read."""
    if cfg.resume is not None:
        return
    max_tokens, batch_tokens = cfg.train.max_tokens, cfg.train.global_batch_tokens
    check_takes_a_step(max_tokens, batch_tokens)
    warmup = _value(cfg, "scheduler.warmup")
    if warmup is _ABSENT:
        return
    steps = max_tokens // batch_tokens
    warmup_steps = warmup_steps_of(warmup, steps)
    if warmup_steps >= steps:
        raise ConfigError(
            f"scheduler.warmup={warmup} gives {warmup_steps} warmup steps, not fewer than the run's {steps} "
            "(train.max_tokens // train.global_batch_tokens): its lr would never reach optim.lr"
        )


def check_train_config(cfg: DictConfig, *, check_paths: bool = True, check_length: bool = True) -> None:
    """The `klalm-train` checks: known keys, TRAIN_RULES, no renamed mixer option, Triton only on a GPU, a fresh run
    longer than its warmup, and that an explicit `resume` path exists.

    `check_paths=False` leaves out that last check, the only one of a file the run reads (`resume` is still
    type-checked): for a sweep's check of every job before the first one starts (`klalm.train.sweep`), since an
    earlier job of the sweep may create that path. Each job runs every check again as it starts. `check_length=False`
    leaves out the run's length (`_check_run_length`): for a config whose `train.max_tokens` no run uses, the study's
    experiment, whose cells each set their own and are checked with it (`klalm.study.runner.read_recipe`)."""
    check_known_keys(cfg)
    _check_switchable_entries(cfg)
    check(cfg, TRAIN_RULES)
    _check_kernel_backends(cfg)
    options = OmegaConf.select(cfg, "model.mixer_options")
    for mixer, values in (options or {}).items():
        for option in values or {}:
            message = renamed_option_message(f"model.mixer_options.{mixer}.{option}")
            if message is not None:
                raise ConfigError(message)
    if check_length:
        _check_run_length(cfg)
    if check_paths and cfg.resume not in (None, "auto") and not Path(cfg.resume).exists():
        raise ConfigError(f"resume={cfg.resume!r}: no such checkpoint file or run directory")


def _check_switchable_entries(cfg: DictConfig) -> None:
    """Each entry of `callbacks` and `logger` is a config (with its `_target_`) or null, which turns it off:
    `callbacks.sampler=false` (or `=nul`) built the data and the model first and then failed in Hydra's instantiate,
    in lines that named no key."""
    for group in ("callbacks", "logger"):
        for name, entry in (OmegaConf.select(cfg, group) or {}).items():
            if entry is not None and not OmegaConf.is_dict(entry):
                raise ConfigError(f"{group}.{name}={entry!r}: give it a config, or {group}.{name}=null to turn it off")


def check_run_dir(cfg: DictConfig, output_dir: str, *, sweep: bool = False) -> None:
    """`paths.run_dir` must be the folder Hydra runs the job in (`output_dir`: hydra.run.dir, or a sweep job's
    folder), where it writes train.log and the config record: a run given another wrote its checkpoints, export and
    summary there and the rest to a second folder, each with its own lock."""
    run_dir = cfg.paths.run_dir
    if os.path.realpath(run_dir) != os.path.realpath(output_dir):
        instead = ("leave it out: a sweep's job folders are hydra.sweep.dir/hydra.sweep.subdir" if sweep
                   else f"set hydra.run.dir={run_dir} instead (paths.run_dir follows it)")  # fmt: skip
        raise ConfigError(f"paths.run_dir={run_dir} is not the run folder: {instead}")


def check_known_eval_keys(cfg: DictConfig) -> None:
    """Refuses a top-level key that configs/eval.yaml lacks (added with `+`, which Hydra accepts and nothing reads),
    naming the nearest known key."""
    known = sorted(OmegaConf.load(files("klalm.configs").joinpath("eval.yaml")).keys())
    for key in sorted(set(cfg.keys()) - set(known)):
        near = difflib.get_close_matches(key, known, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ConfigError(f"{key} is not a klalm-eval key{hint}: nothing reads it")


def check_eval_config(cfg: DictConfig) -> None:
    """The `klalm-eval` checks: known keys and EVAL_RULES (paths, tasks and dtype are checked before any model
    loads)."""
    check_known_eval_keys(cfg)
    check(cfg, EVAL_RULES)
