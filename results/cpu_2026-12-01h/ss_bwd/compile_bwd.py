"""compile_ss.py (results/cpu_2026-12-01g/ss) for the two backward cases only, optionally with other launch settings:
writes OUTDIR/TAG_bwd_fp32.* and OUTDIR/TAG_bwd_bf16dt32.* (TTGIR, PTX, SASS, SASS with control codes, cubin).

usage (root of the tree to compile, its kernels on the import path):
    env -u TRITON_INTERPRET .venv-triton36/bin/python results/cpu_2026-12-01h/ss_bwd/compile_bwd.py TAG OUTDIR [SET ...]

SET: CASE:KEY=VALUE with CASE fp32, bf16dt32 or all; KEY a constexpr (BM, NUM_STAGES, UNROLL, CHUNK, ...) or
`stages` (the launch's num_stages, also written to NUM_STAGES), `warps` or `maxnreg` (Triton's launch option: ptxas's
register cap). Default: DEFAULT_CONFIG's bwd settings.
"""

import sys
from pathlib import Path

import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "cpu_2026-12-01g" / "ss"))
import compile_ss as cs  # noqa: E402

if __name__ == "__main__":
    tag, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for case in ("bwd_fp32", "bwd_bf16dt32"):
        fn, constexprs, formats, warps, stages = cs.CASES[case]
        constexprs, extra = dict(constexprs), {}
        for item in sys.argv[3:]:
            which, setting = item.split(":", 1)
            key, value = setting.split("=")
            if which not in ("all", case[4:]):
                continue
            if key == "stages":
                stages = constexprs["NUM_STAGES"] = int(value)
            elif key == "warps":
                warps = int(value)
            elif key == "maxnreg":
                extra["maxnreg"] = int(value)
            else:
                constexprs[key] = int(value)
        compile_ = triton.compile
        triton.compile = lambda src, target, options, c=compile_, e=extra: c(src, target=target, options=options | e)
        try:
            kernel = cs.cl.compile_sm90(fn, constexprs, formats, warps, stages)
        finally:
            triton.compile = compile_
        cs.write_kernel(kernel, out / f"{tag}_{case}")
        print(
            f"{tag} {case}: registers {cs.cl.resource_usage(kernel)['registers']}",
            {k: constexprs[k] for k in ("BM", "NUM_STAGES", "UNROLL", "CHUNK")},
            f"warps {warps} stages {stages}",
            extra,
        )
