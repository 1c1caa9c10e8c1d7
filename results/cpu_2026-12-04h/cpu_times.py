"""Times the CPU commands a newcomer runs (README "Two commands", docs/training.md "Measured on this machine (CPU)")
and writes the table those docs quote, so that every number in it comes from this run.

Each command runs alone, one after the other, in this checkout with its environment installed (`make install`
done; `make train` and `make test` then skip the install). For the two training runs the table takes the tokens
per second and held-out loss from the run's own summary.json, for the tests pytest's last line. A pure-Python loop
of 20 million additions is timed first, so that a reader can compare this machine's speed with theirs (2-core
instances of one machine type have differed by 3× in it).

    .venv/bin/python results/cpu_2026-12-04h/cpu_times.py > results/cpu_2026-12-04h/cpu_times.md
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"


def loop_seconds() -> float:
    start = time.perf_counter()
    total = 0
    for i in range(20_000_000):
        total += i
    return time.perf_counter() - start


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """(wall seconds, max RSS GB, the output's last line that counts passed or failed tests, else its last non-empty
    line) of `cmd` under /usr/bin/time (stdout then stderr: a warning printed to stderr at the end came last)."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as rusage:
        start = time.perf_counter()
        proc = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rusage.name, *cmd], cwd=ROOT, env=env,
                              capture_output=True, text=True)  # fmt: skip
        wall = time.perf_counter() - start
        rss_gb = int(rusage.read().split()[-1]) / 1e6  # kB
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n" + "\n".join(lines[-20:]))
    summary = [line for line in lines if re.search(r"\d+ (passed|failed)", line)]  # pytest's, above stderr's warnings
    return wall, rss_gb, summary[-1] if summary else lines[-1] if lines else ""


def shown(cmd: list[str]) -> str:
    """A command as the table shows it: paths relative to the checkout."""
    return " ".join(os.path.relpath(part, ROOT) if part.startswith(str(ROOT)) else part for part in cmd)


def training_row(what: str, cmd: list[str], log_dir: Path) -> str:
    wall, rss, _ = timed(cmd, env={**os.environ, "KLALM_LOG_DIR": str(log_dir)})
    summary = json.loads(max(log_dir.glob("*/*/summary.json"), key=lambda p: p.stat().st_mtime).read_text())
    result = (f"{summary['steps']} steps, {summary['perf/tokens_per_s']:,.0f} tokens/s, held-out loss "
              f"{summary['val_loss']:.3f} (perplexity {summary['val_ppl']:.1f})")  # fmt: skip
    return f"| {what} | `{shown(cmd)}` | {wall:.0f} s ({wall / 60:.1f} min) | {rss:.2f} GB | {result} |"


def test_row(what: str, cmd: list[str]) -> str:
    wall, rss, last = timed(cmd)
    counts = re.sub(r"[=\s]*(.*?) in [\d.]+s.*", r"\1", last)
    return f"| {what} | `{shown(cmd)}` | {wall:.0f} s ({wall / 60:.1f} min) | {rss:.2f} GB | {counts} |"


def main() -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    print(f"# CPU times of the newcomer's commands ({time.strftime('%Y-%m-%d')}, klalm {commit.stdout.strip()})\n")
    print(f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), Python {platform.python_version()}; "
          f"a pure-Python loop of 20 million additions: {loop_seconds():.1f} s.\n")  # fmt: skip
    print("| what | command | wall | max RSS | result |")
    print("| --- | --- | ---: | ---: | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        print(training_row("smoke run", [str(BIN / "klalm-train"), "experiment=smoke"], Path(tmp) / "smoke"))
        print(training_row("`make train`", ["make", "train"], Path(tmp) / "train"))
    pytest = [str(BIN / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    print(test_row("kill and resume (SIGTERM, Ctrl-C, SIGKILL)", [*pytest, "-m", "slow", "tests/train/test_resume.py"]))
    print(test_row("2-process DDP and FSDP2 against 1 process", [*pytest, "-m", "slow", "tests/train/test_ddp.py"]))
    print(test_row("2-config sweep", [*pytest, "-m", "slow", "tests/train/test_sweep.py"]))
    print(test_row("`make test`", ["make", "test"]))


if __name__ == "__main__":
    main()
