#!/usr/bin/env bash
# deepseek-v3, colocated pool: 1 instance of 16 devices of dgx-h100 (tp 1, pp 1, dp-attention 16, ep 16), batch 512, weights fp8 a8, kv bf16
# Written by perfmodel for SGLang v0.5.23 (no commit recorded, 2026-10-30; https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/server_args.py);
# every argument below exists at that version (perfmodel/exports/flags).
# Run once per instance (1 of them), on 2 nodes (NODE_RANK 0-1, MASTER_ADDR the first); PORT defaults to 8000.
set -euo pipefail
MODEL="${MODEL:-deepseek-ai/DeepSeek-V3}"
PORT="${PORT:-8000}"
python -m sglang.launch_server \
  --model-path "$MODEL" \
  --tp-size 16 \
  --pp-size 1 \
  --attn-dp-size 16 \
  --ep-size 16 \
  --enable-eplb \
  --ep-num-redundant-experts 32 \
  --max-running-requests 512 \
  --context-length 2560 \
  --nnodes 2 \
  --node-rank "$NODE_RANK" \
  --dist-init-addr "$MASTER_ADDR:5000" \
  --host 0.0.0.0 \
  --port "$PORT"
