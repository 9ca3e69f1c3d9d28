"""Placement from measured co-activation and least-loaded rerouting over a placement (issue 33): the
shipped synthetic file is what its stated process writes, the local tokens never exceed the
co-activation's bound, LLEP never raises the busiest device, and the output is deterministic."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.cli.app import main
from perfmodel.coactivation import measure_coactivation
from perfmodel.llep import LlepRule
from perfmodel.routing import zipf_routing
from perfmodel.search.placement import PlacementProblem, place
from perfmodel.search.rerouting import reroute

ROOT = Path(__file__).parent.parent.parent
FILE = ROOT / "examples" / "routing" / "gpt-oss-120b-synthetic.npz"


def test_shipped_file_is_what_its_stated_process_writes():
    spec = importlib.util.spec_from_file_location("make_synthetic_routing", FILE.with_name("make_synthetic_routing.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fresh, shipped = np.load(io.BytesIO(module.synthetic_npz())), np.load(FILE)
    for name in ("loads", "transitions"):
        assert shipped[name].dtype == np.float32 and np.array_equal(fresh[name], shipped[name])
    assert shipped["loads"].shape == (36, 128) and shipped["transitions"].shape == (35, 128, 128)


def run_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_a_routing_file_refuses_the_affinity_flag(capsys):
    code = main(["place-experts", "--model", "gpt-oss-120b", "--devices", "8", "--routing", str(FILE),
                 "--affinity", "0.9"])
    assert code == 2 and "measured from its transitions" in capsys.readouterr().err


@settings(max_examples=25, deadline=None)
@given(devices=st.sampled_from([2, 4, 8]), per_node=st.sampled_from([1, 2]), replicas=st.integers(0, 6),
       affinity=st.floats(0, 1), zipf=st.floats(0, 2), seed=st.integers(0, 100))
def test_tokens_kept_on_their_device_never_exceed_the_measured_reach(devices, per_node, replicas, affinity, zipf,
                                                                      seed):
    """A device holds at most ``slots`` experts of the next layer, so the tokens a copy keeps on its
    device are at most its expert's ``slots`` most likely successors' share: whatever the method."""
    stats = zipf_routing(4, 12, 2, 3000, zipf, affinity, seed)
    slots = -(-(12 + replicas) // devices)
    problem = PlacementProblem(stats=stats, devices=devices, devices_per_node=min(per_node, devices), slots=slots,
                               replicas=replicas)
    reach = measure_coactivation(stats, slots)
    for method in ("affinity", "round-robin"):
        t = place(problem, method, time_limit=5).traffic
        kept = (t.between_layers - t.cross_device) / t.between_layers
        assert kept <= reach.reach + 1e-9


def test_rerouting_the_shipped_file_never_raises_a_layer_and_counts_its_memory(capsys):
    doc = json.loads(run_json(capsys, "place-experts", "--model", "gpt-oss-120b", "--system", "dgx-h100", "--devices",
                              "8", "--routing", str(FILE), "--reroute", "least-loaded"))
    r, rr = doc["rerouting"], doc["methods"]["round-robin"]
    assert r["max_load_tokens"] < rr["max_load_tokens"] and r["imbalance"] < rr["imbalance"]
    assert r["foreign_experts_max"] >= 1 and r["memory"]["least_loaded_bytes"] > 0
    assert doc["coactivation"]["affinity"] > doc["coactivation"]["independent"]


def test_llep_per_layer_on_a_placement_never_above_static():
    stats = zipf_routing(5, 16, 2, 20000, 1.5, 0.5, seed=2)
    problem = PlacementProblem(stats=stats, devices=4, devices_per_node=4, slots=4, replicas=0)
    static = place(problem, "round-robin")
    r = reroute(problem, static, LlepRule(min_tokens=0.0))
    assert np.all(r.max_load <= static.max_load * (1 + 1e-12))
    assert [float(x.device_load.sum()) for x in r.layers] == pytest.approx(stats.loads.sum(axis=1).tolist())


def test_place_experts_with_rerouting_is_byte_identical(capsys):
    argv = ("place-experts", "--model", "gpt-oss-120b", "--devices", "8", "--zipf", "1.5", "--reroute", "least-loaded",
            "--time-limit", "2")
    assert run_json(capsys, *argv) == run_json(capsys, *argv)
