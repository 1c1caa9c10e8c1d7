"""Train every architecture on the synthetic benchmarks and write tables and plots.

    python scripts/run_synthetic.py --budget quick --out runs/synthetic         # ~6 min on one H200
    python scripts/run_synthetic.py --budget full --out runs/a5 --families a5 --archs kla,gpt --a5-lengths 8,16

A budget is a YAML file in configs/synthetic/ (`quick`, `full`, `cpu`) or a path, read into the dataclasses of
`klalm.tasks.plans`; command-line knobs override it. Families:
- a5: for each arch and length, depths are tried in increasing order and the first depth at which any seed reaches
  the threshold (held-out per-token accuracy, or whole-sequence with `criterion: sequence`) is recorded; the
  remaining depths of that cell are skipped.
- mqar: each (length, pairs) cell with `n_layers` blocks, the best accuracy over the learning rates and seeds.
- mad: each of the six MAD tasks, the best accuracy over learning rates x weight decays x seeds.
With `time_budget_s`, the whole program (data, builds, training, evaluation) aims to finish within that many
seconds: every run gets an equal share of what is left, minus the median measured per-run overhead.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from klalm.tasks import make_task
from klalm.tasks.a5 import A5Task
from klalm.tasks.base import SyntheticTask, materialize
from klalm.tasks.plans import RunPlan, apply_args, count_runs, load_plan, parse_args
from klalm.tasks.report import write_report
from klalm.tasks.train import FreshBatches, SplitBatches, TrainSettings, evaluate, train, wrap_readout

DATA_SEED = 0  # every arch trains and tests on the same fixed splits
A5_AUX_LENGTH = 2  # SLiCE: a batch of length-2 sequences joins every A5 step
MIN_RUN_TRAIN_S = 1.0  # a run always gets at least this much training time, seconds
BUDGET_GRACE_FRAC = 0.1  # runs start until the deadline plus this fraction of the budget; later ones are skipped


class Budget:
    """Shares a wall-clock budget between the runs still planned (None: no limit)."""

    def __init__(self, total_s: float | None, planned_runs: int):
        self.deadline = None if total_s is None else time.perf_counter() + total_s
        self.grace_s = 0.0 if total_s is None else BUDGET_GRACE_FRAC * total_s
        self.remaining_runs, self.overheads = planned_runs, []

    def expired(self) -> bool:
        """True once the deadline plus a grace period has passed: later runs are skipped, not squeezed."""
        return self.deadline is not None and time.perf_counter() > self.deadline + self.grace_s

    def limit(self) -> float | None:
        """Training seconds for the next run."""
        if self.deadline is None:
            return None
        overhead = statistics.median(self.overheads) if self.overheads else 0.0  # robust to one-off compiles
        share = (self.deadline - time.perf_counter()) / max(self.remaining_runs, 1)
        return max(share - overhead, MIN_RUN_TRAIN_S)

    def finished(self, wall_s: float, train_s: float) -> None:
        self.overheads.append(max(wall_s - train_s, 0.0))
        self.remaining_runs -= 1

    def skip(self, runs: int) -> None:
        self.remaining_runs -= runs


@dataclasses.dataclass
class RunSpec:
    """One training run: what to build, how to train it, on what data."""

    family: str
    arch: str
    task: SyntheticTask
    n_layers: int
    d_model: int
    settings: TrainSettings
    seed: int
    test: tuple[torch.Tensor, torch.Tensor]  # the held-out split, [N, L] each
    train_split: tuple[torch.Tensor, torch.Tensor] | None = None  # None: a fresh batch at every step
    aux_task: SyntheticTask | None = None  # A5: the length-2 auxiliary batch
    tags: dict[str, Any] = dataclasses.field(default_factory=dict)  # recorded with the result (length, task, ...)


class Session:
    """Device, data caches, budget and the list of results (written to results.json after every run)."""

    def __init__(self, plan: RunPlan, out_dir: Path):
        self.plan, self.out_dir = plan, out_dir
        self.device = torch.device(
            ("cuda" if torch.cuda.is_available() else "cpu") if plan.device == "auto" else plan.device
        )
        self.records: list[dict[str, Any]] = []
        self.budget = Budget(plan.time_budget_s, count_runs(plan))
        self._splits: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        out_dir.mkdir(parents=True, exist_ok=True)
        print(f"[synthetic] device {self.device}, {self.budget.remaining_runs} runs planned, out {out_dir}", flush=True)

    def split(self, task: SyntheticTask, num_examples: int, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A fixed split on the device, generated once per (task, size, split)."""
        key = (task, num_examples, split)
        if key not in self._splits:
            inputs, labels = materialize(task, num_examples, DATA_SEED, split)
            self._splits[key] = (inputs.to(self.device), labels.to(self.device))
        return self._splits[key]

    def run(self, spec: RunSpec) -> dict:
        """Build, train and evaluate one model; record the result (or the error, or the skip) and return it.

        A run that raises is recorded with its error and the grid goes on (one broken arch must not lose the
        other archs' results); `main` exits non-zero if any run failed.
        """
        settings = spec.settings
        record = {
            "family": spec.family,
            "arch": spec.arch,
            "seed": spec.seed,
            "n_layers": spec.n_layers,
            "d_model": spec.d_model,
            "lr": settings.lr,
            "weight_decay": settings.weight_decay,
            **spec.tags,
        }
        shown = " ".join(f"{k}={v}" for k, v in record.items() if k not in ("family", "arch"))
        start = time.perf_counter()
        if self.budget.expired():
            record["skipped"] = "time budget exhausted"
            self.budget.skip(1)
        else:
            try:
                record.update(self._train_and_evaluate(spec))
            except Exception as err:  # recorded and printed here, a non-zero exit in main
                traceback.print_exc()
                record["error"] = f"{type(err).__name__}: {err}"
            self.budget.finished(time.perf_counter() - start, record.get("train_time_s", 0.0))
        self.records.append(record)
        (self.out_dir / "results.json").write_text(json.dumps(self.results(), indent=1))
        outcome = record.get("error") or record.get("skipped")
        if outcome is None:
            outcome = (
                f"steps={record['steps']} train={record['train_time_s']:.1f}s loss={record['final_loss']:.3f} "
                f"acc={record['token_acc']:.3f} seq_acc={record['seq_acc']:.3f}"
            )
        print(f"[{spec.family} {spec.arch} {shown}] {outcome}", flush=True)
        return record

    def _train_and_evaluate(self, spec: RunSpec) -> dict[str, Any]:
        from klalm.models import build_model  # lazy: the model zoo is heavy to import

        torch.manual_seed(spec.seed)
        overrides = self.plan.model_overrides.get(spec.arch, {})
        vocab, d_model = spec.task.vocab_size, spec.d_model
        model = build_model(spec.arch, d_model=d_model, n_layers=spec.n_layers, vocab_size=vocab, **overrides)
        module = wrap_readout(model, spec.task, d_model).to(self.device)
        settings = dataclasses.replace(spec.settings, time_limit_s=self.budget.limit())
        if spec.train_split is not None:
            next_batch = SplitBatches(*spec.train_split, settings.batch_size, spec.seed)
        else:
            next_batch = FreshBatches(spec.task, settings.batch_size, spec.seed, self.device)
        aux = None
        if spec.aux_task is not None and settings.aux_batch_size > 0:
            aux = FreshBatches(spec.aux_task, settings.aux_batch_size, spec.seed + 10_000, self.device)
        stats = train(module, next_batch, settings, self.device, aux_batch=aux)
        metrics = evaluate(module, *spec.test, settings.eval_batch_size, self.device)
        return {**metrics, **stats, "params": sum(p.numel() for p in module.parameters())}

    def results(self) -> dict:
        return {
            "plan": dataclasses.asdict(self.plan),
            "device": str(self.device),
            "device_name": torch.cuda.get_device_name() if self.device.type == "cuda" else "cpu",
            "runs": self.records,
        }


