"""Design-space sweeps: the design, the hardware a point changes, engines that agree, resuming, spec
errors naming their line, and the sensitivity fit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from perfmodel.cli.app import main
from perfmodel.cli.sweep_table import read_table, write_table
from perfmodel.search.sweep import SweepSpecError, apply_point, design, parse_spec, run_sweep, sensitivity

SMALL = """\
name: small
base_system: dgx-h100
parameters:
  hbm_tb_per_s: [2.0, 4.8]
  scale_up_domain: [8, 32]
workloads:
  - name: train8b
    kind: train
    model: llama-3.1-8b
    devices: 16
    global_batch: 64
    seq_len: 4096
  - name: serve8b
    kind: serve
    model: llama-3.1-8b
    rate: 4
"""


def test_design_grid_and_sampled():
    spec = parse_spec(SMALL)
    points = design(spec)
    assert len(points) == 4 and points[0] == {"hbm_tb_per_s": 2.0, "scale_up_domain": 8.0}
    sampled = SMALL.replace("  hbm_tb_per_s: [2.0, 4.8]\n  scale_up_domain: [8, 32]\n",
                            "  hbm_tb_per_s: {low: 2.0, high: 8.0}\n  hbm_gb: {low: 64, high: 192, log: true}\n") \
        + "sampling: {method: sobol, points: 16, seed: 3}\n"
    a, b = design(parse_spec(sampled)), design(parse_spec(sampled))
    assert a == b and len(a) == 16                                  # seeded: reproducible
    assert all(2.0 <= p["hbm_tb_per_s"] <= 8.0 and 64 <= p["hbm_gb"] <= 192 for p in a)
    latin = design(parse_spec(sampled.replace("sobol", "latin")))
    # A Latin hypercube puts exactly one point in each of the 16 strata of every parameter.
    strata = np.floor((np.array([p["hbm_tb_per_s"] for p in latin]) - 2.0) / 6.0 * 16).astype(int)
    assert sorted(strata) == list(range(16))


def test_a_point_changes_the_hardware_it_names(db):
    values = {"hbm_tb_per_s": 6.0, "hbm_gb": 120.0, "scale_up_domain": 32.0, "scale_out_gbit_per_s": 800.0,
              "flops_scale": 2.0}
    point_db, name = apply_point(db, "dgx-h100", values)
    acc = point_db.accelerator(point_db.system(name).accelerator)
    base = db.accelerator("h100-sxm")
    assert acc.hbm_bytes_per_s == 6e12 and acc.hbm_bytes == 120 * 2**30
    assert acc.peak_flops["bf16"] == pytest.approx(2 * base.peak_flops["bf16"])
    levels = point_db.levels(point_db.system(name).scaled(8))          # 64 devices
    assert levels[0].group_size == 32 and levels[-1].bytes_per_s == pytest.approx(100e9)
    # The measured NVLink collectives belong to the real domain: dropped for a hypothetical one.
    assert point_db.calibration(acc.name).collectives is None and db.calibration("h100-sxm").collectives is not None
    assert db.accelerator("h100-sxm").hbm_bytes == 80 * 2**30                 # the base database is untouched


def test_engines_agree_and_a_table_resumes(tmp_path):
    serial = run_sweep(SMALL, engine="process", workers=1)
    pooled = run_sweep(SMALL, engine="process", workers=2)
    assert serial.rows == pooled.rows and len(serial.rows) == 8
    assert {r["status"] for r in serial.rows} <= {"OPTIMAL", "FEASIBLE"}
    spec = parse_spec(SMALL)
    write_table(tmp_path, spec, serial.rows[:4])                      # the first two points only
    meta, done = read_table(tmp_path)
    resumed = run_sweep(SMALL, done=done, workers=1)
    assert resumed.evaluated == 2
    assert [(r["point"], r["workload"]) for r in resumed.rows] == [(r["point"], r["workload"]) for r in serial.rows]
    assert [r.get("tokens_per_usd") for r in resumed.rows] == pytest.approx([r.get("tokens_per_usd") for r in serial.rows])


def test_ray_gives_the_same_table():
    # Ray is in the test extra: the distributed engine runs here on a local instance, never skipped.
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert run_sweep(SMALL, engine="ray").rows == run_sweep(SMALL, engine="process", workers=1).rows
    finally:
        ray.shutdown()


@pytest.mark.parametrize("change, line, words", [
    (("  hbm_tb_per_s: [2.0, 4.8]", "  hbm_tbs: [2.0, 4.8]"), 4, "unknown parameter"),
    (("  scale_up_domain: [8, 32]", "  scale_up_gb_per_s: [-50]"), 5, "needs 0.1 to"),
    (("  scale_up_domain: [8, 32]", "  hbm_gb: {low: 100, high: 100}"), 5, "empty range"),
    (("  scale_up_domain: [8, 32]", "  hbm_gb: {values: []}"), 5, "non-empty list"),
    (("    rate: 4", "    rats: 4"), 16, "unknown serve flag"),
    (("base_system: dgx-h100", "base_system: dgx-h100\nsampling: {method: halton}"), 3, "unknown sampling"),
])
def test_bad_specs_name_their_line(tmp_path, capsys, change, line, words):
    path = tmp_path / "bad.yaml"
    path.write_text(SMALL.replace(*change))
    with pytest.raises(SweepSpecError, match=f":{line}: .*{words}"):
        parse_spec(path.read_text(), str(path))
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"bad.yaml:{line}:" in err


def test_sensitivity_recovers_known_elasticities():
    rows = [{"point": i, "workload": "w", "a": a, "b": b, "status": "OPTIMAL", "tokens_per_usd": 3.0 * a ** 0.5 / b}
            for i, (a, b) in enumerate((a, b) for a in (1.0, 2.0, 4.0) for b in (1.0, 3.0, 9.0))]
    (s,) = sensitivity({"workloads": ["w"], "parameters": ["a", "b"]}, rows)
    assert s.elasticities["tokens_per_usd"] == pytest.approx({"a": 0.5, "b": -1.0})
    assert s.r2["tokens_per_usd"] == pytest.approx(1.0) and s.strongest("tokens_per_usd") == ("b", pytest.approx(-1.0))


def test_the_command_writes_the_table_and_reports(tmp_path, capsys):
    spec = tmp_path / "small.yaml"
    spec.write_text(SMALL)
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["points"] == 4 and summary["evaluated"] == 4
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1", "--json"]) == 0   # resumed: nothing left
    assert json.loads(capsys.readouterr().out)["evaluated"] == 0
    assert main(["sweep", "report", str(out), "--json", "--heatmap", "hbm_tb_per_s,scale_up_domain"]) == 0
    report = json.loads(capsys.readouterr().out)
    train = next(s for s in report["sensitivity"] if s["workload"] == "train8b")
    assert train["elasticities"]["step_time_s"]["hbm_tb_per_s"] <= 0   # more bandwidth is never slower
    assert len(report["heatmap"]["values"]) == 2
    assert main(["sweep", "report", str(tmp_path / "none")]) == 2
    pytest.importorskip("matplotlib")
    for extra, name in ((["--heatmap", "hbm_tb_per_s,scale_up_domain"], "map.html"), (["--pareto"], "front.svg")):
        chart = tmp_path / name
        assert main(["sweep", "report", str(out), "--json", "--plot", str(chart), *extra]) == 0
        assert json.loads(capsys.readouterr().out)["files"] == [str(chart)] and chart.stat().st_size > 1000


def test_an_interrupted_run_resumes_from_the_rows_it_wrote(tmp_path):
    """Rows are appended as batches finish; a point with only some of its workloads' rows is run again."""
    from perfmodel.cli.sweep_table import append_rows

    spec = parse_spec(SMALL)
    full = run_sweep(SMALL, workers=1)
    append_rows(tmp_path, spec, full.rows[:3])                   # point 0 whole, point 1 half
    _, done = read_table(tmp_path)
    resumed = run_sweep(SMALL, done=done, workers=1, on_rows=lambda rows: append_rows(tmp_path, spec, rows))
    assert resumed.evaluated == 3
    assert [(r["point"], r["workload"]) for r in resumed.rows] == [(r["point"], r["workload"]) for r in full.rows]
    write_table(tmp_path, spec, resumed.rows)
    _, final = read_table(tmp_path)
    assert len(final) == 8 and [r["tokens_per_usd"] for r in final] == pytest.approx(
        [r.get("tokens_per_usd") for r in full.rows])


