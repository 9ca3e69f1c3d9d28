"""The cost model's named constants as one typed, frozen object, built once per database.

Each field is an entry of hardware_db/data/constants.yaml (a ``--hardware-db`` entry of the same name
overrides it), read under its name with "-" written "_"; where a database holds no entry, the value
beside its range in ``hardware_db.schema.CONSTANT_TERMS``. Units are the entries' (fractions,
seconds written in microseconds where the name says ``-us``, years, US dollars).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from perfmodel.hardware_db.schema import CONSTANT_TERMS


@dataclass(frozen=True)
class ModelConstants:
    hbm_reserve_fraction: float
    hbm_headroom_fraction: float
    idle_power_fraction: float
    pue: float
    power_memory_weight: float
    electricity_usd_per_kwh: float
    depreciation_years: float
    server_price_multiplier: float
    facility_usd_per_kw_month: float
    network_capex_fraction: float
    moe_load_imbalance: float
    moe_routing_power_law_alpha: float
    moe_redundant_expert_share: float
    dp_overlap_fraction: float
    framework_gemm_efficiency: float
    prefill_tokens_in_flight: float
    unfitted_kernel_launch_us: float
    unfitted_collective_launch_us: float
    exchange_sms: float
    tp_overlap_bulk_sms: float
    collective_sms: float
    four_bit_gemm_speedup: float
    attention_backward_slowdown: float
    attention_backward_slowdown_1k: float
    unfitted_gemm_error: float
    unfitted_collective_error: float
    framework_fit_error: float
    unmeasured_kernels_error: float
    serving_error: float
    unmeasured_serving_error: float
    moe_training_error: float

    @staticmethod
    def of(values: Mapping[str, float]) -> "ModelConstants":
        """From the database's values by entry name; a name it lacks takes CONSTANT_TERMS' value."""
        return ModelConstants(**{f.name: float(values.get(entry_name(f.name), CONSTANT_TERMS[entry_name(f.name)][0]))
                                 for f in fields(ModelConstants)})

    def value(self, name: str) -> float:
        """The constant an entry ``name`` (as constants.yaml spells it) holds."""
        return getattr(self, name.replace("-", "_"))


def entry_name(field_name: str) -> str:
    """constants.yaml's name of a field."""
    return field_name.replace("_", "-")
