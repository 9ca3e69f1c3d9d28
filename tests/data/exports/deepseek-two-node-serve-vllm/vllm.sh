#!/usr/bin/env bash
# deepseek-v3, colocated pool: 1 instance of 16 devices of dgx-h100 (tp 1, pp 1, dp-attention 16, ep 16), batch 512, weights fp8 a8, kv bf16
# Written by perfmodel for vLLM v0.33.0 (commit 4ba787ec9, 2026-11-01; https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/engine/arg_utils.py);
# every argument below exists at that version (perfmodel/exports/flags).
# Run once per instance (1 of them), on 2 nodes (NODE_RANK 0-1, MASTER_ADDR the first); PORT defaults to 8000.
set -euo pipefail
MODEL="${MODEL:-deepseek-ai/DeepSeek-V3}"
PORT="${PORT:-8000}"
# NODE_RANK > 0: --headless (vllm/v1/engine/utils.py:1502-1514)
headless=(); if [ "${NODE_RANK:?the rank of this host}" -gt 0 ]; then headless=(--headless); fi
vllm serve "$MODEL" ${headless[@]+"${headless[@]}"} \
  --tensor-parallel-size 1 \
  --pipeline-parallel-size 1 \
  --data-parallel-size 16 \
  --enable-expert-parallel \
  --enable-eplb \
  --eplb-config '{"num_redundant_experts":32}' \
  --max-num-seqs 32 \
  --max-model-len 2560 \
  --nnodes 2 \
  --node-rank "$NODE_RANK" \
  --master-addr "$MASTER_ADDR" \
  --port "$PORT"
