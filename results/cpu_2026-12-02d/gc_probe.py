# Where Python's full (generation-2) garbage collections fall in bench_lm.py runs: inside a training loop or between runs.
# Run from the repository root: OMP_NUM_THREADS=1 .venv/bin/python results/cpu_2026-12-02d/gc_probe.py <bench_lm.py arguments>
import gc, time, sys, runpy
import klalm.train.callbacks as cb
events = []; t0 = {}
def gccb(phase, info):
    if info["generation"] != 2: return
    if phase == "start": t0["t"] = time.perf_counter()
    else: events.append(("gc2", t0["t"], time.perf_counter() - t0["t"]))
gc.callbacks.append(gccb)
orig_start = cb.StepMetrics.on_train_start
def start(self, trainer, pl_module):
    events.append(("train_start", time.perf_counter(), 0)); return orig_start(self, trainer, pl_module)
cb.StepMetrics.on_train_start = start
def end(self, trainer, pl_module): events.append(("train_end", time.perf_counter(), 0))
cb.StepMetrics.on_train_end = end
sys.argv = ["bench_lm.py"] + sys.argv[1:]
try: runpy.run_path("scripts/bench_lm.py", run_name="__main__")
except SystemExit: pass
inside = False
for kind, t, d in events:
    if kind == "train_start": inside = True; print("train start")
    elif kind == "train_end": inside = False; print("train end")
    else: print(f"  gen2 {'IN TRAINING' if inside else 'outside'} {d*1e3:.0f} ms")
