"""A serving pool option: one instance configuration of one system in one role, sized to the fewest
instances that carry the whole request rate within the latency targets. search.serve_pools builds
them; the fleet program (search.fleet), the latency search (search.fastest) and the deployment
(search.serve) read them; none changes one after it is built (a pool at another count is a new
option: ``dataclasses.replace``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class InstanceConfig:
    """One instance's layout and formats: what ``perfmodel estimate serve`` takes to reproduce it."""

    tp: int
    pp: int
    ep: int
    dp_attention: int
    batch: int                 # decode slots (sequences in flight) of one instance
    weight_precision: str
    activation_precision: str
    kv_precision: str
    kv_place: str              # memory tier of the KV cache ("hbm", "ddr", "cxl", "pooled")
    weight_place: str          # memory tier the weights stream from
    chunk_tokens: int          # prompt tokens a colocated instance mixes into each decode step; 0: prompts apart

    def as_dict(self) -> dict:
        """The configuration as the deployment's JSON prints it (``Pool.config``)."""
        return {"tp": self.tp, "pp": self.pp, "ep": self.ep, "dp_attention": self.dp_attention, "batch": self.batch,
                "weight_precision": self.weight_precision, "activation_precision": self.activation_precision,
                "kv_precision": self.kv_precision, "kv_place": self.kv_place, "weight_place": self.weight_place,
                "chunk_tokens": self.chunk_tokens}


@dataclass(frozen=True, slots=True)
class QueueInputs:
    """The unloaded times of one instance the queueing model starts from (the arguments of
    perfmodel.queueing.pool_latencies besides the count and the rate); search.fastest re-sizes
    pools with them."""

    output_tokens_mean: float
    batch: int                 # decode slots of one instance
    dp_attention: int          # attention ranks: the prefill servers of one instance
    prefill_p50_s: float       # a p50 prompt's service: its prefill, or its chunks in mixed steps
    prefill_p90_s: float
    tpot_p50_s: float          # the decode step at full batch and the p50 / p90 context
    tpot_p90_s: float
    mixed_step_p50_s: float = 0.0   # a decode step carrying a prompt chunk; 0: no mixed steps
    mixed_step_p90_s: float = 0.0

    def as_dict(self) -> dict:
        """The inputs under the keys of the columns they were read from (search.serve_pools)."""
        return {"output": self.output_tokens_mean, "batch": self.batch, "dpa": self.dp_attention,
                "prefill_s50": self.prefill_p50_s, "prefill_s90": self.prefill_p90_s, "tpot50": self.tpot_p50_s,
                "tpot90": self.tpot_p90_s, "mixed50": self.mixed_step_p50_s, "mixed90": self.mixed_step_p90_s}


@dataclass(frozen=True, slots=True)
class PoolOption:
    """A pool of ``instances`` identical instances of ``config`` on ``system`` in ``role``: its
    totals (power, price) at that count, its latencies there, and what the queueing started from."""

    role: str                  # "colocated", "prefill" or "decode"
    system: str
    accelerator: str
    instances: int             # sized alone: the fewest that carry the whole rate within the targets (N)
    devices_per_instance: int
    power_w: float             # every device of the pool at ``instances``, with its node share
    usd_per_hour: float | None  # the pool at ``instances``; None where the system has no price
    # The pool's latencies at ``instances`` (queueing included; before any KV hand-over).
    ttft_p50_s: float
    ttft_p90_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    ttft_error: float          # relative half-width of the TTFT prediction interval
    tpot_error: float          # relative half-width of the TPOT prediction interval
    prefill_p90_s: float       # unloaded: one p90 prompt per attention rank (``estimate serve``'s prefill)
    step_p90_s: float          # unloaded: the decode step at full batch and the p90 context
    hbm_used_bytes: float      # per device, at full batch and the p90 context
    # What one instance carries within the targets: the rate over N (kept when search.fastest re-sizes a pool).
    requests_per_s_per_instance: float
    queue: QueueInputs
    config: InstanceConfig

    @property
    def devices(self) -> int:
        return self.instances * self.devices_per_instance

    @property
    def kv_precision(self) -> str:
        """The KV cache's format: a prefill pool hands its KV only to a decode pool reading the same."""
        return self.config.kv_precision

    def as_dict(self) -> dict:
        """The option as one plain dict (the form search.serve_pools produced before this class):
        its fields under their earlier keys, ``devices`` and the queue and configuration nested."""
        return {"role": self.role, "system": self.system, "instances": self.instances, "devices": self.devices,
                "devices_per_instance": self.devices_per_instance, "usd_per_hour": self.usd_per_hour,
                "power_w": self.power_w, "ttft50": self.ttft_p50_s, "ttft90": self.ttft_p90_s,
                "tpot50": self.tpot_p50_s, "tpot90": self.tpot_p90_s, "ttft_error": self.ttft_error,
                "tpot_error": self.tpot_error, "service90": self.prefill_p90_s, "step90": self.step_p90_s,
                "kvp": self.kv_precision, "hbm": self.hbm_used_bytes, "queue": self.queue.as_dict(),
                "config": self.config.as_dict(), "accelerator": self.accelerator,
                "capacity": self.requests_per_s_per_instance}
