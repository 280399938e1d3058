#!/usr/bin/env bash
# hetplan plan a100_v100_het_2stage: node v100-0 (node rank 1 of 2), V100-16 in us-central1-a, ranks 3-4.
# Run on host v100-0; MASTER_ADDR overrides the rendezvous host (a100-0).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export HETPLAN_NODE_ID=v100-0
export CUDA_VISIBLE_DEVICES=0,1
exec torchrun \
  --nnodes=2 \
  --nproc-per-node=2 \
  --node-rank=1 \
  --master-addr="${MASTER_ADDR:-a100-0}" \
  --master-port=29500 \
  -m hetplan.runtime.execute \
  --spec "${HETPLAN_SPEC:-$here/../launch_spec.json}" "$@"
