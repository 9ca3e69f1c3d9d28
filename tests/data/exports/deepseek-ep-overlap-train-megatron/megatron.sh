#!/usr/bin/env bash
# deepseek-v3 on 1,024 devices of dgx-h100 (128 nodes of 8): tp 2, pp 8 x 4, dp 64, cp 1, ep 64, micro-batch 1, ZeRO 1, recompute selective, fp8; 8,192 x 2,048 tokens per step
# Written by perfmodel for Megatron-LM core_v0.19.0 (commit 5be9626709af, 2026-08-19; https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py);
# every argument below exists at that version (perfmodel/exports/flags).
# Run from a Megatron-LM checkout on each of the 128 node(s), with NODE_RANK, MASTER_ADDR, TOKENIZER (a Hugging Face id or path), DATA_PATH and CHECKPOINT_DIR set.
set -euo pipefail
: "${TOKENIZER:?}" "${DATA_PATH:?}" "${CHECKPOINT_DIR:?}"
torchrun --nproc-per-node 8 --nnodes 128 --node-rank "${NODE_RANK:-0}" --master-addr "${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-29500}" pretrain_gpt.py \
  --num-layers 61 \
  --hidden-size 7168 \
  --ffn-hidden-size 18432 \
  --num-attention-heads 128 \
  --seq-length 2048 \
  --max-position-embeddings 163840 \
  --normalization RMSNorm \
  --position-embedding-type rope \
  --swiglu \
  --untie-embeddings-and-output-weights \
  --disable-bias-linear \
  --multi-latent-attention \
  --kv-lora-rank 512 \
  --qk-head-dim 128 \
  --qk-pos-emb-head-dim 64 \
  --v-head-dim 128 \
  --q-lora-rank 1536 \
  --num-experts 256 \
  --moe-router-topk 8 \
  --moe-ffn-hidden-size 2048 \
  --moe-shared-expert-intermediate-size 2048 \
  --moe-layer-freq '([0]*3+[1]*58)' \
  --mtp-num-layers 1 \
  --tensor-model-parallel-size 2 \
  --pipeline-model-parallel-size 8 \
  --context-parallel-size 1 \
  --pipeline-model-parallel-layout 'Et|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|mL' \
  --sequence-parallel \
  --expert-model-parallel-size 64 \
  --expert-tensor-parallel-size 1 \
  --micro-batch-size 1 \
  --global-batch-size 8192 \
  --train-iters 59605 \
  --use-distributed-optimizer \
  --recompute-granularity selective \
  --overlap-grad-reduce \
  --overlap-param-gather \
  --overlap-moe-expert-parallel-comm \
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
