#!/usr/bin/env bash
# deepseek-v3 on 1,024 devices of dgx-h100 (128 nodes of 8): tp 2, pp 8 x 4, dp 64, cp 1, ep 64, micro-batch 1, ZeRO 1, recompute selective, fp8; 8,192 x 2,048 tokens per step
# Written by perfmodel for Megatron-Bridge v0.6.0 (commit 51885cf132b2, 2026-08-19; https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/v0.6.0/src/megatron/bridge/training/config.py);
# every argument below exists at that version (perfmodel/exports/flags).
# Run from a Megatron-Bridge checkout on each of the 128 node(s), with NODE_RANK and MASTER_ADDR set; --dataset mock until you point the recipe at your data.
set -euo pipefail
torchrun --nproc-per-node 8 --nnodes 128 --node-rank "${NODE_RANK:-0}" --master-addr "${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-29500}" scripts/training/run_recipe.py --recipe deepseek_v3_pretrain_256gpu_h100_bf16_32nodes_config --mode pretrain --dataset mock \
  model.tensor_model_parallel_size=2 \
  model.pipeline_model_parallel_size=8 \
  model.virtual_pipeline_model_parallel_size=4 \
  model.context_parallel_size=1 \
  model.sequence_parallel=true \
  model.seq_length=2048 \
  dataset.seq_length=2048 \
  train.micro_batch_size=1 \
  train.global_batch_size=8192 \
  train.train_iters=59605 \
  mixed_precision=bf16_with_fp8_current_scaling_mixed \
  optimizer.use_distributed_optimizer=true \
  ddp.use_distributed_optimizer=true \
  ddp.overlap_grad_reduce=true \
  ddp.overlap_param_gather=true \
  model.tp_comm_overlap=false \
  model.overlap_moe_expert_parallel_comm=true \
  model.moe_token_dispatcher_type=alltoall \
  model.moe_shared_expert_overlap=false \
  'model.pipeline_model_parallel_layout=Et|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|tt|mL' \
  model.account_for_embedding_in_pipeline_split=false \
  model.account_for_loss_in_pipeline_split=false \
  model.recompute_granularity=selective \
  model.expert_model_parallel_size=64 \
  model.expert_tensor_parallel_size=1
