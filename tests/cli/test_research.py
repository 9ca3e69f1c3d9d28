"""Published research results as questions perfmodel answers (issue 15): each test types the result's
question and checks what is printed against the published headline, within the stated tolerance."""

from __future__ import annotations

import json

import pytest

from perfmodel.cli.app import main

DEEPSEEK_DECODE = ["estimate", "serve", "--model", "deepseek-v3", "--devices", "72", "--tp", "1", "--ep", "72",
                   "--dp-attention", "72", "--batch", "4608", "--weight-precision", "fp8", "--activation-precision",
                   "a8", "--kv-precision", "fp8", "--input-len", "4096", "--output-len", "1024"]


def ep_per_token(capsys, system: str, overlap: str, balance: str = "balanced") -> float:
    assert main(DEEPSEEK_DECODE + ["--system", system, "--overlap", overlap, "--expert-balance", balance, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)["result"]
    return result["decode_components_s"]["ep all-to-all"]


def test_deepseek_v3_insights_ep_bound_on_h800(capsys):
    """Insights into DeepSeek-V3 (arXiv 2505.09343, Sec. 4.2.2): the EP all-to-all alone bounds TPOT at
    14.76 ms on H800 nodes over 50 GB/s InfiniBand, and at 0.82 ms on GB200 NVL72. The paper's bound
    assumes every device receives the same tokens (balanced); a batch's own routing skew (the default,
    EPLB) makes the busiest device's exchange longer."""
    h800 = ep_per_token(capsys, "hgx-h800", "none")
    assert h800 == pytest.approx(14.76e-3, rel=0.25)
    assert ep_per_token(capsys, "hgx-h800", "none", "eplb") > h800
    nvl72 = ep_per_token(capsys, "gb200-nvl72", "none")
    # The paper's NVL72 figure is bytes over 900 GB/s alone; DeepEP's measured kernel launches and
    # per-op latencies (fitted on aiconfigurator's tables) add ~2 ms at NVLink speed, so the
    # printed ratio is ~5x, not 18x. Order and scale are what the test holds.
    assert 3.0 < h800 / nvl72 < 20.0
    # Two-batch overlap hides part of it where the busiest device's exchange outlasts the re-read half
    # batch: under the default skew (EPLB); with balanced experts the engine keeps one batch here.
    assert ep_per_token(capsys, "hgx-h800", "framework", "eplb") < ep_per_token(capsys, "hgx-h800", "none", "eplb")


def test_h800_is_an_h100_with_a_narrower_nvlink(db):
    h800, h100 = db.accelerator("h800"), db.accelerator("h100-sxm")
    assert h800.peak("bf16") == h100.peak("bf16") and h800.hbm_bytes == h100.hbm_bytes
    assert h800.scale_up_bytes_per_s == 200e9 < h100.scale_up_bytes_per_s
    levels = db.levels(db.system("hgx-h800"))
    assert levels[0].bytes_per_s == 200e9 and levels[-1].bytes_per_s == 50e9   # NVLink, then 400G IB per GPU


def test_v100_trains_in_fp16_and_refuses_bf16(capsys):
    """NVIDIA ADLR, MegatronLM's Supercharged V1.0: 62.4 TFLOP/s, 48% of a DGX-2H V100's peak, for a
    1.2B GPT on one GPU; an 8B model at tp 8 x pp 2 must land near that efficiency, not far above."""
    argv = ["estimate", "train", "--model", "llama-3.1-8b", "--system", "dgx-2", "--devices", "16", "--tp", "8",
            "--pp", "2", "--global-batch", "64", "--seq-len", "2048"]
    assert main(argv + ["--precision", "fp16", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)["result"]
    assert 0.3 < result["mfu"] < 0.55
    assert main(argv) == 2
    assert "does not support bf16" in capsys.readouterr().err


def test_v100_serves_a_bf16_checkpoint_in_fp16(capsys):
    """Serving frameworks cast a bf16 checkpoint to fp16 on Volta: the 16-bit weights run at the fp16 rate,
    and a plan finds V100 deployments."""
    from perfmodel.hardware_db import load_database
    from perfmodel.machine import build_machine
    from perfmodel.plan import QuantScheme

    machine = build_machine(load_database(), "dgx-2", 1)
    assert machine.math16 == "fp16" and QuantScheme(math16=machine.math16).runs_on(machine.supports)
    argv = ["estimate", "serve", "--model", "llama-3.1-8b", "--system", "dgx-2", "--devices", "1", "--tp", "1",
            "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)["result"]
    # Decode streams 16 GB of weights per step over 900 GB/s: at least 18 ms.
    assert 0.018 < result["tpot_s"] < 0.1
    assert main(["plan", "serve", "--model", "llama-3.1-8b", "--system", "dgx-2", "--rate", "2", "--json"]) == 0
    pools = json.loads(capsys.readouterr().out)["best"]["pools"]
    assert all(p["accelerator"] == "v100-sxm2-32gb" for p in pools)


def test_multi_token_prediction_pays_in_plan_serve(capsys):
    """DeepSeek-V3 (Sec. 5.4.3: MTP's second token accepted 85-90% of the time, 1.8x TPS): under a
    20 ms TPOT target, drafting one token with 80% acceptance needs fewer devices."""
    argv = ["plan", "serve", "--model", "deepseek-v3", "--system", "dgx-h100", "--rate", "20", "--tpot-p90-ms", "20",
            "--json"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)["best"]
    assert main(argv + ["--mtp-draft-tokens", "1", "--mtp-acceptance", "0.8"]) == 0
    drafted = json.loads(capsys.readouterr().out)["best"]
    assert drafted["devices"] < plain["devices"] and drafted["tpot_p90_s"] <= 20e-3
    assert main(["plan", "serve", "--model", "llama-3.1-8b", "--mtp-draft-tokens", "1"]) == 2
    assert "no multi-token-prediction layers" in capsys.readouterr().err


def test_die_level_systems_print_per_package_figures(capsys):
    """Zuo et al. 2025 quote CloudMatrix384 throughput per NPU (two dies); the die-level system prints both."""
    argv = ["estimate", "serve", "--model", "deepseek-v3", "--system", "cloudmatrix384-die", "--devices", "320",
            "--tp", "1", "--ep", "320", "--dp-attention", "320", "--batch", "15360", "--input-len", "4096",
            "--output-len", "1", "--weight-precision", "int8", "--activation-precision", "a8", "--mtp-draft-tokens",
            "1", "--mtp-acceptance", "0.7"]
    assert main(argv + ["--json"]) == 0
    r = json.loads(capsys.readouterr().out)["result"]
    assert r["dies_per_package"] == 2
    assert r["decode_tokens_per_s_per_package"] == pytest.approx(2 * r["decode_tokens_per_s_per_device"])
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "package" in out and "(2 dies)" in out


def test_redundant_experts_are_searched(db):
    from perfmodel.catalog import find_model
    from perfmodel.machine import build_machine
    from perfmodel.search.serve_pools import _layouts

    spec = find_model("deepseek-v3")
    layouts = _layouts(spec, build_machine(db, "cloudmatrix384-die", 768), 512)
    # EP 512 over 256 routed experts (attention data-parallel over the dies): two copies of each
    assert (1, 1, 512, 512) in layouts and spec.moe.num_experts == 256


def test_named_heuristics_are_compared_with_the_optimum(capsys):
    """APEX (serving simulator): searched plans beat the usual heuristics. The baseline is the best plan
    of the heuristic's family, so every ratio is at least 1 (the optimum's space holds the family)."""
    assert main(["plan", "train", "--baseline", "tp-node", "--json"]) == 0
    train = json.loads(capsys.readouterr().out)["baseline"]
    assert train["best"]["plan"]["tp"] == 8 and train["best"]["plan"]["zero"] == 1
    assert train["speedup"] >= 1.0
    assert main(["plan", "serve", "--rate", "20", "--baseline", "tp-node", "--json"]) == 0
    serve = json.loads(capsys.readouterr().out)["baseline"]
    assert all(p["config"]["tp"] == 8 for p in serve["best"]["pools"]) and serve["cost_ratio"] >= 1.0
    assert main(["plan", "serve", "--model", "deepseek-v3", "--rate", "20", "--baseline", "tp-node", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["baseline"]["best"] is None   # 671B in fp8 does not fit one node


def test_fastest_plan_on_a_fleet_against_heuristics_and_energy(capsys):
    """APEX (arXiv 2411.17651): on a given cluster, searched serving plans run up to 3.37x faster than
    heuristics, and energy-optimal plans use up to 45% less energy than latency-optimal ones. APEX
    simulates iteration-level batching with mixed prefill and decode steps, so the heuristic may mix
    prompt chunks into its decode steps too; run with prompts in batches of their own it is slower
    still, and the ratio nearer the paper's largest."""
    fleet = ["plan", "serve", "--model", "llama-3.1-70b", "--max-devices", "16", "--json"]
    assert main(fleet + ["--objective", "latency", "--baseline", "tp-node"]) == 0
    fast = json.loads(capsys.readouterr().out)
    assert fast["evidence"]["status"] == "OPTIMAL" and fast["best"]["devices"] <= 16
    assert 1.5 <= fast["baseline"]["latency_ratio"] <= 3.37 * 1.25
    assert main(fleet + ["--objective", "latency", "--baseline", "tp-node", "--chunk-tokens", "0"]) == 0
    separate = json.loads(capsys.readouterr().out)["baseline"]["latency_ratio"]
    assert separate == pytest.approx(3.37, rel=0.25) and separate > fast["baseline"]["latency_ratio"]
    assert main(fleet + ["--objective", "energy"]) == 0
    frugal = json.loads(capsys.readouterr().out)["best"]
    saving = 1.0 - frugal["joules_per_token"] / fast["best"]["joules_per_token"]
    assert saving == pytest.approx(0.45, rel=0.25)
    assert frugal["latency_s"] > fast["best"]["latency_s"]


ZERO_OFFLOAD = ["estimate", "train", "--model", "gpt2-10b", "--system", "dgx-2", "--devices", "1", "--tp", "1", "--pp",
                "1", "--precision", "fp16", "--zero", "2", "--offload-optimizer", "ddr", "--offload-grads", "ddr",
                "--micro-batch", "10", "--global-batch", "10", "--seq-len", "1024", "--recompute", "full", "--json"]


def test_zero_offload_trains_10b_on_one_v100(capsys):
    """ZeRO-Offload (Ren et al. 2021, arXiv 2101.06840): a 10B GPT-2 trains on one V100 32GB at about
    40 TFLOP/s, the optimizer on the CPU over the whole node's host memory; without offload it cannot fit."""
    assert main(ZERO_OFFLOAD) == 0
    out = json.loads(capsys.readouterr().out)
    result = out["result"]
    tflops = result["mfu"] * 125e12 / 1e12                       # V100 SXM2 fp16 tensor peak
    assert tflops == pytest.approx(40.0, rel=0.25)
    tiers = result["memory_tiers"]
    assert tiers["hbm"]["used_bytes"] <= tiers["hbm"]["capacity_bytes"] == 32 * 2**30
    # One GPU sees the node's host memory and the CPU step runs at DDR speed, not over its PCIe link.
    assert tiers["ddr"]["capacity_bytes"] == 1.536e12 and tiers["ddr"]["used_bytes"] > 100e9
    assert result["time_components_s"]["optimizer step"] < 3.0
    assert main(["plan", "train", "--model", "gpt2-10b", "--system", "dgx-2", "--devices", "1", "--precisions",
                 "fp16", "--global-batch", "10", "--seq-len", "1024", "--no-offload"]) == 3


FENGHUANG = ["plan", "serve", "--model", "grok-1", "--rate", "2", "--input-len", "8192", "--output-len", "1024",
             "--objective", "devices", "--weight-precisions", "bf16", "--kv-precisions", "bf16",
             "--activation-precisions", "a16", "--json"]


def test_fenghuang_pooled_memory_cuts_local_hbm(capsys):
    """FengHuang (Li et al. 2025, arXiv 2511.10753): a rack-level pool behind the TAB cuts local HBM by up
    to 93% (and GPUs by up to 50%) for GPT-3 / Grok-1 / Qwen3-235B serving. The weights stream from the
    pool each step: the fleet needs no more GPUs than HBM-only H200s, with a small share of the HBM."""
    assert main(FENGHUANG + ["--system", "hgx-h200"]) == 0
    h200 = json.loads(capsys.readouterr().out)["best"]
    assert main(FENGHUANG + ["--system", "fenghuang-h200"]) == 0
    pooled = json.loads(capsys.readouterr().out)["best"]
    assert pooled["devices"] <= h200["devices"]
    assert all(p["config"]["weight_place"] == "pooled" for p in pooled["pools"])
    local = max(p["hbm_used_bytes"] for p in pooled["pools"])
    assert local <= 20e9 and 1 - local / max(p["hbm_used_bytes"] for p in h200["pools"]) >= 0.8


def test_fenghuang_shared_weights_cut_gpus_where_bandwidth_allows(capsys):
    """FengHuang's GPU saving (up to 50%): one copy of the weights in the pool serves every instance of
    the node, so instances narrower than a node fit and KV gets the room a copy per instance took.
    Where the TPOT target leaves the pool's bandwidth room (150 ms), Grok-1 at 2 requests/s needs 12
    GPUs against 16 H200s, and GPT-3 (the variant) 56 against 72; at 50 ms every device streams its
    shard at the bandwidth an H200 reads HBM at, and the count is the same."""
    def devices(model, system, tpot_ms):
        args = [model if a == "grok-1" else a for a in FENGHUANG] + ["--system", system, "--tpot-p90-ms", str(tpot_ms)]
        assert main(args) == 0
        return json.loads(capsys.readouterr().out)["best"]["devices"]

    for model in ("grok-1", "gpt3-175b"):
        pooled, h200 = devices(model, "fenghuang-h200", 150), devices(model, "hgx-h200", 150)
        assert pooled <= 0.85 * h200
    assert devices("grok-1", "fenghuang-h200", 50) == devices("grok-1", "hgx-h200", 50)


def test_power_capping_lets_a_facility_hold_more_devices(capsys):
    """POLCA (Patel et al. 2024, arXiv 2308.12908): with power capping, about 30% more servers fit in the
    same power budget with little performance loss. Capping an H100 at 406 W: the budget holds 1.30x
    the devices; decode (memory-bound) keeps its speed, prefill (compute-bound) slows, so a fleet
    sized at the edge of its prefill queue may need one device more (7 -> 8 here, 1.14x the demand
    per budget)."""
    assert main(["plan", "serve", "--model", "llama-3.1-70b", "--power-cap-w", "406", "--json"]) == 0
    cap = json.loads(capsys.readouterr().out)["power_cap"]
    assert cap["devices_per_budget_vs_tdp"]["dgx-h100"] == pytest.approx(1.30, rel=0.01)
    assert cap["devices_uncapped"] <= cap["devices_capped"] <= cap["devices_uncapped"] + 1
    assert cap["demand_per_budget_vs_tdp"] == pytest.approx(1.30, rel=0.25)
    laid = cap["uncapped_optimum_under_cap"]
    # Decode steps slow at most by the prefill they share a colocated pool with (a decode pool's own
    # steps do not slow at all); prompts, compute-bound, slow far more.
    assert 1.0 <= laid["tpot_p90_slowdown"] <= 1.15 < laid["ttft_p99_slowdown"]
    # POLCA's own mechanism: the budget at TDP, capping only when the fleet's total exceeds it. From
    # the distribution of the uncapped optimum's power (perfmodel.oversubscription): within 20% of
    # 1.30x, capping at most the risk of the time; a smaller facility pools fewer instances and
    # holds no more.
    f = cap["facility"]
    assert f["devices_held_vs_provisioned"] == pytest.approx(1.30, rel=0.2)
    assert f["capping_probability"] <= f["capping_risk"] == 0.01
    assert f["devices_held_vs_provisioned"] < f["tdp_w_per_device"] / f["mean_w_per_device"]
    assert main(["plan", "serve", "--model", "llama-3.1-70b", "--power-cap-w", "406", "--facility-devices", "64",
                 "--capping-risk", "0.001", "--json"]) == 0
    small = json.loads(capsys.readouterr().out)["power_cap"]["facility"]
    assert 1.0 <= small["devices_held_vs_provisioned"] < f["devices_held_vs_provisioned"]
    assert main(["estimate", "serve", "--power-cap-w", "30"]) == 2
    assert main(["plan", "serve", "--power-cap-w", "406", "--capping-risk", "2"]) == 2


AGENTIC = ["plan", "serve", "--model", "llama-3.1-70b", "--system", "dgx-h100", "--turns", "8", "--input-len", "1024",
           "--output-len", "256", "--rate", "10", "--json"]


def test_owned_older_gpus_mix_with_new_ones_when_they_pay(capsys):
    """Heterogeneous serving (Jiang et al. 2025, arXiv 2502.00722: mixing GPU types raises throughput per
    budget by up to 41%): with A100s already owned, an 8-turn agentic workload's cheapest fleet mixes H100
    prefill with the owned A100s for decode, below the H100-only cost; prefix caching cuts the prefill
    the conversation's earlier turns would repeat."""
    def best(*extra):
        assert main(AGENTIC + list(extra)) == 0
        return json.loads(capsys.readouterr().out)["best"]

    newest = best("--no-prefix-cache")
    mixed = best("--no-prefix-cache", "--owned", "dgx-a100=32@8000")
    assert {p["system"] for p in mixed["pools"]} == {"dgx-h100", "dgx-a100"}
    assert 0 < mixed["owned_used"]["dgx-a100"] <= 32
    assert mixed["usd_per_hour"] < newest["usd_per_hour"]
    assert best()["devices"] < newest["devices"]                 # prefix caching: far less prefill
    limited = best("--no-prefix-cache", "--system", "dgx-a100", "--limit", "dgx-h100=8")
    assert sum(p["devices"] for p in limited["pools"] if p["system"] == "dgx-h100") <= 8
    assert main(AGENTIC + ["--owned", "dgx-a100=-3"]) == 2


def test_mixed_gpu_types_win_on_one_basis_when_the_better_one_is_scarce(capsys):
    """Heterogeneous serving on one price basis (Jiang et al. 2025, arXiv 2502.00722: GPU composition
    chosen under real-time availability beats homogeneous fleets per budget): with B200s capped at 8,
    the cheapest fleet at 60 requests/s mixes H100s with the B200s, below the cheapest H100-only fleet,
    rented or owned, and no B200-only fleet within the cap carries the rate; unlimited, B200 alone wins.
    Variant: 30 requests/s with 4 B200s."""
    def best(*args):
        assert main(["plan", "serve", "--model", "llama-3.1-70b", "--json", *args]) == 0
        return json.loads(capsys.readouterr().out)["best"]

    mixed = {}
    for pricing in ("cloud", "owned"):
        mixed[pricing] = best("--rate", "60", "--system", "dgx-b200", "--system", "dgx-h100", "--limit",
                              "dgx-b200=8", "--pricing", pricing)
        h100 = best("--rate", "60", "--system", "dgx-h100", "--pricing", pricing)
        assert {p["system"] for p in mixed[pricing]["pools"]} == {"dgx-b200", "dgx-h100"}
        assert sum(p["devices"] for p in mixed[pricing]["pools"] if p["system"] == "dgx-b200") <= 8
        assert mixed[pricing]["usd_per_hour"] < 0.9 * h100["usd_per_hour"]
    assert main(["plan", "serve", "--model", "llama-3.1-70b", "--rate", "60", "--system", "dgx-b200", "--limit",
                 "dgx-b200=8"]) == 3
    capsys.readouterr()
    unlimited = best("--rate", "60", "--system", "dgx-b200", "--system", "dgx-h100")
    assert {p["system"] for p in unlimited["pools"]} == {"dgx-b200"}
    assert unlimited["usd_per_hour"] < mixed["cloud"]["usd_per_hour"]
    variant = best("--rate", "30", "--system", "dgx-b200", "--system", "dgx-h100", "--limit", "dgx-b200=4")
    assert {p["system"] for p in variant["pools"]} == {"dgx-b200", "dgx-h100"}
    assert variant["usd_per_hour"] < best("--rate", "30", "--system", "dgx-h100")["usd_per_hour"]


def test_cxl_aware_placement_recovers_the_optimizer_step(capsys):
    """CXL-attached memory for offloaded fine-tuning (Liaw and Chen 2025, arXiv 2507.03305): naive placement of
    the optimizer's data in CXL slows the CPU optimizer step (about 4x), a CXL-aware split recovers the
    DRAM-only throughput (97-99%). Here the split interleaves by bandwidth, so both memories serve the step."""
    assert main(["estimate", "train", "--model", "llama-3.1-70b", "--system", "hgx-h200", "--devices", "8", "--tp",
                 "1", "--pp", "1", "--zero", "3", "--offload-optimizer", "ddr+cxl", "--offload-grads", "ddr+cxl",
                 "--global-batch", "64", "--seq-len", "4096", "--recompute", "full", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    steps = doc["host_placements_step_s"]
    assert steps["cxl"] > steps["ddr"] >= steps["ddr+cxl"]          # naive slower, aware at least DRAM-only
    assert steps["ddr"] / steps["ddr+cxl"] == pytest.approx(1.0, abs=0.1)
    assert main(["plan", "train", "--model", "llama-3.1-70b", "--system", "hgx-h200", "--devices", "8",
                 "--global-batch", "64", "--seq-len", "4096", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["best"]["plan"]
    assert best["optimizer_place"] == "ddr+cxl"                      # the search takes the split


COMET = ["estimate", "serve", "--model", "llama-3.1-70b", "--system", "dgx-a100", "--devices", "1", "--tp", "1",
         "--batch", "64", "--input-len", "1024", "--output-len", "512", "--weight-precision", "int4", "--json"]


def _served_tokens_per_s(capsys, args: list[str]) -> dict:
    """The estimate's result, with the tokens/s a batch serves end to end (batch x output over TTFT
    plus every output token's step)."""
    assert main(args) == 0
    r = json.loads(capsys.readouterr().out)["result"]
    return {**r, "served": 64 * 512 / (r["ttft_s"] + 512 * r["tpot_s"])}


def test_comet_w4a4kv4_serves_70b_on_one_a100(capsys):
    """COMET (Liu et al. 2024, arXiv 2410.12168): W4A4KV4 serving of LLaMA-3-70B on one A100-80G, 2.02x
    TensorRT-LLM's throughput, from a W4Ax kernel 2.88x cuBLAS's W16A16. Against TensorRT-LLM's W4A16
    with a bf16 KV cache at the same batch, W4A4KV4 serves within 20% of 2.02x; the prefill of a bf16
    model gains less than the kernel's 2.88x (attention and the vector work stay 16-bit); W4A8KV4,
    COMET's other kernel path, lands between W4A16 and W4A4."""
    w4a16 = _served_tokens_per_s(capsys, COMET + ["--activation-precision", "a16", "--kv-precision", "bf16"])
    w4a4 = _served_tokens_per_s(capsys, COMET + ["--activation-precision", "a4", "--kv-precision", "int4"])
    w4a8 = _served_tokens_per_s(capsys, COMET + ["--activation-precision", "a8", "--kv-precision", "int4"])
    assert 2.02 / 1.2 <= w4a4["served"] / w4a16["served"] <= 2.02 * 1.2
    assert w4a16["served"] < w4a8["served"] < w4a4["served"]
    small = ["estimate", "serve", "--model", "llama-3.1-8b", "--system", "dgx-a100", "--devices", "1", "--tp", "1",
             "--batch", "8", "--input-len", "2048", "--output-len", "64", "--json"]
    assert main(small) == 0
    bf16 = json.loads(capsys.readouterr().out)["result"]["prefill_tokens_per_s_per_device"]
    assert main(small + ["--weight-precision", "int4", "--activation-precision", "a4"]) == 0
    int4 = json.loads(capsys.readouterr().out)["result"]["prefill_tokens_per_s_per_device"]
    assert 2.0 < int4 / bf16 < 2.88


SYNTHETIC_ROUTING = "examples/routing/gpt-oss-120b-synthetic.npz"


def _place(capsys, *argv) -> dict:
    from pathlib import Path

    routing = str(Path(__file__).parent.parent.parent / SYNTHETIC_ROUTING)
    argv = [routing if a == SYNTHETIC_ROUTING else a for a in argv]
    assert main(["place-experts", *argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("devices, cross_node_cut", [(16, 0.30), (32, 0.22)])
def test_exflow_cut_follows_the_files_own_coactivation(capsys, devices, cross_node_cut):
    """ExFlow (arXiv 2401.08383): up to 67% less cross-GPU traffic from inter-layer affinity. README:
    gpt-oss-120b on 16 H100s with the shipped synthetic statistics (variant: 32 H100s, 4 nodes). The
    affinity is measured from the file (the flag is refused), and the cut is what it allows: tokens
    kept on their device never exceed the share to a device's worth of favourite successors."""
    doc = _place(capsys, "--model", "gpt-oss-120b", "--system", "dgx-h100", "--devices", str(devices),
                 "--routing", SYNTHETIC_ROUTING)
    c, cut = doc["coactivation"], doc["improvement"]
    assert c["affinity"] == pytest.approx(0.109, abs=0.001) and c["independent"] == pytest.approx(0.067, abs=0.001)
    assert c["slots"] == doc["evidence"]["slots"] and c["reach"] > c["reach_independent"]
    assert cut["cross_node_vs_round_robin"] == pytest.approx(cross_node_cut, abs=0.01)
    assert 0 < cut["cross_device_vs_round_robin"] < 0.67          # below ExFlow's best: the file's weaker affinity
    affinity = doc["methods"]["affinity"]
    kept = 1 - affinity["cross_device_tokens"] / doc["evidence"]["tokens_between_layers"]
    assert kept <= c["reach"]
    assert affinity["gap_to_bound"] <= 0.0101                     # locality bought inside the 1% tolerance


@pytest.mark.parametrize("routing, speedup, memory_cut", [(("--routing", SYNTHETIC_ROUTING), 1.14, 1.57),
                                                          (("--zipf", "2.0"), 2.25, 3.88)])
def test_llep_reroutes_per_batch_and_saves_memory(capsys, routing, speedup, memory_cut):
    """LLEP (arXiv 2601.17111): up to 5x faster MoE layers and 4x less peak memory than standard EP under
    extreme imbalance. README: gpt-oss-120b on 8 H100s with the shipped file (variant: Zipf 2.0
    synthetic routing, heavier skew): LLEP lowers the busiest device and the peak memory below
    contiguous experts, pays its weight transfers, and gains more where the skew is heavier."""
    doc = _place(capsys, "--model", "gpt-oss-120b", "--system", "dgx-h100", "--devices", "8", *routing,
                 "--reroute", "least-loaded")
    r, rr = doc["rerouting"], doc["methods"]["round-robin"]
    assert r["rule"] == {"capacity": 1.0, "min_tokens": 1024.0, "threshold": 1.3}
    assert r["speedup_vs_round_robin"] == pytest.approx(speedup, abs=0.01)
    assert 1 / r["memory_vs_round_robin"] == pytest.approx(memory_cut, abs=0.01)
    assert 1 < r["speedup_vs_round_robin"] <= 5 and r["imbalance"] < rr["imbalance"]
    # Replicas are fitted to these very loads, so the static placement is faster; LLEP holds no replicas.
    assert r["speedup_vs_affinity"] < 1 and r["memory"]["least_loaded_bytes"] < r["memory"]["replicas_bytes"]


MEMO_1M = ["plan", "train", "--model", "llama-3.1-8b", "--system", "dgx-a100", "--devices", "8", "--global-batch", "1",
           "--seq-len", "1048576"]
MEMO_MFU = 0.5230    # MEMO (Zhao et al. 2024, arXiv:2407.12117), abstract: a 7B model at 1M tokens on 8 A800s


def test_memo_million_token_training_needs_activation_offload(capsys):
    """MEMO: a 7B model trains at 1M tokens on 8 GPUs at 52.30% MFU by swapping activations to host
    memory (token-wise recomputation and swapping). The README's command: the 1M-token job of the
    catalog's nearest model fits only with activations swapped to DDR, the swap hidden under compute,
    and its MFU is within 0.4x-1.1x of the paper's (perfmodel's fitted A100 attention is slower at
    these lengths; README). Variant, half the sequence: recomputing everything fits, and swapping a
    share of the tokens instead of recomputing them is faster (the paper's MFU gain over Megatron-LM)."""
    assert main(MEMO_1M + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    best = doc["best"]
    assert 0 < best["plan"]["activation_offload"] < 1 and best["plan"]["recompute"] == "full"
    assert doc["evidence"]["feasible"] == 0 and doc["evidence"]["feasible_with_offload"] > 0
    assert doc["evidence"]["status"] == "OPTIMAL"
    assert 0.4 * MEMO_MFU < best["mfu"] < 1.1 * MEMO_MFU
    shown = doc["recommended"]
    assert shown["plan"] == best["plan"] and not shown["runs_on"]   # no exported framework swaps activations
    breakdown = shown["breakdown"]
    assert breakdown["time_components_s"]["activation offload"] < 1e-3 * shown["step_time_s"]   # hidden
    assert breakdown["time_on_link_s"]["activation offload"] > 0
    tiers = breakdown["memory_tiers"]
    assert tiers["ddr"]["used_bytes"] >= breakdown["memory_per_device_bytes"]["activations in host memory"] > 0
    assert main(MEMO_1M + ["--no-offload"]) == 3
    assert "needs 126.3 GB of HBM per device" in capsys.readouterr().err

    half = [a if a != "1048576" else "524288" for a in MEMO_1M]
    assert main(half + ["--json"]) == 0               # some plan fits: by default no swap is searched
    recomputing = json.loads(capsys.readouterr().out)["best"]
    assert main(half + ["--swap-activations", "always", "--json"]) == 0
    swapping = json.loads(capsys.readouterr().out)["best"]
    assert recomputing["plan"]["recompute"] == "full" and "activation_offload" not in recomputing["plan"]
    assert swapping["plan"]["activation_offload"] > 0
    assert 1.0 < swapping["mfu"] / recomputing["mfu"] < 2.42
