#!/usr/bin/env bash
# Multi-GPU launch of klalm-train with torchrun (one node, or one call per node for several nodes).
#
#   scripts/launch_torchrun.sh experiment=kla_45m                        # every GPU of this node, DDP
#   TRAINER=fsdp scripts/launch_torchrun.sh experiment=kla_180m          # FSDP
#   NPROC_PER_NODE=2 scripts/launch_torchrun.sh experiment=gpt_45m optim.lr=6e-4
#   # two nodes: run on each node with the same KLALM_RUN_ID and MASTER_ADDR (the first node's address)
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 KLALM_RUN_ID=job42 scripts/launch_torchrun.sh experiment=kla_180m
#
# Environment: NPROC_PER_NODE (default: number of GPUs), NNODES (1), NODE_RANK (0), MASTER_ADDR, MASTER_PORT
# (29500), TRAINER (ddp | fsdp), KLALM_RUN_ID (run folder name shared by all ranks; default: launch time and PID),
# PYTHON (default .venv/bin/python, else python), TORCH_ELASTIC_SHUTDOWN_TIMEOUT (120: the seconds torchrun gives the
# ranks, after it forwards a SIGTERM, to finish their step and save before it SIGKILLs them; torch >= 2.12 reads it,
# older torchrun keeps 30), TORCHRUN_ARGS (more torchrun options, e.g. "--log-dir logs/ranks --tee 3": each rank's
# output also in its own files; only global rank 0 writes the run folder's train.log). Every other argument is a
# Hydra override for klalm-train.
#
# Exit code: 0 when the run finished; after SIGTERM (e.g. SLURM's, before a time limit or preemption) 143, after
# SIGINT (Ctrl-C) 130, when every rank of this node saved its checkpoint and stopped (resume with resume=auto);
# 1 for a failure, also one during such a stop (a rank killed after TORCH_ELASTIC_SHUTDOWN_TIMEOUT). torchrun itself
# ends with 1 after any signal; klalm.train.torchrun, which runs it here, tells these apart.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_PORT=${MASTER_PORT:-29500}
TRAINER=${TRAINER:-ddp}
if [ -z "${NPROC_PER_NODE:-}" ]; then
  NPROC_PER_NODE=$(nvidia-smi -L 2>/dev/null | wc -l)
  [ "$NPROC_PER_NODE" -gt 0 ] || { echo "launch_torchrun: no GPU found; set NPROC_PER_NODE" >&2; exit 2; }
fi
if [ "$NNODES" -gt 1 ]; then
  : "${MASTER_ADDR:?launch_torchrun: set MASTER_ADDR (address of node 0) for a multi-node run}"
  : "${KLALM_RUN_ID:?launch_torchrun: set the same KLALM_RUN_ID on every node of a multi-node run}"
  RDZV=(--nnodes "$NNODES" --node_rank "$NODE_RANK" --rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT")
else
  RDZV=(--standalone --nnodes 1)
fi
# Every rank composes the config itself; a shared run id keeps them in one run folder.
export KLALM_RUN_ID=${KLALM_RUN_ID:-$(date +%Y-%m-%d_%H-%M-%S)_$$}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-120}

# shellcheck disable=SC2086  # TORCHRUN_ARGS: several options, split on spaces
exec "$PYTHON" -m klalm.train.torchrun "${RDZV[@]}" ${TORCHRUN_ARGS:-} --nproc_per_node "$NPROC_PER_NODE" -m klalm.train \
  "trainer=$TRAINER" "trainer.devices=$NPROC_PER_NODE" "trainer.num_nodes=$NNODES" "$@"
