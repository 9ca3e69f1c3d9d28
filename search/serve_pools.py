"""Instance options of a serving search, per system: the layouts and precisions an instance may take, each
evaluated in one vectorized call of the cost model for prefill and decode, and sized: the fewest instances
meeting the latency targets at the demand (search.serve, step 1 and the queueing of step 2).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np

from perfmodel.hardware_db.errors import SpecError
from perfmodel.hardware_db.loader import Database
from perfmodel.kernels import sorted_distinct
from perfmodel.machine import Machine, build_machine
from perfmodel.model import TransformerSpec
from perfmodel.plan import QuantScheme
from perfmodel.queueing import pool_latencies, pool_shares
from perfmodel.serving import ServePlan, ServeWorkload, estimate_serving_placed, serving_backend

from .options import Demand, ServeSearchOptions
from .pareto import pareto_front
from .placement import imbalance_table
from .pool_option import InstanceConfig, PoolOption, QueueInputs


MAX_INSTANCES = 1 << 20


# Weights stream from a memory tier each step only where it reads at least this share of HBM's
# bandwidth (a pooled tier such as FengHuang's); over a PCIe path (DDR, CXL: 1-3% of HBM) every
# decode step would take 30-100x its HBM time. A declared bound of the searched space.
STREAMING_TIER = 0.25


def _layouts(spec: TransformerSpec, machine: Machine, max_devices: int, framework: str | None = None,
             baseline: str | None = None):
    """(tp, pp, dp_attention, ep) of instances up to ``max_devices`` devices on this system (that
    ``framework`` runs, and that the heuristic ``baseline`` holds, when named)."""
    if baseline is not None:
        from .baselines import serve_layout_ok

        # One host's devices (a GB200 NVL72 tray's 4, a DGX's 8): what the engines' default TP spans.
        per_host = machine.system.devices_per_launch_host
        return [lay for lay in _layouts(spec, machine, max_devices, framework)
                if serve_layout_ok(baseline, per_host, *lay)]
    if framework is not None:
        from perfmodel.exports.serving import layout_problem

        per_host = machine.system.devices_per_launch_host
        return [lay for lay in _layouts(spec, machine, max_devices)
                if layout_problem(framework, *lay, per_host) is None]
    out = []
    sizes = [2 ** k for k in range(0, 20) if 2 ** k <= min(max_devices, machine.devices)]
    for d in sizes:
        for tp in [t for t in sizes if t <= min(d, machine.scale_up_domain) and spec.num_heads % t == 0]:
            for pp in (1, 2, 4):
                if d % (tp * pp) or pp > spec.num_layers:
                    continue
                dpa = d // (tp * pp)
                if dpa > 1 and not spec.mla:      # attention data parallelism: MLA deployments
                    continue
                # Experts fold over the stage's tp x dp_attention devices: all of them TP-split
                # (ep 1), expert-parallel across the TP group, or across every device.
                # Above the routed experts, EP holds redundant copies of hot experts (one slot per device).
                eps = [1] if not spec.moe else sorted({1, tp * dpa} | ({tp} if tp <= spec.moe.num_experts else set()))
                for ep in eps:
                    out.append((tp, pp, dpa, ep))
    return out


def _precision_combos(machine: Machine, options: ServeSearchOptions, native: str = "bf16"):
    """(weight, activation, KV) formats the options allow, the device can run (QuantScheme's rules)
    and the framework, when one is named, serves."""
    if options.framework is not None:
        from perfmodel.exports.serving import format_problem

        return [c for c in _precision_combos(machine, replace(options, framework=None))
                if format_problem(options.framework, *c, native) is None]
    combos = []
    for wp, ap, kvp in itertools.product(options.weight_precisions, options.activation_precisions,
                                         options.kv_precisions):
        try:
            scheme = QuantScheme(wp, ap, kvp, machine.math16)
        except SpecError:
            continue      # a pairing no kernel runs (e.g. W:bf16 with A:a8)
        if scheme.runs_on(machine.supports):
            combos.append((wp, ap, kvp))
    return combos


def _half_width(interval, value) -> np.ndarray:
    """(high - low) / 2 over the value: a prediction interval's relative half-width."""
    low, high = (np.asarray(x, dtype=float) for x in interval)
    return np.where(np.asarray(value) > 0, (high - low) / 2.0 / np.maximum(value, 1e-30), 0.0)


def _evaluate_system(spec, machine: Machine, demand: Demand, options: ServeSearchOptions, counter: dict):
    layouts = _layouts(spec, machine, options.max_instance_devices, options.framework, options.baseline)
    places = ["hbm"] + ([t.kind for t in machine.memory_tiers if t.kind in ("ddr", "cxl", "pooled")]
                        if options.kv_offload else [])
    weight_places = ["hbm"] + ([t.kind for t in machine.memory_tiers if t.kind in ("ddr", "cxl", "pooled")
                                and t.read_bytes_per_s >= STREAMING_TIER * machine.hbm_bytes_per_s]
                               if options.weight_offload else [])
    rows: dict[str, list] = {k: [] for k in ("tp", "pp", "dpa", "ep", "batch", "wp", "ap", "kvp", "kv_place", "w_place",
                                             "devices", "prefill_s50", "prefill_s90", "tpot50", "tpot90",
                                             "hbm", "power_w", "prefill_power_w", "feasible_decode",
                                             "feasible_prefill",
                                             "ttft_error", "tpot_error", "chunk", "mixed50", "mixed90")}
    if not layouts:
        return rows
    lay = np.array(layouts, dtype=float)
    skew = expert_skew(spec, machine, options, lay[:, 3])
    native = "bf16" if spec.native_precision == "fp16" else spec.native_precision
    # Decode: every batch of every layout. The step's mean context is input + output / 2, so
    # output = 2 x (context - input) reproduces it.
    grid_rows = [(i, b) for i, l in enumerate(layouts) for b in options.batches if b % l[2] == 0]
    pre_i = np.array([i for i, _ in grid_rows])
    grid = np.column_stack([lay[pre_i], [b for _, b in grid_rows]]).astype(float)
    n_lay, n_grid = len(lay), len(grid)

    def stacked(values, n):
        """The p50 rows, then the p90 rows: both quantiles in one vectorized estimate."""
        return np.repeat(np.asarray(values, dtype=float), n)

    p50, p90 = pre_i, n_lay + pre_i
    for wp, ap, kvp in _precision_combos(machine, options, native):
        # Prefill: one prompt per attention rank, at the p50 and p90 prompt lengths (the KV's place
        # does not change it; the weights' does).
        n_in = stacked((demand.input_len.p50, demand.input_len.p90), n_lay)
        both = np.tile(lay, (2, 1))
        # The phases' times do not depend on where the KV cache and weights live: one evaluation
        # per phase for every place (estimate_serving_placed).
        prefill = dict(zip(weight_places, estimate_serving_placed(spec, machine, ServePlan(
            tp=both[:, 0], pp=both[:, 1], dp_attention=both[:, 2], ep=both[:, 3], batch=both[:, 2], weight_precision=wp,
            activation_precision=ap, kv_precision=kvp, moe_imbalance=np.tile(skew, 2),
            expert_balance=options.expert_balance, backend=serving_backend(options.framework),
            mtp_draft_tokens=options.mtp_draft_tokens, mtp_acceptance=options.mtp_acceptance,
            power_cap_w=options.device_power_cap_w), ServeWorkload(n_in, 1, demand.cached_share * n_in),
            [("hbm", w_place) for w_place in weight_places], phases=("prefill",))))
        both = np.tile(grid, (2, 1))
        plan = ServePlan(tp=both[:, 0], pp=both[:, 1], dp_attention=both[:, 2], ep=both[:, 3],
                         batch=both[:, 4], weight_precision=wp, activation_precision=ap, kv_precision=kvp,
                         moe_imbalance=np.tile(skew[pre_i], 2), power_cap_w=options.device_power_cap_w,
                         expert_balance=options.expert_balance, backend=serving_backend(options.framework),
                         mtp_draft_tokens=options.mtp_draft_tokens, mtp_acceptance=options.mtp_acceptance)
        placed = list(itertools.product(places, weight_places))
        decodes = estimate_serving_placed(spec, machine, plan, ServeWorkload(
            stacked((demand.input_len.p50, demand.input_len.p90), n_grid),
            stacked((2 * demand.output_len.p50, 2 * demand.output_len.p90), n_grid)), placed, phases=("decode",))
        d50, d90 = np.arange(n_grid), n_grid + np.arange(n_grid)
        # Where the decode batch fits in some place, and meets the TPOT targets there: a mixed step is never
        # faster than the decode step it extends (its TPOT at least T_d), so no other row can.
        fits = np.logical_or.reduce([dec.feasible[d90] & (dec.tpot_s[d50] <= (demand.tpot_p50 or np.inf))
                                     & (dec.tpot_s[d90] <= (demand.tpot_p90 or np.inf)) for dec in decodes])
        keeps, mixed_all = _mixed_steps(spec, machine, plan, grid, fits, np.tile(skew[pre_i], 2), demand, options,
                                        placed)
        new_prompt = {q: (1.0 - demand.cached_share) * n for q, n in ((50, demand.input_len.p50),
                                                                   (90, demand.input_len.p90))}
        for k, ((place, w_place), dec) in enumerate(zip(placed, decodes)):
            pre = prefill[w_place]
            # Separate prompt batches (chunk 0), then each chunk size's rows.
            variants = [(0, np.arange(n_grid), pre.ttft_s[p50], pre.ttft_s[p90], 0.0, 0.0)]
            start = 0
            for c, keep in keeps.items():
                mix, m = mixed_all[k], len(keep)
                step50, step90 = mix.mixed_step_s[start:start + m], mix.mixed_step_s[start + m:start + 2 * m]
                carried = mix.chunk_prompt_tokens[start:start + m]
                start += 2 * m
                variants.append((c, keep, new_prompt[50] / carried * step50, new_prompt[90] / carried * step90,
                                 step50, step90))
            for c, keep, service50, service90, mixed50, mixed90 in variants:
                g, j50, j90, q50, q90 = grid[keep], d50[keep], d90[keep], p50[keep], p90[keep]
                for name, values in (("tp", g[:, 0]), ("pp", g[:, 1]), ("dpa", g[:, 2]), ("ep", g[:, 3]),
                                     ("batch", g[:, 4]), ("devices", g[:, 0] * g[:, 1] * g[:, 2]),
                                     ("prefill_s50", service50), ("prefill_s90", service90),
                                     ("tpot50", dec.tpot_s[j50]), ("tpot90", dec.tpot_s[j90]),
                                     ("hbm", dec.hbm_used_bytes[j90]), ("power_w", dec.power_w[j50]),
                                     ("prefill_power_w", pre.prefill_power_w[q50]),
                                     ("feasible_decode", dec.feasible[j90]),
                                     ("feasible_prefill", pre.feasible[q90] & (c == 0)),
                                     # Relative half-widths of the prediction intervals (Machine.interval).
                                     ("ttft_error", _half_width(pre.ttft_range_s, pre.ttft_s)[q90]),
                                     ("tpot_error", _half_width(dec.tpot_range_s, dec.tpot_s)[j90]),
                                     ("chunk", np.full(len(keep), float(c))),
                                     ("mixed50", np.broadcast_to(mixed50, len(keep))),
                                     ("mixed90", np.broadcast_to(mixed90, len(keep)))):
                    rows[name].append(np.asarray(values))
                for name, value in (("wp", wp), ("ap", ap), ("kvp", kvp), ("kv_place", place), ("w_place", w_place)):
                    rows[name].append((value, len(keep)))       # a name per block, repeated once at the end
            for b in dec.binding[d90][~dec.feasible[d90]].tolist():
                counter[f"instance: {b}"] = counter.get(f"instance: {b}", 0) + 1
    return {k: (np.zeros(0) if not v else np.repeat(np.array([n for n, _ in v], dtype=object), [c for _, c in v])
                if isinstance(v[0], tuple) else np.concatenate(v)) for k, v in rows.items()}


def _mixed_steps(spec, machine: Machine, plan: ServePlan, grid, fits, skew, demand: Demand,
                 options: ServeSearchOptions, placed) -> tuple[dict, list | None]:
    """Colocated instances that mix prompt chunks into their decode steps: the decode grid's rows each
    chunk size applies to ({size: row indices}) and their mixed steps at every place, both quantiles'
    rows of every size in one evaluation (p50 then p90 rows per size). A size applies where the decode
    batch fits in some place and leaves it prompt tokens, without pipeline stages (an engine's pipeline
    runs a batch per stage, each with its own chunk: not modelled) and without multi-token prediction
    (its draft steps are not mixed)."""
    chunks = [c for c in options.chunk_tokens if c > 0] \
        if "colocated" in options.modes and not options.mtp_draft_tokens else []
    keeps = {c: np.flatnonzero(fits & (c > grid[:, 4] / grid[:, 2]) & (grid[:, 1] == 1)) for c in chunks}
    keeps = {c: keep for c, keep in keeps.items() if len(keep)}
    if not keeps:
        return {}, None
    n_grid = len(grid)
    rows = np.concatenate([np.concatenate([keep, n_grid + keep]) for keep in keeps.values()])
    both = np.tile(grid, (2, 1))[rows]
    sizes = np.concatenate([np.full(2 * len(keep), float(c)) for c, keep in keeps.items()])

    def lengths(p50, p90):
        return np.concatenate([np.repeat(np.array([p50, p90], dtype=float), len(keep)) for keep in keeps.values()])
    return keeps, estimate_serving_placed(spec, machine, replace(
        plan, tp=both[:, 0], pp=both[:, 1], dp_attention=both[:, 2], ep=both[:, 3], batch=both[:, 4],
        moe_imbalance=skew[rows], chunk_tokens=sizes), ServeWorkload(
        lengths(demand.input_len.p50, demand.input_len.p90),
        lengths(2 * demand.output_len.p50, 2 * demand.output_len.p90),
        lengths(demand.cached_share * demand.input_len.p50, demand.cached_share * demand.input_len.p90)),
        placed, phases=("mixed",))


def _fewest(ok, rows: int, upper: int, lower=None) -> np.ndarray:
    """Smallest count in [1, upper] for which ``ok(count, rows)`` holds, per row; 0 where even
    ``upper`` fails. ``ok(n, idx)`` says, for the rows ``idx``, whether ``n[i]`` instances meet the
    targets.

    Assumes ``ok`` is monotone in the count (more instances never break a target: the load K / n
    falls, and the M/M/c wait falls with the servers); the answer is then the same as bisecting
    [1, upper]. ``lower`` (optional, per row) is a count below which ``ok`` is known to fail (the
    stability bound), where the search starts: it gallops upward from there, probing lower,
    lower + 1, lower + 3, lower + 7, ... (exponential search; Bentley and Yao, "An almost optimal
    algorithm for unbounded searching", Inf. Proc. Lett. 5(3), 1976) until a probe holds, then
    bisects inside the bracket, each step only on the rows still open. Rows near their bound
    settle in a few probes instead of log2(upper) full passes."""
    all_rows = np.arange(rows)
    feasible = ok(np.full(rows, upper, dtype=np.int64), all_rows)
    lo = np.ones(rows, dtype=np.int64) if lower is None else \
        np.clip(np.asarray(lower, dtype=np.int64), 1, upper)
    hi = np.full(rows, upper, dtype=np.int64)      # ok(hi) holds wherever feasible
    # Galloping: ok fails below lo; probe lo + step - 1 with the step doubling.
    open_ = all_rows[feasible & (lo < hi)]
    step = 1
    while len(open_):
        probe = np.minimum(lo[open_] + (step - 1), hi[open_])
        good = ok(probe, open_)
        hi[open_[good]] = probe[good]
        lo[open_[~good]] = probe[~good] + 1
        open_ = open_[~good & (lo[open_] < hi[open_])]
        step *= 2
    # Bisection inside [lo, hi]: ok fails below lo and holds at hi.
    open_ = all_rows[feasible & (lo < hi)]
    while len(open_):
        mid = (lo[open_] + hi[open_]) // 2
        good = ok(mid, open_)
        hi[open_[good]] = mid[good]
        lo[open_[~good]] = mid[~good] + 1
        open_ = open_[lo[open_] < hi[open_]]
    return np.where(feasible, hi, 0)


def _sizes(cols, demand: Demand, role: str, slo: dict, max_instances: int):
    """Fewest instances per configuration meeting the SLOs in ``role``, with the pool's latencies."""
    lam, out_mean = demand.rate, demand.output_len.mean
    keys = ("batch", "dpa", "prefill_s50", "prefill_s90", "tpot50", "tpot90")

    def latencies(n, quantiles=(0.5, 0.9), rows=slice(None), exact=True):
        return pool_latencies(role, n, lam, out_mean, *(cols[k][rows] for k in keys), quantiles,
                              cols["mixed50"][rows], cols["mixed90"][rows], exact)

    # The quantiles the targets ask for (p90 always: it also decides whether the queue is stable).
    asked = (0.9,) + ((0.5,) if slo["ttft_p50"] is not None else ())

    def ok(n, rows):
        # Every target holds where it holds with the waits' upper bound (Erlang C's, cheap); the wait
        # is computed exactly only on the rows where the TTFT alone fails under that bound (no other
        # target depends on the wait): the same answer, sooner.
        others, ttft_ok = meets(n, rows, role == "decode")    # a decode pool waits for no prompt: exact already
        unsure = np.flatnonzero(others & ~ttft_ok) if role != "decode" else ()
        if len(unsure):
            ttft_ok[unsure] = meets(n[unsure], rows[unsure], True)[1]
        return others & ttft_ok

    def meets(n, rows, exact):
        """(every target but the TTFT's holds, the TTFT's holds) for n instances of the rows."""
        ttft, tpot50, tpot90, load, in_flight = latencies(n, asked, rows, exact)
        others = load < 1.0
        ttft_ok = np.ones(len(others), dtype=bool)
        if role != "decode":
            ttft_ok &= np.isfinite(ttft[0.9])
            if slo["ttft_p50"] is not None:
                ttft_ok &= ttft[0.5] <= slo["ttft_p50"]
            if slo["ttft_p90"] is not None:
                ttft_ok &= ttft[0.9] <= slo["ttft_p90"]
        if role != "prefill":
            others &= in_flight <= cols["batch"][rows]      # a slot for every sequence in flight
            if slo["tpot_p50"] is not None:
                others &= tpot50 <= slo["tpot_p50"]
            if slo["tpot_p90"] is not None:
                others &= tpot90 <= slo["tpot_p90"]
        return others, ttft_ok

    n = _fewest(ok, len(cols["batch"]), max_instances, _stability_bound(cols, lam, out_mean, role))
    ttft, tpot50, tpot90, _, _ = latencies(np.maximum(n, 1))
    return n, ttft[0.5], ttft[0.9], tpot50, tpot90


def _stability_bound(cols, rate: float, output_mean: float, role: str) -> np.ndarray:
    """The smallest count that may be stable: a pool of n instances runs at load K / n
    (perfmodel.queueing.pool_shares) and needs load < 1, so n > K, i.e. n >= floor(K) + 1. K is
    lowered by a relative margin of 1e-9 first, so that float rounding of the load never puts the
    bound above the true smallest count (``_fewest`` starts its search there)."""
    with np.errstate(all="ignore"):
        k = np.add(*pool_shares(role, 1.0, rate, output_mean, cols["batch"], cols["dpa"], cols["prefill_s50"],
                                cols["tpot50"], cols["mixed50"])) * np.ones(len(cols["batch"]))
        k = np.where(np.isfinite(k), k * (1.0 - 1e-9), 0.0)
    return np.floor(np.clip(k, 0.0, float(MAX_INSTANCES))).astype(np.int64) + 1


def slo_of(demand: Demand) -> dict:
    return {"ttft_p50": demand.ttft_p50, "ttft_p90": demand.ttft_p90, "tpot_p50": demand.tpot_p50,
            "tpot_p90": demand.tpot_p90}


@dataclass(frozen=True)
class PoolOptions:
    """Every non-dominated pool option of every candidate system, sized to its SLOs."""

    options: tuple[PoolOption, ...]
    machines: dict[str, Machine]
    counter: dict[str, int]       # instance configurations failing, by what fails
    configurations: int
    feasible: int
    fastest: dict | None = None   # the best TPOT p90 and prefill p90 any instance that fits reaches


def pool_options(spec: TransformerSpec, db: Database, systems: list[str], demand: Demand,
                 options: ServeSearchOptions, progress=None) -> PoolOptions:
    """Evaluate every instance configuration of every system and size each role's pools;
    ``progress`` is called with the number of systems evaluated."""
    slo = slo_of(demand)
    counter: dict[str, int] = {}
    options_list: list[PoolOption] = []
    configurations = feasible_configs = 0
    machines = {}
    fastest: dict = {}
    limits = dict(options.limits)
    for k, name in enumerate(systems):
        max_devices = min(options.max_devices or 10_000_000, limits.get(name, 10_000_000))
        if progress is not None and k:
            progress(k)
        base = db.system(name)
        # Size the system to what a fleet may use: the device limit, or a generous default.
        devices = min(max_devices, max(base.devices, options.max_instance_devices))
        machine = build_machine(db, name, devices - devices % base.devices_per_node or base.devices_per_node,
                                options.pricing, options.prices)
        machines[name] = machine
        cols = _evaluate_system(spec, machine, demand, options, counter)
        if not len(cols.get("tp", [])):
            continue
        configurations += len(cols["tp"])
        for key, ok, value in (("tpot_p90", cols["feasible_decode"], cols["tpot90"]),
                               ("prefill_p90", cols["feasible_prefill"], cols["prefill_s90"])):
            if ok.any():
                fastest[key] = min(fastest.get(key, np.inf), float(value[ok].min()))
        price = _device_hour_usd(machine, cols["power_w"])
        for role in (("colocated",) if "colocated" in options.modes else ()) + \
                (("prefill", "decode") if "disaggregated" in options.modes else ()):
            added, n_fit, n_unfit = _pool_options(role, name, machine.accelerator.name, cols, price, demand, slo,
                                                  options, max_devices)
            options_list += added
            feasible_configs += n_fit
            if n_unfit:
                key = f"{role}: SLO or rate not met by any instance count"
                counter[key] = counter.get(key, 0) + n_unfit
    return PoolOptions(tuple(options_list), machines, counter, configurations, feasible_configs, fastest)


def _device_hour_usd(machine: Machine, power_w):
    from perfmodel.economics import run_cost

    cost = run_cost(machine, power_w)
    return None if np.all(np.isnan(cost)) else cost


def _pool_options(role, system, accelerator, cols, price, demand, slo, options, max_devices
                  ) -> tuple[list[PoolOption], int, int]:
    """Pool options of one role on one system: every configuration sized to its fewest instances,
    then pruned to those no option of the same group (instance size, KV precision) beats on what
    matters: objective and TTFT for prefill and colocated pools (the TTFT leaves the KV hand-over
    its slack), objective and devices for decode pools (and power under a power cap: what the fleet
    program trades)."""
    feasible = cols["feasible_prefill"] if role == "prefill" else cols["feasible_decode"]
    if role == "prefill":
        # A prefill pool's decode batch plays no part: one row per layout and precision (one
        # prompt per attention rank), KV in HBM.
        feasible = feasible & (cols["batch"] == cols["dpa"]) & (cols["kv_place"] == "hbm")
    if role != "colocated":        # only a colocated instance mixes prompt chunks into its decode steps
        feasible = feasible & (cols["chunk"] == 0)
    elif 0 not in options.chunk_tokens:   # its prompts only as chunks (the framework's scheduler)
        feasible = feasible & (cols["chunk"] > 0)
    idx = np.flatnonzero(feasible)
    if not len(idx):
        return [], 0, 0
    sub = {k: v[idx] for k, v in cols.items()}
    n, t50, t90, p50, p90 = _sizes(sub, demand, role, slo, MAX_INSTANCES)
    devices = n * sub["devices"]
    fits = (n > 0) & (devices <= max_devices)
    usd = devices * price[idx] if price is not None else np.full(len(idx), np.inf)
    power = devices * sub["prefill_power_w" if role == "prefill" else "power_w"]
    if options.objective == "latency":
        measures = _latency_measures(role, sub, n, price[idx] if price is not None else None, options)
    else:
        value = {"cost": usd, "energy": power, "devices": devices + power * 1e-9}[options.objective]
        value = np.nan_to_num(value, nan=np.inf)
        # A decode option trades its objective and devices (and power, when power is capped).
        measures = [value, t90] if role != "decode" else [value, devices * 1.0] + (
            [power] if options.power_cap_w is not None and options.objective != "energy" else [])
        if options.owned and role != "decode":
            measures.append(devices * 1.0)   # owned devices discount the larger option more
    kept = []
    # Groups by (KV precision, instance devices); under --objective latency also by whether prompts
    # ride in mixed steps: a colocated instance's latency takes one form with prompts in batches of
    # their own and another with them in mixed steps (perfmodel.queueing), so options compare only
    # within one form. Groups are visited in the order of their names ('fp8|8', 'fp8|8|mixed').
    mixed = (sub["chunk"] > 0) if options.objective == "latency" else np.zeros(len(sub["devices"]), dtype=bool)
    kv_names, kv = sorted_distinct(sub["kvp"])
    size_names, size = sorted_distinct(sub["devices"].astype(np.int64))
    group = (kv * len(size_names) + size) * 2 + mixed
    name = {g: f"{kv_names[g // 2 // len(size_names)]}|{size_names[g // 2 % len(size_names)]}"
            + ("|mixed" if g % 2 else "") for g in set(group[fits].tolist())}
    for g in sorted(name, key=name.__getitem__):
        members = np.flatnonzero(fits & (group == g))
        kept += members[pareto_front(np.stack([m[members] for m in measures], axis=1))].tolist()
    out = []
    for j in kept:
        k = idx[j]
        out.append(PoolOption(
            role=role, system=system, accelerator=accelerator, instances=int(n[j]),
            devices_per_instance=int(sub["devices"][j]), power_w=float(power[j]),
            usd_per_hour=float(usd[j]) if np.isfinite(usd[j]) else None,
            ttft_p50_s=float(t50[j]), ttft_p90_s=float(t90[j]), tpot_p50_s=float(p50[j]), tpot_p90_s=float(p90[j]),
            ttft_error=float(cols["ttft_error"][k]), tpot_error=float(cols["tpot_error"][k]),
            # What ``perfmodel estimate serve`` prints for this configuration: the prefill of one p90
            # prompt per attention rank, and the decode step at full batch and the p90 context.
            prefill_p90_s=float(sub["prefill_s90"][j]), step_p90_s=float(sub["tpot90"][j]),
            hbm_used_bytes=float(cols["hbm"][k]), requests_per_s_per_instance=demand.rate / int(n[j]),
            # The unloaded times the queueing model starts from (search.fastest re-sizes pools with them).
            queue=QueueInputs(demand.output_len.mean, int(sub["batch"][j]), int(sub["dpa"][j]),
                              *(float(sub[key][j]) for key in ("prefill_s50", "prefill_s90", "tpot50", "tpot90",
                                                                "mixed50", "mixed90"))),
            config=InstanceConfig(
                tp=int(cols["tp"][k]), pp=int(cols["pp"][k]), ep=int(cols["ep"][k]), dp_attention=int(cols["dpa"][k]),
                batch=int(cols["batch"][k]), weight_precision=str(cols["wp"][k]),
                activation_precision=str(cols["ap"][k]), kv_precision=str(cols["kvp"][k]),
                kv_place=str(cols["kv_place"][k]), weight_place=str(cols["w_place"][k]),
                chunk_tokens=int(cols["chunk"][k]))))
    return out, int(fits.sum()), int((~fits).sum())


def _latency_measures(role: str, sub: dict, n, price, options: ServeSearchOptions) -> list:
    """What a pool option's latency on a fixed fleet rises with (``--objective latency``), so that
    pruning an option another beats in every one of them is exact (search.fastest): the unloaded
    prefill times (the M/M/c wait grows with the service time), fewer attention ranks per instance
    (fewer servers), the unloaded step times, a smaller batch (a larger share of a colocated
    instance's time), the fewest instances meeting the targets, and an instance's power and price
    when they are limited."""
    power = sub["prefill_power_w" if role == "prefill" else "power_w"]
    per_instance = [sub["devices"] * power] if options.power_cap_w is not None else []
    if options.budget_usd_per_hour is not None:
        per_instance.append(np.nan_to_num(sub["devices"] * price, nan=np.inf) if price is not None
                            else np.full(len(n), np.inf))
    prefill = [sub["prefill_s50"], sub["prefill_s90"], -sub["dpa"]]
    decode = [sub["tpot90"], n * 1.0]
    if role == "decode":
        return decode + per_instance
    if role == "prefill":
        return prefill + [n * 1.0] + per_instance
    # In mixed steps the TTFT's floor and the TPOT's stretch rise with the mixed step (compared only
    # among options of one form: _pool_options' groups).
    return prefill + [sub["tpot50"], sub["tpot90"], -sub["batch"], n * 1.0, sub["mixed50"], sub["mixed90"]] \
        + per_instance


def expert_skew(spec, machine, options, eps) -> np.ndarray:
    """Per EP degree: the busiest over mean EP device load of the ``--routing`` statistics placed
    by EPLB (search.placement.imbalance_table), or 0 without statistics: the serving estimate then
    computes it from the default routing of each pass's tokens (perfmodel.serving._skew)."""
    eps = np.asarray(eps, dtype=float)
    if options.routing is None or not spec.moe:
        return np.zeros(len(eps))
    table = imbalance_table(options.routing, eps, machine.constants.moe_redundant_expert_share,
                            options.expert_balance)
    return np.vectorize(table.get, otypes=[float])(eps.astype(int))
