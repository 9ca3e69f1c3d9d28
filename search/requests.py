"""One typed request per search command: ``plan train``, ``plan serve`` and ``place-experts``.

Each dataclass is the single source of its command's options: their defaults, help and allowed
values (``perfmodel.requests.option``); the command line is built from its fields and the Python API
(``perfmodel.plan_train`` ...) takes the same fields. ``resolve`` checks the values (one-line
errors naming the flag) and turns them into what the search takes. Importing this module loads
nothing heavy: the command line reads it at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.defaults import LLEP_DEFAULTS, SERVE_DEFAULTS, TRAIN_DEFAULTS
from perfmodel.exports import SERVING as SERVING_FRAMEWORKS
from perfmodel.exports import TRAINING as TRAINING_FRAMEWORKS

from .baselines import SERVE_BASELINES, TRAIN_BASELINES
from .vocabulary import SERVE_MODES, SERVE_OBJECTIVES, SHARDING, TRAIN_OBJECTIVES
from perfmodel.hardware_db.errors import SpecError, UnknownNameError
from perfmodel.plan import ACTIVATION_PRECISIONS, CP_COMMS, DISPATCHERS, KV_PRECISIONS, WEIGHT_PRECISIONS
from perfmodel.requests import (EXPERT_BALANCE_HELP, EXPERT_BALANCES, MODEL_HELP, PRICE_HELP, PRICING, PRICING_HELP,
                                check_choices, option, positive)

TRAIN_PRECISIONS = ("bf16", "fp16", "fp8")
SHARDING_HELP = ("Sharding families searched with the ZeRO stages, comma separated: flat (over all dp x cp ranks), "
                 "hsdp (within a topology level, replicated across: HSDP, MiCS), hfsdp (weights and gradients "
                 "within a level, optimizer states across), levels (a level per state, as Frontier's GCD / GPU / "
                 "node), hpz (ZeRO++ secondary partition), qwz and qgz (ZeRO++ quantized collectives). hfsdp, levels, "
                 "qwz and qgz are searched only when named.")

CHUNK_TOKENS_HELP = ("How a colocated instance runs its prompts, comma separated, each searched: 0 in batches of their "
                     "own between decode steps (SGLang's default); N > 0 as chunks inside the decode steps, each "
                     "iteration of an attention rank carrying its decode batch and prompt tokens up to N in all "
                     "(vLLM's --max-num-batched-tokens, TensorRT-LLM's --max_num_tokens).")
ROUTING_HELP = "Routing statistics file (.json, .csv or .npz; see README)."
ZIPF_HELP = "Synthetic routing: Zipf exponent of expert popularity."
AFFINITY_HELP = "Synthetic routing: share of tokens keeping their affine expert."
SEED_HELP = "Synthetic routing: random seed."
REROUTES = ("none", "least-loaded")


def names(flag: str, value, allowed) -> tuple[str, ...]:
    """A comma-separated string (or a sequence) of names, each one of ``allowed``; at least one."""
    items = value.split(",") if isinstance(value, str) else list(value)
    out = tuple(str(t).strip() for t in items if str(t).strip())
    for name in out:
        if name not in allowed:
            raise UnknownNameError(f"{flag} value", name, allowed)
    if not out:
        raise SpecError(f"{flag} needs at least one value")
    return out


def _in_range(flag: str, value, low: float, high: float, what: str = "a positive number") -> None:
    if value is not None and not low < value < high:
        raise SpecError(f"{flag} needs {what}, has {value:g}")


def _routing(spec, request, tokens_per_layer: float = 65536.0):
    """The request's routing statistics: its file, or synthetic (``--affinity`` 0.5 unless given); a
    file's co-activation is its own, so ``--affinity`` with ``--routing`` is refused in one line."""
    from perfmodel.routing import routing_for

    if request.routing is not None and request.affinity is not None:
        raise SpecError("--affinity applies to synthetic routing; with --routing the file's own co-activation "
                        "is measured from its transitions")
    affinity = 0.5 if request.affinity is None else request.affinity
    return routing_for(spec, request.routing, request.zipf, affinity, request.seed, tokens_per_layer)


