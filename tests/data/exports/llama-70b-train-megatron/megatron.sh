#!/usr/bin/env bash
# llama-3.1-70b on 64 devices of dgx-h100 (8 nodes of 8): tp 8, pp 2 x 1, dp 4, cp 1, ep 1, micro-batch 1, ZeRO 1, recompute selective, bf16; 512 x 8,192 tokens per step
# Written by perfmodel for Megatron-LM core_v0.19.0 (commit 5be9626709af, 2026-08-19; https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py);
# every argument below exists at that version (perfmodel/exports/flags).
# Run from a Megatron-LM checkout on each of the 8 node(s), with NODE_RANK, MASTER_ADDR, TOKENIZER (a Hugging Face id or path), DATA_PATH and CHECKPOINT_DIR set.
set -euo pipefail
: "${TOKENIZER:?}" "${DATA_PATH:?}" "${CHECKPOINT_DIR:?}"
# Using tensor model parallelism or context parallelism require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1 (megatron/training/arguments.py:1413-1414,1436-1439)
export CUDA_DEVICE_MAX_CONNECTIONS=1
torchrun --nproc-per-node 8 --nnodes 8 --node-rank "${NODE_RANK:-0}" --master-addr "${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-29500}" pretrain_gpt.py \
  --num-layers 80 \
  --hidden-size 8192 \
  --ffn-hidden-size 28672 \
  --num-attention-heads 64 \
  --seq-length 8192 \
  --max-position-embeddings 131072 \
  --normalization RMSNorm \
  --position-embedding-type rope \
  --group-query-attention \
  --num-query-groups 8 \
  --swiglu \
  --untie-embeddings-and-output-weights \
  --disable-bias-linear \
  --tensor-model-parallel-size 8 \
  --pipeline-model-parallel-size 2 \
  --context-parallel-size 1 \
  --sequence-parallel \
  --micro-batch-size 1 \
  --global-batch-size 512 \
  --train-iters 238419 \
  --use-distributed-optimizer \
  --recompute-granularity selective \
  --overlap-grad-reduce \
  --overlap-param-gather \
  --bf16 \
  --grad-reduce-in-bf16 \
  --attention-backend flash \
  --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model "$TOKENIZER" \
  --data-path "$DATA_PATH" \
  --save "$CHECKPOINT_DIR" \
  --save-interval 500
