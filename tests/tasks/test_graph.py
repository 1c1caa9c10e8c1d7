"""The synthetic training step captured as a CUDA graph against the same step run eagerly (CUDA only; skipped
without a GPU). The CPU tests of the step itself are in test_training.py."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from klalm.config_checks import MAD_TASKS
from klalm.tasks.base import materialize
from klalm.tasks.cells import TrainSettings, Unit
from klalm.tasks.registry import make_task
from klalm.tasks.streams import FreshStream, SplitStream
from klalm.tasks.train import WARMUP_STEPS, GroupTrainer, StopRule, evaluate, train_group
from klalm.tasks.units import Execution, build_member, run_unit, run_units

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
STEPS = 40
PLAIN = {"mixer_options": {"kla": {"block": "plain"}}}


def _unit(arch: str, seeds=(0,), steps: int = STEPS, depth: int = 1) -> Unit:
    train = TrainSettings(steps=steps, batch_size=64, aux_batch_size=8, lr=1e-3, warmup=0.1, eval_batch_size=256)
    overrides = PLAIN if arch == "kla" else {}
    return Unit("a5", {"name": "a5", "length": 8}, arch, depth, 128, overrides, train, list(seeds), 256, None,
                {"name": "a5", "length": 2}, 10, {"metric": "token_acc", "threshold": 0.9})  # fmt: skip


def _losses(unit: Unit, capture: bool, steps: int, compile_backend: str | None = None) -> list[torch.Tensor]:
    members = [build_member(unit, s, CUDA, None, compile_backend) for s in unit.seeds]
    trainer = GroupTrainer(members, CUDA, capture=capture)
    trainer.prepare()
    trainer.advance(steps - trainer.steps_done)
    trainer.synchronize()
    assert (trainer.graph is not None) == capture
    assert all(m.step.item() == steps for m in trainer.members)  # the graph advanced the device counter
    return [m.losses[:steps].cpu() for m in trainer.members]


@pytest.mark.parametrize("arch", ["kla", "gpt", "mamba", "gdn"])
def test_captured_training_gives_the_eager_losses(arch):
    """Steps 0-2 run eagerly (the warm-up), steps 3.. are graph replays; the same numbers as eager up to the
    reduction-order noise of bf16 kernels."""
    unit = _unit(arch)
    eager, captured = _losses(unit, False, STEPS)[0], _losses(unit, True, STEPS)[0]
    assert torch.isfinite(captured).all()
    torch.testing.assert_close(captured[:WARMUP_STEPS], eager[:WARMUP_STEPS], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(captured, eager, rtol=2e-3, atol=2e-3)
    assert captured[-5:].mean() < captured[:5].mean()  # it trains


@pytest.mark.parametrize("arch", ["kla", "gpt"])
def test_captured_inductor_training_gives_the_eager_losses(arch):
    """The step trained through torch.compile (inductor; compiled during the eager warm-up) and then captured."""
    unit = _unit(arch)
    eager, compiled = _losses(unit, False, STEPS)[0], _losses(unit, True, STEPS, "inductor")[0]
    torch.testing.assert_close(compiled, eager, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("arch", ["kla", "gpt"])
def test_captured_mqar_training_on_the_scored_positions_gives_the_eager_losses(arch):
    """MQAR trains on the logits of its K query positions only (top-k of the label mask inside the graph), compiled
    by inductor and captured: the eager losses of the same step."""
    train = TrainSettings(steps=STEPS, batch_size=64, lr=1e-3, warmup=0.1, eval_batch_size=256)
    task = {"name": "mqar", "length": 64, "num_pairs": 4, "vocab": 8192}
    unit = Unit("mqar", task, arch, 2, 64, PLAIN if arch == "kla" else {}, train, [0], 256, 2048, None, 10, None)
    split = tuple(t.to(CUDA) for t in materialize(make_task(**task), 2048, 0, "train"))

    def losses(capture: bool, compile_backend: str | None) -> torch.Tensor:
        member = build_member(unit, 0, CUDA, split, compile_backend)
        assert member.streams[0].scored_per_row == 4
        trainer = GroupTrainer([member], CUDA, capture=capture)
        trainer.prepare()
        trainer.advance(STEPS - trainer.steps_done)
        trainer.synchronize()
        return member.losses.cpu()

    eager, captured = losses(False, None), losses(True, "inductor")
    assert torch.isfinite(captured).all()
    torch.testing.assert_close(captured, eager, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("arch", ["kla", "gpt"])
def test_mqar_evaluation_at_the_scored_positions_agrees_with_the_full_head(arch):
    """`evaluate` with scored_per_row (the head on the K query positions only) against every position's logits, on
    a model trained 200 steps (12 % and 23 % of the queries right on the CPU), in bf16 autocast: the same count,
    and the same accuracy but for a near-tie or two that the two matmuls round apart."""
    train = TrainSettings(steps=200, batch_size=64, lr=1e-2, warmup=0.1, eval_batch_size=256)
    task = {"name": "mqar", "length": 64, "num_pairs": 4, "vocab": 64}
    unit = Unit("mqar", task, arch, 2, 64, PLAIN if arch == "kla" else {}, train, [0], 256, 2048, None, 10, None)
    split = tuple(t.to(CUDA) for t in materialize(make_task(**task), 2048, 0, "train"))
    member = build_member(unit, 0, CUDA, split)
    trainer = GroupTrainer([member], CUDA, capture=False)
    trainer.advance(200)
    test = tuple(t.to(CUDA) for t in materialize(make_task(**task), 1024, 0, "test"))
    full = evaluate(member.module, *test, 256, CUDA)
    scored = evaluate(member.module, *test, 256, CUDA, scored_per_row=4)
    assert scored["scored_tokens"] == full["scored_tokens"] == 4 * 1024 and 0 < full["token_acc"] < 1
    assert abs(scored["token_acc"] - full["token_acc"]) <= 2 / full["scored_tokens"]


def _mad_losses(name: str, arch: str, capture: bool, compile_backend: str | None, device=CUDA) -> torch.Tensor:
    """STEPS steps of a two-block d_model-64 model on the first 512 examples of MAD task `name`'s training split (a
    fixed split on the device, as the grid runner trains MAD)."""
    train = TrainSettings(steps=STEPS, batch_size=32, lr=1e-3, warmup=0.1, eval_batch_size=256)
    unit = Unit("mad", {"name": name}, arch, 2, 64, PLAIN if arch == "kla" else {}, train, [0], 256, 512)
    split = tuple(t.to(device) for t in materialize(make_task(name), 512, 0, "train"))
    member = build_member(unit, 0, device, split, compile_backend)
    trainer = GroupTrainer([member], device, capture=capture)
    trainer.prepare()
    trainer.advance(STEPS - trainer.steps_done)
    trainer.synchronize()
    return member.losses.cpu()


@pytest.mark.parametrize("name", MAD_TASKS)
def test_captured_mad_training_gives_the_eager_losses(name):
    """Every MAD task (its readout included: compression decodes from the last position) trained by the plain KLA
    block through inductor and captured, as `run_synthetic.py run --families mad` trains it on a GPU, against the
    same steps run eagerly."""
    eager, captured = _mad_losses(name, "kla", False, None), _mad_losses(name, "kla", True, "inductor")
    assert torch.isfinite(captured).all()
    torch.testing.assert_close(captured, eager, rtol=2e-3, atol=2e-3)


def test_members_in_one_graph_give_each_seeds_eager_losses():
    """Two seeds in one graph (one stream each) against each seed trained eagerly alone."""
    together = _losses(_unit("kla", seeds=(0, 1)), True, STEPS)
    for seed, losses in zip((0, 1), together):
        alone = _losses(_unit("kla", seeds=(seed,)), False, STEPS)[0]
        torch.testing.assert_close(losses, alone, rtol=2e-3, atol=2e-3)
    assert not torch.allclose(together[0], together[1])


def test_a_graph_captured_again_over_the_members_kept_gives_their_losses():
    """Seeds 0 and 1 captured together; after 10 steps only seed 1 is kept (`GroupTrainer.keep`, a new capture): its
    losses are those of seed 1 trained alone, and seed 0 stays where it was let go."""
    members = [build_member(_unit("kla", seeds=(0, 1)), s, CUDA, None) for s in (0, 1)]
    trainer = GroupTrainer(members, CUDA)
    trainer.prepare()
    trainer.advance(10 - trainer.steps_done)
    trainer.keep(members[1:])
    trainer.advance(STEPS - 10)
    trainer.synchronize()
    assert trainer.graph is not None and members[0].step.item() == 10 and members[1].step.item() == STEPS
    assert torch.isnan(members[0].losses[10:]).all()
    alone = _losses(_unit("kla", seeds=(1,)), True, STEPS)[0]
    torch.testing.assert_close(members[1].losses.cpu(), alone, rtol=2e-3, atol=2e-3)


def test_device_data_equals_cpu_data():
    a5 = make_task("a5", length=12)
    on_gpu, on_cpu = (FreshStream(a5, 32, 3, 1, 100, device) for device in (CUDA, torch.device("cpu")))
    for step in (0, 1, 99):
        gpu_batch = [t.cpu() for t in on_gpu.fill(torch.tensor(step, device=CUDA))]
        cpu_batch = on_cpu.fill(torch.tensor(step))
        assert all(torch.equal(g, c) for g, c in zip(gpu_batch, cpu_batch))
    split = materialize(make_task("mqar", length=64, num_pairs=4), 100, 0, "train")
    gpu_split = SplitStream(*(t.to(CUDA) for t in split), 16, 5, 20)
    cpu_split = SplitStream(*split, 16, 5, 20)
    assert torch.equal(gpu_split.fill(torch.tensor(7, device=CUDA))[0].cpu(), cpu_split.fill(torch.tensor(7))[0])


def test_train_group_on_cuda_evaluates_between_replays_and_stops():
    unit = _unit("gpt", steps=60)
    trainer = GroupTrainer([build_member(unit, 0, CUDA, None)], CUDA)
    test = tuple(t.to(CUDA) for t in materialize(make_task("a5", length=8), 256, 0, "test"))
    result = train_group(trainer, test, eval_every=20, stop=StopRule("token_acc", 0.0))
    assert trainer.graph is not None and result.ended == "threshold" and result.steps == 20


def test_run_unit_on_cuda_records_a_captured_run():
    outcome = run_unit(_unit("kla", seeds=(0, 1), steps=30), CUDA, Execution(commit="test"))
    assert [r["seed"] for r in outcome.rows] == [0, 1]
    assert all(r["run"]["captured"] and r["mixers"]["kla"]["block"] == "plain" for r in outcome.rows)
    assert outcome.rate["step_s"] > 0 and outcome.rate["device"] == torch.cuda.get_device_name(CUDA)


def test_a_pack_on_cuda_gives_each_units_rows(tmp_path):
    """Two A5 lengths side by side in one graph (klalm.tasks.units.run_units), paused half way and resumed as a pack,
    against each unit trained alone and uninterrupted: the same evaluations up to bf16 reduction-order noise."""
    cells = [dataclasses.replace(_unit("kla", steps=30), task={"name": "a5", "length": n}, stop=None) for n in (6, 8)]
    alone = [run_unit(cell, CUDA, Execution()).rows[0] for cell in cells]
    paused = run_units(cells, CUDA, Execution(), deadline=time.time(), state=tmp_path)
    assert paused.rows == [] and paused.rate["units"] == 2 and paused.rate["members"] == 2
    packed = run_units(cells, CUDA, Execution(), state=tmp_path).rows
    assert [r["task"]["length"] for r in packed] == [6, 8] and all(r["run"]["captured"] for r in packed)
    for got, want in zip(packed, alone):
        assert got["steps"] == want["steps"] == 30
        torch.testing.assert_close(got["final_loss"], want["final_loss"], rtol=2e-3, atol=2e-3)
        assert abs(got["token_acc"] - want["token_acc"]) <= 0.02


@pytest.mark.parametrize("arch", ["kla", "gpt"])
def test_a_deterministic_mqar_unit_repeats_bit_for_bit(arch):
    """`Execution(deterministic=True)` (run_synthetic.py run --deterministic): the same MQAR unit, captured through
    inductor as the grid trains it, run twice in one process gives the same evaluations and final loss exactly (the
    grid's captured runs without it part within the first evaluations: results/gpu_2026-12-04g, MQAR block 19).
    A kernel with no deterministic form fails here with torch's error, naming it."""
    train = TrainSettings(steps=60, batch_size=64, lr=1e-3, warmup=0.1, eval_batch_size=256)
    task = {"name": "mqar", "length": 64, "num_pairs": 4, "vocab": 8192}
    unit = Unit("mqar", task, arch, 2, 64, PLAIN if arch == "kla" else {}, train, [0], 256, 2048, None, 20, None)
    execution = Execution(compile_backend="inductor", deterministic=True)
    first, second = (run_unit(unit, CUDA, execution).rows[0] for _ in range(2))
    assert first["run"]["deterministic"] and first["run"]["captured"]
    assert first["evals"] == second["evals"] and first["final_loss"] == second["final_loss"]