@dataclass(frozen=True)
class PlanTrainRequest:
    """``perfmodel plan train``: the optimal training plan over the declared space."""

    model: str = option(TRAIN_DEFAULTS["model"], MODEL_HELP, complete="model")
    system: tuple[str, ...] = option((TRAIN_DEFAULTS["system"],), "Candidate system (repeatable: the search also "
                                     "chooses among them).", complete="system")
    devices: tuple[int, ...] = option((), f"Candidate device count (repeatable; default: {TRAIN_DEFAULTS['devices']}, "
                                          "or the node multiples up to --max-devices).")
    max_devices: int | None = option(None, "Largest device count to consider.")
    global_batch: int = option(TRAIN_DEFAULTS["global_batch"], "Sequences per optimizer step.")
    seq_len: int = option(TRAIN_DEFAULTS["seq_len"], "Tokens per sequence.")
    tokens: float = option(TRAIN_DEFAULTS["tokens"], "Training tokens of the run.")
    objective: str = option("time", "What to minimise.", choices=TRAIN_OBJECTIVES)
    budget: float | None = option(None, "Largest cost of the whole run, USD.")
    pricing: str = option("cloud", PRICING_HELP, choices=PRICING)
    price: tuple[str, ...] = option((), PRICE_HELP)
    power_cap_kw: float | None = option(None, "Largest IT power of all devices, kW.")
    deadline: float | None = option(None, "Longest run, days (needs --tokens): plans that take longer are left out.")
    memory_headroom: float | None = option(None, "Share of HBM to keep free beyond the reserve, from 0 to 1 "
                                                 "(default: the database's hbm-headroom-fraction, 0.05).")
    precisions: str = option(TRAIN_DEFAULTS["precision"], "Allowed GEMM precisions, comma separated (fp8 only when "
                                                          "named here).", choices=TRAIN_PRECISIONS, many=True)
    offload: bool = option(True, "Consider offloading state.")
    swap_activations: str = option("needed", "When to search activation offload to host DDR (MEMO's swap; "
                                             "estimate train --activation-offload): needed (only where no plan fits "
                                             "HBM without it), always (wherever it may pay: memory-bound plans and "
                                             "full recomputation) or never.", choices=("needed", "always", "never"))
    sharding: str = option("flat,hsdp,hpz", SHARDING_HELP, choices=SHARDING, many=True)
    cp_comms: str = option("p2p", "Context-parallel exchanges searched, comma separated: p2p (the ring), all_gather, "
                                  "a2a (estimate train --cp-comm); each beyond the ring adds its plans to the lattice.",
                           choices=CP_COMMS, many=True)
    dispatchers: str = option("alltoall", "MoE token dispatchers searched, comma separated: alltoall (Megatron-Core's), "
                                          "deepep, hybridep (estimate train --dispatcher; NVIDIA GPUs, with the "
                                          "library installed).", choices=DISPATCHERS, many=True)
    top: int = option(5, "How many of the best plans to list.")
    routing: str | None = option(None, ROUTING_HELP)
    zipf: float | None = option(None, ZIPF_HELP)
    affinity: float | None = option(None, AFFINITY_HELP + " Default 0.5; refused with --routing.")
    seed: int = option(0, SEED_HELP)
    framework: str | None = option(None, "Search only plans this framework can run (--export FRAMEWORK implies it).",
                                   choices=TRAINING_FRAMEWORKS)
    baseline: str | None = option(None, "Also find the best plan of a named heuristic on the optimum's system and "
                                        "print how much the optimum gains over it.", choices=tuple(TRAIN_BASELINES))
    any_plan: bool = option(False, "Recommend the optimum itself, not the plan the README's rule picks within its "
                                   "range (one a framework runs, without offload, with fewer parallel dimensions).")

    def resolve(self, db):
        """(spec, [(system, devices)], workload, SearchOptions), or a one-line error naming the flag."""
        from perfmodel.catalog import load_model
        from perfmodel.machine import MAX_DEVICES
        from perfmodel.requests import parse_prices
        from perfmodel.training import TrainWorkload

        from .options import SearchOptions

        for flag, value in [("--devices", n) for n in self.devices] + [("--max-devices", self.max_devices)]:
            if value is not None and not 1 <= value <= MAX_DEVICES:
                raise SpecError(f"{flag} needs 1 to {MAX_DEVICES:,}, has {value}")
        for name in ("global_batch", "seq_len", "top"):
            positive(name, getattr(self, name))
        check_choices(self)
        if not 0 <= self.tokens < 1e18:
            raise SpecError(f"--tokens needs 0 to 1e18, has {self.tokens:g}")
        _in_range("--budget", self.budget, 0, 1e15)
        _in_range("--power-cap-kw", self.power_cap_kw, 0, 1e15)
        _in_range("--deadline", self.deadline, 0, 1e9, "a number of days above 0 and below 1e9")
        headroom = db.constants["hbm-headroom-fraction"].value if self.memory_headroom is None else self.memory_headroom
        precisions = names("--precisions", self.precisions, TRAIN_PRECISIONS)
        if not self.system:
            raise SpecError("--system needs at least one system")
        spec = load_model(self.model)
        pairs = device_candidates(db, list(self.system), list(self.devices) or None, self.max_devices)
        _some_precision_runs(db, {name for name, _ in pairs}, precisions)
        options = SearchOptions(objective=self.objective, budget_usd=self.budget, pricing=self.pricing,
                                prices=parse_prices(db, self.price),
                                power_cap_w=self.power_cap_kw * 1e3 if self.power_cap_kw else None,
                                memory_headroom=headroom, deadline_s=self.deadline * 86400.0 if self.deadline else None,
                                offload=self.offload, top=self.top,
                                space=self._space(precisions, names("--sharding", self.sharding, SHARDING),
                                                  names("--cp-comms", self.cp_comms, CP_COMMS),
                                                  names("--dispatchers", self.dispatchers, DISPATCHERS)),
                                routing=_routing(spec, self),
                                recommend_on=None if self.any_plan else
                                ((self.framework,) if self.framework else TRAINING_FRAMEWORKS))
        return spec, pairs, TrainWorkload(self.global_batch, self.seq_len, self.tokens), options


    def _space(self, precisions: tuple[str, ...], sharding: tuple[str, ...] = ("flat",),
               cp_comms: tuple[str, ...] = ("p2p",), dispatchers: tuple[str, ...] = ("alltoall",)):
        """The declared space: every precision, sharding family, context-parallel exchange and MoE
        dispatcher named, within what ``framework`` can run."""
        from .space import SpaceOptions

        sharding = tuple(dict.fromkeys(("flat",) + sharding))
        swap = ({"activation_offload_when": self.swap_activations} if self.swap_activations != "never"
                else {"activation_offloads": ()})
        if self.framework is None:
            return SpaceOptions(precisions=precisions, sharding=sharding, cp_comms=cp_comms, dispatchers=dispatchers,
                                **swap)
        from perfmodel.exports import CAPABILITIES

        can = CAPABILITIES[self.framework]
        runnable = tuple(p for p in precisions if p in can.precisions)
        if not runnable:
            raise SpecError(f"--precisions {','.join(precisions)}: {self.framework} trains in "
                            f"{', '.join(can.precisions)}")
        # Of the families asked, those the framework runs (levels include the hybrid kind, hfsdp).
        asked = set(sharding) | ({"hfsdp"} if "levels" in sharding else set())
        families = tuple(f for f in can.sharding if f in asked)
        return SpaceOptions(precisions=runnable, max_pp=can.max_pp, max_cp=min(can.max_cp or 16, 16),
                            max_ep=can.max_ep, offload_parts=can.offload, offload_zero=can.offload_zero,
                            sharding=families, hsdp_zero=can.hsdp_zero, shard_whole_cp=can.shard_whole_cp,
                            zeropp_with_groups=can.zeropp_with_groups, tp_overlap=can.tp_overlap,
                            ep_overlap=can.ep_overlap, recomputes=can.recomputes,
                            cp_comms=tuple(c for c in cp_comms if c in can.cp_comms),
                            dispatchers=tuple(d for d in dispatchers if d in can.dispatchers) or ("alltoall",),
                            **({} if can.activation_offload else {"activation_offloads": ()}))


