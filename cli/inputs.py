"""Turn command-line flags into specs and plans, with one-line errors for impossible values."""

from __future__ import annotations

from typing import Any

from hardware_db.errors import SpecError, UnknownNameError


def _positive(flags: dict[str, Any], *names: str) -> None:
    from perfmodel.requests import positive

    for name in names:
        positive(name, flags[name])


def _choice(flags: dict[str, Any], name: str, allowed) -> None:
    from perfmodel.requests import one_of

    one_of(name, flags[name], allowed)


def _request(cls, flags: dict[str, Any]):
    from dataclasses import fields

    given = {f.name: flags[f.name] for f in fields(cls) if f.name in flags}
    if "price" in given:
        given["price"] = tuple(given["price"] or ())
    return cls(**given)


def train_inputs(db, flags: dict[str, Any]):
    from perfmodel.requests import TrainRequest

    return _request(TrainRequest, flags).resolve(db)


def serve_inputs(db, flags: dict[str, Any]):
    from perfmodel.requests import ServeRequest

    return _request(ServeRequest, flags).resolve(db)


def device_candidates(db, systems: list[str], devices: list[int] | None, max_devices: int | None):
    """(system, devices) pairs: the given counts, or node multiples (powers of two) up to --max-devices."""
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
            counts = [per_node]
        pairs += [(name, int(n)) for n in counts if not max_devices or n <= max_devices]
    if not pairs:
        raise SpecError(f"no device count at most --max-devices {max_devices}")
    return pairs


def plan_train_inputs(db, flags: dict[str, Any]):
    from perfmodel.catalog import load_model
    from perfmodel.training import TrainWorkload
    from search.space import SpaceOptions
    from search.train import OBJECTIVES, SearchOptions

    from perfmodel.machine import MAX_DEVICES

    for flag, value in [("--devices", n) for n in flags["devices"] or ()] + [("--max-devices", flags["max_devices"])]:
        if value is not None and not 1 <= value <= MAX_DEVICES:
            raise SpecError(f"{flag} needs 1 to {MAX_DEVICES:,}, has {value}")
    _positive(flags, "global_batch", "seq_len", "top")
    _choice(flags, "objective", OBJECTIVES)
    if not 0 <= flags["tokens"] < 1e18:
        raise SpecError(f"--tokens needs 0 to 1e18, has {flags['tokens']:g}")
    for name in ("budget", "power_cap_kw"):
        if flags[name] is not None and not 0 < flags[name] < 1e15:
            raise SpecError(f"--{name.replace('_', '-')} needs a positive number, has {flags[name]:g}")
    precisions = tuple(p.strip() for p in flags["precisions"].split(",") if p.strip())
    for p in precisions:
        if p not in ("bf16", "fp16", "fp8"):
            raise UnknownNameError("--precisions value", p, ("bf16", "fp16", "fp8"))
    spec = load_model(flags["model"])
    pairs = device_candidates(db, list(flags["system"]), flags["devices"], flags["max_devices"])
    _some_precision_runs(db, {name for name, _ in pairs}, precisions or ("bf16",))
    from .routing_io import routing_for

    from perfmodel.requests import one_of, parse_prices

    one_of("pricing", flags["pricing"], ("cloud", "owned"))
    options = SearchOptions(objective=flags["objective"], budget_usd=flags["budget"],
                            pricing=flags["pricing"], prices=parse_prices(db, flags["price"]),
                            power_cap_w=flags["power_cap_kw"] * 1e3 if flags["power_cap_kw"] else None,
                            memory_headroom=flags["memory_headroom"], offload=flags["offload"], top=flags["top"],
                            space=SpaceOptions(precisions=precisions or ("bf16",)), routing=routing_for(spec, flags))
    work = TrainWorkload(flags["global_batch"], flags["seq_len"], flags["tokens"])
    return spec, pairs, work, options


def _some_precision_runs(db, systems: set[str], precisions: tuple[str, ...]) -> None:
    """At least one candidate system computes in one of ``precisions`` (else no plan exists to search)."""
    from hardware_db.errors import UnsupportedPrecisionError
    from perfmodel.machine import build_machine

    machines = [build_machine(db, name, None) for name in sorted(systems)]
    if not any(m.supports(p) for m in machines for p in precisions):
        names = ", ".join(f"{m.system.name} ({m.accelerator.name})" for m in machines)
        raise UnsupportedPrecisionError(f"--precisions {','.join(precisions)}: none is listed in the datasheet of "
                                        f"{names}; try bf16")


def parse_lengths(flag: str, text: str):
    """"2048" or "mean=2048,p50=1500,p90=4096" -> Lengths (a missing percentile is the mean)."""
    from search.serve import Lengths

    values: dict[str, float] = {}
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


def _names(flag: str, text: str, allowed) -> tuple[str, ...]:
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    for name in names:
        if name not in allowed:
            raise UnknownNameError(f"{flag} value", name, allowed)
    if not names:
        raise SpecError(f"{flag} needs at least one value")
    return names


