#!/usr/bin/env bash
# llama-3.1-70b, colocated pool: 1 instance of 8 devices of dgx-h100 (tp 8, pp 1, dp-attention 1, ep 1), batch 64, weights fp8 a8, kv fp8
# Written by perfmodel for SGLang v0.5.23 (no commit recorded, 2026-10-30; https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/server_args.py);
# every argument below exists at that version (perfmodel/exports/flags).
# Run once per instance (1 of them), on 8 devices of one node; PORT defaults to 8000.
set -euo pipefail
MODEL="${MODEL:-meta-llama/Llama-3.1-70B-Instruct}"
PORT="${PORT:-8000}"
python -m sglang.launch_server \
  --model-path "$MODEL" \
  --tp-size 8 \
  --pp-size 1 \
  --max-running-requests 64 \
  --context-length 2560 \
  --quantization fp8 \
  --kv-cache-dtype fp8_e4m3 \
  --host 0.0.0.0 \
  --port "$PORT"
