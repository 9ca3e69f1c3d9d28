#!/usr/bin/env bash
# deepseek-v3, colocated pool: 1 instance of 8 devices of dgx-b200 (tp 1, pp 1, dp-attention 8, ep 8), batch 256, weights fp8 a8, kv fp8
# Written by perfmodel for vLLM v0.33.0 (commit 4ba787ec9, 2026-11-01; https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/engine/arg_utils.py);
# every argument below exists at that version (perfmodel/exports/flags).
# Run once per instance (1 of them), on 8 devices of one node; PORT defaults to 8000.
set -euo pipefail
MODEL="${MODEL:-deepseek-ai/DeepSeek-V3}"
PORT="${PORT:-8000}"
vllm serve "$MODEL" \
  --tensor-parallel-size 1 \
  --pipeline-parallel-size 1 \
  --data-parallel-size 8 \
  --enable-expert-parallel \
  --enable-eplb \
  --eplb-config '{"num_redundant_experts":32}' \
  --max-num-seqs 32 \
  --max-model-len 2560 \
  --kv-cache-dtype fp8 \
  --port "$PORT"