def plan_serve_inputs(db, flags: dict[str, Any]):
    from perfmodel.catalog import load_model
    from perfmodel.machine import build_machine
    from perfmodel.queueing import rate_from_concurrency
    from perfmodel.plan import ACTIVATION_PRECISIONS, KV_PRECISIONS, WEIGHT_PRECISIONS
    from search.serve import MODES, OBJECTIVES, Demand, ServeSearchOptions, default_weight_precisions

    from perfmodel.requests import one_of, parse_prices

    from .routing_io import routing_for

    from perfmodel.machine import MAX_DEVICES

    _positive(flags, "concurrency", "max_devices", "top")
    if flags["max_devices"] is not None and flags["max_devices"] > MAX_DEVICES:
        raise SpecError(f"--max-devices needs 1 to {MAX_DEVICES:,}, has {flags['max_devices']}")
    if flags["concurrency"] is not None and flags["concurrency"] > 1e9:
        raise SpecError(f"--concurrency needs 1 to 1,000,000,000 users, has {flags['concurrency']}")
    for name in ("rate", "budget_usd_per_hour", "power_cap_kw", "ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms",
                 "tpot_p90_ms"):
        if flags[name] is not None and not 0 < flags[name] < 1e12:
            raise SpecError(f"--{name.replace('_', '-')} needs a positive number, has {flags[name]:g}")
    if flags["objective"] is not None:
        _choice(flags, "objective", OBJECTIVES)
    spec = load_model(flags["model"])
    systems = [db.system(s).name for s in flags["system"]]
    inp, out = parse_lengths("--input-len", flags["input_len"]), parse_lengths("--output-len", flags["output_len"])
    ms = {k: (flags[k] / 1e3 if flags[k] is not None else None) for k in ("ttft_p50_ms", "ttft_p90_ms",
                                                                         "tpot_p50_ms", "tpot_p90_ms")}
    if flags["rate"] is None and flags["concurrency"] is None:
        rate = 10.0
    elif flags["rate"] is not None and flags["concurrency"] is not None:
        raise SpecError("give --rate or --concurrency, not both")
    elif flags["rate"] is not None:
        rate = flags["rate"]
    else:
        ttft = ms["ttft_p90_ms"] or ms["ttft_p50_ms"]
        tpot = ms["tpot_p90_ms"] or ms["tpot_p50_ms"]
        if ttft is None or tpot is None:
            raise SpecError("--concurrency needs TTFT and TPOT targets (rate = users / (TTFT + output x TPOT))")
        rate = rate_from_concurrency(flags["concurrency"], ttft, tpot, out.mean)
    demand = Demand(rate=rate, input_len=inp, output_len=out, ttft_p50=ms["ttft_p50_ms"], ttft_p90=ms["ttft_p90_ms"],
                    tpot_p50=ms["tpot_p50_ms"], tpot_p90=ms["tpot_p90_ms"])
    objective = flags["objective"]
    one_of("pricing", flags["pricing"], ("cloud", "owned"))
    prices = parse_prices(db, flags["price"])
    if objective is None:
        import numpy as np

        from perfmodel.power import run_cost

        priced = [s for s in systems if np.isfinite(run_cost(build_machine(db, s, None, flags["pricing"], prices), 0.0))]
        objective = "cost" if priced else "energy"
    options = ServeSearchOptions(
        pricing=flags["pricing"], prices=prices,
        objective=objective, modes=_names("--modes", flags["modes"], MODES),
        weight_precisions=(_names("--weight-precisions", flags["weight_precisions"], WEIGHT_PRECISIONS)
                           if flags["weight_precisions"] is not None else default_weight_precisions(spec)),
        activation_precisions=_names("--activation-precisions", flags["activation_precisions"],
                                     ACTIVATION_PRECISIONS),
        kv_precisions=_names("--kv-precisions", flags["kv_precisions"], KV_PRECISIONS),
        kv_offload=flags["kv_offload"], max_devices=flags["max_devices"],
        budget_usd_per_hour=flags["budget_usd_per_hour"],
        power_cap_w=flags["power_cap_kw"] * 1e3 if flags["power_cap_kw"] else None, top=flags["top"],
        routing=routing_for(spec, flags))
    return spec, systems, demand, options


def place_inputs(db, flags: dict[str, Any]):
    from perfmodel.catalog import load_model
    from perfmodel.machine import build_machine
    from search.placement import PlacementProblem

    from .routing_io import routing_for

    _positive(flags, "devices", "slots")
    if flags["devices"] > 4096:
        raise SpecError(f"--devices needs at most 4,096 for expert placement, has {flags['devices']:,}")
    if flags["replicas"] < 0:
        raise SpecError(f"--replicas needs 0 or more, has {flags['replicas']}")
    if not 0 < flags["time_limit"] <= 3600:
        raise SpecError(f"--time-limit needs 0 to 3600 seconds, has {flags['time_limit']:g}")
    spec = load_model(flags["model"])
    if not spec.moe:
        raise SpecError(f"{spec.name} has no routed experts to place")
    if flags["routing"] is None and flags["zipf"] is None:
        flags = {**flags, "zipf": 1.0}
    stats = routing_for(spec, flags)
    machine = build_machine(db, flags["system"], flags["devices"])
    dpn = min(machine.system.devices_per_node, flags["devices"])
    if flags["devices"] % dpn:
        dpn = 1
    slots = flags["slots"] or -(-(stats.experts + flags["replicas"]) // flags["devices"])
    problem = PlacementProblem(stats=stats, devices=flags["devices"], devices_per_node=dpn, slots=slots,
                               replicas=flags["replicas"])
    return spec, machine, problem, flags["time_limit"]
