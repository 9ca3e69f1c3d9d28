"""Charts of each command's --json document, rendered headless as PNG, SVG and HTML."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

pytest.importorskip("matplotlib")

from perfmodel.cli import chart_kit, plots  # noqa: E402
from perfmodel.cli.app import main  # noqa: E402
from perfmodel.hardware_db.errors import SpecError  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
COMMANDS = {
    "estimate train": ["estimate", "train"],
    "estimate serve": ["estimate", "serve"],
    "plan train": ["plan", "train", "--pareto"],
    "plan serve": ["plan", "serve", "--pareto"],
    "compare": ["compare"],
}


def _run_json(argv: list[str]) -> dict:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*argv, "--json"])
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def docs() -> dict[str, dict]:
    """Each command's --json document on its defaults, run once for the module."""
    return {name: _run_json(argv) for name, argv in COMMANDS.items()}


def without_operator_work(doc: dict) -> dict:
    """``doc`` with each operator's FLOPs and bytes removed (a document the roofline cannot draw)."""
    out = copy.deepcopy(doc)
    for op in out["result"]["operators_s"].values():
        op.pop("flops", None)
        op.pop("bytes", None)
    return out


def _svg_text(path) -> str:
    root = ET.parse(path).getroot()
    assert root.tag.endswith("svg")
    return " ".join(root.itertext())


# (plot, document, labels the chart must show)
CASES = [
    ("pareto", "plan train", ["Pareto front", "optimum", "step time", "tp"]),
    ("pareto", "plan serve", ["Pareto front", "TTFT", "TPOT", "SLO"]),
    ("breakdown", "estimate train", ["Step time", "tp communication", "compute"]),
    ("breakdown", "estimate serve", ["TTFT", "TPOT", "compute"]),
    ("memory", "estimate train", ["HBM", "weights", "optimizer states", "capacity"]),
    ("memory", "estimate serve", ["HBM", "kv cache", "weights"]),
    ("compare", "compare", ["h100-sxm", "b200", "mi300x", "ascend-910c", "bf16", "fp8"]),
    ("roofline", "estimate train", ["mlp", "attention core", "bf16 peak", "memory"]),
    ("roofline", "estimate serve", ["decode mlp", "prefill mlp", "bf16 peak"]),
]


def _doc(docs, plot: str, name: str) -> dict:
    return docs[name]


@pytest.mark.parametrize("suffix", chart_kit.SUFFIXES)
@pytest.mark.parametrize("plot, name, labels", CASES, ids=[f"{p}-{n.replace(' ', '-')}" for p, n, _ in CASES])
def test_each_plot_in_each_format(docs, tmp_path, plot, name, labels, suffix):
    path = tmp_path / f"chart{suffix}"
    written = getattr(plots, plot)(_doc(docs, plot, name), path)
    assert written == path and path.stat().st_size > 1000
    if suffix == ".png":
        from matplotlib.image import imread

        assert path.read_bytes()[:8] == PNG_MAGIC
        height, width, channels = imread(path).shape
        assert width == chart_kit.FIGSIZE_IN[0] * chart_kit.PNG_DPI and 300 <= height <= 1200 and channels in (3, 4)
    elif suffix == ".svg":
        text = _svg_text(path)
        assert all(label in text for label in labels), [la for la in labels if la not in text]
    else:
        page = path.read_text(encoding="utf-8")
        assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "<table>" in page and "</html>" in page
        assert "<script" not in page and "src=\"http" not in page and "href=\"http" not in page
        assert all(label in page for label in labels)


def test_outputs_are_byte_reproducible(docs, tmp_path):
    for suffix in (".png", ".svg", ".html"):
        a, b = tmp_path / f"a{suffix}", tmp_path / f"b{suffix}"
        plots.compare(docs["compare"], a)
        plots.compare(docs["compare"], b)
        assert a.read_bytes() == b.read_bytes(), suffix


def test_compare_table_holds_the_documents_numbers(docs, tmp_path):
    path = plots.compare(docs["compare"], tmp_path / "c.html")
    page = path.read_text(encoding="utf-8")
    for entry in docs["compare"]["entries"]:
        assert chart_kit.si(entry["peak_bf16_flops"], "FLOP/s", 4) in page
        assert chart_kit.si(entry["hbm_bytes_per_s"], "B/s", 4) in page


def test_breakdown_table_adds_up_to_the_step(docs, tmp_path):
    result = docs["estimate train"]["result"]
    parts = plots._positive(result["time_components_s"])
    assert sum(parts.values()) == pytest.approx(result["step_time_s"], rel=1e-9)
    page = plots.breakdown(docs["estimate train"], tmp_path / "b.html").read_text(encoding="utf-8")
    assert all(name in page for name in parts)


def test_memory_tiers_follow_the_plans_placement(docs):
    best = docs["plan train"]["recommended"]
    tiers = plots.tier_parts(best["breakdown"], best["plan"])
    for tier, info in best["breakdown"]["memory_tiers"].items():
        assert sum(tiers[tier].values()) == pytest.approx(info["used_bytes"], rel=1e-6, abs=1.0)


def test_memory_tier_that_does_not_add_up_is_one_part():
    result = {"memory_per_device_bytes": {"weights": 5.0, "activations": 3.0},
              "memory_tiers": {"hbm": {"used_bytes": 10.0, "capacity_bytes": 20.0}}}
    assert plots.tier_parts(result, {}) == {"hbm": {"used (not split by component)": 10.0}}


