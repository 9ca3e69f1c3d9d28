"""A listed training plan as a typed row: where it runs, the plan, and what the cost model predicts.

``search.train`` describes each listed plan (the best, the top plans, the Pareto front, the ties,
each system's best, the recommendation) as a ``TrainRow``; readers take its fields by name, and
``as_dict`` gives the row's JSON document (the one ``perfmodel plan train --json`` prints).
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.training import TrainPlan

from .space import PLAN_FIELDS

METRICS = ("step_time_s", "step_time_low_s", "step_time_high_s", "tokens_per_s", "mfu", "hbm_used_bytes", "hbm_fill",
           "power_w", "energy_per_token_j", "cost_per_million_tokens_usd", "run_cost_usd", "run_time_s")


@dataclass(frozen=True)
class TrainRow:
    """One listed training plan on ``devices`` devices of ``system``, with its predicted metrics.

    A metric the model cannot give (a cost without a price) is None, never NaN.
    """

    system: str
    devices: int
    plan: TrainPlan                             # the searched fields (PLAN_FIELDS) set, the rest at their defaults
    step_time_s: float                          # predicted step time, s
    step_time_low_s: float                      # low end of the prediction's range, s
    step_time_high_s: float                     # high end of the prediction's range, s
    tokens_per_s: float                         # training throughput of the whole run, tokens/s
    mfu: float                                  # model FLOPs utilization, fraction of peak
    hbm_used_bytes: float                       # HBM used per device, bytes
    hbm_fill: float                             # hbm_used_bytes over the device's HBM, fraction
    power_w: float                              # mean power per device, W
    energy_per_token_j: float                   # J per trained token
    cost_per_million_tokens_usd: float | None   # USD per million trained tokens
    run_cost_usd: float | None                  # USD of the whole run (0 without --tokens)
    run_time_s: float | None                    # length of the whole run, s (0 without --tokens)
    runs_on: tuple[str, ...] | None = None      # the recommendation only: frameworks that run the plan as written

    def plan_dict(self) -> dict:
        """The searched plan fields, name -> value, in PLAN_FIELDS order (what ``TrainPlan(**...)`` takes)."""
        return {k: getattr(self.plan, k) for k in PLAN_FIELDS
                if k != "activation_offload" or self.plan.activation_offload}   # listed only when on

    def as_dict(self) -> dict:
        """The row's JSON document: system, devices, plan, the metrics (and ``runs_on`` when set)."""
        out = {"system": self.system, "devices": self.devices, "plan": self.plan_dict(),
               **{k: getattr(self, k) for k in METRICS}}
        if self.runs_on is not None:
            out["runs_on"] = list(self.runs_on)
        return out
