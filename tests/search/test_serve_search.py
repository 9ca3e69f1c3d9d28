"""Serving search: the queueing formulas, the fleet program against brute force, and the command."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfmodel.catalog import find_model
from perfmodel.search.brute import brute_force_fleet
from perfmodel.search import fleet
from perfmodel.search.options import Demand, Lengths, ServeSearchOptions
from perfmodel.search.pool_option import InstanceConfig, PoolOption, QueueInputs
from perfmodel.search.serve import fleet_instance, search_serving
from perfmodel.search.serve_pools import pool_options, slo_of


SMALL = ServeSearchOptions(weight_precisions=("fp8",), activation_precisions=("a8",), kv_precisions=("fp8",),
                           kv_offload=False, batches=(8, 32, 128), max_instance_devices=8)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rate=st.sampled_from([0.5, 2.0, 8.0, 20.0]), objective=st.sampled_from(["cost", "energy", "devices"]),
       tpot_ms=st.sampled_from([30.0, 60.0]), max_devices=st.sampled_from([None, 24]),
       budget=st.sampled_from([None, 40.0]))
def test_fleet_program_matches_brute_force(db, rate, objective, tpot_ms, max_devices, budget):
    """For every objective, the program's fleet passes the checker and equals the best of every
    fleet the instance allows (brute force, judged by the same checker)."""
    spec = find_model("llama-3.1-8b")
    demand = Demand(rate=rate, input_len=Lengths.of(1024), output_len=Lengths.of(256), ttft_p90=1.0,
                    tpot_p90=tpot_ms / 1e3)
    options = ServeSearchOptions(**{**vars(SMALL), "objective": objective, "max_devices": max_devices,
                                    "budget_usd_per_hour": budget})
    pools = pool_options(spec, db, ["dgx-h100", "mi300x-8x"], demand, options)
    decode = [o for o in pools.options if o.role == "decode"]
    if len(decode) > 5:  # keep the oracle's product small: the program sees the same options
        keep = sorted(decode, key=lambda o: o.power_w)[:5]
        pools = replace(pools, options=tuple(o for o in pools.options if o.role != "decode") + tuple(keep))
    instance, _ = fleet_instance(spec, demand, pools.options, pools.machines, slo_of(demand), options)
    expected = brute_force_fleet(instance)
    # Both exact solvers: the integer program always, the covering program where it applies.
    solvers = [fleet.solve_program] + ([fleet.solve_by_covering] if max_devices is None and budget is None else [])
    for solve in solvers:
        best = solve(instance)
        if not np.isfinite(expected):
            assert best is None
            continue
        assert fleet.check(instance, best) == []
        assert best.status == "OPTIMAL" and best.gap < 1e-6
        assert fleet.totals(instance, best).objective == pytest.approx(expected, rel=1e-7)
    assert fleet.solve(instance).method == (fleet.COVERING if len(solvers) == 2 else fleet.PROGRAM) \
        if np.isfinite(expected) else True


# What the fleet program does not read (latencies, queue, configuration): the same for every option.
UNREAD = PoolOption(role="colocated", system="s", accelerator="a", instances=1, devices_per_instance=1, power_w=0.0,
                    usd_per_hour=None, ttft_p50_s=0.0, ttft_p90_s=0.0, tpot_p50_s=0.0, tpot_p90_s=0.0,
                    ttft_error=0.0, tpot_error=0.0, prefill_p90_s=0.0, step_p90_s=0.0, hbm_used_bytes=0.0,
                    requests_per_s_per_instance=1.0, queue=QueueInputs(1.0, 1, 1, 0.0, 0.0, 0.0, 0.0),
                    config=InstanceConfig(1, 1, 1, 1, 1, "bf16", "a16", "bf16", "hbm", "hbm", 0))


def _option(role, instances, devices_per_instance, power_w, usd):
    return replace(UNREAD, role=role, instances=instances, devices_per_instance=devices_per_instance,
                   power_w=power_w, usd_per_hour=usd)


def test_capacity_is_exact_not_rounded_down():
    """Three instances each carrying a third of the rate carry all of it (the issue's 7 x 2.857
    req/s read as less than 20 by a rounded-down capacity)."""
    opts = (_option("prefill", 1, 1, 1000.0, 1.0), _option("decode", 3, 1, 3000.0, 3.0),
            _option("decode", 7, 1, 7700.0, 7.7))
    instance = fleet.FleetInstance(options=opts, objective="devices", handover=((0, 1, 0.0), (0, 2, 0.0)))
    assert fleet.check(instance, fleet.FleetSolution(0, ((1, 3),))) == []
    assert fleet.check(instance, fleet.FleetSolution(0, ((1, 2),))) != []       # two thirds of the rate
    assert fleet.check(instance, fleet.FleetSolution(0, ((1, 2), (2, 3)))) == []  # 2/3 + 3/7 >= 1
    for solve in (fleet.solve_program, fleet.solve_by_covering):
        best = solve(instance)
        assert best.decode == ((1, 3),) and fleet.totals(instance, best).devices == 4
        assert brute_force_fleet(instance) == pytest.approx(fleet.totals(instance, best).objective)


@pytest.mark.parametrize("objective", ["cost", "energy", "devices"])
def test_covering_program_matches_brute_force_on_mixed_decode_counts(objective):
    """Decode options of co-prime instance counts (3, 5, 7: 105 rate units), only some taking each
    prefill option's KV: the covering program's fleet equals brute force and the integer program."""
    opts = (_option("prefill", 2, 2, 900.0, 6.0), _option("prefill", 1, 8, 2500.0, 20.0),
            _option("decode", 3, 1, 3000.0, 3.3), _option("decode", 5, 2, 4500.0, 8.0),
            _option("decode", 7, 1, 6300.0, 6.5), _option("colocated", 4, 8, 30000.0, 70.0))
    instance = fleet.FleetInstance(options=opts, objective=objective,
                                   handover=((0, 2, 0.0), (0, 3, 0.0), (1, 3, 0.0), (1, 4, 0.0)))
    covering, program = fleet.solve_by_covering(instance), fleet.solve_program(instance)
    assert fleet.check(instance, covering) == [] and covering.method == fleet.COVERING
    value = fleet.totals(instance, covering).objective
    assert value == pytest.approx(brute_force_fleet(instance), rel=1e-12)
    assert value == pytest.approx(fleet.totals(instance, program).objective, rel=1e-6)


def test_no_listed_fleet_beats_the_best(db):
    """The issue's case: the fewest-devices fleet is never beaten by a fleet the output lists."""
    spec = find_model("llama-3.1-70b")
    demand = Demand(rate=20.0, input_len=Lengths.of(2048), output_len=Lengths.of(512), ttft_p90=2.0, tpot_p90=0.05)
    for objective in ("devices", "energy", "cost"):
        result = search_serving(spec, db, ["mi300x-8x", "dgx-h100"], demand, ServeSearchOptions(objective=objective))
        key = {"devices": lambda d: d.devices + d.power_w * 1e-9, "energy": lambda d: d.power_w,
               "cost": lambda d: d.usd_per_hour if d.usd_per_hour is not None else np.inf}[objective]
        assert result.evidence.status == "OPTIMAL"
        for listed in result.top + result.pareto:
            assert key(result.best) <= key(listed) * (1 + 1e-9), objective


