"""The console scripts answer `--help`, `--cfg job` and config errors before torch is imported; config checks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from klalm.cli import check_hydra_flags
from klalm.cli.helptext import key_comments
from klalm.config_checks import (
    TRAIN_RULES,
    WSD_SHAPES,
    ConfigError,
    check_eval_config,
    check_overrides,
    check_train_config,
    override_syntax_message,
    unknown_key_message,
)
from klalm.errors import one_line

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _in_fresh_python(entry: str, argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """Runs `klalm.cli.<entry>()` with `argv` in a new interpreter; prints HEAVY if torch got imported."""
    code = textwrap.dedent(f"""
        import sys
        sys.argv = {[entry, *argv]!r}
        from klalm import cli
        try:
            cli.{entry}()
        finally:
            print("HEAVY" if "torch" in sys.modules or "lightning" in sys.modules else "LIGHT")
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)


def test_train_help_names_the_app_explains_keys_and_hides_internal_groups(tmp_path):
    proc = _in_fresh_python("train", ["experiment=smoke", "--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("klalm-train: pretrain a language model") and out.rstrip().endswith("LIGHT")
    assert "* smoke" in out and "* kla_tiny" in out  # the choices of this command line are marked
    assert "_pretrain_45m " not in out and "  synthetic:" not in out and "  hydra:" not in out
    assert "max_tokens: 10240" in out  # the smoke experiment's value, with the root file's comment:
    assert "# training budget in tokens" in out
    assert "d_state: null" in out and "# S: filter state size per channel [16]" in out
    assert "_target_" not in out


def test_eval_help_and_tasks_path(tmp_path, monkeypatch, capsys):
    proc = _in_fresh_python("evaluate", ["--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("klalm-eval: zero-shot lm-eval") and "LIGHT" in proc.stdout
    assert "limit: null" in proc.stdout and "# examples per task" in proc.stdout
    # --print-tasks-path in this process: a fresh one spent ~10 s importing torch and lm-eval for one printed line
    # (the README's `$(klalm-eval --print-tasks-path)` in a shell: tests/eval/test_app.py's slow lm-eval test)
    from klalm import cli

    monkeypatch.setattr(sys, "argv", ["klalm-eval", "--print-tasks-path"])
    cli.evaluate()
    folder = Path(capsys.readouterr().out.splitlines()[0])
    assert (folder / "piqa_local.yaml").is_file() and (folder / "hellaswag_local.yaml").is_file()


def test_cfg_job_and_a_bad_value_answer_before_torch(tmp_path):
    proc = _in_fresh_python("train", ["model=kla_45m", "model.mixer_options.kla.d_state=8", "--cfg", "job"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "d_state: 8" in proc.stdout and proc.stdout.rstrip().endswith("LIGHT")
    proc = _in_fresh_python("train", ["optim.lr=abc"], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "klalm-train: optim.lr='abc' is invalid: must be a finite number"
    assert proc.stdout.strip() == "LIGHT"
    proc = _in_fresh_python("evaluate", ["checkpoint=x", "limit=many"], tmp_path)
    assert proc.returncode == 1 and proc.stderr.strip().startswith("klalm-eval: limit='many' is invalid")


def test_a_run_folder_given_as_paths_run_dir_is_refused(tmp_path):
    """paths.run_dir follows hydra.run.dir: given alone, the checkpoints and export went to it and train.log and the
    config record to a second folder. One line, and neither folder stays."""
    proc = _in_fresh_python("train", ["experiment=smoke", "paths.run_dir=elsewhere"], tmp_path)
    assert proc.returncode == 1 and proc.stdout.strip() == "LIGHT"
    assert proc.stderr.strip() == (
        "klalm-train: paths.run_dir=elsewhere is not the run folder: set hydra.run.dir=elsewhere instead "
        "(paths.run_dir follows it)"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def compose_config():
    """Composes a config; Hydra is initialised only for the call (`unknown_key_message` initialises it itself)."""

    def composed(name: str, overrides: list[str]):
        with initialize_config_module("klalm.configs", version_base="1.3"):
            return compose(name, overrides=overrides)

    return composed


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.lr=abc", "optim.lr='abc' is invalid: must be a finite number"),
        ("optim.lr=inf", "optim.lr=inf is invalid: must be a finite number"),
        ("optim.weight_decay=nan", "optim.weight_decay=nan is invalid: must be a finite number"),
        ("optim.lr=0", "optim.lr=0 is invalid: must be > 0"),
        ("train.max_tokens=1e6", "train.max_tokens=1000000.0 is invalid: must be an integer"),
        ("train.compile=yes", "train.compile='yes' is invalid: must be true, false or blocks"),
        ("seed=x", "seed='x' is invalid: must be an integer"),
        ("data.seq_len=-4", "data.seq_len=-4 is invalid: must be > 0"),
        ("model.d_model=wide", "model.d_model='wide' is invalid: must be an integer"),
        ("scheduler.min_lr_ratio=2", "scheduler.min_lr_ratio=2 is invalid: must be in [0, 1]"),
        ("callbacks.checkpoint.keep_last=0", "callbacks.checkpoint.keep_last=0 is invalid: must be > 0"),
        ("trainer.precision=16-mixed", "trainer.precision='16-mixed' is invalid: must be one of"),
        ("resume=/no/such.ckpt", "resume='/no/such.ckpt': no such checkpoint file or run directory"),
        ("optim.betas=[0.9]", "optim.betas=[0.9] is invalid: must be a list of two numbers in [0, 1)"),
        ("optim.eps=0", "optim.eps=0 is invalid: must be > 0"),
        ("data.on_bad_record=ignore", "data.on_bad_record='ignore' is invalid: must be raise or skip"),
        ("+train.max_tokns=5", "train.max_tokns is not a klalm-train key (did you mean train.max_tokens?)"),
        ("+sed=3", "sed is not a klalm-train key (did you mean seed?)"),
        ("model.mixer_options.kla.backend=triton", "model.mixer_options.kla.backend=triton needs a CUDA GPU"),
        ("callbacks.sampler=false", "callbacks.sampler=False: give it a config, or callbacks.sampler=null to turn it"),
        ("logger.csv=nul", "logger.csv='nul': give it a config, or logger.csv=null to turn it off"),
        ("scheduler.warmup=20", "scheduler.warmup=20 gives 20 warmup steps, not fewer than the run's 20 (train.max_"
         "tokens // train.global_batch_tokens): its lr would never reach optim.lr"),  # experiment=smoke: 20 steps
        ("scheduler.warmup=0.99", "scheduler.warmup=0.99 gives 20 warmup steps, not fewer than the run's 20"),
        ("train.max_tokens=100", "train.max_tokens=100 is smaller than one global batch (train.global_batch_tokens="
         "512): the run would take no step"),
    ],
)  # fmt: skip
def test_train_checks_name_the_key(compose_config, override, message, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # (the kernel tests' setting: Triton allowed on the CPU)
    with pytest.raises(ConfigError) as info:
        check_train_config(compose_config("train", ["experiment=smoke", override]))
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.train=[]", "data.train=[] is invalid: must be a path or a non-empty list of paths"),
        ("data.val=[]", "data.val=[] is invalid: must be a path or a non-empty list (null: none)"),
        ("data.bpe_vocab_size=100", "data.bpe_vocab_size=100 is invalid: must be > 256 (the 256 bytes and EOS)"),
    ],
)
def test_data_files_checks_name_the_key(compose_config, override, message):
    """Refused once the data module was built, naming neither key: "files source needs at least one path or glob
    pattern in `paths`" for train and val alike, "vocab_size must be > 256"."""
    cfg = compose_config("train", ["experiment=smoke", "data=files", "data.train=a.jsonl", override])
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        check_train_config(cfg)


def test_train_checks_pass_valid_configs_and_skip_what_is_off(compose_config):
    check_train_config(compose_config("train", ["experiment=smoke", "optim.lr=1", "model.d_model=null"]))
    check_train_config(
        compose_config("train", ["experiment=smoke", "callbacks.checkpoint=null", "trainer.devices=auto"])
    )
    check_train_config(compose_config("train", ["scheduler=wsd", "trainer.precision=32"]))  # an int for a string
    check_train_config(compose_config("train", ["experiment=smoke", "scheduler.warmup=19"]))  # 20 steps: one left
    check_train_config(compose_config("train", ["experiment=smoke", "scheduler.warmup=50", "resume=auto"]))  # counted
    # from the checkpoint it resumes, as it is read
    with pytest.raises(ConfigError, match="scheduler.decay_frac"):
        check_train_config(compose_config("train", ["scheduler=wsd", "scheduler.decay_frac=1.5"]))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [  # each of these once ran into a traceback mid-start (leaving a run folder) or trained with the bad value
        (["scheduler=wsd", "scheduler.decay_frac=0"], "scheduler.decay_frac=0 is invalid: must be in (0, 1]"),
        (["scheduler=wsd", "scheduler.shape=cubic"], "scheduler.shape='cubic' is invalid: must be linear, 1-sqrt or"),
        (["data.block_docs=0"], "data.block_docs=0 is invalid: must be > 0"),
        (["data.shuffle=abc"], "data.shuffle='abc' is invalid: must be true or false"),
        (["data.seed=x"], "data.seed='x' is invalid: must be an integer"),
        (["optim.fused=abc"], "optim.fused='abc' is invalid: must be true or false"),
        (["callbacks.metrics.peak_flops_per_device=abc"], "callbacks.metrics.peak_flops_per_device='abc' is invalid"),
    ],
)
def test_train_checks_cover_the_data_optim_scheduler_and_metrics_keys(compose_config, overrides, message):
    with pytest.raises(ConfigError) as info:
        check_train_config(compose_config("train", ["experiment=smoke", *overrides]))
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_the_wsd_shapes_checked_are_the_ones_the_schedule_has(compose_config):
    from klalm.train.optim import DECAY_SHAPES

    assert set(WSD_SHAPES) == set(DECAY_SHAPES)
    for shape in WSD_SHAPES:
        check_train_config(compose_config("train", ["scheduler=wsd", f"scheduler.shape={shape}"]))
    check_train_config(compose_config("train", ["scheduler=wsd", "scheduler.decay_frac=1", "optim.fused=null"]))


def test_eval_checks_name_the_key(compose_config):
    check_eval_config(compose_config("eval", ["checkpoint=[a,b]", "limit=5"]))
    with pytest.raises(ConfigError, match=r"^checkpoint is required"):
        check_eval_config(compose_config("eval", []))
    with pytest.raises(ConfigError, match=r"^batch_size=0 is invalid: must be > 0$"):
        check_eval_config(compose_config("eval", ["checkpoint=a", "batch_size=0"]))
    for bad in ("[]", "[run/hf,./run/hf/]", "''"):  # an empty list and a repeat once ended in a traceback
        with pytest.raises(ConfigError, match=r"^checkpoint=.* is invalid: must be one path or a list of distinct"):
            check_eval_config(compose_config("eval", [f"checkpoint={bad}"]))


def test_every_key_of_train_yaml_has_a_rule():
    root = OmegaConf.load(CONFIGS / "train.yaml")
    keys = {f"train.{key}" for key in root.train} | {key for key in root if key not in ("defaults", "train")}
    assert keys <= {rule.key for rule in TRAIN_RULES}


def test_key_comments_follow_nesting_and_ignore_hashes_in_values():
    text = 'a:\n  b: "x # not a comment"   # what b means\n  c: d#e\nf: 1 # top\n  # a full-line comment\n'
    assert key_comments(text, "pkg") == {"pkg.a.b": "what b means", "pkg.f": "top"}


def test_a_renamed_key_is_refused_naming_the_new_one(tmp_path):
    proc = _in_fresh_python("train", ["experiment=smoke", "model.mixer_options.kla.conv_kernel=3"], tmp_path)
    assert proc.returncode == 1
    assert "klalm-train: model.mixer_options.kla.conv_kernel was renamed: use model.mixer_options.kla.d_conv" in (
        proc.stderr
    )
    assert proc.stdout.rstrip().endswith("LIGHT")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model=kla_45", "model=kla_45: configs/model has no option 'kla_45' (did you mean model=kla_45m?); its "
         "options: gdn_180m, gdn_45m, gdn_tiny, gpt_180m,"),
        ("experiment=smoke,gpt_45", "experiment=gpt_45: configs/experiment has no option 'gpt_45' (did you mean "
         "experiment=gpt_45m?)"),  # one value of a sweep
        ("+trainer=cpux", "trainer=cpux: configs/trainer has no option 'cpux' (did you mean trainer=cpu?)"),
        ("logger=null", "logger=null: a config group cannot be set to null; leave it out with ~logger"),
    ],
)  # fmt: skip
def test_an_unknown_group_option_is_refused_in_one_line_naming_the_nearest(override, message):
    """Hydra prints every option (private `_kla` ones too) and its search path over about 30 lines, and a
    traceback for `group=null`."""
    with pytest.raises(ConfigError) as refused:
        check_overrides([override])
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)
    assert ", _" not in str(refused.value) and ": _" not in str(refused.value)  # no private option listed


