#!/usr/bin/env bash
# DeepSpeed for plan uniform_dp2: 4 GPUs, 2 pipeline stages.
# TRAIN_SCRIPT builds PipelineModule(layers, num_stages, partition_method='uniform')
# with the layers of pipeline.json.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec deepspeed --hostfile "$here/hostfile" --include "a100-0:0,1,2,3" --master_addr "${MASTER_ADDR:-a100-0}" --master_port 29500 \
  "${TRAIN_SCRIPT:?set TRAIN_SCRIPT}" --deepspeed --deepspeed_config "$here/ds_config.json" "$@"
