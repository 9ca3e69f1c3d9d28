"""Every built-in file loads and validates; users add and override entries; errors name file and field."""

from __future__ import annotations

import pytest

from perfmodel.hardware_db.errors import SpecError, UnknownNameError
from perfmodel.hardware_db.loader import BUILTIN_DIR, check_file, load_database, user_dirs_from_env

ACCELERATORS = ["a100-sxm-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "gb200", "mi250x", "mi250x-gcd",
                "mi300x", "mi325x", "ascend-910b", "ascend-910c"]
SYSTEMS = ["dgx-a100", "dgx-h100", "hgx-h200", "dgx-b200", "gb200-nvl72", "mi300x-8x", "ascend-910b-8x",
           "cloudmatrix384", "frontier"]
LINKS = ["nvlink4-nvswitch", "nvlink5-nvswitch", "xgmi-mi300x", "hccs", "unified-bus", "pcie4-x16", "pcie5-x16",
         "ib-ndr-400", "roce-400", "slingshot-11"]
MEMORY_KINDS = {"ddr", "cxl", "nvme", "pooled"}


@pytest.mark.parametrize("path", sorted(BUILTIN_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_every_builtin_file_validates_on_its_own(path):
    assert check_file(path)


def test_the_database_covers_the_required_hardware(db):
    assert set(ACCELERATORS) <= set(db.accelerators)
    assert set(SYSTEMS) <= set(db.systems)
    assert set(LINKS) <= set(db.links)
    assert MEMORY_KINDS <= {m.kind for m in db.memory.values()}
    assert {"nvme"} <= {m.kind for m in db.memory.values()}
    assert {c.vendor.split()[0] for c in db.cpus.values()} >= {"Intel", "NVIDIA", "Huawei"} or \
        {"grace", "kunpeng-920"} <= set(db.cpus)


def test_every_entry_cites_a_source(db):
    for kind in ("accelerators", "cpus", "memory", "links", "systems"):
        for entry in getattr(db, kind).values():
            assert entry.sources and all(len(s) > 10 and "/work/" not in s for s in entry.sources), entry.name


def test_accelerators_list_dense_peaks_with_sensible_ratios(db):
    for a in db.accelerators.values():
        half = "bf16" if a.supports("bf16") else "fp16"   # Volta (V100) predates bf16
        assert a.supports(half), a.name
        assert 50 < a.ridge_point(half) < 600, a.name  # FLOP per HBM byte of every accelerator since Volta
    assert not db.accelerator("v100-sxm2-32gb").supports("bf16")


def test_precision_support_is_listed_not_derived(db):
    assert not db.accelerator("a100-sxm-80gb").supports("fp8")
    assert db.accelerator("h100-sxm").supports("fp8") and not db.accelerator("h100-sxm").supports("fp4")
    assert db.accelerator("b200").supports("fp4")
    assert not db.accelerator("ascend-910c").supports("fp8")


def test_an_older_generation_is_not_priced_above_a_newer_one_owned(db):
    """Owned prices per device follow the generations (A100 < H100 < H200): a purchase price older
    than its successor's would tilt every mixed-fleet question toward the newer device."""
    per_device = {name: db.system(name).node_price_usd / db.system(name).devices_per_node
                  for name in ("dgx-a100", "dgx-h100", "hgx-h200")}
    assert per_device["dgx-a100"] < per_device["dgx-h100"] < per_device["hgx-h200"]


def test_aliases_and_case_resolve(db):
    assert db.accelerator("H100").name == "h100-sxm"
    assert db.entry("DGX-H100").name == "dgx-h100"


def test_unknown_names_suggest_close_ones(db):
    with pytest.raises(UnknownNameError, match="did you mean h100-sxm"):
        db.accelerator("h100-sx")
    with pytest.raises(UnknownNameError, match="unknown system 'dgx-h1000'.*dgx-h100"):
        db.system("dgx-h1000")


def test_levels_are_capped_at_the_system_size_and_nest(db):
    for name in db.systems:
        system = db.system(name)
        for nodes in (1, 3, system.nodes):
            levels = db.levels(system.scaled(nodes))
            sizes = [lv.group_size for lv in levels]
            assert sizes == sorted(sizes) and sizes[-1] == system.devices_per_node * nodes
            assert all(lv.bytes_per_s > 0 and lv.latency_s >= 0 for lv in levels)


def test_frontier_has_its_four_levels(db):
    frontier = db.system("frontier")
    assert frontier.nodes == 9408 and frontier.devices_per_node == 8
    levels = db.levels(frontier)
    assert [lv.group_size for lv in levels][:3] == [2, 8, 1024]
    assert levels[-1].group_size == 9408 * 8
    bandwidths = [lv.bytes_per_s for lv in levels]
    assert bandwidths == sorted(bandwidths, reverse=True)  # slower as groups grow


def test_cloudmatrix_is_one_ub_domain_of_384(db):
    levels = db.levels(db.system("cloudmatrix384"))
    assert any(lv.group_size == 384 and lv.link == "unified-bus" for lv in levels)


def test_memory_tiers_below_hbm(db):
    tiers = db.memory_tiers(db.system("dgx-h100"))
    assert {t.kind for t in tiers} >= {"ddr", "nvme"}
    pcie5 = db.link("pcie5-x16").bytes_per_s
    assert all(t.read_bytes_per_s <= pcie5 for t in tiers)
    assert any(t.kind == "cxl" for t in db.memory_tiers(db.system("hgx-h200")))
    assert any(t.kind == "pooled" for t in db.memory_tiers(db.system("cloudmatrix384")))


def test_scaling_a_system(db):
    assert db.system("dgx-h100", nodes=2048).devices == 16384
    with pytest.raises(SpecError, match="positive integer"):
        db.system("dgx-h100").scaled(0)


def write(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    return tmp_path


def test_user_directory_overrides_and_extends(tmp_path):
    write(tmp_path, "mine.yaml", """
accelerators:
  - name: h100-sxm-lowclock
    extends: h100-sxm
    display_name: H100 SXM at a lower clock (test)
    dense_tflops: {bf16: 800, fp16: 800, fp8: 1600}
    sources: ["my own measurement"]
  - name: mi300x
    extends: mi300x
    display_name: MI300X with my price
    price_usd: 12345
    sources: ["my own quote"]
""")
    db = load_database([tmp_path])
    low = db.accelerator("h100-sxm-lowclock")
    assert low.peak("bf16") == 800e12 and low.hbm_bytes == 80 * 2**30 and not low.supports("fp64")
    assert db.accelerator("mi300x").price_usd == 12345


def test_environment_variable_names_directories(tmp_path):
    assert user_dirs_from_env({"PERFMODEL_HARDWARE_DB": f"{tmp_path}:/x"}) == [str(tmp_path), "/x"]
    assert user_dirs_from_env({}) == []


@pytest.mark.parametrize("text, message", [
    ("accelerators:\n  - name: x\n    hbm_gb: [1, 2\n", r"malformed YAML \(.*bad.yaml:\d+\)"),
    ("accelerators: 3\n", "needs a list of mappings"),
    ("gpus: []\n", "unknown entry kind"),
    ("- 1\n- 2\n", "needs a mapping"),
    ("accelerators:\n  - name: h100-sxm\n    extends: h100-sxm\n    hbm_tb_per_s: 3350\n    sources: [s]\n",
     r"bad.yaml:accelerators.h100-sxm:hbm_tb_per_s: needs 0.05 to 50 TB/s, has 3350; is it in GB/s"),
    ("systems:\n  - name: s2\n    extends: dgx-h100\n    accelerator: h100-sxn\n", "did you mean h100-sxm"),
    ("accelerators:\n  - name: a\n    extends: nothing-here\n", "unknown accelerators entry to extend"),
    ("links:\n  - name: h100-sxm\n    display_name: x\n    kind: host\n    latency_us: 1\n"
     "    gb_per_s_per_direction: 1\n    sources: [s]\n", "used by a"),
])
def test_malformed_user_files_name_the_file_and_field(tmp_path, text, message):
    write(tmp_path, "bad.yaml", text)
    with pytest.raises(SpecError, match=message):
        load_database([tmp_path])


def test_missing_directory_is_a_user_error(tmp_path):
    with pytest.raises(SpecError, match="not found"):
        load_database([tmp_path / "nope"])


def test_a_borrowed_calibration_keeps_kernels_and_drops_other_links_collectives(db):
    """H800 (H100 silicon, NVLink cut to 400 GB/s) takes the H100's measured GEMM and attention
    kernels, not its NVLink collectives; FengHuang's H200 (same links) keeps all of the H200's."""
    h100, h800 = db.calibration("h100-sxm"), db.calibration("h800-sxm")
    assert h800.gemm == h100.gemm and h800.attention == h100.attention
    assert h100.collectives is not None and h800.collectives is None and h800.dispatch is None
    assert h800.scale_up_fraction == db.calibration_default().scale_up_fraction
    assert db.calibration("h200-fenghuang").collectives == db.calibration("h200").collectives


def test_an_unmeasured_device_takes_its_vendors_prior_or_the_lowest_measured(db):
    """A device without its own GEMM measurement takes the median of its vendor's measured fractions
    (its vendor's BLAS), and a vendor with none the lowest fraction measured anywhere (conservative:
    the search must not win a plan on a guess). constant unfitted-gemm-error is the leave-one-out
    error of that rule over the measured devices (H200's bf16 entry repeats the H100's and is left
    out), recomputed here from the database."""
    from statistics import mean, median

    measured = [(db.accelerator(c.device).vendor, p, f) for c in db.calibrations.values() if c.device
                for p, f in c.matmul_fraction.items() if p in ("bf16", "fp8")
                and not (c.name == "h200-measured" and p == "bf16")]

    def prior(vendor, precision, points):
        own = [f for v, p, f in points if v == vendor and p == precision]
        return median(own) if own else min(f for _, p, f in points if p == precision)

    for vendor in ("NVIDIA", "AMD", "Huawei"):
        default = db.calibration_default(vendor).matmul_fraction
        for precision in ("bf16", "fp8"):
            assert default[precision] == pytest.approx(prior(vendor, precision, measured), abs=5e-4)
    errors = [abs(f / prior(v, p, measured[:i] + measured[i + 1:]) - 1) for i, (v, p, f) in enumerate(measured)]
    assert len(errors) == 13
    assert db.constant("unfitted-gemm-error") == pytest.approx(mean(errors), abs=5e-4)
