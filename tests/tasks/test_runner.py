"""The synthetic grid: plan files, command-line knobs, the order and dependencies of units, time estimates, and
blocks that run, resume and fail soft (in this process and in child processes, on the CPU)."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import shutil
import time
import types
from pathlib import Path

import pytest
import torch

from klalm.cli import synthetic
from klalm.cli.synthetic_args import parse_args
from klalm.config_checks import MAD_TASKS
from klalm.fileio import flock_path
from klalm.models import build_model
from klalm.tasks import runner, states, units
from klalm.tasks.base import materialize
from klalm.tasks.cells import FAMILY_NAMES, TrainSettings, Unit
from klalm.tasks.estimates import estimate_s
from klalm.tasks.plans import (
    A5Plan,
    A5Stage,
    Estimate,
    MADPlan,
    MQARPlan,
    MQARStage,
    RunPlan,
    apply_args,
    load_plan,
    plan_units,
)
from klalm.tasks.results import Results, UnitOutcome, merge, read_jsonl
from klalm.tasks.runner import MARGIN_S, MIN_TRAIN_S, GridBlock, plan_table, solved_depths
from klalm.tasks.units import (
    Execution,
    build_member,
    evaluate_saved,
    pack_key,
    paused_rows,
    run_unit,
    run_units,
    state_mib,
)

TINY_MAD = {
    "mad_in_context_recall": {"length": 16},
    "mad_noisy_recall": {"length": 16},
    "mad_fuzzy_recall": {"length": 24},
    "mad_selective_copy": {"length": 16, "num_copy": 4},
    "mad_compression": {"length": 6},
    "mad_memorization": {"vocab": 32, "length": 8},
}


@pytest.mark.parametrize("name", ["quick", "full", "cpu"])
def test_plan_files_load_and_expand(name):
    plan = load_plan(name)
    assert plan.archs == ["kla", "gpt", "mamba", "gdn"] and plan.mad.tasks == list(MAD_TASKS)
    units = plan_units(plan)
    assert {u.family for u in units} == set(FAMILY_NAMES)
    assert all(u.model_overrides["mixer_options"]["kla"]["block"] == "plain" for u in units if u.arch == "kla")


def test_full_plan_is_the_design_recipe_in_the_issue_order():
    plan = load_plan("full")
    a5 = plan.a5
    recipe = (a5.train.steps, a5.train.batch_size, a5.train.aux_batch_size, a5.train.lr, a5.train.min_lr)
    assert recipe == (100_000, 256, 25, 1e-3, 1e-5)
    assert (a5.train.warmup, a5.train.weight_decay, a5.threshold, a5.criterion, a5.d_model) == (
        0.1, 0.01, 0.9, "token", 128)  # fmt: skip
    first = a5.stages[0]
    assert (first.lengths, first.depths, len(first.seeds) >= 3) == ([4, 8, 12, 16, 20], [1, 2], True)
    covered = {(n, d, s) for st in a5.stages for n in st.lengths for d in st.depths for s in st.seeds}
    assert covered == {(n, d, s) for n in range(3, 21) for d in range(1, 5) for s in range(5)}
    units = [u for u in plan_units(plan) if u.family == "a5"]
    assert [(u.arch, u.task["length"], u.n_layers) for u in units[:5]] == [
        ("kla", 4, 1), ("gpt", 4, 1), ("mamba", 4, 1), ("gdn", 4, 1), ("kla", 4, 2)]  # fmt: skip
    assert units[0].seeds == [0, 1, 2] and units[0].stop == {"metric": "token_acc", "threshold": 0.9}
    zoology, long, capacity = plan.mqar.stages
    assert zoology.archs == ["kla", "gpt"] and zoology.cells == [[64, 4], [128, 8], [256, 16], [512, 64]]
    assert zoology.depths == [2] and len(zoology.lrs) == 4 and min(zoology.d_models) >= 64
    assert max(zoology.d_models) <= 256 and len(zoology.d_models) > 1
    assert (long.archs, long.cells, long.depths) == (["kla"], [[2048, 256]], [1, 2])
    assert (capacity.cells, capacity.depths, capacity.d_states) == ([[2048, 256]], [1], [32, 64, 128])
    mqar = [u for u in plan_units(plan) if u.family == "mqar"]  # Zoology: evaluated every epoch, stopped at 99 %
    assert {(u.eval_every, u.stop["threshold"], u.stop["metric"]) for u in mqar} == {(391, 0.99, "token_acc")}


def test_mqar_d_states_set_the_kla_key_dimension_and_name_it():
    """A stage's d_states reach the KLA archs' build_model overrides (the plan's own kept), not the others'; the
    layer's default spelled out names the same unit as no d_state at all (so its finished rows still count)."""
    plan = load_plan("full")
    stage = plan.mqar.stages[0]
    stage.archs, stage.cells, stage.d_models, stage.lrs, stage.d_states = ["kla", "gpt"], [[64, 4]], [64], [1e-3], [64]
    plan.mqar.stages = [stage]
    kla, gpt = [u for u in plan_units(plan) if u.family == "mqar"]
    assert kla.model_overrides == {"mixer_options": {"kla": {"block": "plain", "d_state": 64}}}
    assert kla.kla_d_state() == 64 and "d=64 S=64 lr=0.001" in kla.label()
    assert gpt.model_overrides == {} and gpt.kla_d_state() is None and " S=" not in gpt.label()
    default = apply_args(load_plan("full"), parse_args(["run", "--results", "x", "--families", "mqar",
                                                        "--mqar-d-states", "16"]))  # fmt: skip
    assert {u.key(0) for u in plan_units(default) if u.family == "mqar"} <= {
        u.key(0) for u in plan_units(load_plan("full")) if u.family == "mqar"}  # fmt: skip
    model = build_model(kla.arch, d_model=kla.d_model, n_layers=kla.n_layers, vocab_size=64, **kla.model_overrides)
    assert model.model.layers[0].mixer.d_state == 64


def test_bad_plans_fail_clearly(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("a5:\n  lenghts: [3]\n")
    with pytest.raises(KeyError, match="lenghts"):
        load_plan(str(bad))
    bad.write_text("a5:\n  stages: [{lengths: [3], depths: [1]}]\n")
    with pytest.raises(KeyError, match=r"missing keys \['seeds'\] in .*a5.stages\[0\]"):
        load_plan(str(bad))
    with pytest.raises(FileNotFoundError, match="quick"):
        load_plan("nope")
    with pytest.raises(KeyError, match="archs"):
        apply_args(load_plan("quick"), parse_args(["run", "--results", "x", "--archs", "gpt,transformer"]))
    with pytest.raises(KeyError, match="compile_backend: unknown \\['inductr'\\]"):
        apply_args(load_plan("quick"), parse_args(["run", "--results", "x", "--compile", "inductr"]))
    with pytest.raises(SystemExit):  # a prefix of an option is a typo, not that option (argparse's default)
        parse_args(["run", "--results", "x", "--mad-weight-decay", "0"])
    bad.write_text("mqar:\n  stop_at: 0.99\n")
    with pytest.raises(ValueError, match="mqar.stop_at=0.99 needs mqar.eval_every"):
        apply_args(load_plan(str(bad)), parse_args(["run", "--results", "x"]))
    bad.write_text("mqar:\n  stop_at: 99\n  eval_every: 391\n")  # a percentage where a fraction belongs
    with pytest.raises(ValueError, match=r"mqar.stop_at=99 is an accuracy: it must be in \(0, 1\]"):
        apply_args(load_plan(str(bad)), parse_args(["run", "--results", "x"]))
    knobs = {  # command-line values that would fail only in a unit's process, on the GPU: one line each, up front
        ("--mqar-cells", "64x100"): r"mqar.stages\[0\].cells: MQAR num_pairs=100 needs 1 <= 4 \* num_pairs",
        ("--mqar-depths", "0"): r"mqar.stages\[0\].depths must be >= 1, got \[0\]",
        ("--mqar-d-models", "0"): r"mqar.stages\[0\].d_models must be >= 1",
        ("--mqar-d-states", "512"): r"mqar.stages\[0\].d_states must be in \[1, 256\] .*got \[512\]",
        ("--seeds", "0,-1"): r"a5.stages\[0\].seeds: seeds must be >= 0, got \[0, -1\]",
        ("--seeds", "0,1,0"): r"a5.stages\[0\].seeds: a seed is listed twice, got \[0, 1, 0\]",  # 3 members: 2 rows
        ("--lrs", "1e-3,0"): r"mqar.stages\[0\].lrs: learning rates must be > 0, got \[0.001, 0.0\]",
        ("--mad-weight-decays", "-0.1"): r"mad.weight_decays must be >= 0, got \[-0.1\]",
    }
    for knob, message in knobs.items():
        with pytest.raises(ValueError, match=message):
            apply_args(load_plan("full"), parse_args(["run", "--results", "x", *knob]))
    bad.write_text("mqar:\n  stages: [{archs: [kla], cells: [[64]], depths: [2], d_models: [64], lrs: [1.0e-3], "
                   "seeds: [0]}]\n")  # fmt: skip
    with pytest.raises(ValueError, match=r"mqar.stages\[0\].cells: each cell is \[length, pairs\], got \[64\]"):
        apply_args(load_plan(str(bad)), parse_args(["run", "--results", "x"]))
    bad.write_text("a5:\n  train: {lr: 1.0e-3, min_lr: 1.0e-2}\n  stages: [{lengths: [3], depths: [1], seeds: [0]}]\n")
    with pytest.raises(ValueError, match="min_lr"):
        plan_units(load_plan(str(bad)))


def test_command_line_knobs_replace_plan_values_in_every_stage(capsys):
    args = parse_args(["run", "--results", "x", "--plan", "full", "--archs", "gpt,kla", "--steps", "7",
                       "--seeds", "1,2", "--a5-lengths", "5", "--mqar-cells", "64x4", "--lrs", "1e-3",
                       "--members", "1", "--time-budget-s", "300"])  # fmt: skip
    plan = apply_args(load_plan(args.plan), args)
    assert plan.archs == ["gpt", "kla"] and plan.members == 1 and plan.mad.epochs is None
    assert load_plan("full").compile_backend == "inductor" and plan.compile_backend == "inductor"
    eager = apply_args(load_plan("full"), parse_args(["run", "--results", "x", "--compile", "none"]))
    assert eager.compile_backend is None
    assert plan.a5.train.steps == plan.mqar.train.steps == plan.mad.train.steps == 7
    units = plan_units(plan)
    a5 = [u for u in units if u.family == "a5"]
    assert len(a5) == 2 * 4 * 2 and {u.task["length"] for u in a5} == {5}  # archs x depths x seeds, stages merged
    mqar = [u for u in units if u.family == "mqar"]
    assert {u.task["length"] for u in mqar} == {64} and {u.train.lr for u in mqar} == {1e-3}
    assert {u.arch for u in mqar} == {"gpt", "kla"}
    mad = [u for u in units if u.family == "mad"]
    assert {(u.train.lr, u.train.weight_decay) for u in mad} == {(1e-3, 0.0), (1e-3, 0.1)}  # the plan's two decays
    one = apply_args(load_plan("full"), parse_args(["run", "--results", "x", "--families", "mad", "--lrs", "5e-4",
                                                    "--mad-weight-decays", "0"]))  # fmt: skip
    assert {(u.train.lr, u.train.weight_decay) for u in plan_units(one)} == {(5e-4, 0.0)}
    assert len(plan_units(one)) == len(MAD_TASKS) * len(one.archs)  # one setting per task and arch
    long = apply_args(load_plan("full"), parse_args(["run", "--results", "x", "--families", "mqar", "--archs", "kla",
                                                     "--mqar-cells", "2048x256", "--mqar-depths", "1",
                                                     "--mqar-d-models", "128"]))  # fmt: skip
    assert {(u.task["length"], u.n_layers, u.d_model, u.arch) for u in plan_units(long)} == {(2048, 1, 128, "kla")}
    # the four learning rates, once although two stages name the cell, and the capacity stage's d_state 32, 64 and 128
    assert sorted((u.kla_d_state() or 16, u.train.lr) for u in plan_units(long)) == [
        (16, 1e-4), (16, 4.6e-4), (16, 2.2e-3), (16, 1e-2), (32, 2.2e-3), (64, 2.2e-3), (128, 2.2e-3)]  # fmt: skip
    args = ["run", "--results", "x", "--families", "mqar", "--archs", "kla", "--mqar-cells", "2048x256",
            "--mqar-depths", "1", "--mqar-d-models", "128", "--mqar-d-states", "16"]  # fmt: skip
    default_only = apply_args(load_plan("full"), parse_args(args))
    assert len(plan_units(default_only)) == 4 and not any(u.kla_d_state() for u in plan_units(default_only))
    with pytest.raises(SystemExit):
        parse_args(["run", "--results", "x", "--mqar-cells", "64-4"])
    assert "--mqar-cells: wants LENGTHxPAIRS items like 64x4,128x8; got '64-4'" in capsys.readouterr().err
    empty_items = parse_args(["run", "--results", "x", "--archs", "gpt,,kla,", "--lrs", "1e-3,", "--families", "a5,"])
    assert empty_items.archs == ["gpt", "kla"] and empty_items.lrs == [1e-3] and empty_items.families == ["a5"]
    with pytest.raises(SystemExit):
        parse_args(["run", "--results", "x", "--lrs", "1e-3,fast"])
    assert "--lrs: invalid float_list value: '1e-3,fast'" in capsys.readouterr().err


def _rate(**changes):
    rate = {"device": "H", "family": "a5", "arch": "kla", "d_model": 16, "n_layers": 1, "members": 1,
            "procs_per_gpu": 1, "tokens_per_step": 40, "step_s": 0.01, "overhead_s": 10.0,
            "ended": "steps"}  # fmt: skip
    return {**rate, **changes}


def _a5_unit(length=4, depth=1, seeds=(0,), steps=1000, arch="kla") -> Unit:
    train = TrainSettings(steps=steps, batch_size=8, aux_batch_size=4)
    stop = {"metric": "token_acc", "threshold": 0.9}
    return Unit("a5", {"name": "a5", "length": length}, arch, depth, 16, {}, train, list(seeds), 64, None,
                {"name": "a5", "length": 2}, 100, stop)  # fmt: skip


def test_estimates_use_the_rows_of_the_units_shape_and_name_them():
    prior = Estimate(tokens_per_s={"kla": 4000.0}, overhead_s=5.0, safety=1.0)
    unit = _a5_unit()  # 8 x 4 + 4 x 2 = 40 tokens per step
    assert estimate_s(unit, [], "H", 1, prior) == (pytest.approx(5.0 + 1000 * 40 / 4000), "prior")
    assert estimate_s(_a5_unit(depth=2, seeds=(0, 1)), [], "H", 3, prior)[0] == pytest.approx(5 + 1000 * 0.01 * 12)
    seconds, source = estimate_s(unit, [_rate(device="other"), _rate()], "H", 1, prior)
    assert seconds == pytest.approx(10.0 + 10.0) and source.startswith("10.00 ms/step from rates.jsonl lines 2;")
    assert estimate_s(unit, [_rate()], "H", 1, prior, steps=100)[0] == pytest.approx(10.0 + 1.0)  # a resumed unit
    # launch-bound: one token count measured is flat in the length, not proportional to it
    assert estimate_s(_a5_unit(length=9), [_rate()], "H", 1, prior)[0] == pytest.approx(10 + 1000 * 0.01)
    # several token counts: interpolated between them, the top slope above, flat below
    rates = [_rate(), _rate(tokens_per_step=100, step_s=0.016)]
    for length, step_s in ((8, 0.0132), (19, 0.022), (3, 0.01)):  # 64 + 8, 152 + 8, 24 + 8 tokens
        assert estimate_s(_a5_unit(length=length), rates, "H", 1, prior)[0] == pytest.approx(10 + 1000 * step_s)
    # a shape never measured: bounded from the measured shapes (more layers, seeds, processes are never faster)
    bigger = _a5_unit(depth=2, seeds=(0, 1))
    seconds, source = estimate_s(bigger, [_rate()], "H", 1, prior)
    assert seconds == pytest.approx(10 + 1000 * 0.01 * 2 * 2) and "bounded from depth 1, 1 seeds" in source
    rates = [_rate(), _rate(n_layers=2, members=2, step_s=0.03)]
    assert estimate_s(bigger, rates, "H", 1, prior)[0] == pytest.approx(10 + 1000 * 0.03)  # its own shape wins
    assert estimate_s(unit, [_rate()], "H", 2, prior)[0] == pytest.approx(10 + 1000 * 0.02)
    # a KLA d_state is part of the kind: its rates and the default's (rows without the key) do not mix where both
    # are measured
    wide = dataclasses.replace(unit, model_overrides={"mixer_options": {"kla": {"d_state": 64}}})
    rates = [_rate(), _rate(kla_d_state=64, step_s=0.04)]
    assert estimate_s(wide, rates, "H", 1, prior)[0] == pytest.approx(10 + 1000 * 0.04)
    assert estimate_s(unit, rates, "H", 1, prior)[0] == pytest.approx(10 + 1000 * 0.01)
    assert estimate_s(wide, [_rate()], "H", 1, prior)[0] == pytest.approx(10 + 1000 * 0.01 * 64 / 16)  # see below
    # overhead: unit runs of the arch, else of any arch; benchmark rows (no process start) never; else the prior
    bench = _rate(ended="bench", overhead_s=0.1)
    assert estimate_s(unit, [bench], "H", 1, prior)[0] == pytest.approx(5 + 10)
    others = [bench, _rate(arch="gpt", overhead_s=20.0)]
    assert "overhead 20 s (median of 1 unit runs)" in estimate_s(unit, others, "H", 1, prior)[1]
    with pytest.raises(KeyError, match="'gpt'"):
        estimate_s(_a5_unit(arch="gpt"), [], "H", 1, prior)


def test_estimates_above_the_measured_tokens_take_the_other_shapes_points():
    """MQAR's case: two blocks measured only at a short length (flat there), one block at a long one. Above its own
    counts a shape takes the others' points, bounded up to it; time never falls as the tokens grow."""
    prior = Estimate(tokens_per_s={"kla": 4000.0}, overhead_s=5.0, safety=1.0)
    rates = [_rate(n_layers=2), _rate(tokens_per_step=4000, step_s=0.05)]  # depth 2 at 40 tokens, depth 1 at 4000
    seconds, source = estimate_s(_a5_unit(length=499, depth=2), rates, "H", 1, prior)  # 8 x 499 + 8 = 4000 tokens
    assert seconds == pytest.approx(10 + 1000 * 0.05 * 2)
    assert "from rates.jsonl lines 1 and bounded from depth 1, 1 seeds, 1 proc/GPU on rates.jsonl lines 2" in source
    between = estimate_s(_a5_unit(length=249, depth=2), rates, "H", 1, prior)[0]  # 2000 tokens: interpolated
    assert between == pytest.approx(10 + 1000 * (0.01 + (2000 - 40) / (4000 - 40) * 0.09))
    assert estimate_s(_a5_unit(length=4, depth=2), rates, "H", 1, prior)[0] == pytest.approx(10 + 1000 * 0.01)  # own
    faster = [_rate(n_layers=2, step_s=0.03), _rate(tokens_per_step=400, step_s=0.01)]  # x2 = 0.02 < 0.03 at 400
    assert estimate_s(_a5_unit(length=49, depth=2), faster, "H", 1, prior)[0] == pytest.approx(10 + 1000 * 0.03)
    # a shape never measured: every shape's points, bounded up to it (depth 1 x 4 at 40, depth 2 x 2 at 400)
    unmeasured = [_rate(), _rate(n_layers=2, tokens_per_step=400, step_s=0.05)]
    seconds, source = estimate_s(_a5_unit(length=26, depth=2, seeds=(0, 1)), unmeasured, "H", 1, prior)  # 216
    assert seconds == pytest.approx(10 + 1000 * (0.04 + (216 - 40) / 360 * 0.06))
    assert source.startswith("69.33 ms/step bounded from depth 1, 1 seeds, 1 proc/GPU on rates.jsonl lines 1 and "
                             "bounded from depth 2, 1 seeds, 1 proc/GPU on rates.jsonl lines 2;")  # fmt: skip


def test_an_unmeasured_kla_d_state_is_interpolated_in_d_state_from_the_measured_ones():
    prior = Estimate(tokens_per_s={"kla": 4000.0}, overhead_s=5.0, safety=1.0)
    wide = {"mixer_options": {"kla": {"d_state": 64}}}
    rates = [_rate(step_s=0.010), _rate(step_s=0.040, kla_d_state=64)]  # the default (16) and 64: 10 and 40 ms

    def at(d_state):
        unit = _a5_unit()
        if d_state is not None:
            unit = dataclasses.replace(unit, model_overrides={"mixer_options": {"kla": {"d_state": d_state}}})
        return estimate_s(unit, rates, "H", 1, prior)

    assert at(None)[0] == pytest.approx(10 + 1000 * 0.010) and at(64)[0] == pytest.approx(10 + 1000 * 0.040)
    seconds, source = at(32)  # a third of the way from 16 to 64
    assert seconds == pytest.approx(10 + 1000 * 0.020)
    assert source.startswith("20.00 ms/step at d_state 32, linear in d_state from d_state 16: 10.00 ms/step from "
                             "rates.jsonl lines 1 and d_state 64: 40.00 ms/step from rates.jsonl lines 2")  # fmt: skip
    assert at(128)[0] == pytest.approx(10 + 1000 * 0.080)  # above: the top two's slope
    assert at(8)[0] == pytest.approx(10 + 1000 * 0.010)  # below: the smallest's time
    only_wide = [_rate(step_s=0.040, kla_d_state=64, model_overrides=wide)]
    assert at(None)[0] != estimate_s(_a5_unit(), [], "H", 1, prior)[0]  # measured d_states beat the prior
    assert estimate_s(_a5_unit(), only_wide, "H", 1, prior)[0] == pytest.approx(10 + 1000 * 0.040)  # one: its time


def test_compiled_estimates_read_compiled_rates_else_eager_step_times_and_the_prior_overhead():
    prior = Estimate(tokens_per_s={"kla": 4000.0}, overhead_s=5.0, safety=1.0)
    unit, eager = _a5_unit(), _rate()  # an eager unit run: 10 ms per step, 10 s overhead
    rates = [eager, _rate(tokens_per_step=100, step_s=0.016)]  # a pack's mean tokens per member set the step time
    assert estimate_s(unit, rates, "H", 1, prior, tokens_per_step=70)[0] == pytest.approx(10 + 1000 * 0.013)
    seconds, source = estimate_s(unit, [eager], "H", 1, prior, compile_backend="inductor")
    assert seconds == pytest.approx(5 + 1000 * 0.01)
    assert "from eager rates.jsonl lines 1; overhead 5 s (prior)" in source
    compiled = _rate(step_s=0.004, overhead_s=40.0, compile_backend="inductor")
    seconds, source = estimate_s(unit, [eager, compiled], "H", 1, prior, compile_backend="inductor")
    assert seconds == pytest.approx(40 + 1000 * 0.004) and "from rates.jsonl lines 2;" in source
    assert estimate_s(unit, [eager, compiled], "H", 1, prior)[0] == pytest.approx(10 + 1000 * 0.01)  # eager: line 1


def test_estimates_read_the_latest_three_rows_of_a_shape():
    """Rows are appended as units run; a shape's step time is the median of its latest three, so the runs of an older
    (slower) kernel drop out once newer runs have measured it."""
    prior = Estimate(tokens_per_s={"kla": 4000.0}, overhead_s=5.0, safety=1.0)
    rates = [_rate(step_s=0.05)] * 3 + [_rate(step_s=s) for s in (0.011, 0.01, 0.012)]
    seconds, source = estimate_s(_a5_unit(), rates, "H", 1, prior)
    assert seconds == pytest.approx(10 + 1000 * 0.011) and "rates.jsonl lines 4,5,6" in source
    assert estimate_s(_a5_unit(), rates[:5], "H", 1, prior)[0] == pytest.approx(10 + 1000 * 0.011)  # 0.05, .011, .01


def test_estimates_without_rows_of_the_family_read_the_other_families_of_the_same_model():
    prior = Estimate(tokens_per_s={"kla": 4000.0}, overhead_s=5.0, safety=1.0)
    mad = dataclasses.replace(_a5_unit(), family="mad")  # the same model and tokens; no MAD row anywhere
    rates = [_rate(step_s=0.02), _rate(d_model=32, step_s=0.5)]  # an A5 row of its width, one of another width
    seconds, source = estimate_s(mad, rates, "H", 1, prior)
    assert seconds == pytest.approx(10 + 1000 * 0.02) and "(no mad rows: other families')" in source
    own = _rate(family="mad", step_s=0.03)
    seconds, source = estimate_s(mad, [*rates, own], "H", 1, prior)  # a row of its own family wins
    assert seconds == pytest.approx(10 + 1000 * 0.03) and "from rates.jsonl lines 3;" in source


def test_estimates_of_an_unmeasured_width_scale_the_nearest_narrower_one_else_take_a_wider_ones():
    prior = Estimate(tokens_per_s={"kla": 4000.0, "gpt": 4000.0}, overhead_s=5.0, safety=1.0)
    rates = [_rate(step_s=0.02), _rate(d_model=32, step_s=0.5)]  # A5 rows of kla at d_model 16 and 32
    wide = dataclasses.replace(_a5_unit(), d_model=64)
    seconds, source = estimate_s(wide, rates, "H", 1, prior)
    assert seconds == pytest.approx(10 + 1000 * 0.5 * 4)  # d_model 32's step × (64 / 32)²
    assert source.startswith("2000.00 ms/step: d_model 32's 500.00 ms/step from rates.jsonl lines 2 × 4;")
    between = estimate_s(dataclasses.replace(wide, d_model=24), rates, "H", 1, prior)[0]
    assert between == pytest.approx(10 + 1000 * 0.02 * (24 / 16) ** 2)  # the nearest narrower, not the wider 32
    narrow = estimate_s(dataclasses.replace(wide, d_model=8), rates, "H", 1, prior)[0]
    assert narrow == pytest.approx(10 + 1000 * 0.02)  # only wider ones: the nearest's time
    mqar = dataclasses.replace(wide, family="mqar")  # another family's rows of other widths serve as well
    assert estimate_s(mqar, rates, "H", 1, prior)[0] == pytest.approx(10 + 1000 * 0.5 * 4)
    assert estimate_s(dataclasses.replace(wide, arch="gpt"), rates, "H", 1, prior)[1] == "prior"  # no row of gpt


def _row(unit: Unit, seed: int, acc: float, **more) -> dict:
    return {**unit.cell(), "seed": seed, "token_acc": acc, "seq_acc": 0.0, "steps": unit.train.steps, **more}


def _tiny_plan(**changes) -> RunPlan:
    train = TrainSettings(steps=20, batch_size=4, aux_batch_size=2, eval_batch_size=16)
    plan = RunPlan(
        archs=["gpt"], device="cpu", members=2, model_overrides={"gpt": {"n_heads": 2}},
        estimate=Estimate(tokens_per_s={"gpt": 1e4, "kla": 1e4}, overhead_s=1.0),
        a5=A5Plan(d_model=16, num_test=8, eval_every=10, train=train,
                  stages=[A5Stage(lengths=[3], depths=[1, 2], seeds=[0, 1])]),
        mqar=MQARPlan(vocab=64, num_train=16, num_test=8, train=train,
                      stages=[MQARStage(["gpt"], [[16, 2]], [1], [16], [1e-3, 3e-3], [0])]),
        mad=MADPlan(d_model=16, n_layers=1, lrs=[1e-3], weight_decays=[0.0], task_settings=TINY_MAD, max_train=8,
                    max_test=8, epochs=None, train=train),
    )  # fmt: skip
    return dataclasses.replace(plan, **changes)


def _block(tmp_path, plan, budget=None, in_process=True) -> GridBlock:
    return GridBlock(plan, Results(tmp_path, plan.families), tmp_path / "state", "cpu", 0, in_process, budget, "abc")


def test_a5_depths_wait_for_shallower_ones_and_stop_once_solved(tmp_path):
    plan = _tiny_plan(families=["a5"], archs=["gpt", "kla"])
    block = _block(tmp_path, plan)
    gpt1, kla1, gpt2, kla2 = block.units
    assert [s for _, s in block.states()] == ["ready", "ready", "waits", "waits"]
    block.results.record(_outcome([_row(gpt1, 0, 0.95), _row(gpt1, 1, 0.2)]))  # gpt depth 1 solved
    block.results.record(_outcome([_row(kla1, 0, 0.3)]))  # kla depth 1: seed 1 still missing
    assert [s for _, s in block.states()] == ["done", "ready", "solved", "waits"]
    assert block.free_seeds(kla1) == [1]
    block.results.record(_outcome([_row(kla1, 1, 0.4)]))
    assert [s for _, s in block.states()] == ["done", "done", "solved", "ready"]
    assert list(solved_depths(block.results.rows["a5"]).values()) == [{1}]  # gpt depth 1 only


def _outcome(rows):
    return UnitOutcome(rows, _rate(step_s=1e-3))


def test_a_block_starts_units_while_their_overhead_and_some_training_fit(tmp_path, caplog):
    plan = _tiny_plan(families=["a5"], estimate=Estimate(tokens_per_s={"gpt": 1.0}, overhead_s=1.0, safety=1.0))
    block = _block(tmp_path, plan, budget=MARGIN_S + MIN_TRAIN_S + 5.0)
    unit = block.units[0]
    assert block.fits(unit)  # the prior says 20 steps x 48 s, far past the deadline: it starts and pauses there
    assert block.too_short() is None
    assert [u.seeds for u in block._claim()] == [[0, 1]]  # all its seeds, in one process
    short = _block(tmp_path, plan, budget=MARGIN_S + MIN_TRAIN_S - 1.0)
    assert not short.fits(unit)
    with caplog.at_level(logging.INFO, logger="klalm.synthetic"):
        short.run()  # starts nothing, and says why (exit code 0, as a budget of 0: a device script's late stage)
    assert re.search(
        r"the time budget leaves 7\d s, below the 76 s that the cheapest ready unit needs to start "
        r"\(overhead \+ 60 s training: 61 s, \+ a 15 s margin\): the block starts nothing",
        caplog.text,
    )
    with pytest.raises(ValueError, match="--state"):
        GridBlock(plan, block.results, None, "cpu", 0, True, 60.0, "abc")


def test_a_block_resumes_paused_units_first_and_drops_stale_states(tmp_path):
    plan = _tiny_plan(families=["a5"], archs=["gpt", "kla"])
    block = _block(tmp_path, plan)
    gpt1, kla1 = block.units[:2]
    run_unit(kla1, torch.device("cpu"), Execution(), deadline=time.time(), state=block.state)  # kla paused at 10
    assert [s for _, s in block.states()][:2] == ["ready", "resumes"]
    assert block.steps_left(kla1) == 10 and block._claim()[0].arch == "kla"  # paused units before plan order
    assert "resumes" in plan_table(block)
    block.results.record(_outcome([_row(kla1, 0, 0.3), _row(kla1, 1, 0.3)]))  # its rows came from elsewhere
    assert _block(tmp_path, plan).saved() == {}  # a new block removes the state of the finished unit


def test_paused_units_leave_progress_rows_once(tmp_path, capsys):
    plan = _tiny_plan(families=["a5"], archs=["kla"])
    block = _block(tmp_path, plan)
    kla1 = block.units[0]
    run_unit(kla1, torch.device("cpu"), Execution(), deadline=time.time(), state=block.state)  # paused at step 10
    rows = paused_rows(block.state, "abc")
    assert [(r["seed"], r["steps"], r["ended"], r["commit"]) for r in rows] == [(0, 10, "paused", "abc"),
                                                                                 (1, 10, "paused", "abc")]  # fmt: skip
    assert [e[0] for e in rows[0]["evals"]] == [10] and rows[0]["token_acc"] == rows[0]["evals"][-1][2]
    assert block.results.record_progress(rows) == 2 and block.results.record_progress(rows) == 0  # once per step
    args = ["progress", "--state", str(block.state), "--results", str(tmp_path / "other")]
    synthetic(args)
    assert json.loads(capsys.readouterr().out) == {"progress.jsonl": 2}
    assert merge(tmp_path / "other", tmp_path, "abc")["progress.jsonl"] == 0  # the same pause, not twice
    with pytest.raises(SystemExit, match="state folder .*nowhere does not exist"):
        synthetic(["progress", "--state", str(tmp_path / "nowhere"), "--results", str(tmp_path)])
    saved = evaluate_saved(block.state, torch.device("cpu"))  # the weights reloaded score what training recorded
    assert [(r["seed"], r["steps"]) for r in saved] == [(0, 10), (1, 10)]
    assert all(r["token_acc"] == r["recorded_token_acc"] and len(r["position_acc"]) == 3 for r in saved)
    synthetic(["evaluate", "--state", str(block.state), "--plot", str(tmp_path / "positions.png")])
    table = capsys.readouterr().out
    assert "| a5 length=3 kla depth=1" in table and "| token acc (recorded) |" in table
    assert (tmp_path / "positions.png").stat().st_size > 1000
    with pytest.raises(SystemExit, match="no paused unit in"):
        synthetic(["evaluate", "--state", str(tmp_path / "nowhere")])


def test_a_paused_unit_whose_state_is_lost_is_named_before_it_restarts(tmp_path, caplog):
    plan = _tiny_plan(families=["a5"], archs=["kla"])
    block = _block(tmp_path, plan)
    kla1 = block.units[0]
    run_unit(kla1, torch.device("cpu"), Execution(), deadline=time.time(), state=block.state)  # paused at step 10
    block.results.record_progress(paused_rows(block.state, "abc"))
    assert block.lost_pauses() == []  # its state is there: it resumes
    shutil.rmtree(block.state)  # e.g. a new checkout without the ignored state folder
    lost = _block(tmp_path, plan)
    assert [(u.label(), step) for u, step in lost.lost_pauses()] == [(kla1.label(), 10)]
    assert lost.steps_left(kla1) == 20 and lost.states()[0][1] == "ready"  # from step 0
    assert f"{kla1.label()}: paused at step 10 by progress.jsonl, but its state is not in" in plan_table(lost)
    again = [{**row, "steps": 4} for row in lost.results.progress]  # restarted, paused at 4, and lost again
    lost.results.record_progress(again)
    assert [step for _, step in _block(tmp_path, plan).lost_pauses()] == [4]  # the step recorded last
    with caplog.at_level(logging.WARNING):
        lost.run()
    assert "holds no state for it: it starts again from step 0" in caplog.text
    assert _block(tmp_path, plan).lost_pauses() == []  # once its seeds have rows, nothing is lost any more
    assert GridBlock(plan, lost.results, None, "cpu", 0, True, None, "abc").lost_pauses() == []  # no state folder


def test_a_finish_only_block_starts_only_what_ends_before_the_deadline(tmp_path, monkeypatch):
    monkeypatch.setattr(runner.time, "time", lambda: 1e9)  # a frozen clock: the margins below are a few seconds
    plan = _tiny_plan(families=["a5"], estimate=Estimate(tokens_per_s={"gpt": 1.0}, overhead_s=1.0, safety=1.0))
    budget = MARGIN_S + MIN_TRAIN_S + 5.0
    unit = _block(tmp_path, plan).units[0]
    finishing = GridBlock(plan, Results(tmp_path, ["a5"]), tmp_path / "state", "cpu", 0, True, budget, "abc",
                          finish_only=True)  # fmt: skip
    assert _block(tmp_path, plan, budget=budget).fits(unit) and not finishing.fits(unit)  # 20 steps x 48 s
    cheap = dataclasses.replace(plan, estimate=Estimate(tokens_per_s={"gpt": 1e6}, overhead_s=1.0, safety=1.0))
    assert GridBlock(cheap, Results(tmp_path, ["a5"]), tmp_path / "state", "cpu", 0, True, budget, "abc",
                     finish_only=True).fits(unit)  # fmt: skip
    # a pack steps slower than its first unit alone (the prior: time grows with the seeds side by side), so one
    # that would not end in time is cut down to what does
    prior = Estimate(tokens_per_s={"gpt": 50.0}, overhead_s=1.0, safety=1.0)
    packed = dataclasses.replace(plan, units_per_process=2, estimate=prior)
    packed.a5.stages[0].lengths = [3, 4]  # the prior: 13.8 s alone, 26.6 s packed with the other length
    for budget, size in ((MARGIN_S + 30.0, 2), (MARGIN_S + 20.0, 1), (MARGIN_S + 10.0, 0)):
        block = GridBlock(packed, Results(tmp_path / str(size), ["a5"]), tmp_path / "state", "cpu", 0, True, budget,
                          "abc", finish_only=True)  # fmt: skip
        assert len(block._claim() or []) == size


def test_block_runs_resumes_and_reports(tmp_path):
    plan = _tiny_plan(a5=dataclasses.replace(_tiny_plan().a5, threshold=0.0))
    block = _block(tmp_path, plan)
    block.run()
    a5 = read_jsonl(tmp_path / "a5.jsonl")
    assert [(r["n_layers"], r["seed"], r["ended"]) for r in a5] == [(1, 0, "threshold"), (1, 1, "threshold")]
    assert len(read_jsonl(tmp_path / "mqar.jsonl")) == 2 and len(read_jsonl(tmp_path / "mad.jsonl")) == 6
    assert len(read_jsonl(tmp_path / "rates.jsonl")) == 1 + 2 + 6  # depth 2 was never run: depth 1 solved it
    again = _block(tmp_path, plan)
    again.run()
    assert again.finished_rows == 0 and {s for _, s in again.states()} == {"done", "solved"}
    assert len(read_jsonl(tmp_path / "rates.jsonl")) == 9


def test_units_that_differ_only_in_task_lr_or_weight_decay_share_a_pack_key():
    unit = _a5_unit()
    other = dataclasses.replace(unit, task={"name": "a5", "length": 5}, num_test=32,
                                train=dataclasses.replace(unit.train, lr=3e-3, weight_decay=0.1))  # fmt: skip
    assert pack_key(unit) == pack_key(other)
    assert pack_key(dataclasses.replace(unit, d_model=32)) != pack_key(unit)
    assert pack_key(dataclasses.replace(unit, n_layers=2)) != pack_key(unit)
    assert pack_key(dataclasses.replace(unit, stop=None)) != pack_key(unit)
    with pytest.raises(ValueError, match="cannot share a process"):
        run_units([unit, dataclasses.replace(unit, d_model=32)], torch.device("cpu"), Execution())


def test_a5_units_pack_with_or_without_a_state_folder(tmp_path):
    plan = _tiny_plan(families=["a5"], units_per_process=2)
    plan.a5.stages[0].lengths = [3, 4]
    assert [u.task["length"] for u in _block(tmp_path, plan)._claim()] == [3, 4]
    no_state = GridBlock(plan, Results(tmp_path, plan.families), None, "cpu", 0, True, None, "abc")
    assert len(no_state._claim()) == 2  # when one cell is solved the other trains on: no state needed
    unit = dataclasses.replace(plan_units(plan)[0], seeds=[0, 1])
    params = sum(p.numel() for p in build_member(unit, 0, torch.device("cpu"), None).module.parameters())
    one = state_mib(unit)
    assert one == 2 * (12 * params + 4 * unit.train.steps) / 2**20  # per seed: weights, 2 moments, the loss log
    for max_mib, size in ((1.5 * one, 1), (2.5 * one, 2)):
        bounded = dataclasses.replace(plan, max_state_mib=max_mib)
        assert len(_block(tmp_path / str(size), bounded)._claim()) == size  # the paused states fit one carry


def test_a_pack_trains_an_lr_sweep_in_one_process_with_the_rows_of_separate_units(tmp_path):
    """MQAR's two learning rates side by side (units_per_process 2), paused half way and resumed as a pack: the same
    rows as each unit alone, one rate line per run of the pack."""
    plan = _tiny_plan(families=["mqar"], units_per_process=2)
    plan.mqar.eval_every = 10  # the first stretch of steps ends at step 10, where the deadline pauses the pack
    alone = _block(tmp_path / "alone", dataclasses.replace(plan, units_per_process=1))
    alone.run()
    packed = _block(tmp_path / "packed", plan)
    first = packed._claim()
    assert [u.train.lr for u in first] == [1e-3, 3e-3]
    packed.running.clear()
    packed._busy.clear()
    drawn = []
    with pytest.MonkeyPatch.context() as patch:  # the pack draws its cell's splits once, not once per unit
        patch.setattr(units, "materialize", lambda *args: drawn.append(args[3]) or materialize(*args))
        outcome = run_units(first, torch.device("cpu"), Execution(), deadline=time.time(), state=packed.state)
    assert sorted(drawn) == ["test", "train"]
    assert outcome.rows == [] and outcome.rate["units"] == 2 and outcome.rate["members"] == 2  # both paused
    assert {s for _, s in packed.states()} == {"resumes"} and len(packed._claim()) == 2  # resumed as a pack
    packed.running.clear()
    packed._busy.clear()
    with pytest.MonkeyPatch.context() as patch:  # a pack never passes PACK_MAX_TOKENS tokens per step
        patch.setattr(runner, "PACK_MAX_TOKENS", 2 * first[0].tokens_per_step() - 1)
        assert len(packed._claim()) == 1
    packed.running.clear()
    packed._busy.clear()
    packed.results.record(outcome)
    packed.run()
    key = ("train", "seed", "token_acc", "seq_acc", "final_loss", "evals", "steps")
    rows = {name: [{k: r[k] for k in key} for r in read_jsonl(tmp_path / name / "mqar.jsonl")]
            for name in ("alone", "packed")}  # fmt: skip
    assert rows["packed"] == rows["alone"] and len(rows["alone"]) == 2
    rates = read_jsonl(tmp_path / "packed" / "rates.jsonl")
    assert [(r["units"], r["members"], r["ended"]) for r in rates] == [(2, 2, "paused"), (2, 2, "steps")]


def test_failed_units_are_reported_not_fatal(tmp_path, capsys):
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(json.dumps({
        "archs": ["gpt"], "families": ["mqar"], "device": "cpu", "model_overrides": {"gpt": {"bogus": 1}},
        "estimate": {"tokens_per_s": {"gpt": 1e4}},
        "mqar": {"vocab": 64, "num_train": 8, "num_test": 8, "train": {"steps": 2, "batch_size": 2},
                 "stages": [{"archs": ["gpt"], "cells": [[16, 2]], "depths": [1], "d_models": [16], "lrs": [1e-3],
                             "seeds": [0]}]},
    }))  # fmt: skip
    with pytest.raises(SystemExit, match="1 unit\\(s\\) failed"):
        synthetic(
            [
                "run",
                "--plan",
                str(plan_file),
                "--results",
                str(tmp_path / "r"),
                "--state",
                str(tmp_path / "s"),
                "--in-process",
            ]
        )
    assert not (tmp_path / "r" / "mqar.jsonl").exists()


def test_one_slot_runs_its_units_on_the_main_thread(tmp_path, monkeypatch):
    """With one slot (always so in-process) the runner starts no thread: CUDA graphs are captured and torch.compile
    runs on the main thread, as in a script; in-process, each pack starts with torch.compile's caches cleared."""
    import threading

    threads, resets, run_units = [], [], runner.run_units

    def watched_run_units(*args):
        threads.append(threading.current_thread() is threading.main_thread())
        return run_units(*args)

    monkeypatch.setattr(runner, "run_units", watched_run_units)
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(len(threads)))
    plan = _tiny_plan(families=["mqar"], members=1)
    block = _block(tmp_path, plan)
    assert block.slots == 1
    block.run()
    assert threads == [True, True] and not block.failed  # both units, in this thread
    assert resets == [0, 1]  # torch.compile's caches cleared before each, as a fresh process would have them


def test_units_run_in_child_processes_side_by_side(tmp_path):
    plan = _tiny_plan(families=["mqar"], members=1, procs_per_gpu=2)
    block = _block(tmp_path, plan, in_process=False)
    assert block.slots == 2
    block.run()
    rows = read_jsonl(tmp_path / "mqar.jsonl")
    assert sorted(r["train"]["lr"] for r in rows) == [1e-3, 3e-3] and not block.failed
    rates = read_jsonl(tmp_path / "rates.jsonl")
    assert all(r["procs_per_gpu"] == 2 for r in rates)
    for rate in rates:  # the child's start (imports) and exit are timed too, and all of it fits the runner's wall
        phases = rate["phases_s"]
        assert list(phases) == ["start", "build", "load", "setup", "finish", "exit"], phases
        assert phases["start"] > 0 and all(t >= 0 for t in phases.values())
        assert sum(phases.values()) <= rate["overhead_s"] + 0.1, (phases, rate["overhead_s"])
    with pytest.raises(ValueError, match="one unit at a time"):
        _block(tmp_path, plan, in_process=True)


def test_merge_appends_only_new_rows_and_stamps_the_commit(tmp_path):
    unit = _a5_unit()
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.mkdir(), theirs.mkdir()
    (mine / "a5.jsonl").write_text(json.dumps(_row(unit, 0, 0.5, run={"commit": "old"})) + "\n")
    rows = [_row(unit, 0, 0.5, run={"commit": "old"}), _row(unit, 1, 0.6, run={"commit": "unknown"})]
    (theirs / "a5.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (theirs / "rates.jsonl").write_text(json.dumps(_rate(commit="unknown")) + "\n")
    assert merge(theirs, mine, "abc123") == {"a5.jsonl": 1, "rates.jsonl": 1}
    assert [r["run"]["commit"] for r in read_jsonl(mine / "a5.jsonl")] == ["old", "abc123"]
    assert merge(theirs, mine, "abc123") == {"a5.jsonl": 0, "rates.jsonl": 0}  # nothing twice
    (mine / "a5.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match="a5.jsonl:1"):
        read_jsonl(mine / "a5.jsonl")


def test_merge_appends_a_row_its_source_holds_twice_once_and_on_a_line_of_its_own(tmp_path):
    """A row twice in --from (two runs into it) was appended twice; a results file whose last line had lost its
    newline (an editor's save) got the first new row joined to that line, and neither read again."""
    unit = _a5_unit()
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.mkdir(), theirs.mkdir()
    (mine / "a5.jsonl").write_text(json.dumps(_row(unit, 0, 0.5)))  # no newline at its end
    (theirs / "a5.jsonl").write_text(2 * (json.dumps(_row(unit, 1, 0.6)) + "\n"))
    (theirs / "rates.jsonl").write_text(2 * (json.dumps(_rate()) + "\n"))
    assert merge(theirs, mine, "abc123") == {"a5.jsonl": 1, "rates.jsonl": 1}
    assert [r["seed"] for r in read_jsonl(mine / "a5.jsonl")] == [0, 1] and len(read_jsonl(mine / "rates.jsonl")) == 1


def _restore(parts: list[Path], folder: Path) -> dict:
    """What `merge --state` does with the parts: unpack and check them beside `folder`, then swap them in."""
    return states.swap_in_states(states.unpack_states(parts, folder), folder)


def _state_parts(folder: Path, files: dict[str, bytes], part_bytes: int = 700) -> None:
    """A state folder as a device call sends it back: one tar archive split into state.tar.00, .01, ..."""
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    data = buffer.getvalue()
    for i in range(0, len(data), part_bytes):
        (folder / f"state.tar.{i // part_bytes:02d}").write_bytes(data[i : i + part_bytes])


def test_merge_restores_the_state_that_came_back_and_keeps_the_old_one_otherwise(tmp_path, capsys):
    back, mine, state, paused = tmp_path / "back", tmp_path / "mine", tmp_path / "state", tmp_path / "paused"
    (back / "synthetic").mkdir(parents=True), mine.mkdir(), state.mkdir()
    (back / "synthetic" / "a5.jsonl").write_text(json.dumps(_row(_a5_unit(), 0, 0.5, run={"commit": "x"})) + "\n")
    (state / "old.json").write_text("{}")
    unit = plan_units(_tiny_plan(families=["a5"], archs=["kla"]))[0]  # two seeds, paused at step 10
    run_unit(unit, torch.device("cpu"), Execution(), deadline=time.time(), state=paused)
    files = {f"./{p.name}": p.read_bytes() for p in sorted(paused.iterdir()) if p.suffix in (".json", ".pt")}
    _state_parts(back, files, part_bytes=40_000)
    assert len(list(back.glob("state.tar.*"))) > 1
    args = ["merge", "--from", str(back / "synthetic"), "--results", str(mine), "--state", str(state)]
    synthetic(args)
    added = json.loads(capsys.readouterr().out)
    assert added["a5.jsonl"] == 1 and added["state"]["units"] == 1
    kept = sorted([".lock", *(name[2:] for name in files)])  # the state folder's lock file stays
    assert sorted(p.name for p in state.iterdir()) == kept  # replaced, not added to
    # a call killed before its block's end brought back a checkpoint and no progress rows: merge records them
    assert added["progress.jsonl from the state"] == 2
    assert [(r["seed"], r["steps"], r["ended"]) for r in read_jsonl(mine / "progress.jsonl")] == [
        (0, 10, "paused"), (1, 10, "paused")]  # fmt: skip
    synthetic(args)
    assert json.loads(capsys.readouterr().out)["progress.jsonl from the state"] == 0  # the same pause, not twice
    for part in back.glob("state.tar.*"):
        part.unlink()
    synthetic(args)
    assert json.loads(capsys.readouterr().out) == {"a5.jsonl": 0, "state": f"none came back: kept {state}"}
    assert sorted(p.name for p in state.iterdir()) == kept
    _state_parts(back, {"../outside.json": b"{}"})  # a member outside the folder: refused, the state kept
    with pytest.raises(SystemExit, match="cannot be unpacked"):
        synthetic(args)
    assert not (tmp_path / "outside.json").exists()
    assert sorted(p.name for p in state.iterdir()) == kept
    # a new row beside an archive cut short, or whole but holding a state cut short: the archive is checked first,
    # so nothing is merged (neither the row nor the state)
    (back / "synthetic" / "a5.jsonl").write_text(json.dumps(_row(_a5_unit(), 1, 0.5, run={"commit": "x"})) + "\n")
    rows, pt = (mine / "a5.jsonl").read_text(), next(name for name in files if name.endswith(".pt"))
    for cut_short in ("archive", "state"):
        for part in back.glob("state.tar.*"):
            part.unlink()
        if cut_short == "archive":
            (piece,) = states.pack_states(paused, back)
            piece.write_bytes(piece.read_bytes()[:-1000])
        else:
            _state_parts(back, {**files, pt: files[pt][:-100]}, part_bytes=40_000)
        why = "cannot be unpacked" if cut_short == "archive" else f"holds a damaged state: state file {pt[2:]} is not"
        with pytest.raises(SystemExit, match=why):
            synthetic(args)
        assert (mine / "a5.jsonl").read_text() == rows
        assert sorted(p.name for p in state.iterdir()) == kept
        assert not state.with_name("state.restoring").exists()
    with pytest.raises(SystemExit, match="does not exist"):
        synthetic(["merge", "--from", str(tmp_path / "nowhere"), "--results", str(mine)])


def _info(step: int = 3) -> bytes:
    """A state's .json, in short."""
    return json.dumps({"unit": {}, "label": "a unit", "step": step, "spent": {}}).encode()


def _saved(data) -> bytes:
    """What torch.save writes for `data`: a zip archive, as a state's .pt."""
    import io

    buffer = io.BytesIO()
    torch.save(data, buffer)
    return buffer.getvalue()


def test_pack_writes_the_pieces_merge_restores_and_drops_stale_ones(tmp_path, capsys):
    state, out, back = tmp_path / "state", tmp_path / "out", tmp_path / "back"
    state.mkdir()
    noise = torch.randn(15_000, generator=torch.Generator().manual_seed(0)) * 0.02  # weights-like fp32, in pieces
    files = {"abc.json": _info(), "abc.pt": _saved(noise), "def.json": _info(), "def.pt": _saved({})}
    for name, data in files.items():
        (state / name).write_bytes(data)
    (state / "notes.txt").write_text("not a state")
    parts = states.pack_states(state, out, part_bytes=2000)
    assert [p.name for p in parts] == [f"state.tar.{i:02d}" for i in range(len(parts))] and len(parts) > 2
    assert max(p.stat().st_size for p in parts) == 2000
    (out / "state.tar.00.tmp").write_bytes(b"half written")  # a piece cut off mid-write is not one
    assert states.state_parts(out) == parts
    assert sum(p.stat().st_size for p in parts) < 0.92 * len(files["abc.pt"])  # in planes (plain deflate: 0.93)
    _restore(states.state_parts(out), back)
    assert {p.name: p.read_bytes() for p in back.iterdir()} == {**files, ".lock": b""}  # no stray notes, its own lock
    whole = parts[-1].read_bytes()
    for damaged in (whole[:-5], whole + b"stale"):  # a piece cut short, a stray one after it: refused, the folder kept
        parts[-1].write_bytes(damaged)
        with pytest.raises(ValueError, match="cannot be unpacked"):
            _restore(states.state_parts(out), back)
    assert {p.name: p.read_bytes() for p in back.iterdir()} == {**files, ".lock": b""}
    (state / "abc.pt").write_bytes(_saved(noise[:10].clone()))
    synthetic(["pack", "--state", str(state), "--out", str(out)])
    assert json.loads(capsys.readouterr().out) == {"parts": ["state.tar.00"], "units": 2, "state_mib": 0.0,
                                                   "packed_mib": 0.0}  # fmt: skip
    assert states.state_parts(out) == [out / "state.tar.00"]  # the larger pack's other pieces are gone
    with pytest.raises(SystemExit, match="state folder .*nowhere does not exist"):
        synthetic(["pack", "--state", str(tmp_path / "nowhere"), "--out", str(out)])


def test_merge_and_pack_import_no_torch(tmp_path):
    """merge and pack only move files, but imported torch and transformers through klalm.tasks (5 s of imports on a
    2-core machine, after and beside every device call): in a process of its own, as the command runs, neither is
    imported (this test process has imported torch already)."""
    import subprocess
    import sys

    back, results, state, out = tmp_path / "back", tmp_path / "results", tmp_path / "state", tmp_path / "out"
    back.mkdir(), results.mkdir(), state.mkdir()
    (back / "a5.jsonl").write_text(json.dumps(_row(_a5_unit(), 0, 0.5)) + "\n")
    (state / "abc.json").write_bytes(_info())
    (state / "abc.pt").write_bytes(_saved({"members": [torch.ones(8)], "evals": [[]], "spent": {}}))
    merge_args = ["merge", "--from", str(back), "--results", str(results), "--state", str(state)]
    code = f"""
import sys
from klalm.cli import synthetic
synthetic({merge_args!r})
synthetic({["pack", "--state", str(state), "--out", str(out)]!r})
print(sorted(name for name in ("torch", "transformers", "lightning") if name in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    merged, packed, heavy = done.stdout.splitlines()
    assert json.loads(merged) == {"a5.jsonl": 1, "state": f"none came back: kept {state}"}
    assert json.loads(packed)["parts"] == ["state.tar.00"] and heavy == "[]"


def test_positions_and_curves_import_no_torch(tmp_path):
    """positions and curves only read a results folder, but ran in klalm.tasks.runner, which imports torch (5 s of
    imports on a 2-core machine for a table): in a process of its own, neither they nor their plots import it."""
    import subprocess
    import sys

    evals = [[10, 1.0, 0.25, 0.0], [20, 0.5, 0.75, 0.0]]
    row = _row(
        _a5_unit(length=3, steps=20),
        0,
        0.75,
        evals=evals,
        planned_steps=20,
        ended="steps",
        position_acc=[1.0, 0.5, 0.75],
    )
    (tmp_path / "a5.jsonl").write_text(json.dumps(row) + "\n")
    results, plot = ["--results", str(tmp_path)], ["--plot", str(tmp_path / "p.png")]
    code = f"""
import sys
from klalm.cli import synthetic
synthetic({["positions", *results, *plot]!r})
synthetic({["curves", *results, "--steps", "20", *plot]!r})
print(sorted(name for name in ("torch", "transformers", "lightning") if name in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[2] == "| kla L=3 depth=1 | 0 | 20 | 75.0 | 0.0 | 100 | 50 | 75 |"  # positions
    assert lines[5] == "| kla L=3 depth=1 | 0 | steps at 20 | 75.0 | 75.0 (20) |"  # curves
    assert lines[-1] == "[]" and (tmp_path / "p.png").stat().st_size > 1000


def test_state_folders_work_where_there_is_no_flock(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "fcntl", None)  # `import fcntl` fails, as on Windows
    state, out = tmp_path / "state", tmp_path / "out"
    state.mkdir()
    (state / "abc.json").write_bytes(_info())
    (state / "abc.pt").write_bytes(_saved({}))
    assert [p.name for p in states.pack_states(state, out)] == ["state.tar.00"]
    states.remove_state(state, "abc")
    assert list(state.iterdir()) == []  # no lock file either


def test_damaged_states_are_refused_in_one_line_naming_the_file_before_anything_is_written(tmp_path, monkeypatch):
    """A state cut short (its .pt) or damaged (its .json): every verb that reads the state folder refuses it, naming
    the file, before it writes: pack no piece, progress no --results folder, run no row (and no unit starts)."""
    run = ["run", "--plan", "cpu", "--families", "a5", "--archs", "gpt", "--a5-lengths", "3", "--a5-depths", "1"]
    unit = plan_units(apply_args(load_plan("cpu"), parse_args([*run, "--results", "x"])))[0]
    name, cut, flipped, bad = units.state_name(unit), tmp_path / "cut", tmp_path / "flipped", tmp_path / "bad"
    info = {"unit": dataclasses.asdict(unit), "label": unit.label(), "step": 5, "spent": {}}
    for folder in (cut, flipped, bad):
        folder.mkdir()
        (folder / f"{name}.json").write_text(json.dumps(info))
        (folder / f"{name}.pt").write_bytes(_saved({"members": [torch.ones(256)], "evals": [[]], "spent": {}}))
    (cut / f"{name}.pt").write_bytes((cut / f"{name}.pt").read_bytes()[:-100])  # a copy cut short
    whole = bytearray((flipped / f"{name}.pt").read_bytes())
    at = whole.index(torch.ones(256).numpy().tobytes())  # the tensor's bytes: torch.load would take them as they are
    whole[at + 10] ^= 0xFF
    (flipped / f"{name}.pt").write_bytes(bytes(whole))
    (bad / f"{name}.json").write_text('{"unit": {"fam\n')

    def execute(self, pack, slot):
        raise AssertionError("a unit started from a damaged state")

    monkeypatch.setattr(GridBlock, "_execute", execute)
    results, out = tmp_path / "results", tmp_path / "out"
    verbs = [["evaluate"], ["progress", "--results", str(results)], ["pack", "--out", str(out)],
             [*run, "--results", str(results)], ["plan", *run[1:], "--results", str(results)]]  # fmt: skip
    for damaged, why in ((cut / f"{name}.pt", "is not a whole torch.save archive"),
                         (flipped / f"{name}.pt", r"is damaged: its member \S+ fails its CRC-32 check"),
                         (bad / f"{name}.json", "is not JSON: Invalid control character")):  # fmt: skip
        for verb in verbs:
            with pytest.raises(SystemExit) as refused:
                synthetic([*verb, "--state", str(damaged.parent)])
            assert re.fullmatch(f"klalm-synthetic: state file {re.escape(str(damaged))} ({why}).*", refused.value.code)
    assert not results.exists() and not out.exists()


def _pause(folder: Path, unit: Unit, step: int) -> None:
    """units._save_state of a one-seed `unit` paused at `step`, its member a stand-in (its state is its step)."""
    member = types.SimpleNamespace(step=step, state_dict=lambda: {"step": step})
    evals = [[{"step": step, "loss": 1.0, "token_acc": 0.5, "seq_acc": 0.0}]]
    units._save_state(folder, unit, [member], evals, {"train_s": step, "wall_s": step, "blocks": 1})


def _saved_unless_locked(folder: Path, save) -> bool:
    """Run `save`, another process's save into the state folder `folder` at this moment, unless the folder's lock is
    held (that save would wait for it); returns whether it ran."""
    folder.mkdir(parents=True, exist_ok=True)  # as states.locked does
    try:
        os.close(flock_path(folder / ".lock", os.O_CREAT | os.O_WRONLY))
    except BlockingIOError:
        return False
    save()
    return True


def test_merge_replaces_the_states_under_the_lock_a_save_takes(tmp_path, monkeypatch, capsys):
    """merge --state removed the state folder and renamed the unpacked one into its place without the folder's lock:
    a block pausing into that folder meanwhile (its rows going to another --results) had its save removed, or made
    the folder anew, and the swap failed ("Directory not empty"), the old states gone and the new ones beside it."""
    back, state = tmp_path / "back", tmp_path / "state"
    (tmp_path / "mine").mkdir()
    _pause(tmp_path / "paused", _a5_unit(length=4), 10)
    states.pack_states(tmp_path / "paused", back)
    _pause(state, _a5_unit(length=5), 5)  # what the merge replaces
    pausing, replace, meanwhile = _a5_unit(length=6), os.replace, []

    def swap(source, target):  # the swap's first rename: the block's unit pauses now
        if "state.restoring" in str(source) and not meanwhile:
            meanwhile.append(_saved_unless_locked(state, lambda: _pause(state, pausing, 20)))
        replace(source, target)

    monkeypatch.setattr(os, "replace", swap)
    synthetic(["merge", "--from", str(back / "synthetic"), "--results", str(tmp_path / "mine"), "--state", str(state)])
    assert json.loads(capsys.readouterr().out)["state"]["units"] == 1 and meanwhile == [False]
    _pause(state, pausing, 20)  # the save that waited for the lock
    assert sorted(states.saved_states(state)) == sorted(units.state_name(_a5_unit(length=n)) for n in (4, 6))
    states.check_states(state)


def test_readers_of_saved_states_take_the_lock_a_save_takes(tmp_path, monkeypatch):
    """paused_rows and evaluate_saved read a state's .json, then the .pt it named, without the folder's lock: a save
    between the two (a block pausing or checkpointing into the folder beside `progress` or `evaluate`) had removed
    that .pt, and the state was refused as missing."""
    unit = plan_units(_tiny_plan(families=["a5"], archs=["kla"]))[0]
    members = [build_member(unit, seed, torch.device("cpu"), None) for seed in unit.seeds]  # untrained: step 0
    evals = [[{"step": 0, "loss": 1.0, "token_acc": 0.5, "seq_acc": 0.0}] for _ in unit.seeds]
    spent = {"train_s": 1.0, "wall_s": 1.0, "blocks": 1}
    units._save_state(tmp_path, unit, members, evals, spent)
    check = units.check_weights

    def saved_meanwhile(weights: Path) -> None:  # after the reader read the .json: the unit saves again
        _saved_unless_locked(tmp_path, lambda: units._save_state(tmp_path, unit, members, evals, spent))
        check(weights)

    monkeypatch.setattr(units, "check_weights", saved_meanwhile)
    assert [(row["seed"], row["steps"]) for row in paused_rows(tmp_path, "abc")] == [(0, 0), (1, 0)]
    assert [(row["seed"], row["steps"]) for row in evaluate_saved(tmp_path, torch.device("cpu"))] == [(0, 0), (1, 0)]


def test_a_block_checks_the_saved_states_under_the_lock_a_save_takes(tmp_path, monkeypatch, capsys):
    """A block (and `plan`) checked the state folder's states at its start without the folder's lock: a save between
    reading a .json and checking the .pt it named (a block checkpointing into the folder beside `plan`) had removed
    that .pt, and the plan was refused ("state file ... is missing")."""
    state, unit = tmp_path / "state", _a5_unit()
    _pause(state, unit, 10)
    check, meanwhile = states.check_weights, []

    def saved_meanwhile(weights: Path) -> None:  # after the block read the .json: the unit checkpoints again
        meanwhile.append(_saved_unless_locked(state, lambda: _pause(state, unit, 20)))
        check(weights)

    monkeypatch.setattr(states, "check_weights", saved_meanwhile)
    knobs = ["--plan", "cpu", "--families", "a5", "--archs", "gpt", "--a5-lengths", "3", "--a5-depths", "1"]
    synthetic(["plan", *knobs, "--results", str(tmp_path / "r"), "--state", str(state)])
    assert meanwhile == [False] and "| a5 length=3 gpt depth=1 d=32" in capsys.readouterr().out


def test_a_save_killed_between_its_weights_and_its_json_leaves_the_last_pair_whole(tmp_path, monkeypatch):
    """_save_state replaced X.pt, then X.json: a process killed between the two left the new weights beside the last
    save's step, which the runner reads (estimates, packs of units paused at one step) and progress recorded with the
    new weights' evaluations."""
    unit = _a5_unit()
    name = units.state_name(unit)

    def steps() -> tuple[int, int, int]:  # what the .json says, what its weights hold, what progress records
        (row,) = paused_rows(tmp_path, "abc")
        weights = units._load_state(tmp_path, unit, torch.device("cpu"))["members"][0]["step"]
        return states.saved_states(tmp_path)[name]["step"], weights, row["evals"][-1][0]

    def killed(path, data):
        raise KeyboardInterrupt  # the process ended before the .json was written

    _pause(tmp_path, unit, 10)
    monkeypatch.setattr(units, "write_atomic", killed)
    with pytest.raises(KeyboardInterrupt):
        _pause(tmp_path, unit, 20)
    monkeypatch.undo()
    assert steps() == (10, 10, 10)  # the last save, whole
    assert [p.name for p in states.state_files(tmp_path)] == [f"{name}.json", f"{name}.pt"]  # packed: not the cut one
    _pause(tmp_path, unit, 30)  # writes over the cut save's weights, then removes the last save's
    assert steps() == (30, 30, 30) and sorted(p.name for p in tmp_path.glob("*.pt")) == [f"{name}.1.pt"]
    info = json.loads((tmp_path / f"{name}.json").read_text())
    for weights, why in ((f"{name}.pt", f"{name}.pt is missing"), ("../other.pt", "names weights '../other.pt'")):
        (tmp_path / f"{name}.json").write_text(json.dumps({**info, "weights": weights}))  # a pair put together by hand
        with pytest.raises(ValueError, match=re.escape(why)):
            states.check_states(tmp_path)
    states.remove_state(tmp_path, name)
    assert [p.name for p in tmp_path.iterdir()] == [".lock"]


def test_pack_every_s_sends_each_new_checkpoint_until_killed(tmp_path):
    import subprocess
    import sys

    state, out = tmp_path / "state", tmp_path / "out"
    state.mkdir()
    (state / "abc.json").write_bytes(_info(1))
    (state / "abc.pt").write_bytes(_saved(1))
    script = Path(__file__).resolve().parents[2] / "scripts" / "run_synthetic.py"
    watcher = subprocess.Popen([sys.executable, str(script), "pack", "--state", str(state), "--out", str(out),
                                "--every-s", "0.05"])  # fmt: skip

    def unpacked(step: int | None) -> bool:
        """Whether the pieces in `out` come to hold abc.json at `step` (None: no state) within two minutes."""
        deadline = time.time() + 120
        while time.time() < deadline:
            if states.state_parts(out):
                back = tmp_path / "back"
                _restore(states.state_parts(out), back)
                saved = states.saved_states(back)
                if (saved.get("abc", {}).get("step") if saved else None) == step:
                    return True
            time.sleep(0.05)
        return False

    try:
        assert unpacked(1)
        for name, data in (("abc.pt", _saved(2)), ("abc.json", _info(2))):  # each whole at once, as _save_state's
            (state / "new").write_bytes(data)
            os.replace(state / "new", state / name)
        assert unpacked(2)
        states.remove_state(state, "abc")  # its unit finished: the pieces must not bring the state back
        assert unpacked(None)
    finally:
        watcher.kill()
        watcher.wait()


def test_checkpoints_need_a_state_folder_and_a_positive_period(tmp_path):
    plan = _tiny_plan()
    with pytest.raises(ValueError, match="--checkpoint-every-s needs --state"):
        GridBlock(plan, Results(tmp_path, plan.families), None, "cpu", 0, True, None, "abc", checkpoint_every_s=60.0)
    for every_s in (0.0, math.nan):  # nan had saved at every evaluation
        with pytest.raises(ValueError, match=f"--checkpoint-every-s must be > 0, got {every_s}"):
            GridBlock(plan, Results(tmp_path, plan.families), tmp_path, "cpu", 0, True, None, "abc",
                      checkpoint_every_s=every_s)  # fmt: skip


def test_a_block_with_checkpoints_saves_them_in_its_child_processes_and_removes_them_at_the_end(tmp_path, capfd):
    plan = _tiny_plan(families=["mqar"], members=1, procs_per_gpu=2)
    plan.mqar.eval_every = 10  # an evaluation at step 10 of 20: one checkpoint per unit
    block = GridBlock(plan, Results(tmp_path, plan.families), tmp_path / "state", "cpu", 0, False, None, "abc",
                      checkpoint_every_s=1e-9)  # fmt: skip
    block.run()
    assert len(read_jsonl(tmp_path / "mqar.jsonl")) == 2 and not block.failed
    assert capfd.readouterr().err.count("checkpoint at step 10: 1 unit(s) saved") == 2
    assert states.saved_states(tmp_path / "state") == {}  # the checkpoints of finished units are removed


def test_plan_verb_lists_units_with_estimates(tmp_path, capsys):
    synthetic(["plan", "--plan", "full", "--families", "a5", "--archs", "kla", "--results", str(tmp_path)])
    out = capsys.readouterr().out
    assert "| a5 length=4 kla depth=1 d=128 lr=0.001 wd=0.01 seeds=0,1,2 | ready |" in out
    assert "| a5 length=4 kla depth=2 d=128 lr=0.001 wd=0.01 seeds=0,1,2 | waits |" in out
    assert "packs of up to 4 units run side by side" in out  # the sum counts each unit alone
    ready = re.search(r"\| a5 \| ready \| (\d+) \| ([\d,.]+) \|", out)  # the per-family sums
    assert ready and int(ready[1]) == out.count("| ready |") - 1 and float(ready[2].replace(",", "")) > 0
    assert Path(tmp_path).is_dir()


def test_plan_verb_estimates_for_a_named_gpu_and_bad_input_is_one_line(tmp_path, capsys, monkeypatch):
    rate = _rate(device="NVIDIA H200", d_model=128, members=3, tokens_per_step=256 * 4 + 25 * 2, step_s=0.004)
    (tmp_path / "rates.jsonl").write_text(json.dumps(rate) + "\n")
    args = ["plan", "--plan", "full", "--families", "a5", "--archs", "kla", "--results", str(tmp_path)]
    synthetic([*args, "--gpu-name", "NVIDIA H200", "--compile", "none"])
    assert "seeds=0,1,2 | ready | 471 | 4.00 ms/step from rates.jsonl lines 1;" in capsys.readouterr().out  # x 1.15
    synthetic([*args, "--gpu-name", "NVIDIA H200"])  # as that GPU runs the full plan: compiled, no compiled run yet
    out = capsys.readouterr().out  # (60 s prior overhead + 100,000 x 4 ms) x 1.15
    assert "seeds=0,1,2 | ready | 529 | 4.00 ms/step from eager rates.jsonl lines 1; overhead 60 s (prior)" in out
    synthetic(args)  # this machine's device has no rows: the plan's prior
    assert "| prior |" in capsys.readouterr().out
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="^klalm-synthetic: device='cuda' but torch sees no CUDA device"):
        synthetic([*args, "--device", "cuda"])
    with pytest.raises(SystemExit, match="^klalm-synthetic: device='tpu'"):
        synthetic([*args, "--device", "tpu"])


def _documented_commands() -> list[list[str]]:
    """Arguments of every `run_synthetic.py` / `klalm-synthetic` call in docs/synthetic.md, its run log and README.md,
    and a `run` call for every stage of a documented `RUNS=...` (scripts/device_synthetic.sh's examples count too)."""
    import re
    import shlex

    root = Path(__file__).resolve().parents[2]
    calls = []
    docs = ("docs/synthetic.md", "docs/synthetic_log.md", "README.md")
    for doc in (root / name for name in docs):
        for block in re.findall(r"^```bash\n(.*?)^```", doc.read_text(), re.M | re.S):
            for line in block.replace("\\\n", " ").splitlines():
                tokens = shlex.split(line.replace("$OUT", "/tmp/out").replace("<files_at>", "/tmp/back"), comments=True)
                for i, token in enumerate(tokens):
                    if token.endswith(("run_synthetic.py", "klalm-synthetic")):
                        end = next((j for j in range(i + 1, len(tokens)) if tokens[j] in ("&&", "&", "|", "2>&1", ";")),
                                   len(tokens))  # fmt: skip
                        calls.append(tokens[i + 1 : end])
    texts = [(root / name).read_text() for name in (*docs, "scripts/device_synthetic.sh")]
    for quoted, stages in re.findall(r"RUNS=(\$?)'([^']*)'", "\n".join(texts)):
        for stage in (stages.replace("\\n", "\n") if quoted else stages).splitlines():
            calls.append(["run", "--plan", "full", *shlex.split(stage), "--results", "/tmp/out/synthetic"])
    return calls


def test_documented_device_stages_are_found():
    """`RUNS` stages are checked by the test below: docs/synthetic.md's (A5, MQAR, MAD) and the script's examples."""
    stages = [c for c in _documented_commands() if c[-2:] == ["--results", "/tmp/out/synthetic"]]
    assert len(stages) >= 6 and {c[4] for c in stages} == {"a5", "mqar", "mad"}, stages


def test_positions_of_finished_runs_filter_table_and_plot(tmp_path, capsys):
    plan = _tiny_plan(families=["a5"], archs=["gpt", "kla"])
    block = _block(tmp_path, plan)
    gpt1, kla1, gpt2, _ = block.units
    block.results.record(_outcome([_row(kla1, 0, 0.9, position_acc=[1.0, 0.875, 0.5]),
                                   _row(kla1, 1, 0.4, position_acc=[1.0, 0.25, None]),
                                   _row(gpt2, 0, 0.7, position_acc=[1.0, 1.0, 0.125]),
                                   _row(gpt1, 0, 0.5)]))  # fmt: skip  # a row from before position_acc
    synthetic(["positions", "--results", str(tmp_path), "--plot", str(tmp_path / "positions.png")])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| unit | seed | step | token acc | seq acc | 0 | 1 | 2 |"  # no "recorded" column here
    assert lines[2:] == ["| gpt L=3 depth=2 | 0 | 20 | 70.0 | 0.0 | 100 | 100 | 12 |",
                         "| kla L=3 depth=1 | 0 | 20 | 90.0 | 0.0 | 100 | 88 | 50 |",
                         "| kla L=3 depth=1 | 1 | 20 | 40.0 | 0.0 | 100 | 25 |  |"]  # fmt: skip
    assert (tmp_path / "positions.png").stat().st_size > 1000
    synthetic(["positions", "--results", str(tmp_path), "--archs", "kla", "--depths", "1", "--lengths", "3"])
    assert len(capsys.readouterr().out.splitlines()) == 4
    with pytest.raises(SystemExit, match="no A5 row with accuracy by position in .* matches"):
        synthetic(["positions", "--results", str(tmp_path), "--depths", "4"])
    with pytest.raises(SystemExit, match="results folder .*nowhere does not exist"):
        synthetic(["positions", "--results", str(tmp_path / "nowhere")])
    assert not (tmp_path / "nowhere").exists()  # a mistyped folder is not created


def test_mqar_positions_by_span_table_and_plot(tmp_path, capsys):
    """MQAR rows score only their query positions (None elsewhere): shown as means over spans of length/8."""
    plan = _tiny_plan(families=["mqar"])
    block = _block(tmp_path, plan)
    first = block.units[0]  # gpt, L 16, K 2, depth 1, d 16, lr 1e-3
    acc = [None] * 4 + [1.0, None, 0.5, None, 0.25, None, None, None, 0.0, None, None, 0.5]
    block.results.record(_outcome([_row(first, 0, 0.5, position_acc=acc)]))
    synthetic(["positions", "--family", "mqar", "--results", str(tmp_path), "--plot", str(tmp_path / "mqar.png")])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("MQAR L=16 K=2, held-out accuracy (%) by query position")
    assert lines[2] == "| unit | seed | step | token acc | 4–5 | 6–7 | 8–9 | 12–13 | 14–15 |"  # 10–11: no query
    assert lines[4:] == ["| gpt L=16 K=2 depth=1 d=16 lr=0.001 | 0 | 20 | 50.0 | 100.0 | 50.0 | 25.0 | 0.0 | 50.0 |"]
    assert (tmp_path / "mqar.png").stat().st_size > 1000
    with pytest.raises(SystemExit, match="no MQAR row with accuracy by position in .* matches"):
        synthetic(["positions", "--family", "mqar", "--results", str(tmp_path), "--lengths", "64"])


def test_positions_show_a_paused_run_at_its_last_evaluation(tmp_path, capsys):
    """A paused unit's latest progress row (not an earlier one) joins the finished rows, its step marked paused; a
    progress row of a run that has since finished is not shown twice."""
    plan = _tiny_plan(families=["mqar"])
    block = _block(tmp_path, plan)
    done, paused = block.units  # gpt, L 16, K 2, lr 1e-3 and 3e-3

    def pause(unit, steps, level):  # a progress row whose every query is right with probability `level`
        evals, acc = [[steps, 1.0, level, 0.0]], [None] * 4 + [level] * 12
        return _row(unit, 0, level, steps=steps, ended="paused", planned_steps=20, evals=evals, position_acc=acc)

    block.results.record_progress([pause(done, 10, 0.25)])  # then it finished:
    evals, acc = [[10, 2.0, 0.25, 0.0], [20, 0.1, 1.0, 1.0]], [None] * 4 + [1.0] * 12
    block.results.record(_outcome([_row(done, 0, 1.0, steps=20, planned_steps=20, position_acc=acc, evals=evals)]))
    block.results.record_progress([pause(paused, 10, 0.25)])
    block.results.record_progress([pause(paused, 12, 0.5)])
    synthetic(["positions", "--family", "mqar", "--results", str(tmp_path), "--plot", str(tmp_path / "p.png")])
    lines = capsys.readouterr().out.splitlines()
    cells = [line.split(" | ")[1:4] for line in lines[4:]]
    assert cells == [["0", "20", "100.0"], ["0", "12 (paused)", "50.0"]], lines  # finished, then the latest pause
    assert lines[5].startswith("| gpt L=16 K=2 depth=1 d=16 lr=0.003 |") and lines[5].endswith("| 50.0 |")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_curves_show_finished_and_paused_runs_by_step(tmp_path, capsys):
    """`curves`: a finished run's accuracy at each step (its last evaluation at or before it), a paused run's from
    its latest progress row, blank past its last evaluation; the plot; and a filter that matches nothing."""
    plan = _tiny_plan(families=["mqar"])
    block = _block(tmp_path, plan)
    done, paused = block.units  # gpt, L 16, K 2, lr 1e-3 and 3e-3
    evals = [[10, 2.0, 0.25, 0.0], [20, 1.0, 0.75, 0.5]]
    block.results.record(_outcome([_row(done, 0, 0.75, evals=evals, ended="steps", planned_steps=20)]))
    for steps, acc in ((10, 0.5), (12, 0.625)):  # two pauses: the later one is shown
        so_far = [[10, 1.5, 0.5, 0.0], [steps, 1.2, acc, 0.0]][: 1 + (steps > 10)]
        block.results.record_progress(
            [_row(paused, 0, acc, steps=steps, ended="paused", planned_steps=20, evals=so_far)]
        )
    synthetic(["curves", "--family", "mqar", "--results", str(tmp_path), "--plot", str(tmp_path / "curves.png")])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| unit | seed | ended | step 4 | step 8 | step 12 | step 16 | step 20 | last (step) |"
    assert lines[2:] == [
        "| gpt L=16 K=2 depth=1 d=16 lr=0.001 | 0 | steps at 20 |  |  | 25.0 | 25.0 | 75.0 | 75.0 (20) |",
        "| gpt L=16 K=2 depth=1 d=16 lr=0.003 | 0 | paused at 12 |  |  | 62.5 |  |  | 62.5 (12) |"]  # fmt: skip
    assert (tmp_path / "curves.png").stat().st_size > 1000
    synthetic(["curves", "--family", "mqar", "--results", str(tmp_path), "--steps", "15"])
    assert capsys.readouterr().out.splitlines()[2:] == [
        "| gpt L=16 K=2 depth=1 d=16 lr=0.001 | 0 | steps at 20 | 25.0 | 75.0 (20) |",
        "| gpt L=16 K=2 depth=1 d=16 lr=0.003 | 0 | paused at 12 |  | 62.5 (12) |"]  # fmt: skip
    with pytest.raises(SystemExit, match="no MQAR run with evaluations in .* matches"):
        synthetic(["curves", "--family", "mqar", "--results", str(tmp_path), "--lengths", "64"])
    with pytest.raises(SystemExit, match="no A5 run"):  # another family's paused runs are not this one's
        synthetic(["curves", "--family", "a5", "--results", str(tmp_path)])


def test_a_run_has_one_colour_in_the_positions_and_curves_plots(tmp_path, monkeypatch):
    """A paused run (lr 1e-3) sorts before a finished one (lr 3e-3) of the same cell: the positions plot, which shows
    only the finished run, colours it as `curves` does (C1), not as the first line of its own (C0)."""
    from klalm.tasks import report

    plan = _tiny_plan(families=["mqar"])
    block = _block(tmp_path, plan)
    paused, done = block.units  # gpt, L 16, K 2, lr 1e-3 and 3e-3
    evals = [[10, 2.0, 0.25, 0.0], [20, 1.0, 0.75, 0.5]]
    acc = [None] * 4 + [1.0] * 12
    block.results.record(_outcome([_row(done, 0, 0.75, evals=evals, planned_steps=20, position_acc=acc)]))
    block.results.record_progress([_row(paused, 0, 0.5, steps=10, ended="paused", planned_steps=20,
                                        evals=evals[:1])])  # fmt: skip
    rows = report.training_curves(read_jsonl(tmp_path / "mqar.jsonl"), read_jsonl(tmp_path / "progress.jsonl"),
                                  "mqar", [], [], [])  # fmt: skip
    assert list(report.run_colours(rows).values()) == ["C0", "C1"] and rows[0]["ended"] == "paused"
    drawn = {}
    monkeypatch.setattr(report, "plot_positions", lambda rows, path, colours=None: drawn.update(colours=colours))
    synthetic(["positions", "--family", "mqar", "--results", str(tmp_path), "--plot", str(tmp_path / "p.png")])
    assert drawn["colours"][rows[1]["unit"], 0] == "C1"
    monkeypatch.undo()
    synthetic(["positions", "--family", "mqar", "--results", str(tmp_path), "--plot", str(tmp_path / "p.png")])
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_every_documented_command_parses_and_its_plan_loads():
    calls = _documented_commands()
    verbs = {"run", "plan", "report", "merge", "pack", "progress", "evaluate", "positions", "curves"}
    assert len(calls) >= 8 and {c[0] for c in calls} == verbs
    for call in calls:
        if "--help" in call:
            with pytest.raises(SystemExit) as done:
                parse_args(call)
            assert done.value.code == 0
            continue
        args = parse_args(call)
        if args.verb not in ("merge", "pack", "progress", "evaluate", "positions", "curves"):  # verbs with no plan
            assert plan_units(apply_args(load_plan(args.plan), args)), call


def test_a_running_unit_logs_its_progress_at_most_once_a_period(tmp_path, caplog, monkeypatch):
    plan = _tiny_plan(families=["a5"], archs=["gpt"])
    unit = _block(tmp_path, plan).units[0]  # 20 steps, an evaluation every 10
    monkeypatch.setattr(units, "PROGRESS_EVERY_S", 0.0)
    with caplog.at_level(logging.INFO, logger="klalm.tasks.units"):
        run_unit(unit, torch.device("cpu"), Execution())
    lines = [r.getMessage() for r in caplog.records if r.name == "klalm.tasks.units"]
    assert [line.split(" (")[0] for line in lines] == ["step 10/20", "step 20/20"]
    pattern = rf"step 10/20 \([\d.]+ ms a step, \d+ s to the step cap\): token acc {re.escape(unit.label())}: \d+\.\d%"
    assert re.fullmatch(pattern, lines[0])
    caplog.clear()
    monkeypatch.setattr(units, "PROGRESS_EVERY_S", 3600.0)
    with caplog.at_level(logging.INFO, logger="klalm.tasks.units"):
        run_unit(unit, torch.device("cpu"), Execution())
    assert len([r for r in caplog.records if r.name == "klalm.tasks.units"]) == 1  # the first evaluation's only


def test_the_device_script_runs_its_stages_in_order_on_the_budget(tmp_path):
    """scripts/device_synthetic.sh on the CPU (its setup skipped, no nvidia-smi): two A5 stages of 20 steps run one
    after the other (in-process) into $OUT/synthetic, which gets the results files of the named family (and progress
    and rates) only, and the state folder is packed at the end; a FROM call after it, on a fresh machine, starts from
    what that call returned (its rows and its state parts), a FROM call without the parts starts from the state the
    machine kept, and one sent to a fresh machine without the parts is refused; without
    RUNS it refuses, and a failing stage makes it exit 1 (after running it again in a child process, in-process).

    Every call starts Python 3-4 times (merge, the pack watcher, the stage, the final pack; ~7 s each, importing
    torch and transformers), so the failing stage has no call of its own: it is the only stage of the warm FROM call,
    which checks the merge that comes before its stage."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]

    def machine(repo: Path) -> Path:  # a fresh copy of the scripts and an empty results folder, as a new GPU machine
        (repo / "scripts").mkdir(parents=True)
        (repo / "results" / "synthetic").mkdir(parents=True)
        for name in ("device_synthetic.sh", "device_setup.sh", "run_synthetic.py"):
            shutil.copy(root / "scripts" / name, repo / "scripts" / name)
        (repo / "results" / "synthetic" / "mqar.jsonl").write_text("")  # not named by a stage: stays home
        (repo / "results" / "synthetic" / "rates.jsonl").write_text("")
        return repo

    repo, out = machine(tmp_path / "repo"), tmp_path / "out"
    out.mkdir()
    lines = [f"--families a5 --archs gpt --a5-lengths {n} --a5-depths 1 --seeds 0 --steps 20" for n in (3, 4)]
    stages = "\n".join(lines)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "KLALM_DEVICE_SETUP": str(repo),
           "OUT": str(out), "RUNS": stages, "LIMIT": "600", "IN_PROCESS": "1", "OMP_NUM_THREADS": "1"}  # fmt: skip
    done = subprocess.run(["bash", "scripts/device_synthetic.sh"], cwd=repo, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = read_jsonl(out / "synthetic" / "a5.jsonl")
    assert [(r["task"]["length"], r["steps"]) for r in rows] == [(3, 20), (4, 20)]
    assert sorted(p.name for p in (out / "synthetic").iterdir()) == ["a5.jsonl", "rates.jsonl"]
    log = (out / "block.log").read_text()
    heads = [line.split(";")[0] for line in log.splitlines() if line.startswith("== ")]
    assert heads[:-1] == [f"== {x}" for x in lines] and heads[-1].startswith("== state sha256 ")
    assert log.count(", in-process") == 2 and "again in a child" not in log and "will not come back" not in log
    assert (out / "state.tar.00").exists()
    # FROM a copy without the state parts (too large to carry), sent while this machine is still warm: it checks
    # that the state folder here is the one those parts hold and starts from it
    warm, out_warm = repo / ".carry" / "warm_call", tmp_path / "out_warm"
    shutil.copytree(out, warm, ignore=shutil.ignore_patterns("state.tar.*"))
    out_warm.mkdir()
    # Its one stage is a misspelt option (what this call checks is the merge before it): the stage fails in-process,
    # runs again in a child process, fails there too, and the call exits 1 with the error in block.log
    misspelt = "--families a5 --a5-lenghts 3"
    same = subprocess.run(["bash", "scripts/device_synthetic.sh"], cwd=repo, capture_output=True, text=True,
                          env={**env, "OUT": str(out_warm), "RUNS": misspelt, "FROM": ".carry/warm_call"})  # fmt: skip
    assert same.returncode == 1, same.stdout[-2000:] + same.stderr[-2000:]
    log_warm = (out_warm / "block.log").read_text()
    assert "; the state this machine kept" in log_warm
    assert log_warm.count("unrecognized arguments: --a5-lenghts") == 2
    assert "== the in-process run exited with 2: the stage again in a child process" in log_warm
    # FROM a folder holding only parts (a state folder at home, packed: too large to carry unpacked) on a fresh
    # machine: the state is restored, no rows merged
    home, out_home, packed = machine(tmp_path / "home"), tmp_path / "out_home", tmp_path / "packed"
    out_home.mkdir()
    paused = plan_units(_tiny_plan(families=["a5"], archs=["kla"]))[0]
    run_unit(paused, torch.device("cpu"), Execution(), deadline=time.time(), state=packed)  # paused at step 10
    states.pack_states(packed, home / ".carry" / "state_in")
    restored = subprocess.run(["bash", "scripts/device_synthetic.sh"], cwd=home, capture_output=True, text=True,
                              env={**env, "KLALM_DEVICE_SETUP": str(home), "OUT": str(out_home), "RUNS": lines[0],
                                   "FROM": ".carry/state_in"})  # fmt: skip
    assert restored.returncode == 0, restored.stdout[-2000:] + restored.stderr[-2000:]
    assert '"state": {"units": 1' in (out_home / "block.log").read_text()
    assert sorted(states.saved_states(home / ".carry" / "synthetic_state")) == [units.state_name(paused)]
    # FROM: the next call, sent before this one was merged at home, carries what it returned; on a fresh machine
    # (results without its rows, a stale state folder) it starts from those rows and parts: the finished unit is not
    # trained again, and the state folder becomes the one that came back (empty)
    fresh, out2 = machine(tmp_path / "fresh"), tmp_path / "out2"
    out2.mkdir()
    for name in ("call.log", "a.log", "b.log", "c.log", "d.log"):  # the caller's files: past the 8 a call returns
        (out2 / name).write_text("")
    shutil.copytree(out, fresh / ".carry" / "last_call")
    (fresh / ".carry" / "synthetic_state").mkdir()
    (fresh / ".carry" / "synthetic_state" / "stale.json").write_text("{}")
    again = {**env, "KLALM_DEVICE_SETUP": str(fresh), "OUT": str(out2), "RUNS": lines[0], "FROM": ".carry/last_call"}
    kept = subprocess.run(["bash", "scripts/device_synthetic.sh"], cwd=fresh, env=again, capture_output=True, text=True)
    assert kept.returncode == 0, kept.stdout[-2000:] + kept.stderr[-2000:]
    assert read_jsonl(out2 / "synthetic" / "a5.jsonl") == rows
    log2 = (out2 / "block.log").read_text()
    assert log2.startswith('== from .carry/last_call: {"a5.jsonl": 2') and "0 rows written" in log2
    assert "files under $OUT, a call returns 8: some will not come back" in log2
    assert not (fresh / ".carry" / "synthetic_state" / "stale.json").exists()
    # what came back from a call stopped before it packed its states, or a copy without the parts sent to a fresh
    # machine: refused at once, nothing trained
    for part in (fresh / ".carry" / "last_call").glob("state.tar.*"):
        part.unlink()
    (fresh / ".carry" / "synthetic_state.sha256").write_text("0" * 64)  # another state than the one that came back
    out3 = tmp_path / "out3"
    out3.mkdir()
    stopped = subprocess.run(["bash", "scripts/device_synthetic.sh"], cwd=fresh, env={**again, "OUT": str(out3)},
                             capture_output=True, text=True)  # fmt: skip
    assert stopped.returncode == 3 and "no state.tar.* parts" in stopped.stderr
    assert not (out3 / "block.log").exists()
    missing = subprocess.run(["bash", "scripts/device_synthetic.sh"], cwd=fresh, env={**again, "FROM": "nowhere"},
                             capture_output=True, text=True)  # fmt: skip
    assert missing.returncode == 2 and "FROM=nowhere has no synthetic/" in missing.stderr
    env.pop("RUNS")
    refused = subprocess.run(["bash", "scripts/device_synthetic.sh"], cwd=repo, env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and "set RUNS" in refused.stderr


def test_deterministic_runs_train_with_deterministic_kernels_and_say_so(tmp_path, monkeypatch):
    """--deterministic: every unit trains under torch.use_deterministic_algorithms (with cuBLAS's fixed workspace)
    and its rows and rate record it; the setting before comes back after. (Whether a GPU run then repeats bit for
    bit is tests/tasks/test_graph.py's GPU test.)"""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # so that monkeypatch restores it (unset or not) afterwards
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    seen, train_group = [], units.train_group

    def watched_train_group(*args, **kwargs):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return train_group(*args, **kwargs)

    monkeypatch.setattr(units, "train_group", watched_train_group)
    args = parse_args(["run", "--results", "x", "--deterministic"])
    plan = apply_args(_tiny_plan(families=["mqar"], members=1), args)
    assert plan.deterministic and not apply_args(_tiny_plan(), parse_args(["run", "--results", "x"])).deterministic
    block = _block(tmp_path, plan)
    block.run()
    assert seen == [True, True] and not block.failed
    assert not torch.are_deterministic_algorithms_enabled()  # restored
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    rows = read_jsonl(tmp_path / "mqar.jsonl")
    assert len(rows) == 2 and all(row["run"]["deterministic"] for row in rows)
    assert all(rate["deterministic"] for rate in read_jsonl(tmp_path / "rates.jsonl"))
