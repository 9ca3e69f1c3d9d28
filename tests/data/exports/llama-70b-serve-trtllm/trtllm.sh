#!/usr/bin/env bash
# llama-3.1-70b, colocated pool: 1 instance of 8 devices of dgx-h100 (tp 8, pp 1, dp-attention 1, ep 1), batch 64, weights fp8 a8, kv fp8
# Written by perfmodel for TensorRT-LLM main (untagged; 1.3.0rc series) (commit 00209af149e7; https://github.com/NVIDIA/TensorRT-LLM/blob/00209af149e7774406881a37283dce303571eb11/tensorrt_llm/commands/serve.py);
# every argument below exists at that version (perfmodel/exports/flags).
# Run once per instance (1 of them), on 8 devices of one node; PORT defaults to 8000.
set -euo pipefail
# MODEL must be a checkpoint already quantized to fp8 weights / a8 activations (a ModelOpt checkpoint).
MODEL="${MODEL:?the checkpoint to serve}"
PORT="${PORT:-8000}"
trtllm-serve "$MODEL" \
  --backend pytorch \
  --tp_size 8 \
  --pp_size 1 \
  --ep_size 1 \
  --max_batch_size 64 \
  --max_seq_len 2560 \
  --extra_llm_api_options extra-llm-api-config.yml \
  --host 0.0.0.0 \
  --port "$PORT"
