"""klalm.study.runner and .results without GPUs: budgets, overrides that compose, commands, estimates, lr choice,
and the results folder built from a run folder."""

from __future__ import annotations

import csv
import dataclasses
import re

import pytest
from hydra import compose, initialize_config_module

import klalm.train.app  # noqa: F401  (registers the config resolvers)
from klalm.study import results, runner
from klalm.study.runner import StudyRunner, cell_tokens, estimate_s, read_recipe, train_command, train_overrides
from klalm.study.spec import Cell
from klalm.study.staging import pack, stage
from tests.study.conftest import SEQ_LEN, spec_file, write_run_dir, write_split

SMALL = [f"data.seq_len={SEQ_LEN}", "train.global_batch_tokens=64", "data.batch_size=2"]  # 4 windows a step


@pytest.fixture
def small_spec(tmp_path):
    from klalm.study.spec import load_spec

    return load_spec(str(spec_file(tmp_path, overrides=SMALL)))


def test_one_pass_budget_and_sweep_fraction_follow_the_staged_data(small_spec, shard_folder, tmp_path):
    recipe = read_recipe(small_spec, shard_folder)
    windows = recipe.data["train_tokens"] // (SEQ_LEN + 1)
    assert recipe.max_tokens == windows // 4 * 64 == recipe.full_max_tokens
    sweep_cell = small_spec.sweep_cells()[0]
    assert cell_tokens(small_spec, recipe, sweep_cell) == int(0.1 * recipe.max_tokens) // 64 * 64
    # with part of the train split staged, runs take one pass over what arrived, the sweep its share of the whole
    pack(shard_folder, tmp_path / "packed", preset=1)
    for piece in sorted((tmp_path / "packed").glob("train-*.xz"))[2:]:
        piece.unlink()
    stage([tmp_path / "packed"], tmp_path / "staged")
    partial = read_recipe(small_spec, tmp_path / "staged")
    assert partial.data["partial"] and partial.max_tokens < recipe.max_tokens
    assert partial.full_max_tokens == recipe.max_tokens
    assert cell_tokens(small_spec, partial, sweep_cell) == cell_tokens(small_spec, recipe, sweep_cell)


def test_read_recipe_refuses_a_corrupt_index_and_shards_without_one_global_batch(spec, shard_folder):
    with pytest.raises(ValueError, match=r"train/index.json: its [\d,]+ tokens make no whole global batch of 131,072"):
        read_recipe(spec, shard_folder)  # the shipped recipe's batch is far larger than the test shards
    (shard_folder / "train/index.json").write_text("{")
    with pytest.raises(ValueError, match=r"train/index.json:1: not valid JSON"):
        read_recipe(spec, shard_folder)


def test_every_cell_override_composes(small_spec, shard_folder, tmp_path):
    recipe = read_recipe(small_spec, shard_folder)
    cell = Cell("kla_45m", 1234)
    overrides = train_overrides(small_spec, recipe, cell, 5e-4, tmp_path / "run")
    with initialize_config_module("klalm.configs", version_base="1.3"):
        cfg = compose("train", overrides=[o for o in overrides if not o.startswith("hydra.")])
    assert cfg.model.arch == "kla" and cfg.optim.lr == 5e-4 and cfg.train.dynamics_lr_scale == 0.1
    assert cfg.train.max_tokens == recipe.max_tokens and cfg.run_name == "kla_45m-s1234"


def test_a_spec_override_of_a_key_each_cell_sets_is_refused(small_spec, shard_folder, tmp_path):
    """The spec's overrides come last on each cell's command: a key that the cells set replaced all their values."""
    from klalm.study.spec import load_spec

    recipe = read_recipe(small_spec, shard_folder)
    own = train_overrides(small_spec, recipe, Cell("kla_45m", 1234), 5e-4, tmp_path / "run")[: -len(SMALL)]
    assert len(own) == 8
    for override in own:
        key = override.split("=", 1)[0]
        with pytest.raises(ValueError, match=rf"study overrides: '\+\+{re.escape(override)}' sets {re.escape(key)}, "
                                             "which the study sets per cell"):  # fmt: skip
            load_spec(str(spec_file(tmp_path, overrides=[*SMALL, f"++{override}"])))