@pytest.mark.parametrize(
    "override", ["model=kla_45m", "-m", "model.d_model=64", "hydra/launcher=basic", "~logger", "data=glob(*)", "+x=y"]
)
def test_group_options_that_exist_and_other_overrides_pass_to_hydra(override):
    check_overrides([override])


@pytest.mark.parametrize(
    "arguments",
    [["--config-dir", "/tmp/mine", "experiment=mine"], ["-cd=/tmp/mine", "experiment=mine"],
     ["experiment=mine", "hydra.searchpath=[file:///tmp/mine]"], ["+hydra.searchpath=[pkg://x]", "model=mine"]],
)  # fmt: skip
def test_options_from_folders_added_to_the_search_path_are_left_to_hydra(arguments):
    """A user's own config folder may hold `experiment/mine.yaml`: only Hydra knows its search path."""
    check_overrides(arguments)


@pytest.mark.parametrize(
    ("config", "arguments", "message"),
    [
        ("train", ["model.d_modle=64"], "model.d_modle=64: model has no key 'd_modle' (did you mean model.d_model?)"),
        ("train", ["experiment=smoke", "model=kla_45m", "model.mixer_options.kla.blok=plain"],
         "model.mixer_options.kla.blok=plain: model.mixer_options.kla has no key 'blok' (did you mean "
         "model.mixer_options.kla.block?)"),
        ("train", ["resum=auto"], "resum=auto: the config has no key 'resum' (did you mean resume?)"),
        ("train", ["modle.d_model=3"], "modle.d_model=3: the config has no key 'modle' (did you mean model?)"),
        ("train", ["x=y"], "x=y: the config has no key 'x'; `klalm-train --help` lists the keys"),
        ("train", ["optim.lr.x=1"], "optim.lr.x=1: optim.lr is a value, not a group of keys"),
        ("train", ["paths.run_dir.x=1"], "paths.run_dir.x=1: paths.run_dir is a value"),  # ${hydra:...}: not resolved
        ("train", ["train.max_tokns=5", "model.d_modle=3"], "train.max_tokns=5: train has no key 'max_tokns'"),
        ("eval", ["checkpoint=x", "limt=3"], "limt=3: the config has no key 'limt' (did you mean limit?)"),
    ],
)  # fmt: skip
def test_an_unknown_key_is_refused_in_one_line_naming_the_nearest(config, arguments, message):
    """Hydra says it in six lines and suggests adding the key with `+`, which nothing would read."""
    refusal = unknown_key_message(config, arguments)
    assert refusal is not None and refusal.startswith(message) and "\n" not in refusal
    if config == "train":
        with pytest.raises(ConfigError, match=r"has no key|not a group"):
            check_overrides(arguments)