def test_roofline_needs_operator_flops_and_bytes(docs, tmp_path):
    with pytest.raises(SpecError) as err:
        plots.roofline(without_operator_work(docs["estimate train"]), tmp_path / "r.png")
    message = str(err.value)
    assert "\n" not in message and ".flops" in message and ".bytes" in message


def test_roofline_reads_the_peaks_from_the_document(docs, tmp_path):
    doc = copy.deepcopy(docs["estimate train"])
    doc["result"]["device"] = {"name": "test-device", "peak_flops_per_s": {"bf16": 2e15, "fp8": 4e15},
                               "hbm_bytes_per_s": 4e12}
    page = plots.roofline(doc, tmp_path / "r.html")
    text = page.read_text(encoding="utf-8")
    assert "2 PFLOP/s" in text and "4 TB/s" in text and "test-device" in text


def test_unknown_suffix_is_one_line(docs, tmp_path):
    with pytest.raises(SpecError) as err:
        plots.compare(docs["compare"], tmp_path / "chart.pdf")
    message = str(err.value)
    assert "\n" not in message and all(s in message for s in chart_kit.SUFFIXES)
    assert not (tmp_path / "chart.pdf").exists()


@pytest.mark.parametrize("plot, name, wanted", [
    ("pareto", "estimate train", "plan train --pareto"),
    ("breakdown", "compare", "estimate train"),
    ("memory", "plan serve", "estimate serve"),
    ("roofline", "plan train", "estimate train"),
    ("compare", "estimate serve", "compare --json"),
])
def test_a_document_of_another_command_is_one_line(docs, tmp_path, plot, name, wanted):
    with pytest.raises(SpecError) as err:
        getattr(plots, plot)(docs[name], tmp_path / "x.svg")
    message = str(err.value)
    assert "\n" not in message and wanted in message


def test_a_plan_without_pareto_says_so(docs, tmp_path):
    doc = {k: v for k, v in docs["plan train"].items() if k != "pareto"}
    with pytest.raises(SpecError, match="without --pareto"):
        plots.pareto(doc, tmp_path / "p.png")


def test_not_a_json_object(tmp_path):
    with pytest.raises(SpecError, match="JSON list"):
        plots.memory([], tmp_path / "m.png")


def test_missing_matplotlib_names_the_extra(docs, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(SpecError, match=r"pip install 'perfmodel\[plot\]'"):
        plots.compare(docs["compare"], tmp_path / "c.png")


def test_plot_without_matplotlib_fails_before_the_search(monkeypatch, capsys):
    """--plot without matplotlib is one line and exit 2 before any search runs (nothing lost)."""
    from perfmodel.cli.app import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setattr("perfmodel.search.api.plan_train", lambda *a, **k: pytest.fail("the search ran"))
    assert main(["plan", "train", "--plot", "p.png"]) == 2
    assert "perfmodel[plot]" in capsys.readouterr().err


def test_importing_plots_does_not_import_matplotlib():
    code = "import sys, perfmodel.cli.plots; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("value, unit, text", [
    (3.35e12, "B/s", "3.35 TB/s"), (989.4e12, "FLOP/s", "989 TFLOP/s"), (999.9, "", "1 k"),
    (0.0125, "s", "12.5 ms"), (0.0, "B", "0 B"), (None, "s", "-"), (-2500.0, "", "-2.5 k"),
])
def test_si(value, unit, text):
    assert chart_kit.si(value, unit) == text


def test_spread_keeps_labels_apart_and_in_order():
    values = [1.0, 1.01, 1.02, 3.0]
    out = chart_kit.spread(values, 0.1)
    ordered = sorted(out)
    assert all(b - a >= 0.1 - 1e-12 for a, b in zip(ordered, ordered[1:]))
    assert [sorted(values).index(v) for v in values] == [ordered.index(o) for o in out]
    assert chart_kit.spread([5.0], 1.0) == [5.0]


def test_plan_texts():
    plan = {"tp": 1, "pp": 4, "interleave": 2, "cp": 8, "dp": 2, "ep": 1, "zero": 2, "recompute": "none",
            "precision": "bf16", "optimizer_place": "ddr", "grad_place": "hbm", "param_place": "hbm"}
    assert chart_kit.train_plan_text(plan) == "tp1 pp4/v2 cp8 dp2 z2 bf16 opt>ddr"
    pool = {"role": "prefill", "instances": 4, "config": {"tp": 1, "pp": 1, "ep": 1, "batch": 1,
                                                          "weight_precision": "fp8", "activation_precision": "a8",
                                                          "kv_precision": "bf16"}}
    assert chart_kit.serve_pool_text(pool) == "P 4x tp1 fp8/a8 kv:bf16"


def test_a_component_named_in_a_tier_goes_there():
    result = {"memory_per_device_bytes": {"weights": 6.0, "kv cache": 0.0, "kv cache in ddr": 3.0},
              "memory_tiers": {"hbm": {"used_bytes": 6.0, "capacity_bytes": 20.0}}}
    assert plots.tier_parts(result, {"kv_place": "ddr"}) == {"hbm": {"weights": 6.0}, "ddr": {"kv cache in ddr": 3.0}}


def test_pareto_chart_numbers_the_front_as_the_table_lists_it_and_names_mixed_systems():
    """The chart's key #k is the command's Pareto table row #k; over several systems each point
    names the systems its pools run on."""
    doc = _run_json(["plan", "serve", "--model", "llama-3.1-70b", "--system", "dgx-h100", "--system", "mi300x-8x",
                     "--rate", "20", "--pareto"])
    data = plots._pareto_data(doc, "plan-serve-pareto")
    assert list(data.front) == doc["pareto"]
    for row, text in zip(data.front, data.texts):
        assert all(p["system"] in text for p in row["pools"])
