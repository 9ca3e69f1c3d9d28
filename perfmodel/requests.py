"""One typed request per ``estimate`` command: what the flags say, checked and turned into a plan.

The CLI builds these from its flags and ``validate`` builds them from each published case, so a
case's number is what typing its flags at the CLI prints (``cli_args`` gives those flags).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from hardware_db.errors import SpecError, UnknownNameError

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


def _flags(request, skip=()) -> list[str]:
    """The command-line flags that reproduce ``request`` (booleans as --x / --no-x)."""
    out = []
    for f in fields(request):
        value = getattr(request, f.name)
        if f.name in skip or value is None:
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + f.name.replace("_", "-"))
        else:
            out += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return out


@dataclass(frozen=True)
class TrainRequest:
    """``perfmodel estimate train``: one training plan of a model on a system."""

    model: str = "llama-3.1-8b"
    system: str = "dgx-h100"
    devices: int | None = None          # default: one node
    tp: int = 1
    pp: int = 1
    dp: int | None = None               # default: what fills the devices
    cp: int = 1
    ep: int = 1
    etp: int | None = None              # default: tp
    interleave: int = 1
    micro_batch: int = 1
    zero: int = 1
    recompute: str = "selective"
    sp: bool = True
    precision: str = "bf16"
    offload_optimizer: str = "hbm"
    offload_grads: str = "hbm"
    offload_params: str = "hbm"
    attention: str = "flash"
    dp_overlap: bool = True
    overlap: str = "framework"
    tp_overlap: bool = False
    global_batch: int = 256
    seq_len: int = 4096
    tokens: float = 0.0

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
        spec = spec or load_model(self.model)
        machine = build_machine(db, self.system, self.devices)
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
                         overlap_dp=self.dp_overlap, overlap=self.overlap, tp_overlap=self.tp_overlap)
        return spec, machine, plan, TrainWorkload(self.global_batch, self.seq_len, self.tokens)

    def cli_args(self) -> list[str]:
        return ["estimate", "train"] + _flags(self)


@dataclass(frozen=True)
class ServeRequest:
    """``perfmodel estimate serve``: one serving instance of a model on a system."""

    model: str = "llama-3.1-70b"
    system: str = "dgx-h100"
    devices: int | None = None
    tp: int = 8
    pp: int = 1
    ep: int = 1
    dp_attention: int = 1
    batch: int = 32
    input_len: int = 2048
    output_len: int = 512
    weight_precision: str = "bf16"
    activation_precision: str = "a16"
    kv_precision: str = "bf16"
    mtp_draft_tokens: int = 0
    mtp_acceptance: float = 0.0

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
        spec = spec or load_model(self.model)
        machine = build_machine(db, self.system, self.devices)
        plan = ServePlan(tp=self.tp, pp=self.pp, ep=self.ep, dp_attention=self.dp_attention, batch=self.batch,
                         weight_precision=self.weight_precision, activation_precision=self.activation_precision,
                         kv_precision=self.kv_precision, mtp_draft_tokens=self.mtp_draft_tokens,
                         mtp_acceptance=self.mtp_acceptance)
        return spec, machine, plan, ServeWorkload(self.input_len, self.output_len)

    def cli_args(self) -> list[str]:
        return ["estimate", "serve"] + _flags(self)