def test_commands_for_one_and_several_gpus():
    one = train_command(["a=1"], 1)
    assert one[1:] == ["-m", "klalm.train", "a=1"]
    four = train_command(["a=1", "trainer=gpu"], 4)
    assert four[1:4] == ["-m", "klalm.train.torchrun", "--standalone"]
    assert four[6:8] == ["--nproc_per_node", "4"]
    assert four[-4:] == ["a=1", "trainer=gpu", "trainer=ddp", "trainer.devices=4"]  # the study's trainer wins: last


def test_collect_builds_the_results_folder(spec, tmp_path):
    cell = Cell("gpt_45m", 1234)
    write_run_dir(tmp_path / "work/runs" / cell.name, cell, 2e-3, 4.5, gpus=4, rate=400.0)
    records = results.collect_all(spec, tmp_path / "work")
    assert [r["cell"] for r in records] == [cell.name]
    record = results.load_run(spec, cell)
    assert record["gpu_minutes"] == {"train": 8.0, "eval": 1.0, "total": 9.0}  # 120 s × 4 GPUs + 60 s on one
    assert record["throughput"] == {"tokens_per_s": 400.0, "tokens_per_s_per_gpu": 100.0}  # after the first window
    folder = results.cell_dir(spec, cell)
    assert {p.name for p in folder.iterdir()} == {"run.json", "train.csv", "val.csv", "train.log", "eval.json"}
    with open(folder / "val.csv") as handle:
        assert list(csv.DictReader(handle)) == [{"step": "2", "tokens": "128", "val/loss": "2.9"}]
    assert results.collect_all(spec, tmp_path / "work") == []  # done cells are not collected twice


def test_unfinished_run_folders_are_not_collected(spec, tmp_path):
    cell = Cell("gpt_45m", 1234)
    write_run_dir(tmp_path / "work/runs" / cell.name, cell, 2e-3, 4.5)
    (tmp_path / "work/runs" / cell.name / results.TIMING_FILE).unlink()  # what a failed or killed cell leaves
    assert results.collect_all(spec, tmp_path / "work") == []


@pytest.mark.parametrize(
    ("name", "text", "error", "message"),
    [
        ("csv/metrics.csv", None, FileNotFoundError, "gpt_45m-s1234 lacks csv/metrics.csv: the cell did not finish"),
        (results.CELL_FILE, "{'cell': 1}", ValueError, "cell.json:1: not valid JSON"),
    ],
)
def test_a_run_folder_lacking_or_corrupting_a_file_is_refused_unwritten(spec, tmp_path, name, text, error, message):
    cell = Cell("gpt_45m", 1234)
    run_dir = tmp_path / "work/runs" / cell.name
    write_run_dir(run_dir, cell, 2e-3, 4.5)
    if text is None:
        (run_dir / name).unlink()
    else:
        (run_dir / name).write_text(text)
    with pytest.raises(error, match=message):
        results.collect_all(spec, tmp_path / "work")
    assert not spec.results.exists()  # no empty runs/<cell>/ left behind


def test_a_run_json_that_does_not_parse_is_named(spec):
    (spec.results / "runs/gpt_45m-s1234").mkdir(parents=True)
    (spec.results / "runs/gpt_45m-s1234" / results.RUN_FILE).write_text("{")
    with pytest.raises(ValueError, match=r"gpt_45m-s1234/run.json:1: not valid JSON"):
        results.finished(spec, sweep=False)


def test_best_lr_waits_for_every_sweep_point_then_takes_the_lowest_loss(spec, tmp_path):
    lrs = spec.sweep["lrs"]["gpt_45m"]
    losses = dict(zip(lrs, [7.1, 7.0, 7.05]))
    for lr in lrs:
        cell = Cell("gpt_45m", 1234, float(lr), sweep=True)
        write_run_dir(tmp_path / "work/sweep" / cell.name, cell, float(lr), losses[lr])
        assert results.best_lr(spec, "gpt_45m") is None  # not before every lr of the sweep has finished
        results.collect_all(spec, tmp_path / "work")
    assert results.best_lr(spec, "gpt_45m") == lrs[1]
    assert results.best_lr(spec, "kla_45m") is None


