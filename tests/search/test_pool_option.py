"""Serving pool options (search.pool_option): their dict form against the pools ``plan serve --json``
prints, and their immutability."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError

import pytest

from perfmodel.search.requests import PlanServeRequest
from perfmodel.search.serve_pools import pool_options

# The keys of a pool option's dict form, in order (the dicts search.serve_pools built before PoolOption).
DICT_KEYS = ["role", "system", "instances", "devices", "devices_per_instance", "usd_per_hour", "power_w", "ttft50",
             "ttft90", "tpot50", "tpot90", "ttft_error", "tpot_error", "service90", "step90", "kvp", "hbm", "queue",
             "config", "accelerator", "capacity"]
QUEUE_KEYS = ["output", "batch", "dpa", "prefill_s50", "prefill_s90", "tpot50", "tpot90", "mixed50", "mixed90"]
ARGS = ["--model", "llama-3.1-70b", "--system", "dgx-h100", "--system", "mi300x-8x", "--rate", "20"]


def test_a_pool_options_dict_form_is_what_plan_serve_json_prints_of_its_pools(db, capsys):
    """Every pool of the best, recommended and listed deployments of ``plan serve --json`` is one pool
    option of the same search (same role, system and configuration) at a count: its JSON fields are
    the option's dict form's, the totals scaled by the count over the option's own, the TTFT of a
    prefill pool plus the KV hand-over."""
    from perfmodel.cli.app import main

    assert main(["plan", "serve", *ARGS, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    request = PlanServeRequest(model="llama-3.1-70b", system=("dgx-h100", "mi300x-8x"), rate=20.0)
    spec, systems, demand, options = request.resolve(db)
    forms = [o.as_dict() for o in pool_options(spec, db, systems, demand, options).options]
    assert all(list(d) == DICT_KEYS and list(d["queue"]) == QUEUE_KEYS for d in forms)
    pools = [p for d in [doc["best"], doc["recommended"], *doc["top"]] for p in d["pools"]]
    assert {p["role"] for p in pools} >= {"colocated", "prefill", "decode"}
    for pool in pools:
        (d,) = [d for d in forms if (d["role"], d["system"], d["config"]) == (pool["role"], pool["system"],
                                                                                  pool["config"])]
        n = pool["instances"]
        assert n <= d["instances"] and d["devices"] == d["instances"] * d["devices_per_instance"]
        for key, field in (("accelerator", "accelerator"), ("devices_per_instance", "devices_per_instance"),
                           ("ttft_error", "ttft_error"), ("tpot_error", "tpot_error"), ("service90", "prefill_p90_s"),
                           ("step90", "step_p90_s"), ("hbm", "hbm_used_bytes")):
            assert pool[field] == d[key], key
        assert d["kvp"] == d["config"]["kv_precision"]
        assert pool["requests_per_s"] == d["capacity"] * n
        assert d["capacity"] == demand.rate / d["instances"]
        assert pool["power_w"] == d["power_w"] * (n / d["instances"])
        assert pool["usd_per_hour"] == d["usd_per_hour"] * (n / d["instances"])
        if pool["role"] == "colocated":
            assert (pool["ttft_p50_s"], pool["ttft_p90_s"]) == (d["ttft50"], d["ttft90"])
        if pool["role"] == "prefill":
            kv = pool["ttft_p90_s"] - d["ttft90"]
            assert kv > 0 and pool["ttft_p50_s"] == pytest.approx(d["ttft50"] + kv, rel=1e-12)
        if pool["role"] != "prefill":
            assert (pool["tpot_p50_s"], pool["tpot_p90_s"]) == (d["tpot50"], d["tpot90"])


def test_pool_options_are_immutable(db):
    """A pool option and the set of them are frozen: a later stage derives new values, never edits one."""
    request = PlanServeRequest(model="llama-3.1-8b", system=("dgx-h100",), rate=4.0)
    spec, systems, demand, options = request.resolve(db)
    pools = pool_options(spec, db, systems, demand, options)
    assert isinstance(pools.options, tuple) and pools.options
    option = pools.options[0]
    for target, name in ((option, "instances"), (option.queue, "batch"), (option.config, "tp"),
                         (pools, "options")):
        with pytest.raises(FrozenInstanceError):
            setattr(target, name, 1)
