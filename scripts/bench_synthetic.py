"""Steps per second of the synthetic trainer at the A5 shape: eager against captured, and seeds side by side.

    python scripts/bench_synthetic.py                                   # ~5 min on one H200
    python scripts/bench_synthetic.py --rates results/synthetic/rates.jsonl   # also store the rates for the runner
    python scripts/bench_synthetic.py --device cpu --archs gpt --depths 1 --batch-size 8 --seconds 1   # CPU check

The shape is the plan's A5 recipe (default `full`: d_model 128, batch 256 at --length plus the 25 length-2 rows,
AdamW, clipping, the KLA block of its model_overrides) on the model klalm.tasks.units builds for the runner.

Table 1, one seed: steps/s of the same step function called eagerly and replayed as one captured CUDA graph, per
arch and depth, with the targets. Table 2, seeds side by side, in seed-steps/s: E seeds in one process (one graph,
one CUDA stream per seed) against P processes of one seed each on the same GPU (they start timing together, behind
a file barrier). Each measurement builds its models, warms up and captures (untimed), then times --seconds of steps;
one that fails shows its error in its row and the others still run.

With --rates, every captured measurement is appended to that rates file (klalm.tasks.results), so the grid runner
estimates from them instead of its prior. With --compile BACKEND every step trains through torch.compile (e.g.
`inductor`, which fuses a step's small kernels; run once with and once without to compare); rates measured so
record the backend, and the grid runner estimates compiled units from them. Without CUDA (and without --device cpu)
it says so and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from klalm.cli.synthetic_args import int_list, name_list
from klalm.tasks.cells import Unit
from klalm.tasks.plans import load_plan
from klalm.tasks.train import GroupTrainer
from klalm.tasks.units import Execution, build_member, rate_record, run_record

SETTLE_STEPS = 20  # untimed steps after capture
CHUNK = 50  # steps between clock reads (each a device sync)
BARRIER_TIMEOUT_S = 600.0
TARGETS = {("kla", 1): 500, ("gpt", 1): 700}  # captured steps/s wanted on one H200 at the A5 shape


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plan", default="full", help="plan whose A5 recipe and model_overrides are measured")
    p.add_argument("--archs", type=name_list, default="kla,gpt,mamba,gdn", help="archs of table 1")
    p.add_argument("--depths", type=int_list, default="1,2", help="depths of table 1")
    p.add_argument("--length", type=int, default=12, help="A5 sequence length")
    p.add_argument("--batch-size", type=int, help="main batch (default: the plan's)")
    p.add_argument("--side-archs", type=name_list, default="kla,gpt", help="archs of table 2 (at depth 1)")
    p.add_argument("--members", type=int_list, default="2,3", help="seeds in one process (one graph) for table 2")
    p.add_argument("--procs", type=int_list, default="2,3", help="processes of one seed each for table 2")
    p.add_argument("--seconds", type=float, default=2.0, help="timed seconds per measurement")
    p.add_argument("--device", default="cuda", help="cuda or cpu (cpu: eager only, to check the script)")
    p.add_argument("--rates", type=Path, help="append the captured measurements to this rates.jsonl")
    p.add_argument("--compile", dest="compile_backend", help="train through torch.compile with this backend")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # JSON: one process of a side-by-side measurement
    return p.parse_args(argv)


def a5_unit(args: argparse.Namespace, arch: str, depth: int, seeds: int) -> Unit:
    plan = load_plan(args.plan)
    train = plan.a5.train if args.batch_size is None else dataclasses.replace(plan.a5.train, batch_size=args.batch_size)
    return Unit("a5", {"name": "a5", "length": args.length}, arch, depth, plan.a5.d_model,
                plan.model_overrides.get(arch, {}), train, list(range(seeds)), plan.a5.num_test, None,
                {"name": "a5", "length": 2} if train.aux_batch_size else None)  # fmt: skip


def prepare(unit: Unit, device: torch.device, capture: bool, compile_backend: str | None) -> tuple[GroupTrainer, float]:
    """Build the members, warm up and (capture) and settle; returns the trainer and the seconds it took."""
    started = time.perf_counter()
    members = [build_member(unit, seed, device, None, compile_backend) for seed in unit.seeds]
    trainer = GroupTrainer(members, device, capture=capture)
    trainer.prepare()
    trainer.advance(SETTLE_STEPS)
    trainer.synchronize()
    return trainer, time.perf_counter() - started


def timed(trainer: GroupTrainer, seconds: float) -> tuple[int, float]:
    """Steps run in about `seconds` and the seconds they took."""
    start, steps = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        trainer.advance(CHUNK)
        trainer.synchronize()
        steps += CHUNK
    return steps, time.perf_counter() - start


def measure(unit: Unit, device: torch.device, capture: bool, seconds: float, compile_backend: str | None) -> dict:
    trainer, setup_s = prepare(unit, device, capture, compile_backend)
    steps, elapsed = timed(trainer, seconds)
    return {"steps_per_s": steps / elapsed, "setup_s": setup_s, "captured": trainer.graph is not None}


def worker(spec: dict) -> None:
    """One of P processes: prepare, announce readiness, wait for the go file, time, write the result."""
    barrier = Path(spec["barrier"])
    unit, device = Unit.from_dict(spec["unit"]), torch.device(spec["device"])
    trainer, setup_s = prepare(unit, device, device.type == "cuda", spec["compile_backend"])
    (barrier / f"ready-{spec['index']}").touch()
    waited = time.perf_counter()
    while not (barrier / "go").exists():
        if time.perf_counter() - waited > BARRIER_TIMEOUT_S:
            raise TimeoutError(f"no go file in {barrier} after {BARRIER_TIMEOUT_S:.0f} s")
        time.sleep(0.02)
    steps, elapsed = timed(trainer, spec["seconds"])
    result = {"steps": steps, "seconds": elapsed, "setup_s": setup_s, "captured": trainer.graph is not None}
    (barrier / f"result-{spec['index']}.json").write_text(json.dumps(result))


def measure_processes(unit: Unit, device: str, procs: int, seconds: float, compile_backend: str | None) -> dict:
    """P processes of `unit` (one seed each) timed together; seed-steps/s summed."""
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        children, env = [], dict(os.environ)
        if device == "cpu":  # P processes share the cores instead of each spinning a thread per core
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // procs))
        for index in range(procs):
            spec = {"barrier": tmp, "index": index, "unit": dataclasses.asdict(unit), "device": device,
                    "seconds": seconds, "compile_backend": compile_backend}  # fmt: skip
            children.append(subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(spec)], env=env))
        while not all((Path(tmp) / f"ready-{i}").exists() for i in range(procs)):
            if any(c.poll() not in (None, 0) for c in children) or time.perf_counter() - started > BARRIER_TIMEOUT_S:
                for child in children:
                    child.kill()
                raise RuntimeError(f"a worker of {unit.arch} x{procs} failed before the barrier")
            time.sleep(0.05)
        ready_s = time.perf_counter() - started
        (Path(tmp) / "go").touch()
        if any(child.wait() != 0 for child in children):
            raise RuntimeError(f"a worker of {unit.arch} x{procs} failed")
        results = [json.loads((Path(tmp) / f"result-{i}.json").read_text()) for i in range(procs)]
    per_process = [r["steps"] / r["seconds"] for r in results]
    return {"steps_per_s": sum(per_process), "per_process": per_process, "setup_s": ready_s,
            "captured": all(r["captured"] for r in results)}  # fmt: skip


def append_rate(path: Path, unit: Unit, device: torch.device, captured: bool, procs: int, step_s: float,
                setup_s: float, compile_backend: str | None) -> None:  # fmt: skip
    run = run_record(device, captured, len(unit.seeds), Execution(procs_per_gpu=procs, compile_backend=compile_backend))
    rate = rate_record(unit, run, step_s, 0.0, setup_s, "bench")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(rate) + "\n")


def table(header: list[str], rows: list[list[str]]) -> str:
    """Markdown, the first column left-aligned and the others right-aligned."""
    align = ["---"] + ["---:"] * (len(header) - 1)
    return "\n".join("| " + " | ".join(cells) + " |" for cells in [header, align, *rows])


def _error(err: Exception) -> str:
    return f"error: {type(err).__name__}: {str(err).splitlines()[0][:80] if str(err) else ''}"


def one_seed_table(args: argparse.Namespace, device: torch.device) -> tuple[str, dict]:
    rows, captured_rates = [], {}
    for arch in args.archs:
        for depth in args.depths:
            unit = a5_unit(args, arch, depth, 1)
            line = [arch, str(depth)]
            try:
                eager = measure(unit, device, False, args.seconds, args.compile_backend)
                line.append(f"{eager['steps_per_s']:.0f}")
                if device.type != "cuda":
                    line += ["—", "—", ""]
                else:
                    graph = measure(unit, device, True, args.seconds, args.compile_backend)
                    captured_rates[arch, depth] = graph["steps_per_s"]
                    target = TARGETS.get((arch, depth))
                    met = "" if target is None else f"≥ {target}: {'yes' if graph['steps_per_s'] >= target else 'no'}"
                    line += [f"{graph['steps_per_s']:.0f}", f"{graph['steps_per_s'] / eager['steps_per_s']:.1f}", met]
                    if args.rates:
                        step_s, backend = 1 / graph["steps_per_s"], args.compile_backend
                        append_rate(args.rates, unit, device, True, 1, step_s, graph["setup_s"], backend)
            except Exception as err:  # noqa: BLE001 - reported in the row; the other rows still run
                line += [_error(err)] + [""] * (6 - len(line) - 1)
            rows.append(line)
            print(f"[bench] {arch} {depth} block(s): {' '.join(line[2:])}", flush=True)
    header = ["arch", "blocks", "eager steps/s", "captured steps/s", "× eager", "target"]
    return table(header, rows), captured_rates


def side_by_side_table(args: argparse.Namespace, device: torch.device, single: dict) -> str:
    rows = []
    options = [("members", m) for m in args.members]
    options += [("procs", p) for p in args.procs]
    for arch in args.side_archs:
        base = single.get((arch, 1))
        for kind, count in options:
            what = f"{count} seeds, one process" if kind == "members" else f"{count} processes, one seed each"
            try:
                seed_steps = side_by_side(args, device, arch, kind, count)
                rows.append([arch, what, f"{seed_steps:.0f}", "" if base is None else f"{seed_steps / base:.2f}"])
            except Exception as err:  # noqa: BLE001 - reported in the row; the other rows still run
                rows.append([arch, what, _error(err), ""])
            print(f"[bench] {' '.join(rows[-1])}", flush=True)
    return table(["arch (1 block)", "seeds side by side", "seed-steps/s", "× one seed captured"], rows)


def side_by_side(args: argparse.Namespace, device: torch.device, arch: str, kind: str, count: int) -> float:
    """Seed-steps/s of `count` seeds in one process (kind "members") or in `count` processes (kind "procs")."""
    if kind == "members":
        unit = a5_unit(args, arch, 1, count)
        got = measure(unit, device, device.type == "cuda", args.seconds, args.compile_backend)
        if args.rates and got["captured"]:
            append_rate(args.rates, unit, device, True, 1, 1 / got["steps_per_s"], got["setup_s"], args.compile_backend)
        return got["steps_per_s"] * count
    unit = a5_unit(args, arch, 1, 1)
    got = measure_processes(unit, device.type, count, args.seconds, args.compile_backend)
    if args.rates and got["captured"]:
        step_s = sum(1 / r for r in got["per_process"]) / count
        append_rate(args.rates, unit, device, True, count, step_s, got["setup_s"], args.compile_backend)
    return got["steps_per_s"]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker is not None:
        worker(json.loads(args.worker))
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        print("[bench] no CUDA device: nothing measured (--device cpu runs the eager columns on the CPU)")
        return
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    compiled = f", torch.compile backend {args.compile_backend}" if args.compile_backend else ""
    print(f"## Synthetic trainer, A5 L={args.length} ({name}, torch {torch.__version__}{compiled})\n", flush=True)
    first, single = one_seed_table(args, device)
    second = side_by_side_table(args, device, single)
    print(f"\n{first}\n\n{second}")


if __name__ == "__main__":
    main()
