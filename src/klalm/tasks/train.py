"""The synthetic-task trainer: one step function, run eagerly on the CPU and captured once as a CUDA graph on a GPU.

Small models are launch-bound: a step of a one-block model at d_model 128 is a few hundred tiny kernels, and eager
PyTorch spends most of the step launching them. So the whole step (data, forward, backward, gradient clipping,
AdamW, learning rate) is written without a single host synchronisation, over state that lives on the device:

- the step counter is a 0-d int64 tensor that the step advances;
- the batch is made on the device into static buffers from that counter (`klalm.tasks.streams`);
- the learning rate of each parameter group is a device tensor, set from the counter by
  `klalm.train.optim.cosine_multiplier_tensor` (the warmup + cosine of the Lightning trainer, value for value);
- AdamW runs with `capturable=True` (on CUDA) and reads those tensors;
- the loss of every step is written into a device buffer at the counter.

`GroupTrainer` runs `train_step` for one or more members (one model per seed, each with its own data streams): on
CUDA it warms up on a side stream, captures one step of every member in one graph (each member on its own stream,
so their kernels can overlap) and replays it; on the CPU (or with capture off) it calls the same function eagerly.
Evaluation runs outside the graph, between replays (`train_group`).

A run can pause and resume exactly: everything a step reads or changes is the members' modules, optimiser states,
step counters and loss logs (`Member.state_dict`), since the batches and the learning rate are functions of the
step counter alone (the streams hash (seed, step); the schedule is computed from the step), and nothing draws from
a global random generator. `train_group` pauses where its next stretch of steps would end after its deadline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from klalm.loss import IGNORE_INDEX, token_cross_entropy
from klalm.models import prepare_backends
from klalm.tasks.cells import TrainSettings
from klalm.train.optim import classify_parameters, cosine_multiplier_tensor, param_groups

WARMUP_STEPS = 3  # eager steps on a side stream before capture (optimizer state, kernel compilation, autotuning)
CHECK_EVERY = 250  # steps between host checks of the clock when no evaluation falls sooner (each is one sync)
FINAL_LOSS_STEPS = 50  # `final_loss` is the mean loss of this many last steps


class Stream(Protocol):
    """A source of training batches on the device (klalm.tasks.streams)."""

    scored_per_row: int | None  # K when every row scores exactly K positions

    def fill(self, step: Tensor) -> tuple[Tensor, Tensor]: ...


CUBLAS_DETERMINISTIC = ":4096:8"  # the CUBLAS_WORKSPACE_CONFIG that makes cuBLAS deterministic (CUDA >= 10.2)


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool) -> Iterator[None]:
    """With `enabled`, only deterministic kernels inside (`torch.use_deterministic_algorithms`; an op without one
    raises, naming itself), and cuBLAS's fixed workspace unless CUBLAS_WORKSPACE_CONFIG is set already (torch sizes
    the workspace at a process's first CUDA matmul: `klalm.tasks.units.run_units` enters this before it builds
    anything); the previous setting comes back after. Off: nothing changes."""
    if not enabled:
        yield
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_DETERMINISTIC)
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def autocast(device: torch.device) -> torch.autocast:
    """bf16 autocast on CUDA (off elsewhere); no weight cache, which a captured graph must not keep."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda", cache_enabled=False)


def make_optimizer(module: nn.Module, settings: TrainSettings, device: torch.device) -> torch.optim.AdamW:
    """AdamW over klalm.train.optim's parameter groups, each group's lr a 0-d float32 tensor on `device`.

    CUDA: capturable=True (state and lr read on the device, so a graph can replay the step) with the foreach
    kernels. Elsewhere capturable is unsupported and the single-tensor path is the one that takes a tensor lr.
    """
    groups = param_groups(
        list(module.named_parameters()), classify_parameters(module), lr=settings.lr, weight_decay=settings.weight_decay
    )
    for group in groups:
        group["base_lr"] = group["lr"]
        group["lr"] = torch.tensor(group["lr"], dtype=torch.float32, device=device)
    cuda = device.type == "cuda"
    return torch.optim.AdamW(groups, betas=tuple(settings.betas), eps=settings.eps, capturable=cuda, foreach=cuda)