@pytest.mark.parametrize(
    "arguments",
    [["model.d_model=64", "resume=auto"], ["experiment=smoke", "train.max_tokens=5"], ["model.d_model=["],
     ["model.d_modle=1", "--cfg", "job"], ["-m", "model.d_modle=1,2"], ["+model.d_modle=1"]],
)  # fmt: skip
def test_known_keys_flags_and_other_errors_are_left_to_hydra(arguments):
    assert unknown_key_message("train", arguments) is None


@pytest.mark.parametrize(
    ("override", "reason"),
    [("trainer.max_steps=[1,2", "'[1,2'"), ("run_name=a]b", "']'"), ("model.d_model={", "'{'")],
)
def test_an_override_hydra_cannot_read_is_refused_in_one_line_naming_it(override, reason):
    """Hydra says only "no viable alternative at input '[1,2'" and where its grammar is documented, in four lines."""
    with pytest.raises(ConfigError) as refused:
        check_overrides(["experiment=smoke", override])
    message = str(refused.value)
    assert message.startswith(f"cannot read the override {override!r} (") and reason in message
    assert "\n" not in message and "key='\"text\"'" in message
    assert override_syntax_message(["experiment=smoke", override]) == message


@pytest.mark.parametrize(
    "arguments",
    [
        ["run_name='\"a]b\"'"],
        ["-m", "optim.lr=1e-3,2e-3"],
        ["--cfg", "job"],
        ["optim.lr=range(1,3)"],
        ["x=[1,2]"],
        ["--config-dir", "/tmp/cfg=v2", "seed=1"],
        ["-cd", "/tmp/[x", "seed=1"],
    ],
)
def test_overrides_hydra_reads_pass_the_syntax_check(arguments):
    assert override_syntax_message(arguments) is None


