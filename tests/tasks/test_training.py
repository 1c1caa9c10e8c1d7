"""The synthetic-task trainer on the CPU: the step function against a plain PyTorch loop, the device-tensor learning
rate, members side by side, determinism by seed, stopping rules, and tiny runs that beat chance. (The same step
captured as a CUDA graph is checked against eager in test_graph.py, on a GPU.)"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from klalm.loss import IGNORE_INDEX, token_cross_entropy
from klalm.models import build_model
from klalm.tasks.base import materialize
from klalm.tasks.cells import TrainSettings, Unit
from klalm.tasks.readouts import TokenReadout, wrap_readout
from klalm.tasks.registry import make_task
from klalm.tasks.states import saved_states
from klalm.tasks.streams import FreshStream, SplitStream
from klalm.tasks.train import (
    GroupTrainer,
    Member,
    StopRule,
    evaluate,
    readout_loss,
    stream_loss,
    train_group,
    train_step,
)
from klalm.tasks.units import (
    Checkpoints,
    Execution,
    build_member,
    run_unit,
    run_units,
    state_name,
)
from klalm.train.optim import classify_parameters, cosine_multiplier, param_groups, warmup_cosine

CPU = torch.device("cpu")
A5 = {"name": "a5", "length": 4}
AUX = {"name": "a5", "length": 2}


def test_the_trainer_scores_with_the_token_loss_and_the_tasks_ignore_index():
    from klalm.tasks import mad, mqar

    assert mad.IGNORE_INDEX is mqar.IGNORE_INDEX is IGNORE_INDEX  # generators mark what the trainer's loss skips
    logits = torch.randn(3, 5, 7, dtype=torch.float64)
    labels = torch.randint(7, (3, 5))
    labels[0, :2] = labels[2, 4] = IGNORE_INDEX
    keep = labels != IGNORE_INDEX
    manual = -(logits.log_softmax(-1).gather(2, labels.clamp(min=0)[..., None])[..., 0])[keep].mean()
    assert token_cross_entropy(logits, labels).item() == pytest.approx(manual.item())


class _Fixed(nn.Module):
    """Predicts a fixed token sequence (one-hot logits), to check the metrics."""

    def __init__(self, predictions: torch.Tensor):
        super().__init__()
        self.predictions = predictions

    def forward(self, input_ids):
        rows = self.predictions[input_ids[:, 0]]  # the first token indexes the row to predict
        return F.one_hot(rows, 4).float()


def test_evaluate_token_and_sequence_accuracy():
    predictions = torch.tensor([[1, 2, 3], [1, 2, 3], [0, 0, 0]])
    inputs = torch.tensor([[0, 0, 0], [1, 1, 1], [2, 2, 2]])
    labels = torch.tensor([[1, 2, 3], [1, -100, 0], [-100, -100, -100]])
    metrics = evaluate(_Fixed(predictions), inputs, labels, batch_size=2, device=CPU)
    assert metrics == {"token_acc": 4 / 5, "seq_acc": 1 / 2, "scored_tokens": 5, "position_acc": [1.0, 1.0, 0.5]}
    unscored = labels.clone()
    unscored[:, 1] = -100
    assert evaluate(_Fixed(predictions), inputs, unscored, batch_size=2, device=CPU)["position_acc"] == [1.0, None, 0.5]
    with pytest.raises(ValueError, match="scored"):
        evaluate(_Fixed(predictions), inputs[2:], labels[2:], batch_size=2, device=CPU)


@pytest.mark.parametrize("arch", ["gpt", "kla"])
def test_evaluate_at_the_scored_positions_only_gives_the_full_readouts_metrics(arch):
    """MQAR scores K of L positions per row: with scored_per_row the readout computes those positions' logits only
    (as training does), and every metric, accuracy by position included, is that of the full readout."""
    task = make_task("mqar", length=16, num_pairs=2, vocab=64)
    torch.manual_seed(0)
    model = build_model(arch, d_model=16, n_layers=1, vocab_size=64, **({"n_heads": 2} if arch == "gpt" else {}))
    readout = wrap_readout(model, task, 16)
    train_inputs, train_labels = materialize(task, 1024, 0, "train")
    optimizer = torch.optim.Adam(readout.parameters(), lr=1e-2)
    for lo in range(0, 1024, 16):  # a little training, so that some predictions are right
        loss = readout_loss(readout, train_inputs[lo : lo + 16], train_labels[lo : lo + 16], task.scored_per_row)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    inputs, labels = materialize(task, 48, 0, "test")
    full = evaluate(readout, inputs, labels, batch_size=10, device=CPU)
    assert 0 < full["token_acc"] < 1
    assert evaluate(readout, inputs, labels, batch_size=10, device=CPU, scored_per_row=task.scored_per_row) == full
    labels[3, labels[3].ne(IGNORE_INDEX).nonzero()[0]] = IGNORE_INDEX  # row 3 now scores K - 1 positions
    with pytest.raises(ValueError, match=r"scored_per_row=2, but the test split's rows score \[1, 2\] positions"):
        evaluate(readout, inputs, labels, batch_size=10, device=CPU, scored_per_row=2)


def _unit(arch="gpt", seeds=(0,), steps=30, **train) -> Unit:
    settings = TrainSettings(steps=steps, batch_size=8, aux_batch_size=4, lr=3e-3, warmup=0.2, eval_batch_size=64,
                             **train)  # fmt: skip
    overrides = {"n_heads": 2} if arch == "gpt" else {}
    return Unit("a5", A5, arch, 1, 16, overrides, settings, list(seeds), 64, None, AUX, 10)


@pytest.mark.parametrize("arch", ["gpt", "kla"])
def test_train_step_equals_a_plain_pytorch_loop(arch):
    """Device-tensor lr, counter, static buffers and capturable-style AdamW against float-lr AdamW + LambdaLR."""
    unit = _unit(arch, steps=12, weight_decay=0.1, grad_clip=0.05)
    member = build_member(unit, 0, CPU, None)
    torch.manual_seed(0)
    model = build_model(arch, d_model=16, n_layers=1, vocab_size=60, **unit.model_overrides)
    oracle = wrap_readout(model, make_task(**A5), 16)
    oracle.load_state_dict(member.module.state_dict())
    groups = param_groups(list(oracle.named_parameters()), classify_parameters(oracle), lr=3e-3, weight_decay=0.1)
    optimizer = torch.optim.AdamW(groups, betas=(0.9, 0.98), eps=1e-8, foreach=False)
    schedule = warmup_cosine(optimizer, 12, warmup=0.2, min_lr_ratio=1e-5 / 3e-3)
    streams = [FreshStream(make_task(**A5), 8, 0, 0, 12, CPU), FreshStream(make_task(**AUX), 4, 0, 1, 12, CPU)]
    losses = []
    for step in range(12):
        train_step(member)
        batches = [s.fill(torch.tensor(step)) for s in streams]
        loss = sum(token_cross_entropy(oracle(x), y) for x, y in batches)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(oracle.parameters(), 0.05)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    torch.testing.assert_close(member.losses, torch.tensor(losses), rtol=1e-5, atol=1e-6)
    for (name, got), want in zip(member.module.named_parameters(), oracle.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)
    assert member.step.item() == 12


def test_mqar_rows_score_exactly_its_k_queries_in_both_splits():
    task = make_task("mqar", length=32, num_pairs=3, vocab=64)
    assert task.scored_per_row == 3 and make_task(**A5).scored_per_row is None
    for split in ("train", "test"):
        _, labels = materialize(task, 600, 0, split)
        assert ((labels != IGNORE_INDEX).sum(1) == 3).all()


@pytest.mark.parametrize("arch", ["gpt", "kla"])
def test_the_scored_positions_readout_gives_the_full_readouts_loss_and_gradients(arch):
    """MQAR trains on the logits of its K scored positions only (`readout_loss`): the same loss and gradients as the
    masked cross-entropy over every position, in float64."""
    task = make_task("mqar", length=16, num_pairs=2, vocab=64)
    torch.manual_seed(0)
    overrides = {"n_heads": 2} if arch == "gpt" else {}
    readout = TokenReadout(build_model(arch, d_model=16, n_layers=2, vocab_size=64, **overrides)).double()
    inputs, labels = materialize(task, 24, 0, "train")
    positions = torch.tensor([[3, 0], [5, 15]])
    every = readout(inputs[:2])  # [2, 16, 64]
    torch.testing.assert_close(readout(inputs[:2], positions), every.gather(1, positions[..., None].expand(-1, -1, 64)))
    results = []
    for scored in (None, 2):
        stream = SplitStream(inputs, labels, batch_size=8, seed=0, steps=3, scored_per_row=scored)
        readout.zero_grad()
        loss = stream_loss(partial(readout_loss, readout), stream, torch.tensor(1))
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in readout.parameters()]))
    (full, full_grads), (picked, picked_grads) = results
    torch.testing.assert_close(picked, full, rtol=1e-12, atol=0)
    for got, want in zip(picked_grads, full_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("arch", ["gpt", "kla", "mamba", "gdn"])
def test_a_compiled_member_runs_one_graph_per_stream_and_stops_compiling(arch):
    """Each stream's loss (the main batch and the length-2 batch differ in shape) runs as one compiled graph, and
    the third step compiles nothing new. The selective scan's torch path once called math.isqrt on a size, which
    dynamo cannot trace symbolically: it broke the graph and recompiled at every step."""
    import torch._dynamo

    torch._dynamo.reset()
    member = build_member(_unit(arch, steps=3), 0, CPU, None)
    compiled, ran = [], []

    def counting(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        compiled.append(gm)
        return lambda *args: (ran.append(gm), gm.forward(*args))[1]

    member.loss = torch.compile(member._loss, backend=counting)
    for _ in range(3):
        ran.clear()
        before = len(compiled)
        train_step(member)
    torch._dynamo.reset()
    assert len(ran) == len(member.streams) and len(compiled) == before


def test_compiled_training_equals_eager():
    """A member that trains through torch.compile (aot_eager: the traced forward and backward, no C++ compiler)
    takes the same steps as an eager one; evaluation and the state stay on the plain module. (The KLA layer under
    compile: tests/models/mixers/test_kla.py.)"""
    unit = _unit("gpt", steps=6)
    eager, compiled = build_member(unit, 0, CPU, None), build_member(unit, 0, CPU, None, "aot_eager")
    assert eager.loss == eager._loss and compiled.loss != compiled._loss  # compiled: the forward and the loss together
    for _ in range(6):
        train_step(eager)
        train_step(compiled)
    torch.testing.assert_close(compiled.losses, eager.losses, rtol=1e-5, atol=1e-6)
    for (name, got), want in zip(compiled.module.named_parameters(), eager.module.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)
    assert set(compiled.state_dict()["module"]) == set(eager.state_dict()["module"])  # no _orig_mod. prefix


def test_the_lr_tensors_follow_the_schedule_group_by_group():
    unit = _unit("kla", steps=20)
    member = build_member(unit, 0, CPU, None)
    kw = {"warmup_steps": 4, "total_steps": 20, "min_lr_ratio": 1e-5 / 3e-3}
    assert {g["name"] for g in member.optimizer.param_groups} == {"decay", "no_decay", "dynamics"}
    for step in range(20):
        train_step(member)
        for group in member.optimizer.param_groups:
            assert isinstance(group["lr"], torch.Tensor) and group["lr"].dtype == torch.float32
            assert group["lr"].item() == pytest.approx(3e-3 * cosine_multiplier(step, **kw), rel=1e-6)


def test_members_side_by_side_train_as_they_would_alone():
    together = GroupTrainer([build_member(_unit(), seed, CPU, None) for seed in (0, 1)], CPU)
    together.advance(30)
    for index, seed in enumerate((0, 1)):
        alone = GroupTrainer([build_member(_unit(), seed, CPU, None)], CPU)
        alone.advance(30)
        assert torch.equal(together.members[index].losses, alone.members[0].losses), seed
    assert not torch.equal(together.members[0].losses, together.members[1].losses)  # seeds differ


def test_a_seed_trains_the_same_twice():
    runs = []
    for _ in range(2):
        trainer = GroupTrainer([build_member(_unit("mamba"), 3, CPU, None)], CPU)
        trainer.advance(10)
        runs.append(trainer.members[0].losses[:10].clone())
    assert torch.equal(*runs) and torch.isfinite(runs[0]).all()


def test_capture_needs_cuda_and_steps_cannot_overrun():
    members = [build_member(_unit(steps=5), 0, CPU, None)]
    with pytest.raises(ValueError, match="CUDA"):
        GroupTrainer(members, CPU, capture=True)
    trainer = GroupTrainer(members, CPU)
    trainer.advance(5)
    with pytest.raises(ValueError, match="exceed the planned 5"):
        trainer.advance(1)


def _test_split(unit: Unit):
    return materialize(make_task(**unit.task), unit.num_test, 0, "test")


def test_train_group_evaluates_on_schedule_and_stops_at_the_threshold():
    unit = _unit(seeds=(0, 1), steps=30)
    trainer = GroupTrainer([build_member(unit, s, CPU, None) for s in unit.seeds], CPU)
    result = train_group(trainer, _test_split(unit), eval_every=10)
    assert result.ended == "steps" and result.steps == 30
    assert [e["step"] for e in result.evals[0]] == [10, 20, 30]
    assert result.step_s > 0 and len(result.final_loss) == 2
    assert 0 < result.eval_s < result.train_s  # the three evaluations' seconds, part of the training time
    trainer = GroupTrainer([build_member(unit, s, CPU, None) for s in unit.seeds], CPU)
    stopped = train_group(trainer, _test_split(unit), eval_every=10, stop=StopRule("token_acc", 0.0))
    assert stopped.ended == "threshold" and stopped.steps == 10


def test_train_group_pauses_before_the_deadline():
    unit = _unit(steps=2000)
    trainer = GroupTrainer([build_member(unit, 0, CPU, None)], CPU)
    result = train_group(trainer, _test_split(unit), eval_every=None, deadline=time.time() + 0.5)
    assert result.ended == "paused" and 0 < result.steps < 2000 and result.evals == [[]]
    assert trainer.members[0].step.item() == result.steps


@pytest.mark.parametrize("arch", ["gpt", "kla"])
def test_a_unit_paused_and_resumed_trains_exactly_as_one_run(arch, tmp_path):
    """Evaluated after every step, so the evaluations compare the loss and accuracies step for step; weight decay,
    clipping and warmup in play. Paused after each of its first three steps (a deadline already past pauses after
    the first stretch), each time rebuilt from nothing and loaded from the state folder."""
    unit = dataclasses.replace(_unit(arch, seeds=(0, 1), steps=12, weight_decay=0.1, grad_clip=0.05), eval_every=1)
    whole = run_unit(unit, CPU, Execution()).rows
    for step in (1, 2, 3):
        paused = run_unit(unit, CPU, Execution(), deadline=time.time(), state=tmp_path)
        assert (paused.rows, paused.rate["ended"], paused.rate["steps"]) == ([], "paused", step)
        assert [saved["step"] for saved in saved_states(tmp_path).values()] == [step]
    resumed = run_unit(unit, CPU, Execution(), state=tmp_path).rows
    assert [p.name for p in tmp_path.iterdir()] == [".lock"]  # a finished unit removes its state (not the lock)
    for alone, parts in zip(whole, resumed, strict=True):
        assert len(parts["evals"]) == 12 and parts["evals"] == alone["evals"]
        assert (parts["final_loss"], parts["token_acc"], parts["seq_acc"]) == (
            alone["final_loss"], alone["token_acc"], alone["seq_acc"])  # fmt: skip
        assert parts["run"]["blocks"] == 4 and alone["run"]["blocks"] == 1
    with pytest.raises(ValueError, match="state folder"):
        run_unit(unit, CPU, Execution(), deadline=time.time())


def test_a_saved_state_of_another_unit_is_refused(tmp_path):
    unit = _unit(steps=20)
    run_unit(unit, CPU, Execution(), deadline=time.time(), state=tmp_path)
    (name,) = saved_states(tmp_path)
    info = json.loads((tmp_path / f"{name}.json").read_text())
    info["unit"]["num_test"] = 32
    (tmp_path / f"{name}.json").write_text(json.dumps(info))
    with pytest.raises(ValueError, match="holds another unit"):
        run_unit(unit, CPU, Execution(), state=tmp_path)
    assert state_name(unit) == name != state_name(dataclasses.replace(unit, seeds=[1]))


def test_run_unit_rows_and_rate():
    unit = _unit("gdn", seeds=(0, 2), steps=20)
    outcome = run_unit(unit, CPU, Execution(commit="abc", compile_backend="inductor"))
    assert [r["seed"] for r in outcome.rows] == [0, 2]
    row = outcome.rows[0]
    assert row["arch"] == "gdn" and row["steps"] == 20 and row["ended"] == "steps"
    assert row["evals"][-1][0] == 20 and 0 <= row["token_acc"] <= 1 and 0 <= row["seq_acc"] <= 1
    assert row["run"]["captured"] is False and row["run"]["members"] == 2 and row["run"]["commit"] == "abc"
    assert row["run"]["compile_backend"] is None and outcome.rate["compile_backend"] is None  # the CPU runs eager
    assert row["run"]["backends"] == {"gated_delta_rule cpu float32": "torch"}  # which path ran
    assert outcome.rate["tokens_per_step"] == 8 * 4 + 4 * 2 and outcome.rate["step_s"] > 0
    assert 0 < outcome.rate["eval_s"] <= outcome.rate["train_s"]
    phases = outcome.rate["phases_s"]
    assert list(phases) == ["build", "load", "setup", "finish"] and all(t >= 0 for t in phases.values())
    before_training = phases["build"] + phases["load"] + phases["setup"]  # (rounded to 0.01 s each)
    assert before_training <= outcome.rate["overhead_s"] + 0.05  # run_unit's own; the runner's adds the rest
    assert unit.key(0) != unit.key(2)
    assert run_unit(_unit("kla"), CPU, Execution()).rows[0]["mixers"] == {"kla": {"block": "mamba", "d_state": 16}}
    blocks = {"mixer_options": {"kla": {"block": "plain"}}}
    plain = Unit("a5", A5, "kla", 1, 16, blocks, _unit().train, [0], 64, None, AUX, 10)
    row = run_unit(plain, CPU, Execution()).rows[0]
    assert row["mixers"]["kla"]["block"] == "plain" and row["run"]["backends"] == {"kla_scan cpu float32": "torch"}
    assert run_unit(_unit("gpt"), CPU, Execution()).rows[0]["run"]["backends"] == {}  # attention: no op backend


def _tiny_run(task: dict, arch="gpt", steps=150, n_layers=2, num_train=None, aux=None, batch=32, lr=3e-3):
    settings = TrainSettings(steps=steps, batch_size=batch, lr=lr, warmup=0.05, weight_decay=0.0,
                             aux_batch_size=8 if aux else 0)  # fmt: skip
    unit = Unit("x", task, arch, n_layers, 64, {"n_heads": 4}, settings, [0], 256, num_train, aux, None)
    return run_unit(unit, CPU, Execution()).rows[0]


def test_a5_short_length_beats_chance():
    """Length 3 (chance 1/60 per token); the first position is a copy, the others need the group product."""
    assert _tiny_run({"name": "a5", "length": 3}, aux=AUX)["token_acc"] > 0.3


def test_mqar_tiny_beats_chance():
    """Vocabulary 64 (32 values: chance ~3 %), 2 pairs in 16 tokens."""
    task = {"name": "mqar", "length": 16, "num_pairs": 2, "vocab": 64}
    assert _tiny_run(task, steps=200, num_train=4096)["token_acc"] > 0.15


def test_mad_memorization_beats_chance():
    """A fixed map of 15 keys (vocab 32); chance 1/16."""
    row = _tiny_run({"name": "mad_memorization", "vocab": 32, "length": 8}, n_layers=1, num_train=512)
    assert row["token_acc"] > 0.3


def test_mad_compression_decoder_beats_chance():
    """The last-position decoder readout: 4 tokens over 7 symbols (chance 1/7 for the data positions)."""
    row = _tiny_run({"name": "mad_compression", "vocab": 8, "length": 4}, n_layers=1, num_train=2048)
    assert row["token_acc"] > 0.45  # chance: 3/4 x 1/7 + 1/4 (the fixed last token) ~ 0.36


def test_last_position_decoder_reads_the_lm_hidden_state():
    task = make_task("mad_compression", vocab=8, length=5)
    model = build_model("gpt", d_model=16, n_layers=1, n_heads=2, vocab_size=8)
    module = wrap_readout(model, task, 16)
    inputs, labels = materialize(task, 4, 0, "test")
    logits = module(inputs)
    assert logits.shape == (4, 5, 8)
    token_cross_entropy(logits, labels).backward()
    assert model.get_input_embeddings().weight.grad.abs().sum() > 0  # gradients reach the LM
    changed = inputs.clone()
    changed[:, 0] = (changed[:, 0] + 1) % 7
    assert not torch.allclose(module(changed), logits)  # the output depends on earlier tokens


def test_member_moves_its_module_and_reads_the_settings():
    module = wrap_readout(build_model("gpt", d_model=16, n_layers=1, n_heads=2, vocab_size=60), make_task(**A5), 16)
    member = Member(copy.deepcopy(module), [], TrainSettings(steps=7), CPU, seed=5)
    assert member.losses.shape == (7,) and member.step.item() == 0 and member.seed == 5
    with pytest.raises(ValueError, match="min_lr"):
        Member(module, [], TrainSettings(lr=1e-3, min_lr=1e-2), CPU, seed=0)
    with pytest.raises(ValueError, match=r"^train.warmup gives 9 warmup steps: must be in \[0, 7\)"):  # a plan's key
        TrainSettings(steps=7, warmup=9).schedule()


def test_a_group_keeps_stepping_the_members_it_keeps():
    """`GroupTrainer.keep`: after it, only the members kept advance, with the losses they would have alone."""
    unit = _unit(steps=12, seeds=(0, 1))
    members = [build_member(unit, seed, CPU, None) for seed in (0, 1)]
    trainer = GroupTrainer(members, CPU)
    trainer.advance(4)
    trainer.keep(members[1:])
    trainer.advance(8)
    assert [m.step.item() for m in members] == [4, 12] and torch.isnan(members[0].losses[4:]).all()
    alone = GroupTrainer([build_member(unit, 1, CPU, None)], CPU)
    alone.advance(12)
    assert torch.equal(members[1].losses, alone.members[0].losses)


def test_a_pack_of_a5_cells_ends_the_solved_one_and_trains_the_other_on(tmp_path):
    """Lengths 3 and 5 side by side: at the evaluation where one cell's seed reaches the threshold that cell ends
    and the other trains on in the same process, giving the same rows as two units run alone; with a deadline,
    the other pauses and resumes to the same rows."""
    cells = [dataclasses.replace(_unit(steps=20, seeds=(0, 1)), task={"name": "a5", "length": n}) for n in (3, 5)]
    first_eval = [[log[0][2] for log in (r["evals"] for r in run_unit(c, CPU, Execution()).rows)] for c in cells]
    best = [max(accs) for accs in first_eval]  # each cell's best seed at step 10, no stop rule
    assert best[0] != best[1]
    stop = {"metric": "token_acc", "threshold": (best[0] + best[1]) / 2}
    cells = [dataclasses.replace(c, stop=stop) for c in cells]
    alone = [row for c in cells for row in run_unit(c, CPU, Execution()).rows]
    solved = 0 if best[0] > best[1] else 1
    assert [r["ended"] for r in alone if r["task"] == cells[solved].task] == ["threshold"] * 2
    assert [r["steps"] for r in alone if r["task"] == cells[solved].task] == [10] * 2
    packed = run_units(cells, CPU, Execution())
    assert packed.rate["units"] == 2 and packed.rate["members"] == 4 and packed.rate["steps"] == 20
    assert packed.rate["ended"] == ("threshold" if all(r["ended"] == "threshold" for r in alone) else "steps")
    tokens = [c.tokens_per_step() for c in cells]  # lengths 3 and 5: the rate records a member's mean
    assert tokens[0] != tokens[1] and packed.rate["tokens_per_step"] == round((tokens[0] + tokens[1]) / 2)
    key = ("task", "seed", "token_acc", "seq_acc", "final_loss", "evals", "steps", "ended")

    def same(rows):
        return sorted((r["task"]["length"], [r[k] for k in key]) for r in rows)

    assert same(packed.rows) == same(alone)
    paused = run_units(cells, CPU, Execution(), deadline=time.time() + 1e-3, state=tmp_path)  # past at step 10
    assert paused.rate["ended"] == "paused" and {r["task"]["length"] for r in paused.rows} == {(3, 5)[solved]}
    assert list(saved_states(tmp_path)) == [state_name(cells[1 - solved])]
    resumed = run_units([cells[1 - solved]], CPU, Execution(), state=tmp_path)
    assert same(paused.rows + resumed.rows) == same(alone)
    assert saved_states(tmp_path) == {}


class _Killed(Exception):
    """Stands for the end of a process that is killed (a machine taken back before the run's deadline)."""


def test_a_unit_killed_after_a_checkpoint_resumes_from_it_to_the_rows_of_a_whole_run(tmp_path, monkeypatch):
    """With checkpoint_every_s 0 every evaluation before the last saves the state; a process that dies after the save
    at step 20 of 30 leaves that state, and a run from it ends with the rows of a run never stopped."""
    unit = _unit(steps=30, seeds=(0, 1))
    whole = run_unit(unit, CPU, Execution()).rows
    save = Checkpoints.__call__

    def dies_after_step_20(self, step, *args):
        save(self, step, *args)
        if step == 20:
            raise _Killed

    monkeypatch.setattr(Checkpoints, "__call__", dies_after_step_20)
    with pytest.raises(_Killed):
        run_unit(unit, CPU, Execution(), state=tmp_path, checkpoint_every_s=0.0)
    monkeypatch.undo()
    assert [saved["step"] for saved in saved_states(tmp_path).values()] == [20]
    resumed = run_unit(unit, CPU, Execution(), state=tmp_path, checkpoint_every_s=0.0).rows
    key = ("seed", "token_acc", "seq_acc", "final_loss", "evals", "steps", "ended")
    assert [[r[k] for k in key] for r in resumed] == [[r[k] for k in key] for r in whole]
    assert [r["run"]["blocks"] for r in resumed] == [2, 2] and saved_states(tmp_path) == {}
    with pytest.raises(ValueError, match="checkpoints needs a state folder"):
        run_unit(unit, CPU, Execution(), checkpoint_every_s=1.0)


def test_checkpoints_save_units_whose_seeds_all_train_and_wait_their_period(tmp_path):
    cells = [dataclasses.replace(_unit(seeds=(0, 1)), task={"name": "a5", "length": n}) for n in (3, 5)]
    groups = [[build_member(cell, seed, CPU, None) for seed in cell.seeds] for cell in cells]
    spent = [{"train_s": 1.0, "wall_s": 2.0, "blocks": 1}, {"train_s": 0.0, "wall_s": 0.0, "blocks": 0}]
    evals = [[{"step": 10, "token_acc": 0.5}] for _ in range(4)]
    checkpoints = Checkpoints(tmp_path, cells, groups, spent, every_s=3600.0, started=time.perf_counter())
    checkpoints(10, evals, [0, 1, 2, 3], 5.0)
    assert saved_states(tmp_path) == {}  # an hour has not passed
    checkpoints.every_s = 0.0
    checkpoints(10, evals, [0, 1, 3], 5.0)  # cell 1's first seed has stopped: that cell is not saved
    saved = saved_states(tmp_path)
    assert list(saved) == [state_name(cells[0])]
    assert saved[state_name(cells[0])]["spent"]["train_s"] == 6.0
    assert saved[state_name(cells[0])]["spent"]["blocks"] == 2