def test_deployment_meets_its_targets(db):
    spec = find_model("llama-3.1-70b")
    demand = Demand(rate=5.0, input_len=Lengths.of(2048, 1500, 4096), output_len=Lengths.of(256, 200, 512),
                    ttft_p90=2.0, tpot_p90=0.05)
    result = search_serving(spec, db, ["dgx-h100", "mi300x-8x"], demand, ServeSearchOptions(objective="energy"))
    best = result.best
    assert best is not None and result.evidence.status == "OPTIMAL"
    assert best.ttft_p90_s <= 2.0 and best.tpot_p90_s <= 0.05
    assert sum(p.requests_per_s for p in best.pools if p.role != "prefill") >= 5.0 * (1 - 1e-6)
    keys = lambda d: np.array([d.usd_per_million_tokens or 0.0, d.ttft_p90_s + 256 * d.tpot_p90_s,  # noqa: E731
                               d.joules_per_token])
    for a in result.pareto:
        assert not any(np.all(keys(b) <= keys(a)) and np.any(keys(b) < keys(a)) for b in result.pareto)
    # Per output token, as every estimate reports it: the fleet's IT power (its pools' sum) times the
    # facility's PUE, and its hourly cost, over the output tokens it serves (the mean output length).
    pue, tokens_per_s = db.constant("pue"), 5.0 * 256
    for d in [best, *result.top, *result.pareto]:
        assert d.power_w == pytest.approx(sum(p.power_w for p in d.pools), rel=1e-12)
        assert d.joules_per_token == pytest.approx(d.power_w * pue / tokens_per_s, rel=1e-12)
        assert d.usd_per_million_tokens == pytest.approx(d.usd_per_hour / 3600.0 / tokens_per_s * 1e6, rel=1e-12)


