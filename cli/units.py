"""Quantities in the units a person reads: ``$13.5 M``, ``22.4 GWh``, ``1.2 kW``, ``80 GB``, ``41.5 days``.

Pure functions from SI floats (dollars, joules, watts, bytes, seconds) to short strings, for the
human tables only; ``--json`` keeps the SI floats. Decimal prefixes throughout (GB = 1e9 bytes), as
the hardware database uses them. An absent or non-finite value prints as ``-``, never ``nan``.
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

MISSING = "-"

_WH = 3600.0  # joules in one watt-hour


def _number(value) -> float | None:
    """``value`` as a finite float, or None (absent, NaN, inf, or not a number)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _sig(x: float, digits: int = 3, keep_zeros: bool = False) -> str:
    """``x`` to ``digits`` significant figures (half up) with thousands separators; trailing zeros
    after the point kept or dropped."""
    r = _rounded(x, digits)
    if r == 0:
        return "0"
    places = max(digits - 1 - _exponent(r), 0)
    text = f"{r:,.{places}f}"
    if not keep_zeros and "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _exponent(x) -> int:
    """The power of ten of ``x``'s leading digit (0 for 1 to 9.99)."""
    return Decimal(x).adjusted()


def _rounded(x: float, digits: int = 3) -> Decimal:
    """``x`` rounded half up to ``digits`` significant figures, as its shortest decimal reads
    (so 70.55 gives 70.6, and 999.6 moves up to the next prefix as 1,000)."""
    d = Decimal(repr(float(x)))
    if d == 0:
        return Decimal(0)
    return d.quantize(Decimal(1).scaleb(d.adjusted() - digits + 1), rounding=ROUND_HALF_UP)


def _scaled(x: float, prefixes: tuple[tuple[float, str], ...], keep_zeros: bool = False) -> str:
    """``x`` with the largest prefix not above it (``prefixes`` ascending, the first the base unit)."""
    magnitude = abs(_rounded(x))
    scale, unit = prefixes[0]
    for factor, name in prefixes:
        if magnitude >= Decimal(repr(factor)):
            scale, unit = factor, name
    return f"{_sig(x / scale, keep_zeros=keep_zeros)} {unit}"


def usd(value) -> str:
    """US dollars: ``$0.421``, ``$12.3``, ``$1,235``, ``$12,345``, ``$964 k``, ``$13.5 M``, ``$2.10 B``, ``$1.50 T``.

    Three significant figures, except whole dollars with separators from $1,000 to $99,999 (k is
    used from $100 k only)."""
    x = _number(value)
    if x is None:
        return MISSING
    sign, x = ("-" if x < 0 else ""), abs(x)
    r = _rounded(x)
    if r < 1000:
        return f"{sign}${_sig(x, keep_zeros=True)}"
    whole = Decimal(repr(x)).quantize(Decimal(1), rounding=ROUND_HALF_UP)
    if whole < 100_000:
        return f"{sign}${whole:,.0f}"
    for factor, name in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if r >= factor:
            return f"{sign}${_sig(x / factor, keep_zeros=True)} {name}"
    raise AssertionError("unreachable")  # pragma: no cover


def energy(joules_) -> str:
    """Energy of a run from joules, in watt-hours: ``22.4 GWh``, ``350 kWh``, ``12 Wh``."""
    x = _number(joules_)
    if x is None:
        return MISSING
    return _scaled(x / _WH, ((1.0, "Wh"), (1e3, "kWh"), (1e6, "MWh"), (1e9, "GWh"), (1e12, "TWh")))


def joules(value) -> str:
    """Energy of one token or operation: ``0.42 J``, ``1.41 J``, ``42 mJ``, ``12.5 kJ`` (mJ below 0.1 J)."""
    x = _number(value)
    if x is None:
        return MISSING
    r = abs(_rounded(x))
    if r >= 1e3:
        return _scaled(x, ((1e3, "kJ"), (1e6, "MJ")))
    if r >= Decimal("0.1") or r == 0:
        return f"{_sig(x)} J"
    return f"{_sig(x * 1e3)} mJ" if r >= Decimal("0.0001") else f"{_sig(x * 1e6)} uJ"


def watts(value) -> str:
    """Power: ``700 W``, ``1.2 kW``, ``11.2 MW``."""
    x = _number(value)
    if x is None:
        return MISSING
    return _scaled(x, ((1.0, "W"), (1e3, "kW"), (1e6, "MW"), (1e9, "GW")))


