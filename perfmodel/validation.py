"""The validation set: published measurements, each predicted by the cost model with no further tuning.

Cases live as data in ``perfmodel/validation/*.yaml`` with their citations. A case names its
model (catalog name or inline spec), system, device count, plan and the measured metric; this
module turns it into one ``estimate_training`` / ``estimate_serving`` call (or the closed-form
memory formulas for the ZeRO and Korthikanti cases) and reports predicted vs published.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from perfmodel.hardware_db.errors import SpecError
from perfmodel.hardware_db.files import read_yaml
from perfmodel.hardware_db.loader import Database, format_validation_error

from .catalog import find_model
from .memory import activation_bytes_per_layer, model_state_bytes
from .model import TransformerSpec
from .plan import RECOMPUTE, QuantScheme
from .requests import ServeRequest, TrainRequest
from .serving import estimate_serving
from .training import estimate_training

CASES_DIR = Path(__file__).parent / "validation"

METRICS = ("tflops_per_device", "mfu", "step_time_s", "tokens_per_s_per_device", "model_state_bytes_per_device",
           "activation_bytes_per_layer", "prefill_tokens_per_s_per_device", "decode_tokens_per_s_per_device",
           "ttft_s", "tpot_s")
EXACT_KINDS = ("memory", "activation")   # closed-form figures: must match exactly


class Measured(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    metric: str
    value: float = Field(gt=0)


class Case(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    id: str
    kind: str
    calibration: bool = False
    source: str
    model: Any
    system: str
    devices: int = Field(ge=1)
    devices_per_unit: int = Field(1, ge=1)   # the published per-device figure counts this many devices
    plan: dict[str, Any]
    measured: Measured
    notes: str = ""


def load_cases(directory: Path = CASES_DIR) -> list[Case]:
    """Every case of every YAML file in the validation directory, in file order."""
    cases = []
    for path in sorted(directory.glob("*.yaml")):
        data = read_yaml(path)
        for raw in (data or {}).get("cases", []):
            try:
                cases.append(Case.model_validate(raw))
            except ValidationError as exc:
                raise SpecError(format_validation_error(exc, f"{path}:{raw.get('id', '?')}")) from None
    ids = [c.id for c in cases]
    if len(ids) != len(set(ids)):
        raise SpecError("validation case ids must be unique")
    return cases


def _spec(case: Case) -> TransformerSpec:
    if isinstance(case.model, str):
        return find_model(case.model)
    return TransformerSpec.model_validate(case.model)


def published_flops(case: Case, spec: TransformerSpec) -> float:
    """FLOPs per step as the source counts them when it reports FLOP/s or MFU.

    Narayanan et al. 2021 count hardware FLOPs with the recompute forward (their Eq. 3); everyone
    else reports model FLOPs as PaLM defines them (App. B: 6N plus 12 x layers x width x sequence
    per token, every query against the whole sequence, causal or not). perfmodel's own MFU counts
    the causal half its kernels compute, so published figures are converted, never compared raw.
    """
    p = case.plan
    s, batch = p["seq_len"], p["global_batch"]
    if case.id.startswith("megatron-"):
        layers, h, v = spec.num_layers, spec.hidden_size, spec.vocab_size
        return 96 * batch * s * layers * h**2 * (1 + s / (6 * h) + v / (16 * layers * h))
    return spec.training_flops_per_token(s, causal=False) * batch * s


def _model_name(case: Case) -> str:
    return case.model if isinstance(case.model, str) else f"{case.id}.yaml"


def command(case: Case) -> str | None:
    """The ``perfmodel estimate`` command that reproduces a training or serving case's prediction
    (its model written to ``<id>.yaml`` when the case gives the spec inline)."""
    request = {"training": train_request, "serving": serve_request}.get(case.kind)
    if request is None or (case.kind == "serving" and "input_len" not in case.plan):
        return None
    return " ".join(["perfmodel", *request(case).cli_args()])


def train_request(case: Case) -> TrainRequest:
    """The ``estimate train`` request a case's published plan is (every field a CLI flag)."""
    p = case.plan
    return TrainRequest(
        model=_model_name(case), system=case.system, devices=case.devices, tp=p.get("tp", 1), pp=p.get("pp", 1),
        dp=p.get("dp", 1), cp=p.get("cp", 1), cp_comm=p.get("cp_comm", "p2p"), ep=p.get("ep", 1),
        etp=p.get("etp"), ep_overlap=bool(p.get("ep_overlap", False)), dispatcher=p.get("dispatcher", "alltoall"),
        interleave=p.get("interleave", 1),
        ends_as_layers=bool(p.get("ends_as_layers", False)),
        micro_batch=p.get("microbatch", 1), zero=p.get("zero", 0), recompute=p.get("recompute", "selective"),
        sp=bool(p.get("sequence_parallel", True)), tp_overlap=bool(p.get("tp_overlap", False)),
        precision=p.get("precision", "bf16"),
        attention=p.get("attention", "flash"), dp_overlap=p.get("dp_overlap", True),
        schedule=p.get("schedule", "1f1b"), storage=p.get("storage", "mixed"),
        activation_offload=p.get("activation_offload", 0.0),
        global_batch=p["global_batch"], seq_len=p["seq_len"])