def test_estimates_use_measured_rates_once_a_run_has_finished(small_spec, shard_folder, tmp_path):
    spec, recipe = small_spec, read_recipe(small_spec, shard_folder)
    cell = Cell("gpt_45m", 1234)
    _, source = estimate_s(spec, recipe, cell, 2)
    assert source.endswith("prior (docs/benchmarks.md)")
    write_run_dir(tmp_path / "work/runs" / cell.name, cell, 2e-3, 4.5, gpus=2, rate=1000.0)
    results.collect_all(spec, tmp_path / "work")
    seconds, source = estimate_s(spec, recipe, Cell("gpt_45m", 1235), 2)
    assert "measured (gpt_45m-s1234)" in source and "500 tokens/s/GPU" in source
    expected = recipe.max_tokens / (500 * 2 * spec.estimate["ddp_efficiency"])
    assert seconds == pytest.approx(expected + spec.estimate["overhead_s"] + spec.estimate["eval_s"])


def test_read_recipe_refuses_a_warmup_that_outlasts_the_sweep_cells(shard_folder, tmp_path):
    """A warmup in steps that fits the experiment's own budget but not a sweep cell's (the sweep's fraction of the
    one-pass budget): every sweep cell failed as it started, on its GPU."""
    from klalm.study.spec import load_spec

    recipe = read_recipe(load_spec(str(spec_file(tmp_path, overrides=SMALL))), shard_folder)
    steps = cell_tokens(load_spec(str(spec_file(tmp_path))), recipe, Cell("gpt_45m", 1, 1e-3, sweep=True)) // 64
    assert 1 < steps < recipe.max_tokens // 64
    spec = load_spec(str(spec_file(tmp_path, overrides=[*SMALL, f"scheduler.warmup={steps}"])))
    with pytest.raises(ValueError) as info:
        read_recipe(spec, shard_folder)
    assert str(info.value) == (
        f"study spec: each sweep cell trains {steps * 64:,} tokens, and scheduler.warmup={steps} gives {steps} warmup "
        f"steps, not fewer than the run's {steps} (train.max_tokens // train.global_batch_tokens): its lr would never "
        "reach optim.lr"
    )
    read_recipe(load_spec(str(spec_file(tmp_path, overrides=[*SMALL, f"scheduler.warmup={steps - 1}"]))), shard_folder)


def test_read_recipe_checks_the_cells_budgets_not_the_experiments_own(tmp_path):
    """The experiment's own train.max_tokens, which every cell replaces, was checked too: an experiment whose budget
    holds no global batch of the spec's (smoke's 10,240 tokens, batches of 16,384) was refused, naming that budget,
    although every cell's holds whole batches."""
    from klalm.study.spec import load_spec

    write_split(tmp_path / "shards" / "train", [list(range(1, 500))] * 100, shard_tokens=100_000)  # 50,000 tokens
    big_batches = [f"data.seq_len={SEQ_LEN}", "train.global_batch_tokens=16384", "data.batch_size=2"]
    spec = load_spec(str(spec_file(tmp_path, experiment="smoke", overrides=big_batches)))
    recipe = read_recipe(spec, tmp_path / "shards")
    assert [cell_tokens(spec, recipe, cell) for cell in (spec.sweep_cells()[0], spec.run_cells()[0])] == [16384, 32768]


def _fake_launches(monkeypatch, codes: dict[str, int] | None = None) -> list[str]:
    """Replaces the study's process launcher: each launch appends its module (`-m`) to the list returned and ends
    after 12 s with codes[module] (0 where unnamed)."""
    ran = []

    def run_logged(command, log_path, env):
        module = command[command.index("-m") + 1]
        ran.append(module)
        return (codes or {}).get(module, 0), 12.0

    monkeypatch.setattr(runner, "_run_logged", run_logged)
    return ran


