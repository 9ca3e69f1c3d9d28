#!/usr/bin/env bash
# deepseek-v3, colocated pool: 1 instance of 16 devices of dgx-h100 (tp 1, pp 1, dp-attention 16, ep 16), batch 512, weights fp8 a8, kv bf16
# Written by perfmodel for TensorRT-LLM main (untagged; 1.3.0rc series) (commit 00209af149e7; https://github.com/NVIDIA/TensorRT-LLM/blob/00209af149e7774406881a37283dce303571eb11/tensorrt_llm/commands/serve.py);
# every argument below exists at that version (perfmodel/exports/flags).
# Run once per instance (1 of them), on one host of its 2 (in a Slurm allocation of them, or with HOSTS for mpirun): trtllm-llmapi-launch starts trtllm-serve on every rank; the server answers on the first rank's host; PORT defaults to 8000.
set -euo pipefail
MODEL="${MODEL:-deepseek-ai/DeepSeek-V3}"
PORT="${PORT:-8000}"
# examples/llm-api/llm_mgmn_trtllm_serve.sh:17-19 (commit 0bd88711): 16 MPI ranks, one per GPU, 8 per host.
if [ -n "${SLURM_JOB_ID:-}" ]; then
  launch=(srun -N 2 --ntasks-per-node 8 --mpi=pmix)
else
  HOSTS="${HOSTS:?the 2 hosts of this instance with their GPUs, e.g. host0:8,host1:8}"
  launch=(mpirun -n 16 --host "$HOSTS")
fi
"${launch[@]}" trtllm-llmapi-launch trtllm-serve "$MODEL" \
  --backend pytorch \
  --tp_size 16 \
  --pp_size 1 \
  --ep_size 16 \
  --max_batch_size 32 \
  --max_seq_len 2560 \
  --extra_llm_api_options extra-llm-api-config.yml \
  --gpus_per_node 8 \
  --host 0.0.0.0 \
  --port "$PORT"