def serve_request(case: Case) -> ServeRequest:
    """The ``estimate serve`` request of a case: ``batch`` is per attention data-parallel rank in
    the sources, ``dp_attention: true`` makes every device such a rank."""
    p = case.plan
    tp, pp = p.get("tp", 1), p.get("pp", 1)
    dpa = case.devices // (tp * pp) if p.get("dp_attention") is True else int(p.get("dp_attention", 1))
    # A case names its activation format as the source does (int8, fp8, ...), or none for weight-only.
    weights, kv = p.get("weight_precision", "bf16"), p.get("kv_precision", "bf16")
    quant = QuantScheme.for_weights(weights, kv, quantized_activations="activation_precision" in p)
    return ServeRequest(
        model=_model_name(case), system=case.system, devices=case.devices, tp=tp, pp=pp, ep=p.get("ep", 1),
        dp_attention=dpa, batch=p.get("batch", 1) * dpa, input_len=p["input_len"],
        output_len=p.get("output_len", 1), weight_precision=quant.weight,
        activation_precision=p.get("activation_precision_code", quant.activation), kv_precision=quant.kv,
        mtp_draft_tokens=p.get("mtp_draft_tokens", 0), mtp_acceptance=p.get("mtp_acceptance", 0.0),
        # A source that simulates perfect expert balance says so (expert_balance: balanced).
        expert_balance=p.get("expert_balance", "eplb"))


def _train(case: Case, spec: TransformerSpec, db: Database) -> tuple[float, str]:
    _, machine, plan, work = train_request(case).resolve(db, spec)
    r = estimate_training(spec, machine, plan, work)
    return _train_metric(case, spec, machine, plan, r), str(r.binding)


def _train_metric(case, spec, machine, plan, r) -> float:
    metric = case.measured.metric
    if metric == "step_time_s":
        return float(r.step_time_s)
    if metric == "tokens_per_s_per_device":
        return float(r.tokens_per_s) / case.devices
    flops_per_s = published_flops(case, spec) / float(r.step_time_s) / case.devices
    if metric == "mfu":
        return flops_per_s / machine.peak_flops[plan.precision]
    if metric == "tflops_per_device":
        return flops_per_s / 1e12
    raise SpecError(f"case {case.id}: metric {metric} does not apply to training")


def _serve(case: Case, spec: TransformerSpec, db: Database) -> tuple[float, str]:
    _, machine, plan, work = serve_request(case).resolve(db, spec)
    r = estimate_serving(spec, machine, plan, work)
    return _serve_metric(case, r), str(r.binding)


def _serve_metric(case: Case, r) -> float:
    metric = case.measured.metric
    value = {"prefill_tokens_per_s_per_device": r.prefill_tokens_per_s_per_device,
             "decode_tokens_per_s_per_device": r.decode_tokens_per_s_per_device,
             "ttft_s": r.ttft_s, "tpot_s": r.tpot_s}.get(metric)
    if value is None:
        raise SpecError(f"case {case.id}: metric {metric} does not apply to serving")
    return float(value) * (case.devices_per_unit if metric.endswith("_per_device") else 1)


def _memory(case: Case) -> float:
    p = case.plan
    weights, grads, optim = model_state_bytes(float(case.model["params"]), p["dp"], p["zero"])
    return float(weights + grads + optim)


def _activation(case: Case, spec: TransformerSpec) -> float:
    p = case.plan
    return float(activation_bytes_per_layer(spec, p["seq_len"], p.get("microbatch", 1), p["tp"],
                                            p.get("sequence_parallel", False), RECOMPUTE.index(p["recompute"]),
                                            flash=False))


@dataclass(frozen=True)
class Outcome:
    case: Case
    predicted: float | None
    error: float | None      # predicted / measured - 1
    status: str              # "ok", or why the case could not be predicted
    binding: str = ""        # a constraint the model says the published plan breaks ("" when it fits)


def predict(case: Case, db: Database) -> Outcome:
    """Predict one case; a case whose plan lacks what the model needs is reported, not guessed."""
    fits = ""
    try:
        if case.kind == "memory":
            value = _memory(case)
        elif case.kind == "activation":
            value = _activation(case, _spec(case))
        elif case.kind == "training":
            value, fits = _train(case, _spec(case), db)
        elif case.kind == "serving":
            if "input_len" not in case.plan:
                return Outcome(case, None, None, "skipped: the source gives no input length for this plan")
            value, fits = _serve(case, _spec(case), db)
        else:
            raise SpecError(f"case {case.id}: unknown kind {case.kind}")
    except KeyError as exc:
        return Outcome(case, None, None, f"skipped: plan lacks {exc.args[0]}")
    if not np.isfinite(value):
        return Outcome(case, None, None, "skipped: no finite prediction")
    return Outcome(case, value, value / case.measured.value - 1.0, "ok", fits)


