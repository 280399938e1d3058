#!/usr/bin/env bash
# Megatron-LM for plan uniform_tp2: node a100-0 (node rank 0), A100-40.
# MEGATRON_LM: checkout of Megatron-LM; DATA_ARGS: --data-path / --tokenizer-* for your corpus
# (split on whitespace, never glob-expanded).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export CUDA_VISIBLE_DEVICES=0,1,2,3
export CUDA_DEVICE_MAX_CONNECTIONS=1
mapfile -t args < "$here/args.txt"
read -r -a data_args <<< "${DATA_ARGS:-}"
exec torchrun --nnodes=2 --nproc-per-node=4 --node-rank=0 --master-addr="${MASTER_ADDR:-a100-0}" --master-port=29500 \
  "${MEGATRON_LM:?set MEGATRON_LM}/pretrain_gpt.py" "${args[@]}" "${data_args[@]}" "$@"
