#!/usr/bin/env bash
# hetplan plan a100_v100_het_2stage: node a100-0 (node rank 0 of 2), A100-40 in us-central1-a, ranks 0-2.
# Run on host a100-0; MASTER_ADDR overrides the rendezvous host (a100-0).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export HETPLAN_NODE_ID=a100-0
export CUDA_VISIBLE_DEVICES=0,1,2
exec torchrun \
  --nnodes=2 \
  --nproc-per-node=3 \
  --node-rank=0 \
  --master-addr="${MASTER_ADDR:-a100-0}" \
  --master-port=29500 \
  -m hetplan.runtime.execute \
  --spec "${HETPLAN_SPEC:-$here/../launch_spec.json}" "$@"