def test_impossible_targets_exit_as_infeasible(db):
    from perfmodel.hardware_db.errors import InfeasibleError
    from perfmodel.search.serve import raise_if_infeasible

    spec = find_model("llama-3.1-70b")
    demand = Demand(rate=5.0, input_len=Lengths.of(2048), output_len=Lengths.of(256), ttft_p90=0.001, tpot_p90=0.0001)
    result = search_serving(spec, db, ["dgx-h100"], demand, ServeSearchOptions(objective="energy"))
    with pytest.raises(InfeasibleError, match="no deployment meets"):
        raise_if_infeasible(result)


# --- the fastest deployment on a given fleet (--objective latency) ---------------------------------

def _brute_fastest(instance) -> float:
    """The lowest latency of every fleet the options allow: every count of every colocated option, every
    split of the fleet between every compatible prefill and decode option (no monotonicity assumed)."""
    from perfmodel.search import fastest

    opts, best = instance.options, np.inf
    for i, o in enumerate(opts):
        if o.role != "colocated":
            continue
        for n in range(o.instances, instance.max_devices // o.devices_per_instance + 1):
            t50, t90, p50, p90, _ = fastest.latencies(o, n, instance.rate)
            solution = fastest.FastestSolution(i, n, latency_s=float(t90 + instance.output_mean * p90))
            if not fastest.check(instance, solution):
                best = min(best, solution.latency_s)
    for p, d, kv in instance.handover:
        op, od = opts[p], opts[d]
        for nd in range(od.instances, instance.max_devices // od.devices_per_instance + 1):
            room = instance.max_devices - nd * od.devices_per_instance
            for n in range(op.instances, room // op.devices_per_instance + 1):
                t90 = float(fastest.latencies(op, n, instance.rate)[1])
                p90 = float(fastest.latencies(od, nd, instance.rate)[3])
                solution = fastest.FastestSolution(p, n, d, nd, kv, t90 + kv + instance.output_mean * p90)
                if not fastest.check(instance, solution):
                    best = min(best, solution.latency_s)
    return best


@pytest.mark.parametrize("rate, max_devices", [(2.0, 8), (8.0, 16), (20.0, 24)])
def test_fastest_deployment_matches_brute_force(db, rate, max_devices):
    """--objective latency: the enumeration's fleet passes both checkers and equals the best of every
    count and every split of the fleet (brute force over the same options)."""
    from perfmodel.search import fastest
    from perfmodel.search.serve import _kv_ok

    spec = find_model("llama-3.1-8b")
    demand = Demand(rate=rate, input_len=Lengths.of(2048), output_len=Lengths.of(256), ttft_p90=1.0, tpot_p90=0.05)
    options = ServeSearchOptions(**{**vars(SMALL), "objective": "latency", "max_devices": max_devices})
    pools = pool_options(spec, db, ["dgx-h100"], demand, options)
    opts = pools.options
    handover = tuple((p, d, _kv_ok(spec, demand, opts[p], opts[d], pools.machines, slo_of(demand))[1])
                     for p, op in enumerate(opts) for d, od in enumerate(opts)
                     if op.role == "prefill" and od.role == "decode" and op.kv_precision == od.kv_precision)
    instance = fastest.FastestInstance(tuple(opts), rate, 256.0, slo_of(demand), max_devices, handover=handover)
    found = fastest.solve(instance)
    assert found and fastest.check(instance, found[0]) == []
    assert found[0].latency_s == pytest.approx(_brute_fastest(instance), rel=1e-9)
    result = search_serving(spec, db, ["dgx-h100"], demand, options)
    assert result.evidence.status == "OPTIMAL" and result.best.devices <= max_devices
    assert result.best.latency_s == pytest.approx(found[0].latency_s, rel=1e-9)
    assert all(d.latency_s >= result.best.latency_s for d in result.top + result.pareto)


def test_latency_pruning_loses_nothing(db, monkeypatch):
    """The pool options --objective latency drops are beaten in every parameter its latency rises with:
    searching every option (no pruning at all) finds no faster fleet."""
    from perfmodel.search import serve_pools

    spec = find_model("llama-3.1-8b")
    demand = Demand(rate=6.0, input_len=Lengths.of(4096), output_len=Lengths.of(512), ttft_p90=1.5, tpot_p90=0.04)
    options = ServeSearchOptions(**{**vars(SMALL), "objective": "latency", "max_devices": 16})
    pruned = search_serving(spec, db, ["dgx-h100"], demand, options)
    monkeypatch.setattr(serve_pools, "pareto_front", lambda rows: np.arange(len(rows)))
    everything = search_serving(spec, db, ["dgx-h100"], demand, options)
    assert everything.evidence.pool_options > pruned.evidence.pool_options
    assert pruned.best.latency_s == pytest.approx(everything.best.latency_s, rel=1e-12)


def test_the_fastest_fleet_is_at_least_as_fast_as_the_cheapest_on_the_same_devices(db):
    """Any fleet within the device limit is a candidate of the latency search: the cheapest one too."""
    spec = find_model("llama-3.1-8b")
    demand = Demand(rate=10.0, input_len=Lengths.of(2048), output_len=Lengths.of(256), ttft_p90=1.0, tpot_p90=0.05)
    cheapest = search_serving(spec, db, ["dgx-h100"], demand, ServeSearchOptions(**{**vars(SMALL), "max_devices": 16}))
    fastest = search_serving(spec, db, ["dgx-h100"], demand,
                             ServeSearchOptions(**{**vars(SMALL), "objective": "latency", "max_devices": 16}))
    assert fastest.best.latency_s <= cheapest.best.latency_s * (1 + 1e-12)
    assert fastest.best.devices <= 16


def test_latency_objective_needs_a_fleet():
    from perfmodel.cli.app import main

    assert main(["plan", "serve", "--objective", "latency"]) == 2


# --- the most requests a given fleet carries (--objective throughput) --------------------------------

@pytest.mark.parametrize("start, max_devices", [(1.0, 8), (400.0, 8), (5.0, 16)])
def test_capacity_brackets_the_rate_the_fleet_carries(db, start, max_devices):
    """--objective throughput: the serving search finds a deployment within the fleet at the carried rate
    and none at the rate not carried, the two within 1% of each other, whether the bisection starts
    below the capacity or above it; the result is that search's deployment at the carried rate."""
    spec = find_model("llama-3.1-8b")
    demand = Demand(rate=start, input_len=Lengths.of(2048), output_len=Lengths.of(256), ttft_p90=1.0, tpot_p90=0.05)
    options = ServeSearchOptions(**{**vars(SMALL), "objective": "throughput", "max_devices": max_devices})
    result = search_serving(spec, db, ["dgx-h100"], demand, options)
    carried, not_carried = result.capacity
    assert carried < not_carried <= carried * 1.01 + 1e-12
    devices = ServeSearchOptions(**{**vars(SMALL), "objective": "devices", "max_devices": max_devices})
    at = {rate: search_serving(spec, db, ["dgx-h100"], Demand(**{**vars(demand), "rate": rate}), devices)
          for rate in (carried, not_carried)}
    assert at[carried].best is not None and at[carried].best.devices <= max_devices
    assert at[not_carried].best is None
    assert result.best.devices == at[carried].best.devices and result.best.pools[0].requests_per_s == carried


def test_a_larger_fleet_carries_at_least_as_much(db):
    spec = find_model("llama-3.1-8b")
    demand = Demand(rate=10.0, input_len=Lengths.of(2048), output_len=Lengths.of(256), ttft_p90=1.0, tpot_p90=0.05)
    carried = [search_serving(spec, db, ["dgx-h100"], demand, ServeSearchOptions(
        **{**vars(SMALL), "objective": "throughput", "max_devices": n})).capacity[0] for n in (4, 8, 16)]
    assert carried[0] <= carried[1] * 1.01 and carried[1] <= carried[2] * 1.01 and carried[2] > carried[0]


def test_capacity_per_device_and_per_pool_account_for_every_token(capsys):
    """The JSON capacity block: tokens per second per device over the fleet, and for a disaggregated fleet
    per prefill and per decode device, each times its devices giving the carried rate's tokens."""
    import json

    from perfmodel.cli.app import main

    argv = ["plan", "serve", "--model", "deepseek-v3", "--system", "hgx-h200", "--max-devices", "16", "--objective",
            "throughput", "--input-len", "2048", "--output-len", "512", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    cap, best = doc["capacity"], doc["best"]
    pools = {p["role"]: p["devices"] for p in best["pools"]}
    rate = cap["requests_per_s"]
    assert cap["output_tokens_per_s_per_device"] * best["devices"] == pytest.approx(rate * 512, rel=1e-12)
    assert cap["prompt_tokens_per_s_per_device"] * best["devices"] == pytest.approx(rate * 2048, rel=1e-12)
    assert "decode" in pools
    assert cap["output_tokens_per_s_per_decode_device"] * pools["decode"] == pytest.approx(rate * 512, rel=1e-12)
    assert cap["prefilled_tokens_per_s_per_prefill_device"] * pools["prefill"] == pytest.approx(rate * 2048, rel=1e-12)


def test_throughput_objective_needs_a_fleet_and_compares_no_fleets():
    from perfmodel.cli.app import main

    assert main(["plan", "serve", "--objective", "throughput"]) == 2
    assert main(["plan", "serve", "--objective", "throughput", "--max-devices", "8", "--baseline", "tp-node"]) == 2


@pytest.mark.parametrize("owned, limits", [((("dgx-a100", 8, 0.0),), ()), ((("dgx-a100", 16, 5000.0),), ()),
                                           ((), (("dgx-h100", 8),)), ((("dgx-a100", 4, 0.0),), (("dgx-h100", 16),))])
def test_owned_devices_and_kind_limits_match_brute_force(db, owned, limits):
    """Owned devices (sunk or at a resale value) and per-system limits: the program's fleet passes the
    checker and equals the brute-force best; owned devices never raise a fleet's cost."""
    spec = find_model("llama-3.1-8b")
    demand = Demand(rate=8.0, input_len=Lengths.of(1024), output_len=Lengths.of(256), ttft_p90=1.0, tpot_p90=0.05)
    options = ServeSearchOptions(**{**vars(SMALL), "owned": owned, "limits": limits})
    systems = ["dgx-h100", "dgx-a100"]
    pools = pool_options(spec, db, systems, demand, options)
    decode = [o for o in pools.options if o.role == "decode"]
    if len(decode) > 5:
        keep = sorted(decode, key=lambda o: (o.system, o.usd_per_hour or 0))[:3] + \
            sorted(decode, key=lambda o: (o.system != "dgx-a100", o.usd_per_hour or 0))[:2]
        pools = replace(pools, options=tuple(o for o in pools.options if o.role != "decode") + tuple(keep))
    instance, _ = fleet_instance(spec, demand, pools.options, pools.machines, slo_of(demand), options)
    best = fleet.solve(instance)
    expected = brute_force_fleet(instance)
    assert fleet.check(instance, best) == []
    assert fleet.totals(instance, best).objective == pytest.approx(expected, rel=1e-7)
    plain, _ = fleet_instance(spec, demand, pools.options, pools.machines, slo_of(demand),
                              ServeSearchOptions(**{**vars(SMALL), "limits": limits}))
    assert fleet.totals(instance, best).usd_per_hour <= fleet.totals(plain, fleet.solve(plain)).usd_per_hour + 1e-9
    for name, most in limits:
        assert fleet.devices_by_system(instance, best).get(name, 0) <= most


@settings(max_examples=40, deadline=None)
@given(thresholds=st.lists(st.integers(1, 1 << 12), min_size=1, max_size=30),
       upper=st.sampled_from([1, 2, 7, 1 << 10, 1 << 12]), slack=st.integers(0, 50))
def test_fewest_gallops_to_the_same_count_as_brute_force(thresholds, upper, slack):
    """Galloping from a valid lower bound, then bisecting, finds the smallest count a monotone
    test passes (0 where ``upper`` fails), as a scan over every count does."""
    from perfmodel.search.serve_pools import _fewest

    t = np.array(thresholds, dtype=np.int64)
    def ok(n, rows):
        return n >= t[rows]

    expected = np.where(t <= upper, t, 0)
    assert (_fewest(ok, len(t), upper) == expected).all()
    lower = np.maximum(t - slack, 1)             # any bound at or below the answer
    assert (_fewest(ok, len(t), upper, lower) == expected).all()


def test_stability_bound_never_exceeds_the_fewest_count(db):
    """The load K / n needs n > K: the bound the search starts from is below every answer."""
    from perfmodel.search.serve_pools import MAX_INSTANCES, _sizes, _stability_bound

    spec = find_model("llama-3.1-8b")
    demand = Demand(rate=40.0, input_len=Lengths.of(1024), output_len=Lengths.of(256), ttft_p90=1.0, tpot_p90=0.05)
    pools = pool_options(spec, db, ["dgx-h100"], demand, SMALL)
    assert pools.options
    for o in pools.options:
        q = o.queue.as_dict()
        cols = {k: np.array([float(v)]) for k, v in q.items() if k != "output"}
        n = _sizes(cols, demand, o.role, slo_of(demand), MAX_INSTANCES)[0]
        assert n[0] == o.instances
        assert _stability_bound(cols, demand.rate, demand.output_len.mean, o.role)[0] <= n[0]
