"""The multi-GPU check on the CPU: per-rank loader states re-split exactly across world sizes, the token audit, the
analysis script on synthetic run logs (it must catch each kind of failure), and (slow) the whole driver
scripts/multigpu_check.sh rehearsed with 2 gloo processes."""

from __future__ import annotations

import copy
import csv
import importlib.util
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from klalm.data import ResumableLoader, ShardDataset, ShardSource
from klalm.data.prepare import ShardWriter
from klalm.train.callbacks import StopAfterSteps
from klalm.train.checkpoint import _dataset_states, reshard_loader_states
from klalm.train.token_audit import batch_window_hashes, window_hash

REPO = Path(__file__).resolve().parents[2]
SEQ, BATCH = 7, 2  # windows of 8 tokens, 2 per batch


def _load_analysis():
    spec = importlib.util.spec_from_file_location("multigpu_check", REPO / "scripts" / "multigpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """A shard folder of 800 distinct token ids (100 windows of 8), in two files."""
    out = tmp_path_factory.mktemp("shards")
    writer = ShardWriter(out, "uint16", eos_id=0, shard_tokens=500)
    for start in range(1, 800, 100):
        writer.add(list(range(start, start + 99)))  # 99 ids + EOS per document
    writer.close({"vocab_size": 1000, "tokenizer": "none", "source": "test", "skipped": {}})
    return out


def _windows(batch: dict[str, torch.Tensor]) -> list[tuple[int, ...]]:
    return [tuple(x.tolist()) + (int(y[-1]),) for x, y in zip(batch["input_ids"], batch["labels"])]


def _loader(shards: Path, rank: int, world: int, workers: int) -> ResumableLoader:
    dataset = ShardDataset(
        ShardSource(str(shards)), seq_len=SEQ, batch_size=BATCH, rank=rank, world_size=world, seed=3, shuffle=True
    )
    return ResumableLoader(dataset, batch_size=None, num_workers=workers)


def _take(loader: ResumableLoader, n: int) -> tuple[list, dict]:
    """The windows of the first n batches and the loader state after them."""
    out, it = [], iter(loader)
    for _ in range(n):
        out += _windows(next(it))
    return out, loader.state_dict()


@pytest.mark.parametrize("workers", [0, 1])
def test_two_rank_state_resumes_exactly_on_one_rank(shards, workers):
    reference, _ = _take(_loader(shards, 0, 1, workers), 10)  # one rank, 20 windows in the epoch's order
    read, states = [], []
    for rank in range(2):  # two ranks, 3 batches each: windows 0..11 of the same order
        windows, state = _take(_loader(shards, rank, 2, workers), 3)
        read += windows
        states.append(state)
    assert sorted(read) == sorted(reference[:12])
    resumed = _loader(shards, 0, 1, workers)
    resumed.load_state_dict(reshard_loader_states(states, world_size=1, rank=0))
    rest, _ = _take(resumed, 4)
    assert rest == reference[12:20]


def test_same_world_size_gives_each_rank_its_own_state(shards):
    states = [_take(_loader(shards, rank, 2, 0), 2)[1] for rank in range(2)]
    assert reshard_loader_states(states, world_size=2, rank=1) is states[1]
    assert reshard_loader_states(states[:1], world_size=1, rank=0) is states[0]


def test_reshard_refuses_what_it_cannot_split_exactly(shards):
    states = [_take(_loader(shards, rank, 2, 0), 3)[1] for rank in range(2)]
    lagging = copy.deepcopy(states)
    _dataset_states(lagging[1])[0]["pos"] -= BATCH
    with pytest.raises(ValueError, match="lock-step"):
        reshard_loader_states(lagging, world_size=1, rank=0)
    with pytest.raises(ValueError, match="exactly"):  # 2 consumers at pos 6 -> 12 windows over 5 consumers
        reshard_loader_states(states, world_size=5, rank=0)
    packed = copy.deepcopy(states)
    for state in packed:
        _dataset_states(state)[0]["buffer"] = []  # a document-stream state (PackedTextDataset), not shards
    with pytest.raises(ValueError, match="data=shards"):
        reshard_loader_states(packed, world_size=1, rank=0)
    with pytest.raises(ValueError, match="rank 2"):
        reshard_loader_states(states, world_size=2, rank=2)


def test_window_hashes_identify_windows():
    ids = torch.arange(12).reshape(2, 6)  # [B, T]
    batch = {"input_ids": ids, "labels": ids + 1}
    hashes = batch_window_hashes(batch)
    assert hashes == [window_hash(np.arange(7)), window_hash(np.arange(6, 13))]
    assert len(set(hashes)) == 2 and all(len(h) == 16 for h in hashes)
    with pytest.raises(KeyError, match="labels"):
        batch_window_hashes({"input_ids": ids})
    with pytest.raises(ValueError, match="steps"):
        StopAfterSteps(0)


# ----------------------------------------------------------------------------- analysis on synthetic logs

PLAN = {
    "cpu": 1,
    "steps": 8,
    "window": 4,
    "resume_at": 6,
    "seq_len": 32,
    "micro_batch": 2,
    "global_batch_tokens": 128,
    "loss_tol": 1e-4,
    "fsdp_loss_tol": 1e-4,
    "kla_experiment": "x",
    "gpt_experiment": "y",
    "deadline_s": 1,
}
RUNS = {  # name: (ranks, first step, last step)
    "ddp2": (2, 1, 8),
    "single": (1, 1, 4),
    "resume_ddp2": (2, 7, 8),
    "resume_single": (1, 7, 8),
    "gpt_ddp2": (2, 1, 4),
    "gpt_single": (1, 1, 4),
}


def _write_run(work: Path, name: str, ranks: int, first: int, last: int) -> None:
    run = work / name / "mg"
    (run / "csv").mkdir(parents=True)
    (run / "token_audit").mkdir()
    with open(run / "csv" / "metrics.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "step",
                "train/loss",
                "train/tokens_seen",
                "perf/tokens_per_s",
                "perf/tokens_per_s_per_device",
                "perf/step_time_ms",
            ]
        )
        for step in range(first, last + 1):
            tps = 1000.0 * ranks * (0.9 if ranks == 2 else 1.0)
            writer.writerow([step, round(10 - 0.1 * step, 6), step * 128, tps, tps / ranks, 128 / tps * 1e3])
    for rank in range(ranks):  # the 4 windows of step s are s0..s3; rank r of n takes every n-th
        lines = [f"{s}\tw{s}_{w}\n" for s in range(first - 1, last) for w in range(4) if w % ranks == rank]
        (run / "token_audit" / f"rank{rank}.tsv").write_text("".join(lines))


@pytest.fixture
def work(tmp_path) -> Path:
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    rows = ["name\trc\twall_s\tnproc\tstrategy\texperiment\tnote"]
    for name, (ranks, first, last) in RUNS.items():
        _write_run(tmp_path, name, ranks, first, last)
        rows.append(f"{name}\t0\t10\t{ranks}\t{'ddp' if ranks == 2 else 'single'}\tx\t")
    rows.append("fsdp2\t\t\t2\tfsdp\tx\tskipped: in MG_SKIP")
    (tmp_path / "status.tsv").write_text("\n".join(rows) + "\n")
    return tmp_path


def _failed(work: Path) -> list[tuple[str, str]]:
    analysis = _load_analysis()
    analysis.analyse(work, work / "out", warmup_steps=0)
    results = json.loads((work / "out" / "results.json").read_text())
    return [(c["check"], c["runs"]) for c in results["checks"] if not c["pass"]]


def test_analysis_passes_consistent_runs_and_reports_scaling(work):
    assert _failed(work) == [("run finished", "fsdp2")]  # the skipped run is the only failure
    results = json.loads((work / "out" / "results.json").read_text())
    assert {s["model"]: round(s["efficiency"], 3) for s in results["scaling"]} == {"kla": 0.9, "gpt": 0.9}
    report = (work / "out" / "results.md").read_text()
    assert "| kla | 1,000 | 1,800 | 90.0% |" in report and "**NO**" in report


def test_analysis_catches_a_window_read_by_two_ranks(work):
    audit = work / "ddp2" / "mg" / "token_audit" / "rank1.tsv"
    audit.write_text(audit.read_text().replace("w2_1", "w2_0"))  # rank 1 re-reads rank 0's window at step 2
    failed = _failed(work)
    assert ("no window read by two ranks", "ddp2") in failed and (
        "same windows at every step",
        "single vs ddp2",
    ) in failed


def test_analysis_catches_loss_and_resume_mismatches(work):
    path = work / "resume_single" / "mg" / "csv" / "metrics.csv"
    rows = path.read_text().splitlines()
    path.write_text("\n".join([rows[0], rows[1].replace("9.3", "9.4"), *rows[2:]]) + "\n")  # step 7 loss off by 0.1
    single = work / "single" / "mg" / "csv" / "metrics.csv"
    single.write_text("\n".join(single.read_text().splitlines()[:-1]) + "\n")  # one step short
    failed = _failed(work)
    assert ("resume continues (... resumed on 1 GPU)", "resume_single vs ddp2") in failed
    assert any(check.startswith("loss matches") and runs == "single vs ddp2" for check, runs in failed)


def test_loss_gap_by_window_keeps_the_sign():
    """A run that trails the reference by 0.1 from step 11 on shows +0.1 in every later window, 0 before."""
    ref = {s: {"train/loss": 10.0 - 0.01 * s} for s in range(1, 121)}
    got = {s: {"train/loss": ref[s]["train/loss"] + (0.1 if s > 10 else 0.0)} for s in ref}
    windows = _load_analysis().loss_diff(got, ref, range(1, 121))["windows"]
    assert [(w["first"], w["last"]) for w in windows] == [(1, 10), (11, 50), (51, 100), (101, 120)]
    assert [round(w["mean_gap"], 6) for w in windows] == [0.0, 0.1, 0.1, 0.1]
    assert [round(w["mean_abs_gap"], 6) for w in windows] == [0.0, 0.1, 0.1, 0.1]


def test_analysis_again_keeps_the_original_environment(work, tmp_path):
    original = tmp_path / "results.json"
    original.write_text(json.dumps({"environment": {"torch": "2.11.0", "gpus": ["NVIDIA H200", "NVIDIA H200"]}}))
    _load_analysis().analyse(work, tmp_path / "again", warmup_steps=0, environment_from=original)
    again = json.loads((tmp_path / "again" / "results.json").read_text())
    assert again["environment"]["gpus"] == ["NVIDIA H200", "NVIDIA H200"]
    assert "Loss gap by window of steps" in (tmp_path / "again" / "results.md").read_text()


def test_analysis_needs_the_driver_outputs(tmp_path):
    with pytest.raises(FileNotFoundError, match="plan.json"):
        _load_analysis().analyse(tmp_path, tmp_path / "out", warmup_steps=0)


# ----------------------------------------------------------------------------- the driver, rehearsed on the CPU


@pytest.mark.slow
def test_driver_rehearsal_on_two_cpu_processes(tmp_path, shared_data):
    from klalm.data.prepare import prepare_dataset

    tokenizer = {"kind": "hf", "name_or_path": str(shared_data / "gpt2_tokenizer")}
    source = {"kind": "files", "paths": str(shared_data / "enwiki_2015" / "enwiki-00009-of-00010.jsonl.gz")}
    config = {"source": source, "val_source": source, "tokenizer": tokenizer, "on_bad_record": "skip"}
    prepare_dataset(config, tmp_path / "shards", max_documents=20, progress=False)
    env = {
        **os.environ,
        "KLALM_MULTIGPU_CPU": "1",
        "MG_WORK": str(tmp_path / "work"),
        "OUT": str(tmp_path / "out"),
        "KLALM_SHARDS": str(tmp_path / "shards"),
        "MG_KLA_EXPERIMENT": "smoke",
        "MG_GPT_EXPERIMENT": "smoke",
        "MG_SKIP": "gpt_ddp2 gpt_single",
    }
    proc = subprocess.run(
        [str(REPO / "scripts" / "multigpu_check.sh")], env=env, capture_output=True, text=True, timeout=900
    )
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    failed = [(c["check"], c["runs"], c["value"]) for c in results["checks"] if not c["pass"]]
    skipped = {("run finished", name) for name in ("fsdp2", "gpt_ddp2", "gpt_single")}
    assert {f[:2] for f in failed} == skipped, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 1 and proc.stdout.rstrip().splitlines()[-1].startswith("multigpu_check:")
    checks = {(c["check"], c["runs"]) for c in results["checks"]}
    assert ("resume continues (... resumed on 1 GPU)", "resume_single vs ddp2") in checks
    assert ("same windows at every step", "resume_ddp2 vs ddp2") in checks
    assert (tmp_path / "out" / "runs.tar.gz").stat().st_size > 0 and len(list((tmp_path / "out").iterdir())) == 3
