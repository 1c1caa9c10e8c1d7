"""Analysis of scripts/multigpu_check.sh: loss curves, token windows per rank, resume continuity, throughput.

    python scripts/multigpu_check.py --work outputs/multigpu_work --out outputs/multigpu_check

Reads `<work>/plan.json` and `<work>/status.tsv` (written by the driver) and, for every run `<work>/<name>/mg/`,
`csv/metrics.csv` (one row per optimiser step) and `token_audit/rank<r>.tsv` (`<step>\\t<window hash>` per consumed
window). Writes `<out>/results.md` (Markdown tables, also printed) and `<out>/results.json`; exits 1 when a run
failed or a check did not pass.

Checks:
- loss: 1-GPU and FSDP runs vs the 2-GPU DDP run over the same steps (same seed, data and global batch): max |Δ|.
- windows: no window hash on two ranks of one run; the same set of windows at every step in the compared runs.
- resume: resumed runs start at step M + 1 with tokens_seen (M + 1)·G and follow the uninterrupted run's losses.
- throughput: median tokens/s over the steps after the first `--warmup-steps`; scaling efficiency of 2 GPUs =
  tokens/s(2 GPUs) / (2 × tokens/s(1 GPU)).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

RUN_SUBDIR = "mg"  # the driver's KLALM_RUN_ID: runs live in <work>/<name>/mg
# (compared run, reference run, what the comparison shows, plan key of its tolerance); steps 1..window.
# FSDP gets its own tolerance: Lightning's FSDP bf16-mixed computes with bf16 parameter copies and reduces
# gradients in bf16, where DDP keeps float32 parameters under autocast and reduces float32 gradients.
LOSS_PAIRS = (
    ("single", "ddp2", "1 GPU (accumulate 2) vs 2-GPU DDP, same global batch", "loss_tol"),
    ("fsdp2", "ddp2", "2-GPU FSDP vs 2-GPU DDP", "fsdp_loss_tol"),
    ("gpt_single", "gpt_ddp2", "gpt: 1 GPU vs 2-GPU DDP", "loss_tol"),
)
RESUMES = (("resume_ddp2", "ddp2 step-M checkpoint resumed on 2 GPUs"), ("resume_single", "... resumed on 1 GPU"))
SCALING = (("ddp2", "single", "kla"), ("gpt_ddp2", "gpt_single", "gpt"))


def read_status(work: Path) -> dict[str, dict[str, str]]:
    """Rows of status.tsv by run name (rc, wall_s, nproc, strategy, experiment, note)."""
    path = work / "status.tsv"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run scripts/multigpu_check.sh first")
    with open(path, newline="") as handle:
        return {row["name"]: row for row in csv.DictReader(handle, delimiter="\t")}


def read_metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    """step → metrics row (floats; empty cells dropped) from csv/metrics.csv; {} when the file is missing."""
    path = run_dir / "csv" / "metrics.csv"
    if not path.is_file():
        return {}
    rows: dict[int, dict[str, float]] = {}
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            values = {k: float(v) for k, v in row.items() if v not in ("", None)}
            if "step" in values and "train/loss" in values:
                rows[int(values["step"])] = values
    return rows


def read_audit(run_dir: Path) -> dict[int, list[tuple[int, str]]]:
    """rank → [(step index, window hash), ...] from token_audit/rank<r>.tsv ({} when absent)."""
    audit: dict[int, list[tuple[int, str]]] = {}
    for path in sorted((run_dir / "token_audit").glob("rank*.tsv")):
        rank = int(path.stem.removeprefix("rank"))
        with open(path) as handle:
            audit[rank] = [(int(step), digest) for step, digest in (line.split() for line in handle if line.strip())]
    return audit


def gap_windows(steps: list[int]) -> list[list[int]]:
    """`steps` grouped into the windows of the loss-gap table: steps 1-10, 11-50, then 50 at a time."""
    groups: dict[int, list[int]] = defaultdict(list)
    for s in steps:
        groups[0 if s <= 10 else 1 if s <= 50 else 2 + (s - 51) // 50].append(s)
    return [groups[k] for k in sorted(groups)]


def loss_diff(got: dict[int, dict], ref: dict[int, dict], steps: range) -> dict[str, Any]:
    """Max and mean |loss(got) - loss(ref)| over `steps` (1-based optimiser steps present in both runs), and per
    window of steps the mean signed gap (got - ref) beside the mean |gap|: a gap of one sign that persists means one
    run trains slower, one that changes sign means the two curves wander around each other."""
    common = [s for s in steps if s in got and s in ref]
    if not common:
        return {"steps": 0, "max_abs": None, "mean_abs": None}
    gap = {s: got[s]["train/loss"] - ref[s]["train/loss"] for s in common}
    diffs = [abs(g) for g in gap.values()]
    return {
        "steps": len(common),
        "first": common[0],
        "last": common[-1],
        "max_abs": max(diffs),
        "mean_abs": sum(diffs) / len(diffs),
        "ref_first_loss": ref[common[0]]["train/loss"],
        "ref_last_loss": ref[common[-1]]["train/loss"],
        "windows": [
            {
                "first": w[0],
                "last": w[-1],
                "mean_gap": statistics.fmean(gap[s] for s in w),
                "mean_abs_gap": statistics.fmean(abs(gap[s]) for s in w),
                "ref_mean_loss": statistics.fmean(ref[s]["train/loss"] for s in w),
            }
            for w in gap_windows(common)
        ],
    }


def window_stats(audit: dict[int, list[tuple[int, str]]]) -> dict[str, Any]:
    """Windows per rank, hashes seen on more than one rank, and repeated hashes within the run."""
    owners: dict[str, set[int]] = defaultdict(set)
    counts: Counter[str] = Counter()
    for rank, rows in audit.items():
        for _, digest in rows:
            owners[digest].add(rank)
            counts[digest] += 1
    return {
        "ranks": len(audit),
        "windows_per_rank": [len(audit[r]) for r in sorted(audit)],
        "cross_rank_duplicates": sum(len(r) > 1 for r in owners.values()),
        "repeated_windows": sum(c > 1 for c in counts.values()),
    }


def windows_by_step(audit: dict[int, list[tuple[int, str]]]) -> dict[int, Counter]:
    """step index → multiset of window hashes consumed at that step over all ranks."""
    steps: dict[int, Counter] = defaultdict(Counter)
    for rows in audit.values():
        for step, digest in rows:
            steps[step][digest] += 1
    return steps


def same_windows(got: dict[int, list], ref: dict[int, list], step_indices: range) -> dict[str, Any]:
    """Steps (0-based indices) of `step_indices` whose window multisets differ between two runs."""
    a, b = windows_by_step(got), windows_by_step(ref)
    compared = [s for s in step_indices if s in a or s in b]
    differing = [s for s in compared if a.get(s) != b.get(s)]
    return {"steps": len(compared), "differing_steps": differing[:10], "n_differing": len(differing)}


def throughput(metrics: dict[int, dict], warmup_steps: int) -> dict[str, Any]:
    """Median tokens/s, tokens/s per device, step time and max peak memory over steps after the warm-up."""
    rows = [metrics[s] for s in sorted(metrics) if s > min(metrics) + warmup_steps - 1] if metrics else []
    if not rows:
        return {"steps": 0}
    out: dict[str, Any] = {"steps": len(rows)}
    for key, name in (
        ("perf/tokens_per_s", "tokens_per_s"),
        ("perf/tokens_per_s_per_device", "tokens_per_s_per_gpu"),
        ("perf/step_time_ms", "step_ms"),
        ("perf/mfu", "mfu"),
    ):
        values = [r[key] for r in rows if key in r]
        if values:
            out[name] = statistics.median(values)
    memory = [r["perf/peak_mem_gb"] for r in rows if "perf/peak_mem_gb" in r]
    if memory:
        out["peak_mem_gb"] = max(memory)
    return out


def _check(name: str, runs: str, value: str, ok: bool) -> dict[str, Any]:
    return {"check": name, "runs": runs, "value": value, "pass": bool(ok)}


def _fmt(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}g}"


def run_checks(plan: dict, status: dict, runs: dict[str, dict]) -> tuple[list[dict], dict[str, Any]]:
    """Every pass/fail check of the plan over the runs that exist, plus the raw numbers behind them."""
    checks, details = [], {"loss": {}, "windows": {}, "same_windows": {}, "resume": {}}
    for name, row in status.items():
        checks.append(_check("run finished", name, row["note"] or f"exit {row['rc']}", row["rc"] == "0"))
    window = range(1, plan["window"] + 1)
    for got, ref, what, tol_key in LOSS_PAIRS:
        if got in runs and ref in runs:
            tol = plan[tol_key]
            d = details["loss"][got] = loss_diff(runs[got]["metrics"], runs[ref]["metrics"], window)
            ok = d["steps"] == plan["window"] and d["max_abs"] is not None and d["max_abs"] <= tol
            checks.append(
                _check(
                    f"loss matches ({what})",
                    f"{got} vs {ref}",
                    f"max abs diff {_fmt(d['max_abs'])} over {d['steps']} steps (tol {tol})",
                    ok,
                )
            )
    for name, run in runs.items():
        if run["status"]["nproc"] not in ("", "1"):
            d = details["windows"][name] = window_stats(run["audit"])
            ok = d["ranks"] == int(run["status"]["nproc"]) and not d["cross_rank_duplicates"]
            value = (
                f"{d['ranks']} ranks, windows/rank {d['windows_per_rank']}, on two ranks: "
                f"{d['cross_rank_duplicates']}, repeated: {d['repeated_windows']}"
            )
            checks.append(_check("no window read by two ranks", name, value, ok and not d["repeated_windows"]))
    pairs = [(g, r, range(plan["window"])) for g, r, *_ in LOSS_PAIRS] + [("gpt_ddp2", "ddp2", range(plan["window"]))]
    pairs += [(g, "ddp2", range(plan["resume_at"], plan["steps"])) for g, _ in RESUMES]
    for got, ref, steps in pairs:
        if got in runs and ref in runs:
            d = details["same_windows"][got] = same_windows(runs[got]["audit"], runs[ref]["audit"], steps)
            value = f"{d['steps']} steps compared, {d['n_differing']} differ {d['differing_steps'] or ''}".strip()
            checks.append(
                _check(
                    "same windows at every step",
                    f"{got} vs {ref}",
                    value,
                    d["steps"] == len(steps) and not d["n_differing"],
                )
            )
    for name, what in RESUMES:
        if name in runs and "ddp2" in runs:
            checks.append(resume_check(name, what, runs[name]["metrics"], runs["ddp2"]["metrics"], plan, details))
    return checks, details


def resume_check(name: str, what: str, got: dict, ref: dict, plan: dict, details: dict) -> dict[str, Any]:
    """A resumed run continues at step M + 1 with tokens (M + 1)·G and the uninterrupted run's losses."""
    start, tokens = plan["resume_at"] + 1, (plan["resume_at"] + 1) * plan["global_batch_tokens"]
    first = got.get(min(got)) if got else None
    d = loss_diff(got, ref, range(start, plan["steps"] + 1))
    d.update(first_step=min(got) if got else None, first_tokens=first and int(first["train/tokens_seen"]))
    details["resume"][name] = d
    ok = (
        d["first_step"] == start
        and d["first_tokens"] == tokens
        and d["steps"] == plan["steps"] - start + 1
        and d["max_abs"] is not None
        and d["max_abs"] <= plan["loss_tol"]
    )
    value = (
        f"first step {d['first_step']} (want {start}), tokens {d['first_tokens']} (want {tokens}), "
        f"max abs loss diff {_fmt(d['max_abs'])} over {d['steps']} steps"
    )
    return _check(f"resume continues ({what})", f"{name} vs ddp2", value, ok)