@pytest.mark.parametrize("entry", ["train", "evaluate"])
def test_two_hydra_commands_are_refused_in_one_line_before_torch(entry, tmp_path):
    """Hydra raises a ValueError for `-m ... --cfg job`: a traceback."""
    proc = _in_fresh_python(entry, ["-m", "seed=1,2", "--cfg", "job"], tmp_path)
    name = {"train": "klalm-train", "evaluate": "klalm-eval"}[entry]
    assert proc.returncode == 1 and proc.stdout.strip() == "LIGHT"
    assert (
        proc.stderr.strip()
        == f"{name}: --multirun and --cfg cannot be given together: Hydra takes one of them per command"
    )


def test_one_hydra_command_and_its_flags_pass():
    check_hydra_flags(["--cfg", "job", "--package", "model", "experiment=smoke"])
    check_hydra_flags(["-m", "--config-dir", "/tmp/x", "seed=1,2"])


def test_an_unknown_key_stops_both_commands_before_torch(tmp_path):
    proc = _in_fresh_python("train", ["model.d_modle=64"], tmp_path)
    assert proc.returncode == 1 and proc.stdout.strip() == "LIGHT"
    assert proc.stderr.strip().startswith("klalm-train: model.d_modle=64: model has no key 'd_modle'")
    proc = _in_fresh_python("evaluate", ["checkpoint=x", "limt=3"], tmp_path)
    assert proc.returncode == 1 and proc.stdout.strip() == "LIGHT"
    assert proc.stderr.strip() == ("klalm-eval: limt=3: the config has no key 'limt' (did you mean limit?); "
                                   "`klalm-eval --help` lists the keys")  # fmt: skip


