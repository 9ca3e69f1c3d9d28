#!/usr/bin/env bash
# llama-3.1-8b on 8 devices of dgx-h100 (1 node of 8): tp 1, pp 1 x 1, dp 2, cp 4 (all_gather), ep 1, micro-batch 1, ZeRO 1, recompute full, bf16; 64 x 32,768 tokens per step
# Written by perfmodel for Megatron-LM core_v0.19.0 (commit 5be9626709af, 2026-08-19; https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py);
# every argument below exists at that version (perfmodel/exports/flags).
# Run from a Megatron-LM checkout on each of the 1 node(s), with NODE_RANK, MASTER_ADDR, TOKENIZER (a Hugging Face id or path), DATA_PATH and CHECKPOINT_DIR set.
set -euo pipefail
: "${TOKENIZER:?}" "${DATA_PATH:?}" "${CHECKPOINT_DIR:?}"
# Using tensor model parallelism or context parallelism require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1 (megatron/training/arguments.py:1413-1414,1436-1439)
export CUDA_DEVICE_MAX_CONNECTIONS=1
torchrun --nproc-per-node 8 --nnodes 1 --node-rank "${NODE_RANK:-0}" --master-addr "${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-29500}" pretrain_gpt.py \
  --num-layers 32 \
  --hidden-size 4096 \
  --ffn-hidden-size 14336 \
  --num-attention-heads 32 \
  --seq-length 32768 \
  --max-position-embeddings 131072 \
  --normalization RMSNorm \
  --position-embedding-type rope \
  --group-query-attention \
  --num-query-groups 8 \
  --swiglu \
  --untie-embeddings-and-output-weights \
  --disable-bias-linear \
  --tensor-model-parallel-size 1 \
  --pipeline-model-parallel-size 1 \
  --context-parallel-size 4 \
  --cp-comm-type all_gather \
  --micro-batch-size 1 \
  --global-batch-size 64 \
  --train-iters 476838 \
  --use-distributed-optimizer \
  --recompute-granularity full \
  --recompute-method uniform \
  --recompute-num-layers 1 \
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
