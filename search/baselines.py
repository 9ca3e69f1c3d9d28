"""Named heuristics a search is compared with (``--baseline NAME``): the plan practitioners start from,
as a restriction of the declared space. The baseline's number is the best plan the heuristic's family
holds (so the printed speed-up is a lower bound on what the heuristic's first guess would lose).
"""

from __future__ import annotations

from dataclasses import replace

TRAIN_BASELINES = {
    "tp-node": "tensor parallel over one node's devices (a host's: within NVLink), pipeline stages as needed, data "
               "parallel across nodes, ZeRO-1, selective recompute, micro-batch 1, no offload (Megatron-LM's "
               "usual starting point; Narayanan et al. 2021, Sec. 3.3 takeaway #1)",
    "fsdp": "ZeRO-3 / FSDP over every device with no tensor or pipeline parallelism (PyTorch FSDP's default)",
}
SERVE_BASELINES = {
    "tp-node": "colocated instances of one node (a host) each, tensor parallel over its devices, the model's own "
               "weight and KV formats (vLLM's and SGLang's defaults: --tensor-parallel-size = GPUs per node)",
}
BASELINES = tuple(dict.fromkeys((*TRAIN_BASELINES, *SERVE_BASELINES)))


def _known(name: str, family: dict, what: str) -> None:
    """A one-line error for a heuristic ``family`` does not name (the requests check first; a caller
    of these functions gets the same answer)."""
    if name not in family:
        from perfmodel.hardware_db.errors import UnknownNameError

        raise UnknownNameError(f"{what} baseline", name, tuple(family))


def train_options(name: str, options, per_node: int):
    """``options`` (SearchOptions) restricted to the heuristic ``name`` on a system of ``per_node``
    devices a node (a host's devices where a scale-up domain spans several hosts, as on GB200 NVL72)."""
    _known(name, TRAIN_BASELINES, "training")
    space = options.space
    if name == "tp-node":
        space = replace(space, tps=(per_node,), max_cp=1, zero_stages=(1,), recomputes=("selective",),
                        micro_batches=(1,), interleaves=(1,), offload_parts=(), sharding=("flat",))
    elif name == "fsdp":
        space = replace(space, tps=(1,), max_pp=1, max_cp=1, zero_stages=(3,), offload_parts=(), sharding=("flat",))
    return replace(options, space=space, offload=False)


def serve_layout_ok(name: str, per_node: int, tp: int, pp: int, dp_attention: int, ep: int) -> bool:
    """Whether an instance layout belongs to the serving heuristic ``name``."""
    _known(name, SERVE_BASELINES, "serving")
    return name != "tp-node" or (tp == per_node and pp == 1 and dp_attention == 1 and ep == 1)


def serve_options(name: str, options, native: str):
    """``options`` (ServeSearchOptions) restricted to the serving heuristic ``name``."""
    _known(name, SERVE_BASELINES, "serving")
    activation = "a8" if native in ("fp8", "int8") else "a16"
    return replace(options, baseline=name, modes=("colocated",), weight_precisions=(native,),
                   activation_precisions=(activation,), kv_precisions=("bf16",), kv_offload=False,
                   weight_offload=False)


def _ratio(heuristic, optimum):
    """The heuristic's figure over the optimum's, or None where either is missing or zero."""
    return heuristic / optimum if heuristic and optimum else None


def train_comparison(name: str, found, best) -> dict:
    """What the optimum ``best`` (a TrainRow) gains over the named heuristic's best plan, as data: the
    heuristic's status and plan, and its step time, run cost and energy per token over the optimum's
    (``speedup``, ``cost_ratio``, ``energy_ratio``); the reason when the heuristic has no plan."""
    out = {"name": name, "description": TRAIN_BASELINES[name], "status": found.evidence.status}
    if found.best is None:
        return {**out, "best": None, "reason": f"no plan of the heuristic fits or is valid on {best.devices:,} x "
                                               f"{best.system}"}
    b = found.best
    return {**out, "best": b.as_dict(), "speedup": _ratio(b.step_time_s, best.step_time_s),
            "cost_ratio": _ratio(b.run_cost_usd, best.run_cost_usd),
            "energy_ratio": _ratio(b.energy_per_token_j, best.energy_per_token_j)}


def serve_comparison(name: str, found, best) -> dict:
    """What the optimum deployment ``best`` gains over the named heuristic's best one, as data: its
    devices, latency, cost and energy per token over the optimum's; the reason when it has none."""
    out = {"name": name, "description": SERVE_BASELINES[name], "status": found.evidence.status}
    if found.best is None:
        return {**out, "best": None, "reason": found.closest}
    b = found.best
    return {**out, "best": b.as_dict(), "devices_ratio": _ratio(b.devices, best.devices),
            "latency_ratio": _ratio(b.latency_s, best.latency_s), "cost_ratio": _ratio(b.usd_per_hour, best.usd_per_hour),
            "energy_ratio": _ratio(b.joules_per_token, best.joules_per_token)}
