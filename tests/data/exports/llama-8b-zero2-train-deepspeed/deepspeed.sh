#!/usr/bin/env bash
# llama-3.1-8b on 8 devices of dgx-h100 (1 node of 8): tp 2, pp 1 x 1, dp 4, cp 1, ep 1, micro-batch 1, ZeRO 2, recompute selective, bf16; 64 x 8,192 tokens per step
# Written by perfmodel for DeepSpeed v0.19.5 (commit cf44300453eb, 2026-08-09; https://github.com/deepspeedai/DeepSpeed/blob/v0.19.5/deepspeed/runtime/config.py);
# every argument below exists at that version (perfmodel/exports/flags).
# Run with your DeepSpeed training script (TRAIN_SCRIPT) over a hostfile of 1 node(s); activations are recomputed in your model code (deepspeed.checkpointing.checkpoint), selective as planned.
set -euo pipefail
# Tensor parallelism (autotp_size 2): train_batch_size 64 = 1 x 16 x 4 data-parallel ranks, not x 8 ranks. Without a model-parallel unit
# DeepSpeed counts every rank and refuses the config: "Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size"
# (deepspeed/runtime/config.py:912-927). TRAIN_SCRIPT must build the TP groups and pass them as mpu, as
# DeepSpeed's engine does for AutoTP (deepspeed/runtime/engine.py:653-654):
#   import deepspeed
#   from deepspeed.utils import groups
#   deepspeed.init_distributed()
#   groups._init_tp_mesh_device(tensor_model_parallel_size=2)
#   engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
#                                                  config="ds_config.json", mpu=groups)
: "${TRAIN_SCRIPT:?your DeepSpeed training script}"
deepspeed --num_nodes 1 --num_gpus 8 --hostfile "${HOSTFILE:-hostfile}" "$TRAIN_SCRIPT" \
  --deepspeed \
  --deepspeed_config ds_config.json
