"""Writes gpt-oss-120b-synthetic.npz: SYNTHETIC routing statistics (not measured on a model) in
gpt-oss-120b's shape (36 MoE layers x 128 experts, top-4), for the README's place-experts
questions. No public per-layer routing trace with transition counts and a clear license was found
for a model in the catalog, so the file comes from a stated, seeded token-level process instead
(``perfmodel.coactivation.latent_domain_routing``, its defaults): 32,768 tokens (the LLEP
repository's example batch), each in one of 32 latent domains (Zipf 1.0 over domains); per layer a
token's router logits are its domain's preferences (normal, sd 1.5) plus the layer's expert
popularity (normal, sd 0.75) plus its own noise (normal, sd 1.0), top-4 taken; seed 0. The
inter-layer co-activation and the skew are consequences of that process, measured afterwards
(``perfmodel place-experts`` prints them), never set.

    python examples/routing/make_synthetic_routing.py [OUT.npz]

tests/search/test_rerouting.py regenerates it and checks it equals the shipped file.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np

from perfmodel.coactivation import latent_domain_routing

SHAPE = {"layers": 36, "experts": 128, "top_k": 4, "tokens": 32768, "seed": 0}
FILE = Path(__file__).with_name("gpt-oss-120b-synthetic.npz")


def synthetic_npz() -> bytes:
    """The file's bytes (float32 counts: every count is a multiple of 1/4 below 2^21, exact)."""
    stats = latent_domain_routing(**SHAPE)
    out = io.BytesIO()
    np.savez_compressed(out, loads=stats.loads.astype(np.float32), transitions=stats.transitions.astype(np.float32))
    return out.getvalue()


if __name__ == "__main__":
    Path(sys.argv[1] if len(sys.argv) > 1 else FILE).write_bytes(synthetic_npz())
