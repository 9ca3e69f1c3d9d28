"""One typed request per ``estimate`` command: what the flags say, checked and turned into a plan.

The CLI builds these from its flags and ``validate`` builds them from each published case, so a
case's number is what typing its flags at the CLI prints (``cli_args`` gives those flags).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from hardware_db.errors import SpecError, UnknownNameError

from .defaults import SERVE_DEFAULTS, TRAIN_DEFAULTS
from .plan import ACTIVATION_PRECISIONS, KV_PRECISIONS, OVERLAP, PLACES, RECOMPUTE, WEIGHT_PRECISIONS, QuantScheme


def positive(name: str, value) -> None:
    """A positive integer flag (None: not given), else a one-line error naming the flag."""
    if value is not None and value < 1:
        raise SpecError(f"--{name.replace('_', '-')} needs a positive integer, has {value}")


def one_of(name: str, value, allowed) -> None:
    """A flag whose value is one of ``allowed``, else a one-line error listing them."""
    if value not in allowed:
        raise UnknownNameError(f"--{name.replace('_', '-')} value", str(value), allowed)


def _positive(request, *names: str) -> None:
    for name in names:
        positive(name, getattr(request, name))


def _choice(request, name: str, allowed) -> None:
    one_of(name, getattr(request, name), allowed)


def _flags(request, skip=(), keep=()) -> list[str]:
    """The command-line flags that reproduce ``request`` (booleans as --x / --no-x); fields at their
    default are left out unless named in ``keep``."""
    out = []
    for f in fields(request):
        value = getattr(request, f.name)
        if f.name in skip or value is None or (f.name not in keep and value == f.default):
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, tuple):
            for item in value:
                out += [flag, str(item)]
        elif isinstance(value, bool):
            out.append(flag if value else "--no-" + f.name.replace("_", "-"))
        else:
            out += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return out


@dataclass(frozen=True)
class TrainRequest:
    """``perfmodel estimate train``: one training plan of a model on a system."""

    model: str = TRAIN_DEFAULTS["model"]
    system: str = TRAIN_DEFAULTS["system"]
    devices: int | None = TRAIN_DEFAULTS["devices"]
    tp: int = 8
    pp: int = 2
    dp: int | None = None               # default: what fills the devices
    cp: int = 1
    ep: int = 1
    etp: int | None = None              # default: tp
    interleave: int = 1
    micro_batch: int = 1
    zero: int = 1
    recompute: str = "selective"
    sp: bool = True
    precision: str = TRAIN_DEFAULTS["precision"]
    offload_optimizer: str = "hbm"
    offload_grads: str = "hbm"
    offload_params: str = "hbm"
    attention: str = "flash"
    dp_overlap: bool = True
    overlap: str = "framework"
    tp_overlap: bool = False
    moe_imbalance: float = 0.0          # busiest over mean expert device load; 0: the named constant
    pricing: str = "cloud"              # cost basis: cloud or owned
    price: tuple[str, ...] = ()         # SYSTEM=USD per device-hour, the user's prices
    global_batch: int = TRAIN_DEFAULTS["global_batch"]
    seq_len: int = TRAIN_DEFAULTS["seq_len"]
    tokens: float = TRAIN_DEFAULTS["tokens"]

    def resolve(self, db, spec=None):
        """(spec, machine, plan, workload), or a one-line SpecError naming the bad value."""
        from .catalog import load_model
        from .machine import build_machine
        from .training import ATTENTION, TrainPlan, TrainWorkload

        _positive(self, "devices", "tp", "pp", "dp", "cp", "ep", "etp", "interleave", "micro_batch",
                  "global_batch", "seq_len")
        _choice(self, "recompute", RECOMPUTE)
        _choice(self, "precision", ("bf16", "fp16", "fp8"))
        _choice(self, "attention", ATTENTION)
        _choice(self, "overlap", OVERLAP)
        for name in ("offload_optimizer", "offload_grads", "offload_params"):
            _choice(self, name, PLACES)
        if self.zero not in (0, 1, 2, 3):
            raise SpecError(f"--zero needs 0, 1, 2 or 3, has {self.zero}")
        if not 0 <= self.tokens < 1e18:
            raise SpecError(f"--tokens needs 0 to 1e18, has {self.tokens:g}")
        _imbalance(self.moe_imbalance)
        spec = spec or load_model(self.model)
        machine = build_machine(db, self.system, self.devices, self.pricing, parse_prices(db, self.price))
        machine.flops(self.precision)  # unsupported precision: one clear error
        for name in ("offload_optimizer", "offload_grads", "offload_params"):
            if getattr(self, name) != "hbm":
                machine.tier(getattr(self, name))      # a tier the system lacks: one clear error
        dp = self.dp or max(machine.devices // (self.tp * self.pp * self.cp), 1)
        plan = TrainPlan(tp=self.tp, pp=self.pp, dp=dp, cp=self.cp, ep=self.ep, etp=self.etp or 0,
                         interleave=self.interleave, micro_batch=self.micro_batch, zero=self.zero,
                         recompute=self.recompute, sp=self.sp and self.tp > 1, precision=self.precision,
                         optimizer_place=self.offload_optimizer, grad_place=self.offload_grads,
                         param_place=self.offload_params, flash=self.attention == "flash",
                         overlap_dp=self.dp_overlap, overlap=self.overlap, tp_overlap=self.tp_overlap,
                         moe_imbalance=self.moe_imbalance)
        return spec, machine, plan, TrainWorkload(self.global_batch, self.seq_len, self.tokens)

    def cli_args(self) -> list[str]:
        return ["estimate", "train"] + _flags(self, keep=("model", "system", "devices", "tp", "pp", "dp"))

    @staticmethod
    def of_plan(model: str, system: str, devices: int, plan: dict, work) -> "TrainRequest":
        """The request that evaluates a searched plan (``search.train`` row) on its own."""
        return TrainRequest(
            model=model, system=system, devices=devices, tp=plan["tp"], pp=plan["pp"], dp=plan["dp"], cp=plan["cp"],
            ep=plan["ep"], etp=plan["etp"] or None, interleave=plan["interleave"], micro_batch=plan["micro_batch"],
            zero=plan["zero"], recompute=plan["recompute"], sp=plan["sp"] or plan["tp"] == 1, precision=plan["precision"],
            offload_optimizer=plan["optimizer_place"], offload_grads=plan["grad_place"],
            offload_params=plan["param_place"], moe_imbalance=plan["moe_imbalance"],
            global_batch=work.global_batch, seq_len=work.seq_len, tokens=float(work.tokens))


@dataclass(frozen=True)
class ServeRequest:
    """``perfmodel estimate serve``: one serving instance of a model on a system."""

    model: str = SERVE_DEFAULTS["model"]
    system: str = SERVE_DEFAULTS["system"]
    devices: int | None = None
    tp: int = 8
    pp: int = 1
    ep: int = 1
    dp_attention: int = 1
    batch: int = 32
    input_len: int = SERVE_DEFAULTS["input_len"]
    output_len: int = SERVE_DEFAULTS["output_len"]
    weight_precision: str = "bf16"
    activation_precision: str = "a16"
    kv_precision: str = "bf16"
    kv_place: str = "hbm"
    mtp_draft_tokens: int = 0
    mtp_acceptance: float = 0.0
    moe_imbalance: float = 0.0
    pricing: str = "cloud"
    price: tuple[str, ...] = ()

    def resolve(self, db, spec=None):
        from .catalog import load_model
        from .machine import build_machine
        from .serving import ServePlan, ServeWorkload

        _positive(self, "devices", "tp", "pp", "ep", "dp_attention", "batch", "input_len", "output_len")
        _choice(self, "weight_precision", WEIGHT_PRECISIONS)
        _choice(self, "activation_precision", ACTIVATION_PRECISIONS)
        _choice(self, "kv_precision", KV_PRECISIONS)
        if not 0 <= self.mtp_draft_tokens <= 16:
            raise SpecError(f"--mtp-draft-tokens needs 0 to 16, has {self.mtp_draft_tokens}")
        if not 0.0 <= self.mtp_acceptance <= 1.0:
            raise SpecError(f"--mtp-acceptance needs a share from 0 to 1, has {self.mtp_acceptance:g}")
        QuantScheme(self.weight_precision, self.activation_precision, self.kv_precision)  # the pairing rule
        _choice(self, "kv_place", ("hbm", "ddr", "cxl", "pooled"))
        _imbalance(self.moe_imbalance)
        spec = spec or load_model(self.model)
        machine = build_machine(db, self.system, self.devices, self.pricing, parse_prices(db, self.price))
        plan = ServePlan(tp=self.tp, pp=self.pp, ep=self.ep, dp_attention=self.dp_attention, batch=self.batch,
                         weight_precision=self.weight_precision, activation_precision=self.activation_precision,
                         kv_precision=self.kv_precision, kv_place=self.kv_place,
                         mtp_draft_tokens=self.mtp_draft_tokens, mtp_acceptance=self.mtp_acceptance,
                         moe_imbalance=self.moe_imbalance)
        return spec, machine, plan, ServeWorkload(self.input_len, self.output_len)

    def cli_args(self) -> list[str]:
        return ["estimate", "serve"] + _flags(self, keep=("model", "system", "devices", "tp", "batch"))


def parse_prices(db, texts) -> dict[str, float]:
    """``SYSTEM=USD`` flags (all-in USD per device-hour) as {system name: price}; one-line errors."""
    import math

    prices = {}
    for text in texts or ():
        name, sep, value = str(text).partition("=")
        try:
            usd = float(value)
        except ValueError:
            usd = float("nan")
        if not sep or not math.isfinite(usd) or not 0 < usd < 1e6:
            raise SpecError(f"--price needs SYSTEM=USD_PER_DEVICE_HOUR with a positive price, has {text!r}")
        prices[db.system(name.strip()).name] = usd
    return prices


def _imbalance(value: float) -> None:
    if value != 0 and not 1.0 <= value <= 1e3:
        raise SpecError(f"--moe-imbalance needs 0 (the named constant) or a ratio from 1 to 1,000, has {value:g}")


def command(request) -> str:
    """The shell command that reproduces ``request``: ``perfmodel estimate ...``."""
    import shlex

    return " ".join(["perfmodel"] + [shlex.quote(a) for a in request.cli_args()])
