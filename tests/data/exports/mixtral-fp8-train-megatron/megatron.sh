#!/usr/bin/env bash
# mixtral-8x7b on 64 devices of dgx-h100 (8 nodes of 8): tp 8, pp 4 x 8, dp 2, cp 1, ep 8, micro-batch 1, ZeRO 1, recompute none, fp8; 256 x 4,096 tokens per step
# Written by perfmodel for Megatron-LM core_v0.19.0 (commit 5be9626709af, 2026-08-19; https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py);
# every argument below exists at that version (perfmodel/exports/flags).
# Run from a Megatron-LM checkout on each of the 8 node(s), with NODE_RANK, MASTER_ADDR, TOKENIZER (a Hugging Face id or path), DATA_PATH and CHECKPOINT_DIR set.
set -euo pipefail
: "${TOKENIZER:?}" "${DATA_PATH:?}" "${CHECKPOINT_DIR:?}"
# Using tensor model parallelism or context parallelism require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1 (megatron/training/arguments.py:1413-1414,1436-1439)
export CUDA_DEVICE_MAX_CONNECTIONS=1
torchrun --nproc-per-node 8 --nnodes 8 --node-rank "${NODE_RANK:-0}" --master-addr "${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-29500}" pretrain_gpt.py \
  --num-layers 32 \
  --hidden-size 4096 \
  --ffn-hidden-size 14336 \
  --num-attention-heads 32 \
  --seq-length 4096 \
  --max-position-embeddings 32768 \
  --normalization RMSNorm \
  --position-embedding-type rope \
  --group-query-attention \
  --num-query-groups 8 \
  --swiglu \
  --untie-embeddings-and-output-weights \
  --disable-bias-linear \
  --num-experts 8 \
  --moe-router-topk 2 \
  --moe-ffn-hidden-size 14336 \
  --tensor-model-parallel-size 8 \
  --pipeline-model-parallel-size 4 \
  --context-parallel-size 1 \
  --num-virtual-stages-per-pipeline-rank 8 \
  --sequence-parallel \
  --expert-model-parallel-size 8 \
  --expert-tensor-parallel-size 1 \
  --micro-batch-size 1 \
  --global-batch-size 256 \
  --train-iters 953675 \
  --use-distributed-optimizer \
  --overlap-grad-reduce \
  --overlap-param-gather \
  --moe-token-dispatcher-type alltoall \
  --bf16 \
  --grad-reduce-in-bf16 \
  --fp8-format hybrid \
  --fp8-recipe tensorwise \
  --attention-backend flash \
  --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model "$TOKENIZER" \
  --data-path "$DATA_PATH" \
  --save "$CHECKPOINT_DIR" \
  --save-interval 500
