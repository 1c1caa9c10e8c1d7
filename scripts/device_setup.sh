#!/usr/bin/env bash
# Source this first in a command sent to the GPU machine (no network there):
#   source scripts/device_setup.sh
# It installs the wheels carried in .whl/ (downloaded beforehand with `pip download`) into .site/ (git-ignored) and
# klalm itself (editable, no dependencies), so `import klalm`, `klalm.kernels` and the console scripts work.
# Sourced again in a shell that inherits a finished setup of this folder (a script called by another), it does nothing.
if [ "${KLALM_DEVICE_SETUP:-}" = "$PWD" ]; then return 0; fi
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl \
    || return 1
  export PYTHONPATH=$PWD/.site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || return 1
# The image's Python packages have no usable __pycache__: every process compiled ~2,000 modules from source (8.4 s of a
# synthetic runner's start on the H200, results/gpu_2026-12-02/call6). Bytecode goes to .pycache/ (git-ignored) in the
# repository, so later processes, and later calls to the same machine, read it.
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-$PWD/.pycache}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -c "import torch, triton, klalm.kernels; print('device:', torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__)" \
  && export KLALM_DEVICE_SETUP=$PWD