def run_a5(session: Session, arch: str) -> None:
    """Minimum depth per length (see `a5_min_depth`)."""
    for length in session.plan.a5.lengths:
        a5_min_depth(session, arch, A5Task(length=length))


def a5_min_depth(session: Session, arch: str, task: A5Task) -> int | None:
    """Try depths in increasing order; return the first one that any seed solves (None: none does).

    The rest of the cell (later seeds and depths) is skipped once a run solves it.
    """
    plan = session.plan.a5
    metric = {"token": "token_acc", "sequence": "seq_acc"}[plan.criterion]
    test, aux_task = session.split(task, plan.num_test, "test"), A5Task(length=A5_AUX_LENGTH)
    tried, cell_runs = 0, len(plan.depths) * len(plan.seeds)
    for depth in plan.depths:
        for seed in plan.seeds:
            tags = {"length": task.length}
            spec = RunSpec("a5", arch, task, depth, plan.d_model, plan.train, seed, test, None, aux_task, tags)
            tried += 1
            if session.run(spec).get(metric, -1.0) >= plan.threshold:
                session.budget.skip(cell_runs - tried)
                return depth
    return None


def run_mqar(session: Session, arch: str) -> None:
    plan = session.plan.mqar
    for length, pairs in plan.cells:
        task = make_task("mqar", length=length, num_pairs=pairs, vocab=plan.vocab)
        train_split, test = session.split(task, plan.num_train, "train"), session.split(task, plan.num_test, "test")
        for lr in plan.lrs:
            settings = dataclasses.replace(plan.train, lr=lr)
            for seed in plan.seeds:
                spec = RunSpec("mqar", arch, task, plan.n_layers, plan.d_model, settings, seed, test, train_split)
                session.run(dataclasses.replace(spec, tags={"length": length, "pairs": pairs}))


