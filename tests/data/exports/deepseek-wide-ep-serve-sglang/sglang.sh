#!/usr/bin/env bash
# deepseek-v3, colocated pool: 1 instance of 8 devices of dgx-b200 (tp 1, pp 1, dp-attention 8, ep 8), batch 256, weights fp8 a8, kv fp8
# Written by perfmodel for SGLang v0.5.23 (no commit recorded, 2026-10-30; https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/server_args.py);
# every argument below exists at that version (perfmodel/exports/flags).
# Run once per instance (1 of them), on 8 devices of one node; PORT defaults to 8000.
set -euo pipefail
MODEL="${MODEL:-deepseek-ai/DeepSeek-V3}"
PORT="${PORT:-8000}"
python -m sglang.launch_server \
  --model-path "$MODEL" \
  --tp-size 8 \
  --pp-size 1 \
  --attn-dp-size 8 \
  --ep-size 8 \
  --enable-eplb \
  --ep-num-redundant-experts 32 \
  --max-running-requests 256 \
  --context-length 2560 \
  --kv-cache-dtype fp8_e4m3 \
  --host 0.0.0.0 \
  --port "$PORT"
