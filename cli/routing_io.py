"""Read routing statistics from a file (JSON, CSV or NumPy .npz), or make synthetic ones.

Formats (documented in the README):
- JSON: {"loads": [[tokens of expert 0, 1, ...] per MoE layer], "transitions": optional
  [[[tokens from expert i to expert j] ...] per consecutive layer pair]}.
- CSV: a header "layer,expert,tokens" and one row per (layer, expert); no transitions.
- NPZ: arrays "loads" (layers x experts) and optional "transitions" ((layers-1) x experts x
  experts); read without pickles.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from hardware_db.errors import SpecError


def read_routing(path_text: str):
    from perfmodel.routing import RoutingStats

    path = Path(path_text)
    if not path.is_file():
        raise SpecError(f"routing file not found: {path}")
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or "loads" not in data:
                raise SpecError(f"{path}: needs a JSON object with 'loads' (and optional 'transitions')")
            loads = np.asarray(data["loads"], dtype=float)
            transitions = np.asarray(data["transitions"], dtype=float) if data.get("transitions") is not None else None
        elif suffix == ".csv":
            with path.open(newline="", encoding="utf-8") as fh:
                rows = list(csv.DictReader(fh))
            if not rows or not {"layer", "expert", "tokens"} <= set(rows[0]):
                raise SpecError(f"{path}: needs a header 'layer,expert,tokens' and rows")
            layers = 1 + max(int(r["layer"]) for r in rows)
            experts = 1 + max(int(r["expert"]) for r in rows)
            loads = np.zeros((layers, experts))
            for r in rows:
                layer, expert = int(r["layer"]), int(r["expert"])
                if layer < 0 or expert < 0:
                    raise SpecError(f"{path}: layer and expert need non-negative indices")
                loads[layer, expert] += float(r["tokens"])
            transitions = None
        elif suffix == ".npz":
            with np.load(path, allow_pickle=False) as data:
                if "loads" not in data:
                    raise SpecError(f"{path}: needs an array named 'loads'")
                loads = np.asarray(data["loads"], dtype=float)
                transitions = np.asarray(data["transitions"], dtype=float) if "transitions" in data else None
        else:
            raise SpecError(f"routing file {path}: needs .json, .csv or .npz, has '{suffix or 'no suffix'}'")
    except (ValueError, TypeError, KeyError, OSError, json.JSONDecodeError) as exc:
        raise SpecError(f"malformed routing file ({path}): {exc.__class__.__name__}: {exc}".splitlines()[0]) from None
    return RoutingStats(loads=loads, transitions=transitions)


def routing_for(spec, flags) -> object:
    """The statistics the flags ask for: a file (--routing), synthetic (--zipf), or None."""
    from perfmodel.routing import zipf_routing

    if flags.get("routing") and flags.get("zipf") is not None:
        raise SpecError("give --routing or --zipf, not both")
    if not spec.moe:
        if flags.get("routing") or flags.get("zipf") is not None:
            raise SpecError(f"{spec.name} has no routed experts; --routing and --zipf apply to MoE models")
        return None
    if flags.get("routing"):
        stats = read_routing(flags["routing"])
    elif flags.get("zipf") is not None:
        stats = zipf_routing(spec.moe_layers, spec.moe.num_experts, spec.moe.top_k, flags.get("tokens_per_layer")
                             or 65536, flags["zipf"], flags.get("affinity") or 0.0, flags.get("seed") or 0)
    else:
        return None
    if stats.experts != spec.moe.num_experts:
        raise SpecError(f"routing statistics have {stats.experts} experts, {spec.name} has {spec.moe.num_experts}")
    return stats
