"""Backward-kernel experiment: forward and backward timed apart by chunk and L2 eviction hints (throwaway)."""
import sys, torch
sys.path.insert(0, "kernels")
from triton.testing import do_bench
import klalm.kernels.mobius_scan_bwd as B
from klalm.kernels.common import ScanConfig
from klalm.kernels.mobius_scan import kla_scan_fwd_op
from bench_scan import kla_inputs

def run(shape, dtype16, chunk, hints):
    x = kla_inputs(**shape)
    if dtype16:
        x = [t.to(torch.bfloat16) if i in (0, 2, 3) else t for i, t in enumerate(x)]
    cfg = ScanConfig(chunk=chunk)
    B.EXPERIMENT.clear(); B.EXPERIMENT.update(hints)
    outs = kla_scan_fwd_op(*x, None, None, False, list(cfg), True, None)
    saved = (*x, None, None, outs[2], outs[3], outs[4], outs[5])
    gy = torch.randn_like(x[0])
    fwd = lambda: kla_scan_fwd_op(*x, None, None, False, list(cfg), True, None)
    bwd = lambda: B.mobius_scan_bwd(saved, gy, None, None, None, False, cfg)
    return do_bench(fwd, warmup=25, rep=100, return_mode="median"), do_bench(bwd, warmup=25, rep=100, return_mode="median")

HINTS = {"none": {}, "scr last": {"SCR_EVICT": "evict_last"}, "scr last + out first": {"SCR_EVICT": "evict_last", "OUT_EVICT": "evict_first"}}
SHAPES = {"main fp32 B8 L2048 M1536 S16": (dict(batch=8, length=2048, channels=1536, state=16), False),
          "kla_45m bf16 B16 L2048 M1024 S16": (dict(batch=16, length=2048, channels=1024, state=16), True)}
if __name__ == "__main__":
    if len(sys.argv) > 1:  # one bwd call for ncu: shape index, chunk, hint name
        name = list(SHAPES)[int(sys.argv[1])]; shape, d16 = SHAPES[name]
        chunk, hint = int(sys.argv[2]), sys.argv[3]
        x = kla_inputs(**shape)
        if d16: x = [t.to(torch.bfloat16) if i in (0, 2, 3) else t for i, t in enumerate(x)]
        cfg = ScanConfig(chunk=chunk); B.EXPERIMENT.update(HINTS[hint])
        outs = kla_scan_fwd_op(*x, None, None, False, list(cfg), True, None)
        saved = (*x, None, None, outs[2], outs[3], outs[4], outs[5])
        B.mobius_scan_bwd(saved, torch.randn_like(x[0]), None, None, None, False, cfg); torch.cuda.synchronize()
        sys.exit()
    print("| shape | chunk | hints | fwd ms | bwd(y) ms |\n|---|---|---|---|---|")
    if "REPEAT" in __import__("os").environ:  # chunk 32 only, hints in reverse order, twice
        for name, (shape, d16) in SHAPES.items():
            for rep in range(2):
                for hname, h in reversed(HINTS.items()):
                    f, b = run(shape, d16, 32, h)
                    print(f"| {name} | 32 | {hname} | {f:.3f} | {b:.3f} |", flush=True)
        sys.exit()
    for name, (shape, d16) in SHAPES.items():
        for chunk in (32, 16, 8):
            for hname, h in HINTS.items():
                if chunk != 32 and hname == "scr last + out first":
                    continue
                f, b = run(shape, d16, chunk, h)
                print(f"| {name} | {chunk} | {hname} | {f:.3f} | {b:.3f} |", flush=True)