def test_a_cell_whose_evaluation_failed_is_evaluated_again_not_trained_again(small_spec, shard_folder, tmp_path,
                                                                              monkeypatch):  # fmt: skip
    """Its training done, a cell whose validation failed was trained from scratch in the next block: now the block
    runs its evaluation only, unless the cell would be launched otherwise now (more staged data: another budget)."""
    ran = _fake_launches(monkeypatch, {"klalm.study.validate": 1})
    recipe = read_recipe(small_spec, shard_folder)
    cell, work = small_spec.sweep_cells()[0], tmp_path / "work"
    assert StudyRunner(small_spec, recipe, shard_folder, work, tmp_path, 1, 60, "abc").run_cell(cell, [0]) is None
    assert ran == ["klalm.train", "klalm.study.validate"]
    ran.clear()
    next_block = StudyRunner(small_spec, recipe, shard_folder, work, tmp_path, 1, 60, "abc")
    assert next_block.train_cell(cell, [0]) == (work / "sweep" / cell.name, {"train": 12.0}) and ran == []
    more_data = dataclasses.replace(recipe, full_max_tokens=2 * recipe.full_max_tokens)
    assert cell_tokens(small_spec, more_data, cell) != cell_tokens(small_spec, recipe, cell)
    StudyRunner(small_spec, more_data, shard_folder, work, tmp_path, 1, 60, "abc").train_cell(cell, [0])
    assert ran == ["klalm.train"]


def test_a_cell_whose_run_went_beyond_its_export_is_not_evaluated(small_spec, shard_folder, tmp_path, monkeypatch,
                                                                  caplog):  # fmt: skip
    """The study evaluated <run>/hf by its path, past klalm-eval's check of a run folder: a cell resumed for more steps
    after its export (and stopped before it exported again) was scored on the older weights without a word. Now its
    evaluation is refused in one line naming the export and the later checkpoint; a current export is evaluated."""
    ran = _fake_launches(monkeypatch)
    recipe = read_recipe(small_spec, shard_folder)
    cell, work = small_spec.sweep_cells()[0], tmp_path / "work"
    block = StudyRunner(small_spec, recipe, shard_folder, work, tmp_path, 1, 60, "abc")
    run_dir = block.run_dir(cell)
    write_run_dir(run_dir, cell, lr=cell.lr, val_loss=2.0)
    (run_dir / "hf").mkdir()
    (run_dir / "hf" / "source.json").write_text('{"step": 4}')
    (run_dir / "checkpoints").mkdir()
    later = run_dir / "checkpoints" / "step-00000006.ckpt"
    later.write_bytes(b"not read")  # (only its name is)
    with caplog.at_level("ERROR", logger="klalm.study"):
        assert block.finish_cell(cell, run_dir, {"train": 12.0}, [0]) is None
    assert ran == [] and results.load_run(small_spec, cell) is None
    assert f"{cell.name}: {run_dir}/hf holds the weights of step 4 (its source.json), but the run has the later " \
           f"checkpoint {later}: name the one to load by its path" in caplog.text  # fmt: skip
    later.rename(later.with_name("step-00000004.ckpt"))
    assert block.finish_cell(cell, run_dir, {"train": 12.0}, [0]) is not None and ran == ["klalm.study.validate"]


@pytest.mark.parametrize("text", ['{"train": "12"}\n', "[12.0]\n", "{}\n"])
def test_a_trained_json_without_training_seconds_is_trained_again(small_spec, shard_folder, tmp_path, monkeypatch,
                                                                   caplog, text):  # fmt: skip
    """A trained.json that parses but holds no {"train": seconds} was taken as trained (and its time used later)."""
    ran = _fake_launches(monkeypatch)
    recipe = read_recipe(small_spec, shard_folder)
    cell, work = small_spec.sweep_cells()[0], tmp_path / "work"
    StudyRunner(small_spec, recipe, shard_folder, work, tmp_path, 1, 60, "abc").train_cell(cell, [0])
    with caplog.at_level("INFO", logger="klalm.study"):
        StudyRunner(small_spec, recipe, shard_folder, work, tmp_path, 1, 60, "abc").train_cell(cell, [0])
    assert ran == ["klalm.train"] and "delete that file to train it again" in caplog.text
    (work / "sweep" / cell.name / runner.TRAINED_FILE).write_text(text)
    caplog.clear()
    with caplog.at_level("WARNING", logger="klalm.study"):
        StudyRunner(small_spec, recipe, shard_folder, work, tmp_path, 1, 60, "abc").train_cell(cell, [0])
    assert ran == ["klalm.train", "klalm.train"] and "holds no training seconds" in caplog.text