def test_the_triton_backend_on_the_cpu_passes_under_the_interpreter(compose_config, monkeypatch):
    """The kernel tests run Triton on the CPU through its interpreter: the check lets that through."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    check_train_config(compose_config("train", ["experiment=smoke", "model.mixer_options.kla.backend=triton"]))


def test_one_line_takes_a_loader_workers_error_from_the_end_of_its_traceback():
    """A DataLoader worker's exception comes back as "Caught X in DataLoader worker process N." plus the worker's
    traceback, whose last line is the error; any other message gives its first line."""
    wrapped = ValueError(
        "Caught BadRecordError in DataLoader worker process 0.\nOriginal Traceback (most recent "
        'call last):\n  File "x.py", line 1\nklalm.data.records.BadRecordError: bad record at a:1'
    )
    assert one_line(wrapped) == "bad record at a:1"
    assert one_line(ValueError("first\nsecond")) == "first" and one_line(KeyError()) == "KeyError"


def test_klalm_train_names_its_own_setting_in_a_bad_records_hint():
    """The hint named the Python argument, on_bad_record='skip', which klalm-train does not take; its key is
    data.on_bad_record. Here as a loader worker's error comes back (`one_line` takes its last line)."""
    import time

    from klalm.cli import _refuse_run
    from klalm.data.records import BadRecordError, BadRecordPolicy, Record

    with pytest.raises(BadRecordError) as bad:
        BadRecordPolicy("raise").accept(Record(None, "a.jsonl:line 2", "corrupt_json", "Expecting value"))
    assert str(bad.value).endswith(" (set on_bad_record='skip' to skip and count such records)")  # the Python API's
    traceback = 'Original Traceback (most recent call last):\n  File "x.py", line 1'
    wrapped = BadRecordError(f"Caught BadRecordError in DataLoader worker process 0.\n{traceback}\n"
                             f"klalm.data.records.BadRecordError: {bad.value}")  # fmt: skip
    for err in (bad.value, wrapped):
        with pytest.raises(SystemExit) as stop:
            _refuse_run(err, time.time())
        assert stop.value.code == ("klalm-train: bad record at a.jsonl:line 2: corrupt_json: Expecting value (set "
                                   "data.on_bad_record=skip to skip and count such records)")  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "message", "log_dir_there"),
    [
        (["train.global_batch_tokens=100"], "klalm-train: train.global_batch_tokens=100 is not a multiple of", False),
        (["trainer.accelerator=mps"], "klalm-train: trainer: ", False),
        # slow (`make test-full`): a refusal from the data's setup ends as budget's and lightning's do (one line, no
        # folder), and its message is tests/data/test_local_files.py's (in-process)
        pytest.param(["data=files", "data.train=/no/such/corpus.jsonl", "data.tokenizer=bpe"],
                     "klalm-train: no file matches", False, id="data-file", marks=pytest.mark.slow),
        (["+optim.fused_x=1"], "klalm-train: optim.fused_x is not an argument of torch.optim.AdamW (did you mean ",
         False),
        (["+model.foo=1"], "klalm-train: model: build_model: unknown keys ['foo']", False),
        (["train.global_batch_tokens=100"], "klalm-train: train.global_batch_tokens=100 is not a multiple of", True),
    ],
    ids=["budget", "lightning", "data-file", "optim-argument", "model-key", "budget-log-dir-there"],
)  # fmt: skip
def test_a_run_refused_at_its_start_says_why_in_one_line_and_leaves_no_folder(tmp_path, overrides, message,
                                                                              log_dir_there):  # fmt: skip
    """Refusals raised once the run has begun (the token budget, Lightning's trainer) end like the config checks:
    one line, exit code 1, and the run folder Hydra had begun is gone, with the log folder it created for it (one
    that was there stays)."""
    log_dir = tmp_path / "out"
    if log_dir_there:
        log_dir.mkdir()
    proc = _in_fresh_python("train", ["experiment=smoke", "run_name=r", f"paths.log_dir={log_dir}", *overrides],
                            tmp_path)  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith(message) and "Traceback" not in proc.stderr
    assert not (log_dir / "r").exists() and log_dir.exists() == log_dir_there