def throughput_rows(runs: dict[str, dict], warmup_steps: int) -> tuple[dict[str, dict], list[dict]]:
    """Per-run throughput, and the scaling efficiency of each (2-GPU, 1-GPU) pair that ran."""
    perf = {name: throughput(run["metrics"], warmup_steps) for name, run in runs.items()}
    scaling = []
    for two, one, model in SCALING:
        t2, t1 = perf.get(two, {}).get("tokens_per_s"), perf.get(one, {}).get("tokens_per_s")
        if t2 and t1:
            scaling.append(
                {"model": model, "tokens_per_s_1gpu": t1, "tokens_per_s_2gpu": t2, "efficiency": t2 / (2 * t1)}
            )
    return perf, scaling


def render(plan: dict, status: dict, checks: list[dict], details: dict, perf: dict, scaling: list[dict]) -> str:
    """The Markdown report: runs, checks, the loss gap by window of steps, throughput and scaling."""
    lines = [
        f"## multigpu_check: {'2 CPU processes (gloo)' if plan['cpu'] else '2 GPUs'}",
        "",
        f"seq_len {plan['seq_len']}, micro-batch {plan['micro_batch']} per device, global batch "
        f"{plan['global_batch_tokens']:,} tokens; DDP run {plan['steps']} steps, windows of {plan['window']} "
        f"steps, resume from step {plan['resume_at']}.",
        "",
        "| run | devices | strategy | experiment | exit | wall s | note |",
        "| --- | ---: | --- | --- | ---: | ---: | --- |",
    ]
    for name, row in status.items():
        lines.append(
            f"| {name} | {row['nproc']} | {row['strategy']} | {row['experiment']} | {row['rc']} | "
            f"{row['wall_s']} | {row['note']} |"
        )
    lines += ["", "| check | runs | result | pass |", "| --- | --- | --- | --- |"]
    lines += [f"| {c['check']} | {c['runs']} | {c['value']} | {'yes' if c['pass'] else '**NO**'} |" for c in checks]
    gaps = [
        (got, ref, details["loss"][got]) for got, ref, *_ in LOSS_PAIRS if details["loss"].get(got, {}).get("steps")
    ]
    if gaps:
        lines += [
            "",
            "Loss gap by window of steps (compared run minus reference, same steps):",
            "",
            "| runs | steps | reference mean loss | mean gap | mean abs gap |",
            "| --- | --- | ---: | ---: | ---: |",
        ]
        lines += [
            f"| {got} vs {ref} | {w['first']}-{w['last']} | {w['ref_mean_loss']:.4f} | {w['mean_gap']:+.4f} | "
            f"{w['mean_abs_gap']:.4f} |"
            for got, ref, d in gaps
            for w in d["windows"]
        ]
    lines += [
        "",
        "| run | devices | tokens/s | tokens/s per device | step ms | MFU | peak GiB | steps timed |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, p in perf.items():
        if p.get("steps"):
            mfu = f"{p['mfu']:.1%}" if "mfu" in p else "n/a"
            mem = f"{p['peak_mem_gb']:.1f}" if "peak_mem_gb" in p else "n/a"
            lines.append(
                f"| {name} | {status[name]['nproc']} | {p['tokens_per_s']:,.0f} | "
                f"{p['tokens_per_s_per_gpu']:,.0f} | {p['step_ms']:.1f} | {mfu} | {mem} | {p['steps']} |"
            )
    if scaling:
        lines += [
            "",
            "| model | 1 device tokens/s | 2 devices tokens/s | scaling efficiency |",
            "| --- | ---: | ---: | ---: |",
        ]
        lines += [
            f"| {s['model']} | {s['tokens_per_s_1gpu']:,.0f} | {s['tokens_per_s_2gpu']:,.0f} | {s['efficiency']:.1%} |"
            for s in scaling
        ]
    passed = sum(c["pass"] for c in checks)
    lines += ["", f"{passed}/{len(checks)} checks passed."]
    return "\n".join(lines) + "\n"


def environment() -> dict[str, Any]:
    """Versions and device names (torch is imported only here)."""
    import torch

    env = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return env


def analyse(work: Path, out: Path, warmup_steps: int, environment_from: Path | None = None) -> bool:
    """Runs every check, writes results.md and results.json into `out`, prints the report; True if all passed.

    environment_from: a results.json whose "environment" (versions, GPU names) is kept, for runs analysed again
    away from the machine that ran them.
    """
    plan_path = work / "plan.json"
    if not plan_path.is_file():
        raise FileNotFoundError(f"{plan_path} not found: run scripts/multigpu_check.sh first")
    plan, status = json.loads(plan_path.read_text()), read_status(work)
    runs = {}
    for name, row in status.items():
        if row["rc"] != "":  # skipped runs have no exit code and no folder
            run_dir = work / name / RUN_SUBDIR
            runs[name] = {"status": row, "metrics": read_metrics(run_dir), "audit": read_audit(run_dir)}
    checks, details = run_checks(plan, status, runs)
    perf, scaling = throughput_rows(runs, warmup_steps)
    report = render(plan, status, checks, details, perf, scaling)
    env = json.loads(environment_from.read_text())["environment"] if environment_from else environment()
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(report)
    results = {
        "plan": plan,
        "status": status,
        "checks": checks,
        "details": details,
        "throughput": perf,
        "scaling": scaling,
        "warmup_steps": warmup_steps,
        "environment": env,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(report)
    return all(c["pass"] for c in checks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="MG_WORK of scripts/multigpu_check.sh")
    parser.add_argument("--out", type=Path, required=True, help="folder for results.md and results.json")
    parser.add_argument("--warmup-steps", type=int, default=5, help="first steps of a run left out of throughput")
    parser.add_argument(
        "--environment", type=Path, help="keep the versions and GPU names of this results.json (analysing again)"
    )
    args = parser.parse_args(argv)
    return 0 if analyse(args.work, args.out, args.warmup_steps, args.environment) else 1


if __name__ == "__main__":
    sys.exit(main())