def test_peaks_per_precision_and_the_pareto_front(tmp_path, capsys, db):
    point_db, name = apply_point(db, "dgx-a100", {"fp8_tflops": 600.0, "bf16_tflops": 400.0})
    acc = point_db.accelerator(point_db.system(name).accelerator)
    assert acc.peak_flops["fp8"] == 600e12 and acc.peak_flops["bf16"] == 400e12    # A100 gains an fp8 rate
    spec = tmp_path / "priced.yaml"
    spec.write_text(SMALL.replace("  scale_up_domain: [8, 32]", "  price_usd_per_hour: [1.0, 4.0]"))
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--workers", "1", "--pareto", "--json"]) == 0
    front = json.loads(capsys.readouterr().out)["report"]["pareto"]
    times = [p["step_time_s"] for p in front["points"]]
    costs = [p["cost_per_million_tokens_usd"] for p in front["points"]]
    assert times == sorted(times) and costs == sorted(costs, reverse=True)   # non-dominated: faster costs more
    assert all(p["price_usd_per_hour"] == 1.0 for p in front["points"])      # the same speed, cheaper


def test_the_first_tasks_are_one_point_each_so_progress_shows_early():
    """Progress (and its rate) moves after one point's search per worker, not after a whole batch;
    every point is in exactly one task, in order."""
    from perfmodel.search.sweep import batches

    todo = [(i, {}) for i in range(1000)]
    tasks = batches(todo, 2)
    assert [len(t) for t in tasks[:2]] == [1, 1]
    assert [p for t in tasks for p in t] == todo
    assert max(len(t) for t in tasks) <= 200