def test_a_resume_of_a_folder_without_checkpoints_writes_nothing_into_it(tmp_path):
    """resume=<folder> that is no run folder (an export, an empty folder): refused in one line, and the folder
    keeps exactly what it held (before, the start wrote its config, log and lock into it first)."""
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    proc = _in_fresh_python("train", ["experiment=smoke", f"resume={folder}", f"paths.log_dir={tmp_path / 'out'}"],
                            tmp_path)  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"klalm-train: resume='{folder}': the folder holds no valid checkpoints/step-*.ckpt"
    )
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]
    assert not any((tmp_path / "out").rglob("*.log"))


def test_a_run_whose_export_folder_holds_other_files_is_refused_before_it_trains(tmp_path):
    """The export at the end would refuse a hf/ folder holding a file that is no earlier export's: refused at the
    start instead, in one line, the file kept (before, the run trained and then failed with a traceback)."""
    folder = tmp_path / "run"
    (folder / "hf").mkdir(parents=True)
    (folder / "hf" / "notes.txt").write_text("mine")
    proc = _in_fresh_python("train", ["experiment=smoke", f"hydra.run.dir={folder}"], tmp_path)
    assert proc.returncode == 1
    refusal = f"klalm-train: export folder '{folder / 'hf'}' already holds 'notes.txt'"
    assert proc.stderr.strip().splitlines()[-1].startswith(refusal)
    assert (folder / "hf" / "notes.txt").read_text() == "mine" and not (folder / "checkpoints").exists()


