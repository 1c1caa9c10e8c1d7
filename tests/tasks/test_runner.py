"""The synthetic-benchmark runner: budget files, command-line knobs, the A5 depth search and the report."""

from __future__ import annotations

import json

import pytest

from klalm.tasks import MAD_TASKS
from klalm.tasks.plans import (
    FAMILY_NAMES,
    A5Plan,
    MADPlan,
    MQARPlan,
    RunPlan,
    TrainSettings,
    apply_args,
    count_runs,
    load_plan,
    parse_args,
)
from klalm.tasks.report import a5_min_blocks, write_report
from klalm.tasks.runner import FAMILIES, Budget, run

TINY_MAD = {
    "mad_in_context_recall": {"length": 16},
    "mad_noisy_recall": {"length": 16},
    "mad_fuzzy_recall": {"length": 24},
    "mad_selective_copy": {"length": 16, "num_copy": 4},
    "mad_compression": {"length": 6},
    "mad_memorization": {"vocab": 32, "length": 8},
}


@pytest.mark.parametrize("budget", ["quick", "full", "cpu"])
def test_budget_files_load(budget):
    plan = load_plan(budget)
    assert plan.archs == ["kla", "gpt", "mamba", "gdn"] and plan.mad.tasks == list(MAD_TASKS)
    assert count_runs(plan) > 0


def test_every_family_name_has_a_runner():
    assert tuple(FAMILIES) == FAMILY_NAMES


def test_full_budget_is_the_design_recipe():
    plan = load_plan("full")
    assert plan.a5.lengths == list(range(3, 21)) and plan.a5.depths == [1, 2, 3, 4] and len(plan.a5.seeds) == 5
    assert (plan.a5.train.steps, plan.a5.train.batch_size, plan.a5.train.aux_batch_size) == (100_000, 256, 25)
    assert [2048, 256] in plan.mqar.cells and plan.mqar.vocab == 8192 and plan.mqar.num_train == 100_000
    assert plan.time_budget_s is None