def validate(db: Database, cases: list[Case] | None = None) -> list[Outcome]:
    return [predict(c, db) for c in (load_cases() if cases is None else cases)]


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    """Mean absolute percentage error by group: calibration set, held-out, exact cases."""
    def mape(rows):
        errs = [abs(o.error) for o in rows if o.error is not None]
        return {"cases": len(errs), "mape": float(np.mean(errs)) if errs else None,
                "max_abs_error": float(np.max(errs)) if errs else None}

    predicted = [o for o in outcomes if o.error is not None]
    return {
        "calibration": mape([o for o in predicted if o.case.calibration]),
        "held_out": mape([o for o in predicted if not o.case.calibration and o.case.kind not in EXACT_KINDS]),
        "exact": mape([o for o in predicted if o.case.kind in EXACT_KINDS]),
        "held_out_by_kind": {k: mape([o for o in predicted if not o.case.calibration and o.case.kind == k])
                             for k in ("training", "serving")},
        "skipped": len([o for o in outcomes if o.error is None]),
    }


CALIBRATED_CONSTANT = "framework-gemm-efficiency"


def without_kernel_fits(db: Database) -> Database:
    """The same database with every device's measured kernels removed (GEMM, attention, collective
    and expert-exchange fits), its measured fractions kept: every device priced as one without
    kernel measurements is (its large-GEMM fraction, roofline attention, the link model)."""
    from dataclasses import replace

    stripped = {name: c.model_copy(update={"gemm": {}, "weight_only": {}, "block_scaled": {}, "attention": None, "collectives": None,
                                           "dispatch": None})
                for name, c in db.calibrations.items()}
    return replace(db, calibrations=stripped)


def unmeasured_kernels_error(db: Database, cases: list[Case] | None = None) -> float:
    """Held-out training error (MAPE) of the model on devices priced without their kernel fits
    (without_kernel_fits): the step-level error a device without kernel measurements carries, as
    measured where the measurements exist to check it."""
    stripped = without_kernel_fits(db)
    cases = [c for c in (load_cases() if cases is None else cases) if c.kind == "training" and not c.calibration]
    return summarize([predict(c, stripped) for c in cases])["held_out_by_kind"]["training"]["mape"]


def moe_training_error(db: Database, cases: list[Case] | None = None) -> float:
    """Held-out training error (MAPE) of the model on mixture-of-experts models: the least width an MoE
    training step's range carries (``moe-training-error``), since its exchange, grouped GEMMs and
    overlap are priced less surely than a dense layer's."""
    cases = [c for c in (load_cases() if cases is None else cases)
             if c.kind == "training" and not c.calibration and _spec(c).moe is not None]
    return summarize([predict(c, db) for c in cases])["held_out_by_kind"]["training"]["mape"]


def serving_error(db: Database, measured: bool, cases: list[Case] | None = None) -> float:
    """Held-out serving error (MAPE) of the model on devices with (``measured``) or without GEMM
    kernel fits: the least width a serving prediction's range carries on such a device
    (``serving-error``, ``unmeasured-serving-error``)."""
    def fitted(case: Case) -> bool:
        return bool(db.calibration(db.system(case.system).accelerator).gemm)

    cases = [c for c in (load_cases() if cases is None else cases)
             if c.kind == "serving" and not c.calibration and fitted(c) == measured]
    return summarize([predict(c, db) for c in cases])["held_out_by_kind"]["serving"]["mape"]


def with_constant(db: Database, name: str, value: float) -> Database:
    """The same database with one named constant set to ``value``."""
    from dataclasses import replace

    from perfmodel.hardware_db.schema import Constant

    old = db.constants.get(name)
    entry = old.model_copy(update={"value": value}) if old else Constant(
        name=name, display_name=name, value=value, unit="ratio", sources=("set by with_constant",))
    return replace(db, constants={**db.constants, name: entry})


def calibrate(db: Database, cases: list[Case] | None = None) -> dict[str, float]:
    """Fit ``framework-gemm-efficiency`` on the calibration cases (Narayanan et al. 2021 Table 1)
    by minimizing the mean squared log error of the predictions; nothing else is fitted."""
    from scipy.optimize import minimize_scalar

    cases = [c for c in (load_cases() if cases is None else cases) if c.calibration]

    def loss(x: float) -> float:
        trial = with_constant(db, CALIBRATED_CONSTANT, x)
        return float(np.mean([np.log(predict(c, trial).predicted / c.measured.value) ** 2 for c in cases]))

    fit = minimize_scalar(loss, bounds=(0.3, 1.0), method="bounded", options={"xatol": 1e-4})
    before = summarize([predict(c, with_constant(db, CALIBRATED_CONSTANT, 1.0)) for c in cases])["calibration"]
    after = summarize([predict(c, with_constant(db, CALIBRATED_CONSTANT, float(fit.x))) for c in cases])["calibration"]
    return {"value": float(fit.x), "cases": len(cases), "mape_before": before["mape"], "mape_after": after["mape"]}
