"""A new user's session, end to end: a made-up accelerator and system typed into a YAML file,
then every command a planner would run on it, with --hardware-db where they type it."""

from __future__ import annotations

import json
import textwrap

import pytest

from perfmodel.cli.app import main

ACCELERATOR = """\
accelerators:
  - name: acme-x1
    display_name: ACME X1 (made up)
    vendor: ACME
    dense_tflops: {bf16: 1200, fp8: 2400}
    hbm_gb: 144
    hbm_tb_per_s: 6
    tdp_w: 900
    l2_mb: 96
    scale_up_gb_per_s_per_direction: 600
    nic_gbit_per_s_per_direction: 400
    host_link: pcie5-x16
    compute_units: 160
    cloud_usd_per_hour: 3.0
    sources: ["a made-up accelerator for the new-user test"]
systems:
  - name: acme-8x
    display_name: ACME 8x X1 node
    vendor: ACME
    accelerator: acme-x1
    devices_per_node: 8
    nodes: 64
    tiers:
      - {name: fabric, link: nvlink4-nvswitch, group_size: 8}
      - {name: ib, link: ib-ndr-400}
    sources: ["a made-up system for the new-user test"]
"""


@pytest.fixture
def mine(tmp_path):
    (tmp_path / "acme.yaml").write_text(ACCELERATOR)
    return str(tmp_path)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv", [
    ("hardware", "show", "acme-x1"),
    ("hardware", "show", "acme-8x"),
    ("compare", "acme-8x", "dgx-h100"),
    ("estimate", "train", "--system", "acme-8x", "--model", "llama-3.1-8b", "--devices", "8", "--tp", "8", "--pp", "1",
     "--global-batch", "64"),
    ("estimate", "serve", "--system", "acme-8x", "--model", "llama-3.1-8b", "--devices", "1", "--tp", "1"),
    ("plan", "train", "--system", "acme-8x", "--system", "dgx-h100", "--model", "llama-3.1-8b", "--devices", "8",
     "--global-batch", "64"),
    ("plan", "serve", "--system", "acme-8x", "--system", "dgx-h100", "--model", "llama-3.1-8b", "--rate", "5"),
    ("calibrate", "gemm", "--device", "acme-x1", "--table", "tests/data/gemm_h100_sample.csv"),
])
def test_a_made_up_accelerator_runs_through_every_command(argv, mine, capsys, monkeypatch, request):
    """--hardware-db after the command, as typed; every command answers, and a plan on the made-up
    device says its constants are unmeasured."""
    monkeypatch.chdir(request.config.rootpath)
    code, out, err = run(capsys, *argv, "--hardware-db", mine)
    assert code == 0, err
    assert "acme" in out
    if argv[0] in ("plan", "estimate") and "acme-8x" in out.split("recommended")[0]:
        assert "no measured kernels" in " ".join(out.split())


def test_the_made_up_device_prices_and_plans_in_json(mine, capsys):
    code, out, err = run(capsys, "--hardware-db", mine, "plan", "train", "--system", "acme-8x", "--model",
                         "llama-3.1-8b", "--devices", "8", "--global-batch", "64", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["recommended"]["system"] == "acme-8x" and doc["recommended"]["run_cost_usd"] > 0
    assert "cloud on-demand rent, $3 per device-hour" in doc["cost_basis"]["acme-8x"]


def test_every_mistake_of_a_file_in_one_line(tmp_path, capsys):
    """Two entries with five mistakes between them: all named in one line, exit 2."""
    (tmp_path / "bad.yaml").write_text(textwrap.dedent("""\
        accelerators:
          - name: bad-one
            display_name: Bad one
            vendor: X
            dense_tflops: {bf16: -5}
            hbm_gb: 80
            hbm_tb_per_s: 2
            tdp_w: 500
            l2_mb: 50
            scale_up_gb_per_s_per_direction: 300
            sources: [x]
          - name: bad-two
            display_name: Bad two
            vendor: X
            dense_tflops: {bf16: 100}
            hbm_gbs: 80
            hbm_tb_per_s: 2
            tdp_w: 500
            l2_mb: 50
            scale_up_gb_per_s_per_direction: 300
            sources: [x]
        """))
    code, out, err = run(capsys, "hardware", "list", "--hardware-db", str(tmp_path))
    assert code == 2 and err.count("\n") == 1 and not out
    assert "bad-one" in err and "bf16" in err and "bad-two" in err and "hbm_gbs" in err and "hbm_gb: missing" in err