def device_candidates(db, systems: list[str], devices: list[int] | None, max_devices: int | None):
    """(system, devices) pairs: the given counts, or node multiples (powers of two) up to ``max_devices``,
    or the default count when neither is given."""
    pairs = []
    for name in dict.fromkeys(db.system(s).name for s in systems):
        per_node = db.system(name).devices_per_node
        if devices:
            counts = devices
        elif max_devices:
            counts, nodes = [], 1
            while nodes * per_node <= max_devices:
                counts.append(nodes * per_node)
                nodes *= 2
            if max_devices // per_node * per_node not in counts and max_devices >= per_node:
                counts.append(max_devices // per_node * per_node)
            counts = counts or [max_devices]
        else:
            counts = [TRAIN_DEFAULTS["devices"]]
        pairs += [(name, int(n)) for n in counts if not max_devices or n <= max_devices]
    if not pairs:
        raise SpecError(f"no device count at most --max-devices {max_devices}")
    return pairs


def _some_precision_runs(db, systems: set[str], precisions: tuple[str, ...]) -> None:
    """At least one candidate system computes in one of ``precisions`` (else no plan exists to search)."""
    from perfmodel.hardware_db.errors import UnsupportedPrecisionError
    from perfmodel.machine import build_machine

    machines = [build_machine(db, name, None) for name in sorted(systems)]
    if not any(m.supports(p) for m in machines for p in precisions):
        listed = ", ".join(f"{m.system.name} ({m.accelerator.name})" for m in machines)
        raise UnsupportedPrecisionError(f"--precisions {','.join(precisions)}: none is listed in the datasheet of "
                                        f"{listed}; try bf16")


def parse_lengths(flag: str, text):
    """2048, "2048" or "mean=2048,p50=1500,p90=4096" -> Lengths (a missing percentile is the mean)."""
    from .options import Lengths

    values: dict[str, float] = {}
    text = str(text)
    try:
        if "=" not in text:
            values["mean"] = float(text)
        else:
            for part in text.split(","):
                key, _, value = part.partition("=")
                key = key.strip().lower()
                if key not in ("mean", "p50", "p90"):
                    raise UnknownNameError(f"{flag} field", key, ("mean", "p50", "p90"))
                values[key] = float(value)
    except ValueError:
        raise SpecError(f"{flag} needs a number or mean=,p50=,p90=, has {text!r}") from None
    if "mean" not in values:
        values["mean"] = values.get("p50", values.get("p90", 0.0))
    for key, value in values.items():
        if not 1 <= value <= 10_000_000:
            raise SpecError(f"{flag} {key} needs 1 to 10,000,000 tokens, has {value:g}")
    lengths = Lengths.of(values["mean"], values.get("p50"), values.get("p90"))
    if lengths.p90 < lengths.p50:
        raise SpecError(f"{flag}: p90 ({lengths.p90:g}) needs to be at least p50 ({lengths.p50:g})")
    return lengths


@dataclass(frozen=True)
class PlanServeRequest:
    """``perfmodel plan serve``: the cheapest deployment meeting a request rate within latency targets."""

    model: str = option(SERVE_DEFAULTS["model"], MODEL_HELP, complete="model")
    system: tuple[str, ...] = option((SERVE_DEFAULTS["system"],), "Candidate system (repeatable; pools may use "
                                     "different ones).", complete="system")
    rate: float | None = option(None, "Requests per second (default: 10 unless --concurrency).")
    concurrency: int | None = option(None, "Concurrent users instead of --rate (rate = users / (TTFT + output x "
                                           "TPOT targets)).")
    input_len: str = option(str(SERVE_DEFAULTS["input_len"]), "Prompt tokens: a mean, or mean=,p50=,p90=.")
    output_len: str = option(str(SERVE_DEFAULTS["output_len"]), "Generated tokens: a mean, or mean=,p50=,p90=.")
    ttft_p50_ms: float | None = option(None, "Time-to-first-token target at p50, ms.")
    ttft_p90_ms: float | None = option(2000.0, "Time-to-first-token target at p90, ms.")
    tpot_p50_ms: float | None = option(None, "Time-per-output-token target at p50, ms.")
    tpot_p90_ms: float | None = option(50.0, "Time-per-output-token target at p90, ms.")
    objective: str | None = option(None, "What to minimise (default: cost where the systems have prices, else "
                                         "energy; latency: the fastest deployment on --max-devices; throughput: "
                                         "the most requests per second --max-devices carry within the targets, "
                                         "from --rate up or down).",
                                   choices=SERVE_OBJECTIVES)
    budget_usd_per_hour: float | None = option(None, "Largest fleet cost, USD per hour.")
    pricing: str = option("cloud", PRICING_HELP, choices=PRICING)
    price: tuple[str, ...] = option((), PRICE_HELP)
    power_cap_kw: float | None = option(None, "Largest fleet IT power, kW.")
    power_cap_w: float | None = option(None, "Power limit per accelerator, W (default: its TDP): latencies at the "
                                             "clock it allows; prints the p99 slowdown and how many more devices a "
                                             "facility provisioned at the cap holds.")
    facility_devices: int = option(1024, "With --power-cap-w: the devices a facility's power budget is provisioned "
                                         "for at TDP (each with its node share), over which the fleet's power "
                                         "is pooled.")
    capping_risk: float = option(0.01, "With --power-cap-w: the largest share of time the facility may cap its "
                                       "devices because their total exceeds the budget.")
    max_devices: int | None = option(None, "Largest fleet, devices.")
    owned: tuple[str, ...] = option((), "Devices already owned: SYSTEM=COUNT (a sunk purchase) or SYSTEM=COUNT@USD "
                                        "(the resale value per device it forgoes); repeatable. Beyond them the "
                                        "system is priced as usual.", complete="system")
    limit: tuple[str, ...] = option((), "Most devices of one system the fleet may use: SYSTEM=COUNT; repeatable.",
                                    complete="system")
    modes: str = option("colocated,disaggregated", "Deployment modes, comma separated.", choices=SERVE_MODES, many=True)
    weight_precisions: str | None = option(None, "Allowed weight precisions, comma separated (default: the model's "
                                                 "own and fp8; int8, int4 and fp4 only when named here).",
                                           choices=WEIGHT_PRECISIONS, many=True)
    activation_precisions: str = option("a16,a8", "Allowed activation precisions, comma separated.",
                                        choices=ACTIVATION_PRECISIONS, many=True)
    kv_precisions: str = option("bf16,fp8", "Allowed KV-cache precisions, comma separated.", choices=KV_PRECISIONS, many=True)
    kv_offload: bool = option(True, "Consider KV cache in host memory.")
    weight_offload: bool = option(True, "Consider weights streamed each step from a pooled memory tier (one reading "
                                        "at least a quarter of HBM's bandwidth).")
    turns: int = option(1, "Conversation turns: each request is one turn, its prompt carrying the earlier turns "
                           "(--input-len is a turn's new tokens).")
    prefix_cache: bool = option(True, "Reuse the earlier turns' KV cache (prefix caching): only a turn's new input "
                                      "is prefilled.")
    mtp_draft_tokens: int = option(0, "Multi-token prediction: draft tokens per decode step (0-16; the model needs "
                                      "MTP layers).")
    mtp_acceptance: float = option(0.0, "Share of draft tokens accepted (0-1).")
    chunk_tokens: str = option("0,512,2048,8192", CHUNK_TOKENS_HELP)
    top: int = option(5, "How many of the best deployments to list.")
    routing: str | None = option(None, ROUTING_HELP + " Default: aiconfigurator's power law (see --expert-balance).")
    expert_balance: str = option("eplb", EXPERT_BALANCE_HELP, choices=EXPERT_BALANCES)
    zipf: float | None = option(None, ZIPF_HELP)
    affinity: float | None = option(None, AFFINITY_HELP + " Default 0.5; refused with --routing.")
    seed: int = option(0, SEED_HELP)
    framework: str | None = option(None, "Search only deployments this framework runs, their GEMMs priced on its "
                                         "engine's measured kernels (--export FRAMEWORK implies it). Default: any "
                                         "framework, GEMMs on TensorRT-LLM's kernels.", choices=SERVING_FRAMEWORKS)
    baseline: str | None = option(None, "Also find the best deployment of a named heuristic and print how much the "
                                        "optimum gains over it.", choices=tuple(SERVE_BASELINES))
    any_plan: bool = option(False, "Recommend the optimum itself, not the first tie (best first) a serving "
                                   "framework runs as written.")

    def resolve(self, db):
        """(spec, systems, Demand, ServeSearchOptions), or a one-line error naming the flag."""
        from perfmodel.catalog import load_model
        from perfmodel.machine import MAX_DEVICES, build_machine
        from perfmodel.queueing import rate_from_concurrency
        from perfmodel.requests import parse_prices

        from .options import Demand, ServeSearchOptions, default_weight_precisions

        for name in ("concurrency", "max_devices", "top"):
            positive(name, getattr(self, name))
        if self.max_devices is not None and self.max_devices > MAX_DEVICES:
            raise SpecError(f"--max-devices needs 1 to {MAX_DEVICES:,}, has {self.max_devices}")
        if self.concurrency is not None and self.concurrency > 1e9:
            raise SpecError(f"--concurrency needs 1 to 1,000,000,000 users, has {self.concurrency}")
        if not 1 <= self.facility_devices <= MAX_DEVICES:
            raise SpecError(f"--facility-devices needs 1 to {MAX_DEVICES:,}, has {self.facility_devices}")
        if not (isinstance(self.capping_risk, (int, float)) and 0 < self.capping_risk < 1):
            raise SpecError(f"--capping-risk needs a share of time between 0 and 1, has {self.capping_risk:g}")
        for name in ("rate", "budget_usd_per_hour", "power_cap_kw", "ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms",
                     "tpot_p90_ms"):
            _in_range("--" + name.replace("_", "-"), getattr(self, name), 0, 1e12)
        check_choices(self)
        if not 0 <= self.mtp_draft_tokens <= 16:
            raise SpecError(f"--mtp-draft-tokens needs 0 to 16, has {self.mtp_draft_tokens}")
        if not 0.0 <= self.mtp_acceptance <= 1.0:
            raise SpecError(f"--mtp-acceptance needs a share from 0 to 1, has {self.mtp_acceptance:g}")
        if not self.system:
            raise SpecError("--system needs at least one system")
        spec = load_model(self.model)
        if self.mtp_draft_tokens and not spec.mtp_layers:
            raise SpecError(f"--mtp-draft-tokens: {spec.name} has no multi-token-prediction layers to draft with")
        owned, limits = _inventory(db, self.owned, self.limit)
        systems = list(dict.fromkeys([db.system(s).name for s in self.system] + [name for name, _, _ in owned]))
        if self.power_cap_w is not None:
            from perfmodel.requests import check_power_cap

            for name in systems:
                check_power_cap(build_machine(db, name), self.power_cap_w)
        inp, out = parse_lengths("--input-len", self.input_len), parse_lengths("--output-len", self.output_len)
        slo = {k: (getattr(self, k) / 1e3 if getattr(self, k) is not None else None)
               for k in ("ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms")}
        if self.rate is not None and self.concurrency is not None:
            raise SpecError("give --rate or --concurrency, not both")
        rate = self.rate if self.rate is not None else 10.0
        if self.concurrency is not None:
            ttft, tpot = slo["ttft_p90_ms"] or slo["ttft_p50_ms"], slo["tpot_p90_ms"] or slo["tpot_p50_ms"]
            if ttft is None or tpot is None:
                raise SpecError("--concurrency needs TTFT and TPOT targets (rate = users / (TTFT + output x TPOT))")
            rate = rate_from_concurrency(self.concurrency, ttft, tpot, out.mean)
        if not 1 <= self.turns <= 1000:
            raise SpecError(f"--turns needs 1 to 1,000, has {self.turns}")
        demand = Demand.conversation(rate, inp, out, self.turns, self.prefix_cache, ttft_p50=slo["ttft_p50_ms"],
                                     ttft_p90=slo["ttft_p90_ms"], tpot_p50=slo["tpot_p50_ms"],
                                     tpot_p90=slo["tpot_p90_ms"])
        prices = parse_prices(db, self.price)
        objective = self.objective
        if objective == "latency" and self.max_devices is None:
            raise SpecError("--objective latency needs --max-devices: the fleet to find the fastest deployment on")
        if objective == "throughput":
            if self.max_devices is None:
                raise SpecError("--objective throughput needs --max-devices: the fleet whose capacity it finds")
            if self.baseline or self.power_cap_w is not None:
                raise SpecError("--objective throughput takes neither --baseline nor --power-cap-w: each compares "
                                "fleets at one rate")
        if objective is None:
            import numpy as np

            from perfmodel.economics import run_cost

            priced = [s for s in systems
                      if np.isfinite(run_cost(build_machine(db, s, None, self.pricing, prices), 0.0))]
            objective = "cost" if priced else "energy"
        chunks = chunk_sizes(self.chunk_tokens, self.framework)
        options = ServeSearchOptions(
            chunk_tokens=chunks,
            pricing=self.pricing, prices=prices, objective=objective, modes=names("--modes", self.modes, SERVE_MODES),
            weight_precisions=(names("--weight-precisions", self.weight_precisions, WEIGHT_PRECISIONS)
                               if self.weight_precisions is not None else default_weight_precisions(spec)),
            activation_precisions=names("--activation-precisions", self.activation_precisions, ACTIVATION_PRECISIONS),
            kv_precisions=names("--kv-precisions", self.kv_precisions, KV_PRECISIONS),
            kv_offload=self.kv_offload and self.framework is None,
            weight_offload=self.weight_offload and self.framework is None, framework=self.framework,
            max_devices=self.max_devices, budget_usd_per_hour=self.budget_usd_per_hour,
            power_cap_w=self.power_cap_kw * 1e3 if self.power_cap_kw else None, top=self.top,
            routing=_routing(spec, self), expert_balance=self.expert_balance,
            mtp_draft_tokens=self.mtp_draft_tokens, mtp_acceptance=self.mtp_acceptance,
            device_power_cap_w=self.power_cap_w, owned=owned, limits=limits)
        return spec, systems, demand, options


def chunk_sizes(text, framework: str | None = None) -> tuple[int, ...]:
    """``--chunk-tokens``: distinct token counts from 0 to 1,048,576, comma separated; with a framework
    that always mixes prompts into its decode steps (perfmodel.exports.serving.MIXES_ALWAYS), the sizes
    above 0 only."""
    from perfmodel.exports.serving import ENGINE, MIXES_ALWAYS

    items = [t.strip() for t in (text.split(",") if isinstance(text, str) else map(str, text)) if t.strip()]
    try:
        sizes = tuple(sorted({int(t) for t in items}))
    except ValueError:
        sizes = ()
    if not sizes or not all(0 <= c <= 1 << 20 for c in sizes):
        raise SpecError(f"--chunk-tokens needs token counts from 0 to 1,048,576, comma separated, has {text!r}")
    if framework is not None and ENGINE[framework] in MIXES_ALWAYS:
        sizes = tuple(c for c in sizes if c > 0)
        if not sizes:
            raise SpecError(f"--chunk-tokens: {framework} puts prompts into its decode steps; give a size above 0")
    return sizes


def _inventory(db, owned_texts, limit_texts) -> tuple[tuple, tuple]:
    """``--owned SYSTEM=COUNT[@USD]`` and ``--limit SYSTEM=COUNT`` as ((system, count, resale USD), ...)
    and ((system, count), ...); one-line errors naming the flag."""
    def parse(flag, text, value_allowed):
        name, sep, rest = str(text).partition("=")
        count, at, value = rest.partition("@")
        try:
            n, usd = int(count), float(value) if at else 0.0
        except ValueError:
            n, usd = -1, 0.0
        if not sep or n < 1 or n > 10_000_000 or not 0 <= usd < 1e8 or (at and not value_allowed):
            form = "SYSTEM=COUNT or SYSTEM=COUNT@USD" if value_allowed else "SYSTEM=COUNT"
            raise SpecError(f"{flag} needs {form} with a positive count, has {text!r}")
        return db.system(name.strip()).name, n, usd

    owned = tuple(parse("--owned", t, True) for t in owned_texts or ())
    limits = tuple(parse("--limit", t, False)[:2] for t in limit_texts or ())
    for flag, entries in (("--owned", owned), ("--limit", limits)):
        names = [e[0] for e in entries]
        if len(set(names)) < len(names):
            raise SpecError(f"{flag} names a system twice")
    return owned, limits


@dataclass(frozen=True)
class PlaceExpertsRequest:
    """``perfmodel place-experts``: MoE experts (with replicas of hot ones) placed on devices."""

    model: str = option("deepseek-v3", MODEL_HELP, complete="model")
    system: str = option("dgx-h100", "System name from the hardware database.", complete="system")
    devices: int = option(64, "Devices of the expert-parallel group (at most 4,096).")
    routing: str | None = option(None, ROUTING_HELP + " Default: synthetic, Zipf 1.0.")
    zipf: float | None = option(None, ZIPF_HELP)
    affinity: float | None = option(None, AFFINITY_HELP + " Default 0.5; with --routing the file's own "
                                    "co-activation is measured instead (the flag is refused).")
    seed: int = option(0, SEED_HELP)
    tokens_per_layer: float = option(65536.0, "Synthetic routing: tokens per batch.")
    replicas: int = option(32, "Redundant expert copies per layer.")
    reroute: str = option("none", "least-loaded: also price LLEP's per-batch rerouting of an overloaded device's "
                                  "tokens (and its experts' weights) to the least-loaded devices, over contiguous "
                                  "experts without replicas (Nguyen et al. 2026).", choices=REROUTES)
    reroute_capacity: float = option(LLEP_DEFAULTS["capacity"], "LLEP's alpha: a device takes up to this x the "
                                     "mean device's tokens (1 to 100).")
    reroute_min_tokens: float = option(LLEP_DEFAULTS["min_tokens"], "LLEP's m: the smallest spill worth a weight "
                                       "transfer, tokens.")
    reroute_threshold: float = option(LLEP_DEFAULTS["threshold"], "LLEP's lambda: reroute a layer only when its "
                                      "busiest device carries this x the mean (1 to 100).")
    slots: int | None = option(None, "Expert copies one device holds per layer (default: what the copies need).")
    load_tolerance: float = option(0.01, "Share (0 to 1) by which the busiest device may exceed its proven bound "
                                         "(or the load-first peak, if higher) while experts move for locality.")
    time_limit: float = option(30.0, "Deterministic seconds for the whole model (at most 3,600): work counted, "
                                     "not the wall clock, so the same input gives the same placement on any "
                                     "machine; layers past it keep their load-first placement.")

    def resolve(self, db):
        """(spec, machine, PlacementProblem), or a one-line error naming the flag."""
        from dataclasses import replace

        from perfmodel.catalog import load_model
        from perfmodel.machine import build_machine

        from .placement import PlacementProblem

        positive("devices", self.devices)
        positive("slots", self.slots)
        if self.devices > 4096:
            raise SpecError(f"--devices needs at most 4,096 for expert placement, has {self.devices:,}")
        if self.replicas < 0:
            raise SpecError(f"--replicas needs 0 or more, has {self.replicas}")
        if not 0 < self.time_limit <= 3600:
            raise SpecError(f"--time-limit needs 0 to 3600 seconds, has {self.time_limit:g}")
        if not 0 <= self.load_tolerance <= 1:
            raise SpecError(f"--load-tolerance needs a share from 0 to 1, has {self.load_tolerance:g}")
        self.llep_rule()
        spec = load_model(self.model)
        if not spec.moe:
            raise SpecError(f"{spec.name} has no routed experts to place")
        request = replace(self, zipf=1.0) if self.routing is None and self.zipf is None else self
        stats = _routing(spec, request, self.tokens_per_layer)
        machine = build_machine(db, self.system, self.devices)
        per_node = min(machine.system.devices_per_node, self.devices)
        if self.devices % per_node:
            per_node = 1
        slots = self.slots or -(-(stats.experts + self.replicas) // self.devices)
        problem = PlacementProblem(stats=stats, devices=self.devices, devices_per_node=per_node, slots=slots,
                                   replicas=self.replicas, load_tolerance=self.load_tolerance)
        return spec, machine, problem

    def llep_rule(self):
        """LLEP's knobs (``perfmodel.llep.LlepRule``), checked."""
        from perfmodel.llep import LlepRule

        return LlepRule(capacity=self.reroute_capacity, min_tokens=self.reroute_min_tokens,
                        threshold=self.reroute_threshold)
