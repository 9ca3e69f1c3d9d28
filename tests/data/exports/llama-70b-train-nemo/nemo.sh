#!/usr/bin/env bash
# llama-3.1-70b on 64 devices of dgx-h100 (8 nodes of 8): tp 8, pp 2 x 1, dp 4, cp 1, ep 1, micro-batch 1, ZeRO 1, recompute selective, bf16; 512 x 8,192 tokens per step
# Written by perfmodel for Megatron-Bridge v0.6.0 (commit 51885cf132b2, 2026-08-19; https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/v0.6.0/src/megatron/bridge/training/config.py);
# every argument below exists at that version (perfmodel/exports/flags).
# Run from a Megatron-Bridge checkout on each of the 8 node(s), with NODE_RANK and MASTER_ADDR set; --dataset mock until you point the recipe at your data.
set -euo pipefail
torchrun --nproc-per-node 8 --nnodes 8 --node-rank "${NODE_RANK:-0}" --master-addr "${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-29500}" scripts/training/run_recipe.py --recipe llama31_70b_pretrain_32gpu_h100_bf16_config --mode pretrain --dataset mock \
  model.tensor_model_parallel_size=8 \
  model.pipeline_model_parallel_size=2 \
  model.virtual_pipeline_model_parallel_size=null \
  model.context_parallel_size=1 \
  model.sequence_parallel=true \
  model.seq_length=8192 \
  dataset.seq_length=8192 \
  train.micro_batch_size=1 \
  train.global_batch_size=512 \
  train.train_iters=238419 \
  mixed_precision=bf16_mixed \
  optimizer.use_distributed_optimizer=true \
  ddp.use_distributed_optimizer=true \
  ddp.overlap_grad_reduce=true \
  ddp.overlap_param_gather=true \
  model.tp_comm_overlap=false \
  model.pipeline_model_parallel_layout=null \
  model.account_for_embedding_in_pipeline_split=false \
  model.account_for_loss_in_pipeline_split=false \
  model.recompute_granularity=selective
