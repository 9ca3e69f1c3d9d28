#!/usr/bin/env bash
# llama-3.1-70b, colocated pool: 1 instance of 8 devices of dgx-h100 (tp 8, pp 1, dp-attention 1, ep 1), batch 64, weights fp8 a8, kv fp8
# Written by perfmodel for vLLM v0.33.0 (commit 4ba787ec9, 2026-11-01; https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/engine/arg_utils.py);
# every argument below exists at that version (perfmodel/exports/flags).
# Run once per instance (1 of them), on 8 devices of one node; PORT defaults to 8000.
set -euo pipefail
MODEL="${MODEL:-meta-llama/Llama-3.1-70B-Instruct}"
PORT="${PORT:-8000}"
vllm serve "$MODEL" \
  --tensor-parallel-size 8 \
  --pipeline-parallel-size 1 \
  --max-num-seqs 64 \
  --max-model-len 2560 \
  --quantization fp8 \
  --kv-cache-dtype fp8 \
  --port "$PORT"