def size(value) -> str:
    """Bytes with decimal prefixes: ``512 B``, ``80 GB``, ``1.5 TB``."""
    x = _number(value)
    if x is None:
        return MISSING
    return _scaled(x, ((1.0, "B"), (1e3, "kB"), (1e6, "MB"), (1e9, "GB"), (1e12, "TB"), (1e15, "PB")))


def rate(value) -> str:
    """Bytes per second: ``3.35 TB/s``, ``50 GB/s``."""
    text = size(value)
    return text if text == MISSING else text + "/s"


def flop(value) -> str:
    """Floating-point operations: ``93.7 GFLOP``, ``2.5 PFLOP``."""
    x = _number(value)
    if x is None:
        return MISSING
    return _scaled(x, ((1.0, "FLOP"), (1e3, "kFLOP"), (1e6, "MFLOP"), (1e9, "GFLOP"), (1e12, "TFLOP"),
                       (1e15, "PFLOP"), (1e18, "EFLOP")))


def count(value) -> str:
    """A count of tokens or parameters: ``512``, ``12,345``, ``1.5M``, ``70.6B``, ``15T``; a fraction
    keeps three significant figures (``0.5``)."""
    x = _number(value)
    if x is None:
        return MISSING
    if abs(round(x)) < 100_000:
        return f"{x:,.0f}" if abs(x) >= 1000 or x == int(x) else _sig(x)
    r = abs(_rounded(x))
    factor, unit = max((f, u) for f, u in ((1e3, "k"), (1e6, "M"), (1e9, "B"), (1e12, "T"), (1e15, "P")) if r >= f)
    return f"{_sig(x / factor)}{unit}"


def seconds(value) -> str:
    """A duration: ``850 ns``, ``12.5 us``, ``412 ms``, ``57.0 s``, ``412 s``, ``12.5 min``, ``3.2 h``, ``41.5 days``.

    Below ten minutes, three significant figures; from ten minutes up, one decimal of the unit."""
    x = _number(value)
    if x is None:
        return MISSING
    if x < 0:
        return "-" + seconds(-x)
    if x == 0:
        return "0 s"
    r = _rounded(x)
    if r < Decimal("1e-6"):
        return f"{_sig(x * 1e9, keep_zeros=True)} ns"
    if r < Decimal("1e-3"):
        return f"{_sig(x * 1e6, keep_zeros=True)} us"
    if r < 1:
        return f"{_sig(x * 1e3, keep_zeros=True)} ms"
    if r < 600:
        return f"{_sig(x, keep_zeros=True)} s"
    for limit, scale, unit in ((3600, 60, "min"), (86400, 3600, "h"), (math.inf, 86400, "days")):
        if round(x / scale, 1) < limit / scale:
            return f"{x / scale:,.1f} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover


def device_noun(accelerator, devices: int = 2) -> str:
    """What one calls the accelerators: GPUs (NVIDIA, AMD), NPUs (Huawei Ascend), else devices;
    singular for one."""
    vendor = (getattr(accelerator, "vendor", "") or "").lower()
    name = (getattr(accelerator, "name", "") or "").lower()
    if vendor in ("nvidia", "amd"):
        noun = "GPU"
    elif vendor == "huawei" or name.startswith("ascend"):
        noun = "NPU"
    else:
        noun = "device"
    return noun if devices == 1 else noun + "s"


def fleet(devices: int, system, accelerator, named_node: bool | None = None) -> str:
    """A fleet as a person counts it: ``16,384 GPUs (2,048 x dgx-h100)``.

    ``system`` is the database entry the name stands for: when it is one node (as ``dgx-h100``),
    the node count reads as that many systems; when the name stands for several nodes (as
    ``cloudmatrix384``, 48 nodes), as nodes of it (``named_node`` says which when ``system`` is not
    the entry itself but a resized copy). A count that is not whole nodes says the node size
    instead: ``12 GPUs of dgx-h100 (8 per node)``."""
    devices = int(devices)
    noun = device_noun(accelerator, devices)
    per_node = int(system.devices_per_node)
    if devices % per_node:
        return f"{devices:,} {noun} of {system.name} ({per_node:,} per node)"
    nodes = devices // per_node
    if named_node if named_node is not None else getattr(system, "nodes", 1) == 1:
        return f"{devices:,} {noun} ({nodes:,} x {system.name})"
    return f"{devices:,} {noun} ({nodes:,} node{'s' if nodes != 1 else ''} of {system.name})"