class Member:
    """One model in training: module, optimiser, data streams and its device-side step counter and loss log.

    Args:
        module: maps input_ids [B, L] to logits [B, L, V] (klalm.tasks.readouts.wrap_readout); moved to `device`.
        streams: the batches of every step; the step loss is the sum of each stream's mean masked cross-entropy.
        settings: optimisation settings.
        device: where everything lives.
        seed: the seed this member was built and fed with (a label for results).
        compile_backend: compute the training loss (the module's forward and the cross-entropy together, see
            `readout_loss`) through `torch.compile(..., backend=...)` ("inductor" fuses the small kernels of a step,
            and the loss's float32 cast, log-softmax and NLL; evaluation and the state stay on the plain module);
            None: eager.
    """

    def __init__(self, module: nn.Module, streams: list[Stream], settings: TrainSettings, device: torch.device,
                 seed: int, compile_backend: str | None = None) -> None:  # fmt: skip
        self.module, self.streams, self.settings = module.to(device), streams, settings
        self.device, self.seed = device, seed
        self.loss = self._loss
        if compile_backend is not None:
            prepare_backends(self.module, device)  # decided inside the trace, a choice would split the graph
            self.loss = torch.compile(self._loss, backend=compile_backend)
        self.module.train()
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(self.module, settings, device)
        self.schedule = settings.schedule()
        self.step = torch.zeros((), dtype=torch.long, device=device)
        self.losses = torch.full((settings.steps,), float("nan"), device=device)  # [steps] float32

    def _loss(self, inputs: Tensor, labels: Tensor, scored_per_row: int | None) -> Tensor:
        return readout_loss(self.module, inputs, labels, scored_per_row)

    def state_dict(self) -> dict[str, Any]:
        """Everything training reads or changes: module, optimiser state, step counter and loss log (tensors)."""
        return {"module": self.module.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step,
                "losses": self.losses}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict()` of a member built the same way (the tensors' device may differ)."""
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step.copy_(state["step"])
        self.losses.copy_(state["losses"])


def readout_loss(module: Callable[..., Tensor], inputs: Tensor, labels: Tensor, scored_per_row: int | None) -> Tensor:
    """The mean masked cross-entropy of `module`'s logits (a readout) for `inputs` [B, L] against `labels` [B, L].

    When every row scores exactly K = `scored_per_row` positions, the readout computes the logits of those positions
    only (found with a top-k of the label mask, a fixed shape that CUDA graphs can capture): the same loss as over
    all positions, without the [B, L, V] logits of the positions that are not scored.
    """
    if scored_per_row is None:
        return token_cross_entropy(module(inputs), labels)
    scored = labels.ne(IGNORE_INDEX).to(torch.float32)  # [B, L], exactly K ones per row
    positions = scored.topk(scored_per_row, dim=1, sorted=False).indices  # [B, K]
    return token_cross_entropy(module(inputs, positions), labels.gather(1, positions))


def stream_loss(loss: Callable[[Tensor, Tensor, int | None], Tensor], stream: Stream, step: Tensor) -> Tensor:
    """`loss(inputs, labels, scored_per_row)` (`Member.loss`) of step `step`'s batch of `stream`."""
    inputs, labels = stream.fill(step)
    return loss(inputs, labels, stream.scored_per_row)


def train_step(member: Member) -> None:
    """One optimiser step of `member` with no host synchronisation (so CUDA can capture it).

    lr ← base lr × cosine_multiplier(step); batch ← streams at step; loss = Σ streams' mean masked CE (bf16
    autocast on CUDA); backward; clip the global gradient norm; AdamW; losses[step] ← loss; step += 1.
    """
    multiplier = cosine_multiplier_tensor(member.step, **member.schedule)
    for group in member.optimizer.param_groups:
        group["lr"].copy_(multiplier * group["base_lr"])
    member.optimizer.zero_grad(set_to_none=True)
    with autocast(member.device):
        loss = sum(stream_loss(member.loss, stream, member.step) for stream in member.streams)
    loss.backward()
    if member.settings.grad_clip > 0:
        nn.utils.clip_grad_norm_(member.params, member.settings.grad_clip)
    member.optimizer.step()
    member.losses.index_copy_(0, member.step.view(1), loss.detach().float().view(1))
    member.step.add_(1)


class GroupTrainer:
    """Steps every member once per `advance` step: a CUDA graph replay, or `train_step` called eagerly.

    Args:
        members: the models trained side by side (same settings, so the same number of steps).
        device: where they live.
        capture: capture the step as a CUDA graph (default: on CUDA devices). On CUDA, each member runs on its own
            stream, eager or captured.
    """

    def __init__(self, members: list[Member], device: torch.device, capture: bool | None = None) -> None:
        self.members, self.device = members, device
        self.capture = device.type == "cuda" if capture is None else capture
        if self.capture and device.type != "cuda":
            raise ValueError(f"CUDA graph capture needs a CUDA device, got {device}")
        cuda = device.type == "cuda"
        self.member_streams = [torch.cuda.Stream(device) for _ in members] if cuda else None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.steps_done = int(members[0].step)  # > 0 when the members were loaded from a paused run

    def _step_all(self) -> None:
        if self.member_streams is None:
            for member in self.members:
                train_step(member)
            return
        origin = torch.cuda.current_stream(self.device)
        for member, stream in zip(self.members, self.member_streams):
            stream.wait_stream(origin)
            with torch.cuda.stream(stream):
                train_step(member)
        for stream in self.member_streams:
            origin.wait_stream(stream)

    def prepare(self) -> None:
        """CUDA capture: WARMUP_STEPS eager steps on a side stream (real steps of the run), then capture one step.

        Without capture (or with too few steps left for the warm-up and one replay) there is nothing to prepare.
        """
        if not self.capture or self.steps_done + WARMUP_STEPS >= self.members[0].settings.steps:
            return
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self._step_all()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.steps_done += WARMUP_STEPS
        self._capture()

    def _capture(self) -> None:
        """Capture one step of every member as the graph that `advance` replays."""
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._step_all()  # recorded, not run: the counters stay where they are

    def keep(self, members: list[Member]) -> None:
        """Step only `members` (some of the current ones) from now on: when a pack's cell is solved, the others
        train on in the same process. A captured step is captured again over the members kept (they are already
        warm); the members let go keep the state they reached."""
        kept = [i for i, member in enumerate(self.members) if any(member is m for m in members)]
        self.members = [self.members[i] for i in kept]
        if self.member_streams is not None:
            self.member_streams = [self.member_streams[i] for i in kept]
        if self.graph is not None:
            self.graph.reset()
            self._capture()

    def advance(self, steps: int) -> None:
        """Run `steps` more steps of every member (asynchronously on CUDA)."""
        if self.steps_done + steps > self.members[0].settings.steps:
            raise ValueError(f"{self.steps_done} + {steps} steps exceed the planned {self.members[0].settings.steps}")
        for _ in range(steps):
            if self.graph is not None:
                self.graph.replay()
            else:
                self._step_all()
        self.steps_done += steps

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


@torch.no_grad()
def evaluate(module: nn.Module, inputs: Tensor, labels: Tensor, batch_size: int, device: torch.device,
             scored_per_row: int | None = None) -> dict:  # fmt: skip
    """Held-out accuracy on the scored positions.

    Args:
        module: maps input_ids [B, L] to logits [B, L, V] (and, with `scored_per_row`, input_ids and positions
            [B, K] to the logits there, [B, K, V]: `TokenReadout`).
        inputs, labels: the test split, [N, L] each (any device).
        batch_size: sequences per forward.
        device: where the module lives.
        scored_per_row: K when every row scores exactly K positions (the task's, as in training's `readout_loss`):
            the logits of those positions only are computed. Same predictions; at MQAR's long cell 1/8 of the
            head's work and memory.

    Returns:
        {"token_acc": correct scored tokens / scored tokens, "seq_acc": sequences with every scored token correct
        / sequences with at least one scored token, "scored_tokens": count, "position_acc": the token accuracy at
        each position 0..L-1, None where no label is scored}.

    Raises:
        ValueError: a row does not score exactly `scored_per_row` positions, or no position is scored.
    """
    if scored_per_row is not None:
        counts = labels.ne(IGNORE_INDEX).sum(1)
        if not bool(counts.eq(scored_per_row).all()):
            raise ValueError(f"scored_per_row={scored_per_row}, but the test split's rows score "
                             f"{sorted(set(counts.tolist()))} positions")  # fmt: skip
    module.eval()
    correct = total = seq_correct = seq_total = 0
    position_hits = position_scored = torch.zeros(labels.shape[1], dtype=torch.long)
    for lo in range(0, inputs.shape[0], batch_size):
        x, y = inputs[lo : lo + batch_size].to(device), labels[lo : lo + batch_size].to(device)
        scored = y != IGNORE_INDEX
        with autocast(device):
            if scored_per_row is None:
                predictions = module(x).argmax(-1)  # [B, L]
            else:  # the scored positions' logits only; the others' predictions stay -1, never a label
                positions = scored.to(torch.float32).topk(scored_per_row, dim=1, sorted=False).indices  # [B, K]
                predictions = torch.full_like(y, -1).scatter_(1, positions, module(x, positions).argmax(-1))
        hits = (predictions == y) & scored
        correct += int(hits.sum())
        total += int(scored.sum())
        position_hits, position_scored = position_hits + hits.sum(0).cpu(), position_scored + scored.sum(0).cpu()
        has_scored = scored.any(1)
        seq_correct += int(((hits == scored).all(1) & has_scored).sum())
        seq_total += int(has_scored.sum())
    module.train()
    if total == 0:
        raise ValueError("the test split has no scored positions (every label is -100)")
    position_acc = [h / n if n else None for h, n in zip(position_hits.tolist(), position_scored.tolist(), strict=True)]
    return {"token_acc": correct / total, "seq_acc": seq_correct / max(seq_total, 1), "scored_tokens": total,
            "position_acc": position_acc}  # fmt: skip


@dataclasses.dataclass
class StopRule:
    """A cell is solved at the first evaluation where one of its members' `metric` reaches `threshold` (the members
    of a cell: see `train_group`'s `cells`)."""

    metric: str  # "token_acc" or "seq_acc"
    threshold: float


@dataclasses.dataclass
class GroupResult:
    """What `train_group` did.

    ended: "steps" (the members still training reached their planned steps), "threshold" (every cell was solved)
    or "paused" (the next stretch of steps would have ended after the deadline; the members still training hold the
    state to resume from). steps: the step the last members reached. evals[i] lists member i's evaluations as
    {"step", "loss" (mean since the previous evaluation), **evaluate()}. final_loss[i]: member i's mean loss over
    its last FINAL_LOSS_STEPS steps. solved: cell -> the step at which it was solved (its members stopped there).
    """

    ended: str
    steps: int
    evals: list[list[dict]]
    final_loss: list[float]
    setup_s: float
    train_s: float
    step_s: float  # seconds per step with every member training (evaluations included): before the first solve
    solved: dict[int, int] = dataclasses.field(default_factory=dict)
    eval_s: float = 0.0  # seconds of train_s spent in held-out evaluations


def train_group(
    trainer: GroupTrainer,
    test: tuple[Tensor, Tensor] | list[tuple[Tensor, Tensor]],
    *,
    eval_every: int | None,
    stop: StopRule | None = None,
    deadline: float | None = None,
    evals: list[list[dict]] | None = None,
    cells: list[int] | None = None,
    progress: Callable[[int, int, float, dict[int, float]], None] | None = None,
    checkpoint: Callable[[int, list[list[dict]], list[int], float], None] | None = None,
) -> GroupResult:
    """Train every member of `trainer` to its planned steps, evaluating on `test` every `eval_every` steps and at
    the end; stop a cell's members early by `stop`, the others training on; pause when the next stretch of steps
    (up to the next evaluation, at most CHECK_EVERY steps), at the measured rate, would end after `deadline` (a
    time.time() value).

    Args:
        test: the held-out split, or one per cell.
        evals: the evaluations so far of members resumed from a paused run (GroupResult.evals); None for a new run.
        cells: the cell of each member (default: all one cell). When a member reaches the stop rule, every member
            of its cell stops there; the group ends when no cell is left.
        progress: called after every evaluation with the step, the planned steps, the seconds per step so far in
            this run and, for each cell still training, the best token accuracy of its members at this evaluation.
        checkpoint: called after every evaluation that leaves members to train, with the step, the evaluations so
            far (as `GroupResult.evals`), the indices of the members still training and the seconds trained so far
            in this run: where a caller saves what a pause would, so a process killed early loses little.
    """
    members, total = list(trainer.members), trainer.members[0].settings.steps
    cells = [0] * len(members) if cells is None else cells
    tests = test if isinstance(test, list) else [test] * (max(cells) + 1)
    started = time.perf_counter()
    trainer.prepare()
    trainer.synchronize()
    loop_start, loop_first = time.perf_counter(), trainer.steps_done
    setup_s = loop_start - started
    evals = [list(log) for log in evals] if evals is not None else [[] for _ in members]
    final_loss: list[float] = [float("nan")] * len(members)
    active, solved, before_solve = list(range(len(members))), {}, None
    ended, eval_s, eval_total_s = "steps", 0.0, 0.0
    last_eval = evals[0][-1]["step"] if evals[0] else 0
    while True:
        due = _next_evaluation(trainer.steps_done, total, eval_every)
        trainer.advance(min(due, trainer.steps_done + CHECK_EVERY) - trainer.steps_done)
        trainer.synchronize()
        step = trainer.steps_done
        if step == due:
            eval_start = time.perf_counter()
            for i in active:
                loss = float(members[i].losses[last_eval:step].mean())
                evals[i].append({"step": step, "loss": loss, **_evaluate_member(members[i], tests[cells[i]])})
            eval_s, last_eval = time.perf_counter() - eval_start, step
            eval_total_s += eval_s
            if progress is not None and step > loop_first:
                best: dict[int, float] = {}
                for i in active:
                    best[cells[i]] = max(best.get(cells[i], 0.0), evals[i][-1]["token_acc"])
                progress(step, total, (time.perf_counter() - loop_start) / (step - loop_first), best)
            reached = {cells[i] for i in active if stop is not None and evals[i][-1][stop.metric] >= stop.threshold}
            if reached:
                before_solve = before_solve or (time.perf_counter() - loop_start, step - loop_first)
                solved.update(dict.fromkeys(sorted(reached), step))
                for i in active:
                    if cells[i] in reached:
                        final_loss[i] = _final_loss(members[i], step)
                active = [i for i in active if cells[i] not in reached]
                if not active:
                    ended = "threshold"
                    break
                if step < total:
                    trainer.keep([members[i] for i in active])
            if checkpoint is not None and step < total:
                checkpoint(step, evals, active, time.perf_counter() - loop_start)
        if step == total:
            break
        per_step = (time.perf_counter() - loop_start) / (step - loop_first)
        due = _next_evaluation(step, total, eval_every)
        stretch_end = min(due, step + CHECK_EVERY)
        ends_at = time.time() + (stretch_end - step) * per_step + (eval_s if stretch_end == due else 0.0)
        if deadline is not None and ends_at > deadline:
            ended = "paused"
            break
    train_s = time.perf_counter() - loop_start
    step = trainer.steps_done
    for i in active:
        final_loss[i] = _final_loss(members[i], step)
    full_s, full_steps = before_solve or (train_s, step - loop_first)
    step_s = full_s / max(full_steps, 1)
    return GroupResult(ended, step, evals, final_loss, setup_s, train_s, step_s, solved, eval_total_s)


def _final_loss(member: Member, step: int) -> float:
    """The mean loss of the FINAL_LOSS_STEPS steps before `step`."""
    return float(member.losses[max(0, step - FINAL_LOSS_STEPS) : step].mean())


def _next_evaluation(step: int, total: int, eval_every: int | None) -> int:
    """The step of the first evaluation after `step` (the last step when evaluating at the end only)."""
    return total if not eval_every else min(total, (step // eval_every + 1) * eval_every)


def _evaluate_member(member: Member, test: tuple[Tensor, Tensor]) -> dict:
    scored_per_row = member.streams[0].scored_per_row  # the task's, which its test split shares
    return evaluate(member.module, *test, member.settings.eval_batch_size, member.device, scored_per_row)
