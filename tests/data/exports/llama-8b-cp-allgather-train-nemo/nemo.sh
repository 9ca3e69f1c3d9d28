#!/usr/bin/env bash
# llama-3.1-8b on 8 devices of dgx-h100 (1 node of 8): tp 1, pp 1 x 1, dp 2, cp 4 (all_gather), ep 1, micro-batch 1, ZeRO 1, recompute full, bf16; 64 x 32,768 tokens per step
# Written by perfmodel for Megatron-Bridge v0.6.0 (commit 51885cf132b2, 2026-08-19; https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/v0.6.0/src/megatron/bridge/training/config.py);
# every argument below exists at that version (perfmodel/exports/flags).
# Run from a Megatron-Bridge checkout on each of the 1 node(s), with NODE_RANK and MASTER_ADDR set; --dataset mock until you point the recipe at your data.
set -euo pipefail
torchrun --nproc-per-node 8 --nnodes 1 --node-rank "${NODE_RANK:-0}" --master-addr "${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-29500}" scripts/training/run_recipe.py --recipe llama31_8b_pretrain_2gpu_h100_bf16_config --mode pretrain --dataset mock \
  model.tensor_model_parallel_size=1 \
  model.pipeline_model_parallel_size=1 \
  model.virtual_pipeline_model_parallel_size=null \
  model.context_parallel_size=4 \
  model.sequence_parallel=false \
  model.cp_comm_type=all_gather \
  model.seq_length=32768 \
  dataset.seq_length=32768 \
  train.micro_batch_size=1 \
  train.global_batch_size=64 \
  train.train_iters=476838 \
  mixed_precision=bf16_mixed \
  optimizer.use_distributed_optimizer=true \
  ddp.use_distributed_optimizer=true \
  ddp.overlap_grad_reduce=true \
  ddp.overlap_param_gather=true \
  model.tp_comm_overlap=false \
  model.pipeline_model_parallel_layout=null \
  model.account_for_embedding_in_pipeline_split=false \
  model.account_for_loss_in_pipeline_split=false \
  model.recompute_granularity=full \
  model.recompute_method=uniform \
  model.recompute_num_layers=1
