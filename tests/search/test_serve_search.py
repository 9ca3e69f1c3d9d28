"""Serving search: the queueing formulas, the fleet program against brute force, and the command."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfmodel.catalog import find_model
from search.brute import brute_force_fleet
from search.serve import Demand, Lengths, ServeSearchOptions, _solve_fleet, pool_options, search_serving, slo_of


SMALL = ServeSearchOptions(weight_precisions=("fp8",), activation_precisions=("a8",), kv_precisions=("fp8",),
                           kv_offload=False, batches=(8, 32, 128), max_instance_devices=8)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rate=st.sampled_from([0.5, 2.0, 8.0]), objective=st.sampled_from(["energy", "devices"]),
       tpot_ms=st.sampled_from([30.0, 60.0]), max_devices=st.sampled_from([None, 24]))
def test_fleet_program_matches_brute_force(db, rate, objective, tpot_ms, max_devices):
    spec = find_model("llama-3.1-8b")
    demand = Demand(rate=rate, input_len=Lengths.of(1024), output_len=Lengths.of(256), ttft_p90=1.0,
                    tpot_p90=tpot_ms / 1e3)
    options = ServeSearchOptions(**{**vars(SMALL), "objective": objective, "max_devices": max_devices})
    pools = pool_options(spec, db, ["dgx-h100", "mi300x-8x"], demand, options)
    decode = [o for o in pools.options if o["role"] == "decode"]
    if len(decode) > 6:  # keep the oracle's product small: the program sees the same options
        keep = sorted(decode, key=lambda o: o["power_w"])[:6]
        pools.options = [o for o in pools.options if o["role"] != "decode"] + keep
    expected = brute_force_fleet(spec, demand, pools.options, pools.machines, options)
    best, status, _ = _solve_fleet(spec, demand, pools.options, pools.machines, slo_of(demand), options)
    if not np.isfinite(expected):
        assert best is None
        return
    value = {"energy": best.power_w, "devices": best.devices + best.power_w * 1e-9}[objective]
    assert status == "OPTIMAL"
    assert value == pytest.approx(expected, rel=1e-6)


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


def test_impossible_targets_exit_as_infeasible(db):
    from hardware_db.errors import InfeasibleError
    from search.serve import raise_if_infeasible

    spec = find_model("llama-3.1-70b")
    demand = Demand(rate=5.0, input_len=Lengths.of(2048), output_len=Lengths.of(256), ttft_p90=0.001, tpot_p90=0.0001)
    result = search_serving(spec, db, ["dgx-h100"], demand, ServeSearchOptions(objective="energy"))
    with pytest.raises(InfeasibleError, match="no deployment meets"):
        raise_if_infeasible(result)