def test_a_diverged_run_ends_in_one_line_and_keeps_its_folder(tmp_path):
    """`max_bad_steps` non-finite steps in a row: one line naming the learning rate (it was Hydra's traceback), and
    the run's folder stays with the traceback in its train.log."""
    folder = tmp_path / "run"
    overrides = ["experiment=smoke", "optim.lr=1000", "train.max_bad_steps=3", f"hydra.run.dir={folder}"]  # not 10
    proc = _in_fresh_python("train", overrides, tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("klalm-train: 3 consecutive optimiser steps were non-finite") and "optim.lr=1000" in last
    assert "NonFiniteLossError" in (folder / "train.log").read_text()


def test_a_data_file_that_cannot_be_read_ends_the_run_in_one_line_naming_it(tmp_path, shared_data):
    """A damaged or mislabelled compressed file (or a parquet file without the field, a .json that is no array),
    found by a loader worker once training has begun, ended in Hydra's traceback, and gzip's message named no file."""
    corpus = tmp_path / "corpus.jsonl.gz"
    corpus.write_text('{"text": "not gzipped"}\n')
    overrides = ["experiment=smoke", "data=files", f"data.train={corpus}",
                 f"data.tokenizer={shared_data / 'gpt2_tokenizer'}", f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    proc = _in_fresh_python("train", overrides, tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == f"klalm-train: cannot read {corpus}: Not a gzipped file (b'{{\"')"


@pytest.mark.parametrize("buffered", [False, True], ids=["line-by-line", "flushed-at-exit"])
def test_params_into_a_pipe_closed_early_exits_quietly(tmp_path, buffered):
    """`klalm-params | head -1`: the reader closes the pipe after the first line; the command stops without a
    BrokenPipeError traceback (or, with its output in Python's buffer, without an "Exception ignored" at exit).

    The first count waits until the pipe is closed, so that every row comes after the reader has gone."""
    closed = tmp_path / "closed"
    code = textwrap.dedent(f"""
        import os, time
        import klalm.models.params as p
        count = p.preset_parameter_count
        def count_once_closed(*args, **kwargs):
            deadline = time.monotonic() + 60
            while not os.path.exists({str(closed)!r}) and time.monotonic() < deadline:
                time.sleep(0.01)
            return count(*args, **kwargs)
        p.preset_parameter_count = count_once_closed
        from klalm.cli import params
        params([])
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env = env if buffered else {**env, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=tmp_path, text=True)  # fmt: skip
    if not buffered:
        assert proc.stdout.readline().startswith("# preset parameters")
    proc.stdout.close()
    closed.touch()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 1
    assert stderr == ""


@pytest.mark.parametrize("closed_at", ["the first log line", "the progress bar"])
def test_a_training_run_into_a_pipe_closed_early_stops_quietly(tmp_path, closed_at):
    """`klalm-train ... | head -1`: whichever write meets the closed pipe first (a log record, through the console
    handler, or the progress bar) ends the run with exit code 1 and nothing on stderr, instead of a "--- Logging
    error ---" traceback per later line, or Hydra's report of the BrokenPipeError; the run's log says why it stopped."""
    code = textwrap.dedent(f"""
        import sys
        sys.argv = ["klalm-train", "experiment=smoke", "paths.log_dir={tmp_path / "out"}"]
        from klalm.cli import train
        train()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                            text=True)  # fmt: skip
    if closed_at == "the first log line":
        assert proc.stdout.readline()
    else:
        seen = ""
        while "train:" not in seen:  # the bar's first frame (it draws with carriage returns, no newline)
            char = proc.stdout.read(1)
            assert char, f"stdout ended before the progress bar: {seen[-300:]}"
            seen += char
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=300) == 1
    assert "Logging error" not in stderr and "Traceback" not in stderr and "HYDRA_FULL_ERROR" not in stderr, stderr
    (log,) = (tmp_path / "out").glob("*/*/train.log")
    assert "stopped: stdout's reader closed it" in log.read_text()


@pytest.mark.parametrize(
    ("ending", "rc", "stderr_is"),
    [("sys.exit(0)", 1, ""),  # as `klalm-study` ends: `sys.exit(main())`
     ("sys.exit('klalm-x: a refusal')", 1, "klalm-x: a refusal\n")],  # its message still reaches stderr
)  # fmt: skip
def test_a_command_ending_in_sys_exit_into_a_closed_pipe_exits_quietly(tmp_path, ending, rc, stderr_is):
    """Rows still in Python's buffer when the reader has gone are flushed by the wrapper of every console script
    that prints, not at interpreter exit ("Exception ignored")."""
    closed = tmp_path / "closed"
    code = textwrap.dedent(f"""
        import os, sys, time
        from klalm.cli import quiet_when_the_reader_stops
        @quiet_when_the_reader_stops
        def command():
            deadline = time.monotonic() + 60
            while not os.path.exists({str(closed)!r}) and time.monotonic() < deadline:
                time.sleep(0.01)
            print("| a | table |")
            {ending}
        command()
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=tmp_path, text=True)  # fmt: skip
    proc.stdout.close()
    closed.touch()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == rc
    assert stderr == stderr_is


def test_a_broken_pipe_that_is_not_stdout_is_not_hidden(tmp_path):
    """A command that writes into a subprocess that has exited gets its BrokenPipeError, stdout being fine."""
    code = textwrap.dedent("""
        import subprocess
        from klalm.cli import quiet_when_the_reader_stops
        @quiet_when_the_reader_stops
        def command():
            child = subprocess.Popen(["true"], stdin=subprocess.PIPE)
            child.wait()
            child.stdin.write(b"x" * 200_000)
            child.stdin.flush()
        command()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 1 and "BrokenPipeError" in proc.stderr


def test_a_command_started_with_stdout_closed_ends_as_it_would_otherwise(tmp_path):
    """`klalm-params >&-`: Python's sys.stdout is None; the wrapper's flush must not turn that into a traceback."""
    code = "from klalm.cli import params; params(['--preset', 'kla_tiny'])"
    proc = subprocess.run(["bash", "-c", f'exec "{sys.executable}" -c "{code}" >&-'], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)  # fmt: skip
    assert proc.returncode == 0 and proc.stderr == ""


def test_a_comma_separated_value_without_m_is_refused_in_one_line_saying_a_sweep_needs_it():
    """`optim.lr=1e-3,2e-3` without -m: Hydra's five lines on an "ambiguous" value; klalm-train runs sweeps with -m."""
    with pytest.raises(ConfigError) as refused:
        check_overrides(["experiment=smoke", "optim.lr=1e-3,2e-3"])
    assert str(refused.value) == (
        "optim.lr=1e-3,2e-3: Hydra reads a comma outside brackets and quotes as a sweep over values, which needs -m "
        "(`klalm-train -m ... optim.lr=1e-3,2e-3` runs one job per value); a list is written 'optim.lr=[1e-3,2e-3]', "
        """a text with commas optim.lr='"1e-3,2e-3"'"""
    )
    check_overrides(["-m", "experiment=smoke", "optim.lr=1e-3,2e-3"])


def test_a_comma_separated_value_is_a_sweep_where_an_override_sets_multirun_mode():
    """`klalm-train sweep=archs_45m` sweeps without -m (configs/sweep/*.yaml set hydra.mode: MULTIRUN), and Hydra then
    sweeps a `key=a,b` of the command line too: refusing it as "needs -m" was wrong (the grid's jobs are checked by
    klalm.train.sweep). `hydra.mode=MULTIRUN` likewise; a sweep config that does not set it does not count."""
    check_overrides(["sweep=archs_45m", "optim.lr=6e-4,1.5e-3"])
    check_overrides(["experiment=smoke", "sweep=lr", "data.batch_size=2,4"])
    check_overrides(["experiment=smoke", "hydra.mode=MULTIRUN", "optim.lr=1e-3,2e-3"])
    for run_mode in (["hydra.mode=RUN"], ["experiment=kla_45m"]):
        with pytest.raises(ConfigError, match="which needs -m"):
            check_overrides(["experiment=smoke", *run_mode, "optim.lr=1e-3,2e-3"])
