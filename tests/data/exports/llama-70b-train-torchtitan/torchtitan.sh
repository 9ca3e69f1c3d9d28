#!/usr/bin/env bash
# llama-3.1-70b on 64 devices of dgx-h100 (8 nodes of 8): tp 8, pp 2 x 1, dp 4, cp 1, ep 1, micro-batch 1, ZeRO 1, recompute selective, bf16; 512 x 8,192 tokens per step
# Written by perfmodel for torchtitan v0.2.2 (commit 73a0e6979dd1, 2026-02-20; https://github.com/pytorch/torchtitan/blob/v0.2.2/torchtitan/config/job_config.py);
# every argument below exists at that version (perfmodel/exports/flags).
# Run from a torchtitan checkout on each of the 8 node(s), with NODE_RANK and MASTER_ADDR set.
set -euo pipefail
torchrun --nproc-per-node 8 --nnodes 8 --node-rank "${NODE_RANK:-0}" --master-addr "${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-29500}" -m torchtitan.train \
  --job.config_file torchtitan.toml