def test_bad_budget_keys_and_names_fail_clearly(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("a5:\n  lenghts: [3]\n")
    with pytest.raises(KeyError, match="lenghts"):
        load_plan(str(bad))
    with pytest.raises(FileNotFoundError, match="quick"):
        load_plan("nope")
    with pytest.raises(KeyError, match="archs"):
        apply_args(load_plan("quick"), parse_args(["--out", "x", "--archs", "gpt,transformer"]))


def test_command_line_knobs_override_the_budget():
    args = parse_args(
        [
            "--out",
            "x",
            "--budget",
            "quick",
            "--archs",
            "gpt",
            "--steps",
            "7",
            "--seeds",
            "1,2",
            "--mqar-cells",
            "64x4,128x8",
            "--a5-lengths",
            "5",
            "--lrs",
            "1e-3,3e-3",
            "--time-budget-s",
            "0",
        ]
    )
    plan = apply_args(load_plan(args.budget), args)
    assert plan.archs == ["gpt"] and plan.time_budget_s is None and plan.mad.epochs is None
    assert plan.a5.train.steps == plan.mqar.train.steps == plan.mad.train.steps == 7
    assert plan.mqar.cells == [[64, 4], [128, 8]] and plan.a5.lengths == [5] and plan.mad.seeds == [1, 2]
    assert plan.mqar.lrs == plan.mad.lrs == [1e-3, 3e-3]


def test_budget_shares_time_between_runs():
    budget = Budget(total_s=100.0, planned_runs=10)
    assert 9.0 < budget.limit() <= 10.0
    budget.finished(wall_s=12.0, train_s=10.0)  # 2 s overhead per run
    budget.skip(4)
    assert 100.0 / 5 - 2.0 - 1.0 < budget.limit() <= 100.0 / 5 - 2.0
    assert Budget(None, 3).limit() is None


def test_a5_min_blocks_takes_the_first_solving_depth():
    runs = [
        {"arch": "kla", "length": 8, "n_layers": 1, "token_acc": 0.95, "seq_acc": 0.5},
        {"arch": "gpt", "length": 8, "n_layers": 1, "token_acc": 0.40, "seq_acc": 0.0},
        {"arch": "gpt", "length": 8, "n_layers": 2, "token_acc": 0.92, "seq_acc": 0.6},
        {"arch": "gpt", "length": 16, "n_layers": 1, "token_acc": 0.10, "seq_acc": 0.0},
    ]
    plan = {"criterion": "token", "threshold": 0.9, "depths": [1, 2]}
    assert a5_min_blocks(runs, plan) == {"kla": {8: (1, 0.95)}, "gpt": {8: (2, 0.92), 16: (None, 0.10)}}
    assert a5_min_blocks(runs, {**plan, "criterion": "sequence"})["gpt"][8] == (None, 0.6)


def test_end_to_end_tiny_run_writes_tables_and_plots(tmp_path):
    steps = TrainSettings(steps=2, batch_size=4, eval_batch_size=16, aux_batch_size=2)
    plan = RunPlan(
        archs=["gpt"],
        device="cpu",
        model_overrides={"gpt": {"n_heads": 2}},
        a5=A5Plan(d_model=16, lengths=[3, 4], depths=[1, 2], seeds=[0], threshold=0.0, num_test=8, train=steps),
        mqar=MQARPlan(d_model=16, vocab=64, cells=[[16, 2]], lrs=[1e-3], num_train=16, num_test=8, train=steps),
        mad=MADPlan(
            d_model=16,
            n_layers=1,
            lrs=[1e-3],
            weight_decays=[0.0],
            task_settings=TINY_MAD,
            max_train=8,
            max_test=8,
            epochs=None,
            train=steps,
        ),
    )
    results = run(plan, tmp_path)
    families = [r["family"] for r in results["runs"]]
    assert families.count("a5") == 2  # threshold 0: depth 1 solves each length, depth 2 is skipped
    assert families.count("mqar") == 1 and families.count("mad") == 6
    saved = json.loads((tmp_path / "results.json").read_text())
    assert len(saved["runs"]) == 9 and saved["plan"]["a5"]["threshold"] == 0.0
    markdown = (tmp_path / "results.md").read_text()
    assert "| gpt | 1 (" in markdown and "L=16 K=2" in markdown and "selective_copy" in markdown
    for png in ("a5_min_blocks.png", "mqar_accuracy.png", "mad_accuracy.png"):
        assert (tmp_path / png).stat().st_size > 1000


def test_failed_and_skipped_runs_are_recorded_not_fatal(tmp_path, capsys):
    steps = TrainSettings(steps=1, batch_size=2, eval_batch_size=8)
    mqar = MQARPlan(d_model=16, vocab=64, cells=[[16, 2]], lrs=[1e-3], num_train=8, num_test=8, train=steps)
    broken = RunPlan(archs=["gpt"], families=["mqar"], device="cpu", model_overrides={"gpt": {"bogus": 1}}, mqar=mqar)
    results = run(broken, tmp_path / "broken")
    assert "bogus" in results["runs"][0]["error"]
    assert "Failed or skipped" in (tmp_path / "broken" / "results.md").read_text()
    late = RunPlan(archs=["gpt"], families=["mqar"], device="cpu", time_budget_s=1e-9, mqar=mqar)
    assert run(late, tmp_path / "late")["runs"][0]["skipped"] == "time budget exhausted"


def _a5_run(arch, length, depth, acc, steps, planned=60):
    return {"family": "a5", "arch": arch, "length": length, "n_layers": depth, "token_acc": acc, "seq_acc": 0.0,
            "steps": steps, "planned_steps": planned}  # fmt: skip


@pytest.mark.parametrize("lengths", [[8], [4, 8, 16]])
def test_report_marks_values_resting_on_runs_cut_short_by_the_time_budget(tmp_path, lengths):
    runs = []
    for length in lengths:
        runs += [_a5_run("kla", length, 1, 0.95, 22), _a5_run("gpt", length, 1, 0.40, 60),
                 _a5_run("gpt", length, 2, 0.50, 60)]  # fmt: skip
    mqar = {"family": "mqar", "length": 64, "pairs": 4, "token_acc": 0.5, "planned_steps": 100}
    runs += [{**mqar, "arch": "kla", "steps": 100}, {**mqar, "arch": "gpt", "steps": 40}]
    plan = {"a5": {"criterion": "token", "threshold": 0.9, "depths": [1, 2]}}
    markdown = write_report({"device_name": "cpu", "plan": plan, "runs": runs}, tmp_path)
    assert "| kla |" + " 1 (95.0) † |" * len(lengths) + " 22 |" in markdown
    assert "| gpt |" + " >2 (50.0) |" * len(lengths) + " 60 |" in markdown  # full runs: no mark
    assert "| gpt | 50.0 † | 40 |" in markdown and "| kla | 50.0 | 100 |" in markdown
    assert f"({len(lengths) + 1} of {len(runs)} runs;" in markdown
    assert (tmp_path / "a5_min_blocks.png").stat().st_size > 1000
