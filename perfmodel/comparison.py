"""Side-by-side figures of accelerators and systems, for architects comparing hardware.

Each metric is a plain float in SI units (or None where the entry has no such figure), with the
direction that counts as better, so that a renderer can highlight the best value of each row.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.hardware_db.loader import Database
from perfmodel.hardware_db.schema import PRECISIONS, Accelerator, System


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    scale: float  # divide the SI value by this to print it in ``unit``
    higher_is_better: bool


def metrics() -> tuple[Metric, ...]:
    """The rows of a comparison, in order."""
    rows = [Metric(f"peak_{p}_flops", f"peak {p}", "TFLOP/s", 1e12, True) for p in PRECISIONS]
    rows += [
        Metric("hbm_bytes", "HBM capacity", "GB", 1e9, True),
        Metric("hbm_bytes_per_s", "HBM bandwidth", "TB/s", 1e12, True),
    ]
    rows += [Metric(f"ridge_{p}_flop_per_byte", f"ridge point {p}", "FLOP/B", 1.0, False) for p in PRECISIONS]
    rows += [
        Metric("sram_bytes", "on-chip SRAM (L2)", "MB", 1e6, True),
        Metric("scale_up_bytes_per_s", "scale-up per device, one way", "GB/s", 1e9, True),
        Metric("scale_up_domain", "scale-up domain", "devices", 1.0, True),
        Metric("scale_out_bytes_per_s", "scale-out per device, one way", "Gbit/s", 1e9 / 8, True),
        Metric("tdp_w", "TDP", "W", 1.0, False),
        Metric("bf16_flops_per_w", "bf16 per watt", "TFLOP/s/W", 1e12, True),
        Metric("fp8_flops_per_w", "fp8 per watt", "TFLOP/s/W", 1e12, True),
        Metric("price_usd", "price", "USD", 1.0, False),
        Metric("cloud_usd_per_device_hour", "cloud rent per device-hour", "USD", 1.0, False),
        Metric("owned_usd_per_device_hour", "owned cost per device-hour at TDP", "USD", 1.0, False),
        Metric("bf16_flops_per_usd", "bf16 per dollar", "GFLOP/s/USD", 1e9, True),
        Metric("devices", "devices", "", 1.0, True),
        Metric("gemm_constants", "GEMM constants from", "", 1.0, True),
        Metric("compute_error", "compute time error (+-)", "%", 0.01, False),
        Metric("step_error", "step time error beyond the kernels (+-)", "%", 0.01, False),
    ]
    return tuple(rows)


def gemm_provenance(acc: Accelerator, db: Database) -> tuple[str, float]:
    """(where the device's GEMM constants come from, the relative error a prediction's compute
    carries): a fit on measured GEMM kernels (its held-out error), the device's measured large-GEMM
    fraction of its peak (a datasheet peak times one measurement), or for a device without
    measurements its vendor's prior (the median of the vendor's measured devices; the lowest
    fraction measured anywhere for a vendor with none; the constant unfitted-gemm-error)."""
    cal = db.calibration(acc.name)
    unfitted = db.constant("unfitted-gemm-error")
    if cal.gemm:
        return f"fitted on measured GEMMs ({', '.join(sorted(cal.gemm))})", max(f.held_out_mape for f in cal.gemm.values())
    if cal.matmul_fraction:
        return (f"measured large-GEMM fraction ({', '.join(sorted(cal.matmul_fraction))}), no kernel fit",
                unfitted)
    vendor = acc.vendor.lower() in {v.lower() for v in db.calibration_default().vendor_matmul_fraction}
    return ("not measured: " + (f"the median of {acc.vendor}'s measured devices" if vendor else
                                "the lowest fraction measured on any device"), unfitted)


def _scale_up(system: System, db: Database) -> tuple[float | None, int | None, float | None]:
    """Per-device scale-up bandwidth and domain (the largest tier over a scale-up link) and scale-out bandwidth."""
    up_bw = up_size = out_bw = None
    for level in db.levels(system):
        kind = db.link(level.link).kind
        if kind in ("scale-up", "package"):
            up_bw, up_size = level.bytes_per_s, level.group_size
        elif kind == "scale-out" and out_bw is None:
            out_bw = level.bytes_per_s
    return up_bw, up_size, out_bw


def profile(name: str, db: Database) -> dict[str, float | str | None]:
    """Every comparison metric of one accelerator or system (systems are shown per device)."""
    entry = db.entry(name)
    system = entry if isinstance(entry, System) else None
    if system is None and not isinstance(entry, Accelerator):
        from perfmodel.hardware_db.errors import SpecError

        raise SpecError(f"'{name}' is a {entry.__class__.__name__.lower()}; compare takes accelerators or systems")
    acc = db.accelerator(system.accelerator) if system else entry
    out: dict[str, float | str | None] = {"name": entry.name, "display_name": entry.display_name,
                                          "kind": "system" if system else "accelerator"}
    for p in PRECISIONS:
        peak = acc.peak_flops.get(p)
        out[f"peak_{p}_flops"] = peak
        out[f"ridge_{p}_flop_per_byte"] = peak / acc.hbm_bytes_per_s if peak else None
    out.update(hbm_bytes=acc.hbm_bytes, hbm_bytes_per_s=acc.hbm_bytes_per_s, sram_bytes=acc.sram_bytes,
               tdp_w=acc.tdp_w, price_usd=acc.price_usd)
    if system:
        up_bw, up_size, out_bw = _scale_up(system, db)
        out.update(scale_up_bytes_per_s=up_bw, scale_up_domain=up_size, scale_out_bytes_per_s=out_bw,
                   devices=system.devices)
        if system.node_price_usd:
            out["price_usd"] = system.node_price_usd / system.devices_per_node
    else:
        out.update(scale_up_bytes_per_s=acc.scale_up_bytes_per_s, scale_up_domain=None,
                   scale_out_bytes_per_s=acc.nic_bytes_per_s, devices=1)
    for p in ("bf16", "fp8"):
        peak = acc.peak_flops.get(p)
        out[f"{p}_flops_per_w"] = peak / acc.tdp_w if peak else None
    out.update(device_hour_prices(db, system.name) if system else
               {"cloud_usd_per_device_hour": acc.cloud_usd_per_hour, "owned_usd_per_device_hour": None})
    bf16 = acc.peak_flops.get("bf16")
    out["bf16_flops_per_usd"] = bf16 / out["price_usd"] if bf16 and out["price_usd"] else None
    out["gemm_constants"], out["compute_error"] = gemm_provenance(acc, db)
    # The whole-step error measured for the device's kind of constants (perfmodel.machine.Machine.interval).
    out["step_error"] = db.constant("framework-fit-error" if db.calibration(acc.name).gemm
                                    else "unmeasured-kernels-error")
    return out


def device_hour_prices(db: Database, system_name: str) -> dict[str, float | None]:
    """What a plan charges per device-hour on a system, on each cost basis (perfmodel.power.run_cost):
    the cloud rent, and the owned total cost with the device drawing its TDP (and node share). None
    where the database has no price."""
    from perfmodel.machine import build_machine
    from perfmodel.economics import run_cost

    out = {}
    for basis in ("cloud", "owned"):
        machine = build_machine(db, system_name, None, basis)
        usd = float(run_cost(machine, machine.tdp_w + machine.overhead_w_per_device))
        out[f"{basis}_usd_per_device_hour"] = usd if usd == usd else None
    return out


def compare(names: list[str], db: Database) -> list[dict[str, float | str | None]]:
    """Profiles of several accelerators or systems, in the order given."""
    return [profile(n, db) for n in names]


def best_index(values: list[float | None], higher_is_better: bool) -> int | None:
    """Index of the best value of a row (None when fewer than two entries have one)."""
    present = [(v, i) for i, v in enumerate(values) if v is not None]
    if len(present) < 2 or len({v for v, _ in present}) == 1:
        return None
    return (max if higher_is_better else min)(present)[1]