def run_mad(session: Session, arch: str) -> None:
    plan = session.plan.mad
    for name in plan.tasks:
        task = make_task(name, **plan.task_settings.get(name, {}))
        num_train = min(task.num_train, plan.max_train or task.num_train)
        num_test = min(task.num_test, plan.max_test or task.num_test)
        train_split, test = session.split(task, num_train, "train"), session.split(task, num_test, "test")
        steps = plan.train.steps if plan.epochs is None else math.ceil(plan.epochs * num_train / plan.train.batch_size)
        for lr in plan.lrs:
            for weight_decay in plan.weight_decays:
                settings = dataclasses.replace(plan.train, lr=lr, weight_decay=weight_decay, steps=steps)
                for seed in plan.seeds:
                    spec = RunSpec("mad", arch, task, plan.n_layers, plan.d_model, settings, seed, test, train_split)
                    session.run(dataclasses.replace(spec, tags={"task": name}))


FAMILIES = {"a5": run_a5, "mqar": run_mqar, "mad": run_mad}


def run(plan: RunPlan, out_dir: Path) -> dict:
    """Run every family for every arch (family by family, so partial results compare archs); write the report."""
    session = Session(plan, out_dir)
    start = time.perf_counter()
    for family in plan.families:
        for arch in plan.archs:
            FAMILIES[family](session, arch)
    results = session.results()
    results["wall_s"] = time.perf_counter() - start
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    print(write_report(results, out_dir), flush=True)
    print(f"[synthetic] done in {results['wall_s']:.0f} s; results in {out_dir}", flush=True)
    return results


def main(argv: list[str] | None = None) -> None:
    """Entry point of scripts/run_synthetic.py."""
    args = parse_args(argv)
    results = run(apply_args(load_plan(args.budget), args), args.out)
    failed = [r for r in results["runs"] if "error" in r]
    if failed:
        sys.exit(f"[synthetic] {len(failed)} run(s) failed; see the errors above and in results.json")
