"""The defaults ``plan`` and ``estimate`` share, so that a searched plan's numbers are what
``estimate`` prints for its degrees. Imports nothing: the command line reads these at start-up.

Training: Llama 3.1 70B on 64 H100s (8 DGX H100), 512 sequences of 8,192 tokens per step, a
1T-token run, bf16 (fp8 only when asked). Serving: the same model, prompts of 2,048 tokens and
outputs of 512.
"""

TRAIN_DEFAULTS = {"model": "llama-3.1-70b", "system": "dgx-h100", "devices": 64, "global_batch": 512,
                  "seq_len": 8192, "tokens": 1e12, "precision": "bf16"}
SERVE_DEFAULTS = {"model": "llama-3.1-70b", "system": "dgx-h100", "input_len": 2048, "output_len": 512}

# Least-loaded expert parallelism's knobs (perfmodel.llep): the values the LLEP repository's example
# runs (github.com/SalesforceAIResearch/LeastLoadedEP, README: max_tokens_factor 1.0,
# min_tokens_per_gemm 1024, MOE_ADAPTIVE_LPT_ROUTING_RATIO 1.3).
LLEP_DEFAULTS = {"capacity": 1.0, "min_tokens": 1024.0, "threshold": 1.3}
