# The register tables of README.md here, without a GPU: both backward kernels compiled for sm_90 under the GPU image's
# Triton 3.6.0 (a separate virtual environment, .venv-triton36: kernels/NOTES.md "Commands"), on main and with the
# two patches applied, into registers36.md. Run from the repository root on a clean tree; the tree is left as it came.
set -e
D=results/cpu_2026-12-02e
PY=".venv-triton36/bin/python"
kla() { env -u TRITON_INTERPRET $PY -c "from klalm.kernels import bench_scan; bench_scan.BWD_VARIANTS = []; \
bench_scan.run_registers()" 2>&1 | grep -E "^\| (kernel|bwd)"; }
ss() { for pu in 2 1; do echo "PAIR_UNROLL $pu: $(env -u TRITON_INTERPRET $PY $D/ss_registers.py $pu 3 2>/dev/null | tail -1)"; done; }
{
  echo "## main ($(git rev-parse --short HEAD))"; echo; kla; echo; ss; echo
  git apply $D/ss_bwd_half_scratch.patch && git apply $D/kla_bwd_rows_once.patch
  echo "## with ss_bwd_half_scratch.patch and kla_bwd_rows_once.patch"; echo; kla; echo; ss
  git apply -R $D/kla_bwd_rows_once.patch && git apply -R $D/ss_bwd_half_scratch.patch
} > $D/registers36.md
