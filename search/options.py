"""What a search is asked: the typed options of the training and serving searches and the serving demand.

``search.requests`` builds them from a command's flags; ``search.train`` and ``search.serve`` read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from perfmodel.model import TransformerSpec

from .space import SpaceOptions
from .vocabulary import SERVE_MODES as MODES


@dataclass(frozen=True)
class SearchOptions:
    objective: str = "time"
    budget_usd: float | None = None       # cost of the whole run
    power_cap_w: float | None = None      # IT power of all devices, with their node share
    memory_headroom: float = 0.0          # share of HBM to leave free beyond the named reserve
    deadline_s: float | None = None       # longest run (its tokens at the plan's throughput), seconds
    offload: bool = True
    top: int = 10
    space: SpaceOptions = field(default_factory=SpaceOptions)
    routing: object = None                # RoutingStats: EP imbalance from a placement, per EP degree
    pricing: str = "cloud"                # cost basis (perfmodel.power.run_cost)
    prices: dict = field(default_factory=dict)   # the user's USD per device-hour by system
    # Frameworks the recommendation must run on as written (RECOMMENDATION); None: the optimum is the answer.
    recommend_on: tuple[str, ...] | None = None
    threads: int | None = None            # threads the plan evaluation uses (None: every core; a sweep's workers: 1)


@dataclass(frozen=True)
class Lengths:
    """A token-length distribution given by its mean and two percentiles."""

    mean: float
    p50: float
    p90: float

    @staticmethod
    def of(mean: float, p50: float | None = None, p90: float | None = None) -> "Lengths":
        return Lengths(mean, p50 if p50 is not None else mean, p90 if p90 is not None else mean)


@dataclass(frozen=True)
class Demand:
    """Requests per second, their lengths, and the latency targets (seconds; None: no target)."""

    rate: float
    input_len: Lengths
    output_len: Lengths
    ttft_p50: float | None = None
    ttft_p90: float | None = None
    tpot_p50: float | None = None
    tpot_p90: float | None = None
    cached_share: float = 0.0       # share of each prompt whose KV is already cached (earlier turns)

    @staticmethod
    def conversation(rate: float, turn_input: Lengths, output: Lengths, turns: int, prefix_cache: bool,
                     **targets) -> "Demand":
        """Each request one turn of ``turns``-turn conversations: its prompt carries the earlier turns
        (their inputs and outputs), on average (turns - 1) / 2 of them; with prefix caching their KV is
        reused and only the turn's new input is prefilled."""
        earlier = (turns - 1) / 2.0 * (turn_input.mean + output.mean)
        prompt = Lengths(turn_input.mean + earlier, turn_input.p50 + earlier, turn_input.p90 + earlier)
        share = earlier / prompt.mean if prefix_cache else 0.0
        return Demand(rate=rate, input_len=prompt, output_len=output, cached_share=share, **targets)


@dataclass(frozen=True)
class ServeSearchOptions:
    objective: str = "cost"
    modes: tuple[str, ...] = MODES
    weight_precisions: tuple[str, ...] = ("bf16", "fp8")
    activation_precisions: tuple[str, ...] = ("a16", "a8")
    kv_precisions: tuple[str, ...] = ("bf16", "fp8")
    kv_offload: bool = True
    weight_offload: bool = True     # weights may stream from a tier of at least STREAMING_TIER x HBM bandwidth
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    max_instance_devices: int = 512
    max_devices: int | None = None
    budget_usd_per_hour: float | None = None
    power_cap_w: float | None = None
    top: int = 5
    routing: object = None          # RoutingStats: EP imbalance from a placement, per EP degree
    expert_balance: str = "eplb"    # perfmodel.eplb.BALANCES: how the routing (or the default one) is placed
    pricing: str = "cloud"          # cost basis (perfmodel.power.run_cost)
    prices: dict | None = None      # the user's USD per device-hour by system
    framework: str | None = None    # search only what this serving framework runs (perfmodel.exports.serving)
    baseline: str | None = None     # search only a named heuristic's instances (search.baselines)
    mtp_draft_tokens: int = 0       # multi-token prediction: draft tokens per decode step
    mtp_acceptance: float = 0.0     # share of them accepted
    device_power_cap_w: float | None = None   # per-accelerator power limit (perfmodel.power.capped_phase)
    owned: tuple[tuple[str, int, float], ...] = ()   # (system, devices already owned, resale USD each; 0: sunk)
    limits: tuple[tuple[str, int], ...] = ()         # (system, most devices of it the fleet may use)
    # Tokens per iteration and attention rank of a colocated instance that mixes prompt chunks into its
    # decode steps (vLLM's --max-num-batched-tokens); 0: prompts in batches of their own (perfmodel.queueing).
    chunk_tokens: tuple[int, ...] = (0, 512, 2048, 8192)


def default_weight_precisions(spec: TransformerSpec) -> tuple[str, ...]:
    """What a serving search tries unless told otherwise: the model's published format and fp8
    (where the device runs it); int8, int4 and fp4 change the model and are searched only when asked."""
    native = "bf16" if spec.native_precision == "fp16" else spec.native_precision
    return tuple(dict.fromkeys((native, "fp8")))
