"""The serving fleet as an integer program: instance, solver, solution and an independent checker.

The pattern of the CP-SAT primer (Schrader, "The CP-SAT Primer", Sec. "Benchmarking your model"):
the instance holds every number the program needs, the solver turns it into a CP-SAT model, and
``check`` re-evaluates any solution from the instance alone, in exact arithmetic where the model
rounds, so that a status of OPTIMAL is printed only for a solution the checker accepts.

A fleet is one colocated pool, or one prefill pool with a decode pool of integer instance counts
over any decode options (hardware kinds may mix). Each pool option was sized alone to carry the
whole rate within its SLOs (``instances`` = N); one instance of option d carries 1 / N_d of the
rate, so decode counts carry the rate when sum n_d / N_d >= 1 (exact: rationals, never rounded).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from fractions import Fraction

import numpy as np

from .pool_option import PoolOption

# The fewest-devices objective breaks ties by power: this weight keeps power from ever outweighing
# one device (a fleet draws far less than 10^9 W).
DEVICE_TIE_BREAK = 1e-9
# How a fleet was solved (FleetSolution.method).
PROGRAM = "CP-SAT integer program"
COVERING = "exact covering program (dynamic programming over the rate's integer units)"


@dataclass(frozen=True)
class FleetInstance:
    """Everything the fleet program and its checker need: pool options sized to the rate, the
    limits, and the KV hand-over time of every prefill / decode pair that meets the TTFT SLOs."""

    options: tuple[PoolOption, ...]
    objective: str
    max_devices: int | None = None
    power_cap_w: float | None = None
    budget_usd_per_hour: float | None = None
    handover: tuple[tuple[int, int, float], ...] = ()      # (prefill option, decode option, seconds)
    # Devices already owned, per system: (system, count, USD per device-hour saved on each one used),
    # the saving being its market price less what owning it still costs (search.serve.owned_savings).
    owned: tuple[tuple[str, int, float], ...] = ()
    limits: tuple[tuple[str, int], ...] = ()                # (system, most devices of it)

    def per_instance(self, i: int) -> float:
        """Objective of one instance of option ``i`` (inf when a cost has no price)."""
        o = self.options[i]
        if self.objective == "cost":
            return np.inf if o.usd_per_hour is None else o.usd_per_hour / o.instances
        if self.objective == "energy":
            return o.power_w / o.instances
        return o.devices_per_instance + o.power_w / o.instances * DEVICE_TIE_BREAK

    @cached_property
    def kv_seconds(self) -> dict[tuple[int, int], float]:
        """KV hand-over seconds by (prefill option, decode option), built once."""
        return {(p, d): s for p, d, s in self.handover}


@dataclass(frozen=True)
class FleetSolution:
    """One pool at its own count (colocated or prefill) and, after a prefill pool, decode counts."""

    front: int
    decode: tuple[tuple[int, int], ...] = ()        # (decode option, instances), instances >= 1
    status: str = "FEASIBLE"
    gap: float = 0.0
    method: str = PROGRAM

    def counts(self, instance: FleetInstance) -> list[tuple[int, int]]:
        return [(self.front, instance.options[self.front].instances)] + list(self.decode)


@dataclass(frozen=True)
class FleetTotals:
    devices: int
    power_w: float
    usd_per_hour: float | None
    objective: float


def devices_by_system(instance: FleetInstance, solution: FleetSolution) -> dict[str, int]:
    by: dict[str, int] = {}
    for i, n in solution.counts(instance):
        o = instance.options[i]
        by[o.system] = by.get(o.system, 0) + o.devices_per_instance * n
    return by


def owned_used(instance: FleetInstance, solution: FleetSolution) -> dict[str, int]:
    """Owned devices a fleet runs on, per system: as many as it has of that system, up to what is owned."""
    by = devices_by_system(instance, solution)
    return {name: min(count, by.get(name, 0)) for name, count, _ in instance.owned}


def totals(instance: FleetInstance, solution: FleetSolution) -> FleetTotals:
    """Devices, power, cost per hour and objective of a solution, from the instance alone (owned
    devices at what owning them still costs)."""
    parts = solution.counts(instance)
    opts = instance.options
    devices = sum(opts[i].devices_per_instance * n for i, n in parts)
    power = sum(opts[i].power_w / opts[i].instances * n for i, n in parts)
    priced = all(opts[i].usd_per_hour is not None for i, _ in parts)
    used = owned_used(instance, solution)
    saved = sum(used[name] * saving for name, _, saving in instance.owned)
    usd = sum(opts[i].usd_per_hour / opts[i].instances * n for i, n in parts) - saved if priced else None
    objective = sum(instance.per_instance(i) * n for i, n in parts) - (saved if instance.objective == "cost" else 0.0)
    return FleetTotals(devices, power, usd, objective)


def check(instance: FleetInstance, solution: FleetSolution) -> list[str]:
    """What is wrong with ``solution`` (empty: nothing), re-derived from the instance alone:
    roles, counts, the rate carried (exact rationals), the KV hand-over, and every limit."""
    absent = [i for i in (solution.front, *(d for d, _ in solution.decode)) if not 0 <= i < len(instance.options)]
    if absent:
        return [f"option {i} does not exist" for i in absent]
    return _problems(instance, solution, totals(instance, solution))


def _problems(instance: FleetInstance, solution: FleetSolution, t: FleetTotals) -> list[str]:
    """``check`` of a solution whose options exist, with its ``totals`` given."""
    opts, problems = instance.options, []
    front = opts[solution.front]
    if front.role == "decode":
        problems.append("a decode pool cannot stand alone")
    if front.role == "colocated" and solution.decode:
        problems.append("a colocated pool takes no decode pool")
    if front.role == "prefill":
        carried = Fraction(0)
        kv = instance.kv_seconds
        for d, n in solution.decode:
            if opts[d].role != "decode":
                problems.append(f"option {d} is not a decode pool")
            if not 1 <= n <= opts[d].instances:
                problems.append(f"decode option {d} has {n} instances, allowed 1 to {opts[d].instances}")
            if (solution.front, d) not in kv:
                problems.append(f"prefill option {solution.front} cannot hand its KV cache to decode option {d} "
                                "within the TTFT targets")
            carried += Fraction(n, opts[d].instances)
        if carried < 1:
            problems.append(f"the decode pools carry {float(carried):.6g} of the rate")
    if instance.max_devices is not None and t.devices > instance.max_devices:
        problems.append(f"{t.devices} devices, the limit is {instance.max_devices}")
    if instance.power_cap_w is not None and t.power_w > instance.power_cap_w * (1 + 1e-9):
        problems.append(f"{t.power_w:,.0f} W, the cap is {instance.power_cap_w:,.0f} W")
    if instance.budget_usd_per_hour is not None and (t.usd_per_hour is None or
                                                     t.usd_per_hour > instance.budget_usd_per_hour * (1 + 1e-9)):
        problems.append("no price" if t.usd_per_hour is None else
                        f"${t.usd_per_hour:,.4g} per hour, the budget is ${instance.budget_usd_per_hour:,.4g}")
    by = devices_by_system(instance, solution)
    for name, most in instance.limits:
        if by.get(name, 0) > most:
            problems.append(f"{by[name]} devices of {name}, the limit is {most}")
    if not np.isfinite(t.objective):
        problems.append(f"no {instance.objective} value (a system without a price)")
    return problems


def _rate_weights(counts: list[int]) -> tuple[list[int], int]:
    """Integer weights w_d and total W with sum n_d w_d >= W  <=>  sum n_d / N_d >= 1, exactly:
    W = lcm of the N_d, w_d = W / N_d (an lcm below 2^40 keeps every product within int64)."""
    whole = 1
    for n in set(counts):
        whole = whole * n // math.gcd(whole, n)
        if whole >= 1 << 40:
            raise OverflowError
    return [whole // n for n in counts], whole


# The covering program runs when the rate's integer units (the lcm of the decode counts) are at
# most this many: its table has one entry per unit.
COVER_UNITS = 1 << 17


def solve(instance: FleetInstance, max_deterministic_time: float = 20.0) -> FleetSolution | None:
    """The cheapest fleet: by the exact covering program when the instance has no limit beyond the
    rate (no device, power, budget, per-system or owned-device term) and the rate's integer units
    are few; otherwise by the integer program (CP-SAT). None when no fleet is feasible."""
    if not (instance.max_devices is not None or instance.power_cap_w is not None
            or instance.budget_usd_per_hour is not None or instance.limits or instance.owned):
        try:
            _, whole = _rate_weights([o.instances for o in instance.options if o.role == "decode"] or [1])
        except OverflowError:
            whole = COVER_UNITS + 1
        if whole <= COVER_UNITS:
            return solve_by_covering(instance)
    return solve_program(instance, max_deterministic_time)


def solve_by_covering(instance: FleetInstance) -> FleetSolution | None:
    """The fleet without side limits, exactly, by dynamic programming (Martello and Toth,
    "Knapsack Problems", 1990, Sec. 3.1, the bounded knapsack recursion, here covering a demand):
    after a prefill option p, the cheapest decode counts carrying at least the whole rate in
    integer units (sum n_d w_d >= W, as the integer program counts it) over the options that take
    p's KV cache. cost[u] is the least cost carrying at least u units, built one option and one
    count at a time; ties keep the earlier option and the smaller count. Every pick is the exact
    minimum of its objective in floating point: OPTIMAL, with no rounding gap."""
    opts = instance.options
    value = [instance.per_instance(i) for i in range(len(opts))]
    usable = [i for i, v in enumerate(value) if np.isfinite(v)]
    dec = [i for i in usable if opts[i].role == "decode"]
    weights, whole = _rate_weights([opts[d].instances for d in dec] or [1])
    weight = dict(zip(dec, weights))
    takes: dict[int, list[int]] = {}
    for p, d, _ in instance.handover:
        if d in weight:
            takes.setdefault(p, []).append(d)
    covers: dict[tuple, tuple[float, tuple]] = {}

    def cover(options: tuple) -> tuple[float, tuple]:
        """(least cost, decode counts) carrying the whole rate over ``options`` (inf: none)."""
        cost = np.full(whole + 1, np.inf)
        cost[0] = 0.0
        units = np.arange(whole + 1)
        picks = []
        for d in options:
            best, count = cost.copy(), np.zeros(whole + 1, dtype=np.int64)
            for k in range(1, opts[d].instances + 1):
                tried = cost[np.maximum(units - k * weight[d], 0)] + k * value[d]
                better = tried < best
                best, count = np.where(better, tried, best), np.where(better, k, count)
            picks.append(count)
            cost = best
        if not np.isfinite(cost[whole]):
            return np.inf, ()
        counts, u = [], whole
        for d, count in zip(reversed(options), reversed(picks)):
            k = int(count[u])
            if k:
                counts.append((d, k))
                u = max(u - k * weight[d], 0)
        return float(cost[whole]), tuple(sorted(counts))

    best, pick = np.inf, None
    for i in usable:
        role = opts[i].role
        if role == "decode":
            continue
        front = value[i] * opts[i].instances
        decode: tuple = ()
        if role == "prefill":
            options = tuple(sorted(set(takes.get(i, ()))))
            if options not in covers:
                covers[options] = cover(options)
            rest, decode = covers[options]
            front += rest
        if front < best:
            best, pick = front, FleetSolution(i, decode, "OPTIMAL", 0.0, COVERING)
    return pick


def solve_program(instance: FleetInstance, max_deterministic_time: float = 20.0) -> FleetSolution | None:
    """The fleet program (CP-SAT): pick one colocated or prefill option; decode counts n_d in
    [0, N_d] carry the rate after a prefill pick; only KV-compatible pairs; devices, power and
    budget are linear limits; minimize the objective. None when no fleet is feasible.

    The objective's coefficients are integers (10^9 units for the largest): the reported gap is
    the solver's plus the bound that rounding can hide. A rate weight the lcm cannot express falls
    back to rounding up one instance's share, and the solution is then at most FEASIBLE."""
    from ortools.sat.python import cp_model

    opts = instance.options
    value = [instance.per_instance(i) for i in range(len(opts))]
    usable = [i for i, v in enumerate(value) if np.isfinite(v)]
    if not usable:
        return None
    colo = [i for i in usable if opts[i].role == "colocated"]
    pre = [i for i in usable if opts[i].role == "prefill"]
    dec = [i for i in usable if opts[i].role == "decode"]
    model = cp_model.CpModel()
    x = {i: model.NewBoolVar(f"front{i}") for i in colo + pre}
    n = {i: model.NewIntVar(0, opts[i].instances, f"dec{i}") for i in dec}
    model.AddExactlyOne(x.values())
    any_pre = sum(x[i] for i in pre)
    compatible: dict[int, set[int]] = {}
    for p, d, _ in instance.handover:
        compatible.setdefault(d, set()).add(p)
    for d in dec:
        # A decode option serves only a prefill pick that can hand it the KV cache in time.
        model.Add(n[d] == 0).OnlyEnforceIf([x[p].Not() for p in compatible.get(d, set()) if p in x])
    exact = True
    try:
        weights, whole = _rate_weights([opts[d].instances for d in dec] or [1])
    except OverflowError:
        exact, whole = False, 10 ** 9
        weights = [-(-whole // opts[d].instances) for d in dec]
    model.Add(sum(w * n[d] for w, d in zip(weights, dec)) >= whole * any_pre)

    def total(front_value, per_instance_value):
        return sum(front_value(i) * x[i] for i in x) + sum(per_instance_value(i) * n[i] for i in dec)

    if instance.max_devices is not None:
        model.Add(total(lambda i: opts[i].devices, lambda i: opts[i].devices_per_instance) <= instance.max_devices)
    # Power and money limits in integer milliwatts and millidollars, rounded against the fleet:
    # the checker re-tests them exactly.
    if instance.power_cap_w is not None:
        model.Add(total(lambda i: math.ceil(opts[i].power_w * 1e3),
                        lambda i: math.ceil(opts[i].power_w / opts[i].instances * 1e3))
                  <= math.floor(instance.power_cap_w * 1e3))
    # Devices per system (per-kind limits; owned devices, each one used saving its market price less
    # what owning it costs: the solver takes min(owned, devices) of them, as the checker counts).
    def on(name):
        return total(lambda i: opts[i].devices * (opts[i].system == name),
                     lambda i: opts[i].devices_per_instance * (opts[i].system == name))

    for name, most in instance.limits:
        model.Add(on(name) <= most)
    owned = []
    for name, count, saving in instance.owned:
        used = model.NewIntVar(0, count, f"owned_{name}")
        model.Add(used <= on(name))
        owned.append((used, saving))
    if instance.budget_usd_per_hour is not None:
        priced = lambda i: opts[i].usd_per_hour is not None  # noqa: E731
        for i in list(x) + dec:
            if not priced(i):
                model.Add((x[i] if i in x else n[i]) == 0)
        model.Add(total(lambda i: math.ceil((opts[i].usd_per_hour or 0.0) * 1e3),
                        lambda i: math.ceil((opts[i].usd_per_hour or 0.0) / opts[i].instances * 1e3))
                  - sum(math.floor(saving * 1e3) * used for used, saving in owned)
                  <= math.floor(instance.budget_usd_per_hour * 1e3))
    scale = 1e9 / max(max(value[i] * (opts[i].instances if i in x else 1) for i in usable), 1e-300)
    savings = sum(round(saving * scale) * used for used, saving in owned) if instance.objective == "cost" else 0
    model.Minimize(total(lambda i: round(value[i] * opts[i].instances * scale),
                         lambda i: round(value[i] * scale)) - savings)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_deterministic_time = max_deterministic_time  # reproducible, unlike wall clock
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    front = next(i for i in x if solver.Value(x[i]))
    decode = tuple((d, int(solver.Value(n[d]))) for d in dec if solver.Value(n[d]) > 0) \
        if opts[front].role == "prefill" else ()
    solution = FleetSolution(front, decode)
    objective = totals(instance, solution).objective
    # Rounding hides at most half a unit per instance of the solution and of the true optimum.
    units = sum(c for _, c in solution.counts(instance)) + 1 + sum(opts[d].instances for d in dec) \
        + sum(count for _, count, _ in instance.owned)
    rounding = 0.5 * units / scale / max(objective, 1e-300)
    gap = rounding if status == cp_model.OPTIMAL else rounding + abs(
        solver.ObjectiveValue() - solver.BestObjectiveBound()) / max(abs(solver.ObjectiveValue()), 1e-12)
    name = "OPTIMAL" if status == cp_model.OPTIMAL and exact else "FEASIBLE"
    return FleetSolution(front, decode, name, gap)


def single_pool_solutions(instance: FleetInstance) -> list[FleetSolution]:
    """Fleets of one configuration per pool: every colocated option and every compatible prefill /
    decode pair at their own counts, within the limits (the checker decides)."""
    return [s for s, _ in single_pools_summed(instance)]


def single_pools_summed(instance: FleetInstance) -> list[tuple[FleetSolution, FleetTotals]]:
    """``single_pool_solutions`` with each one's ``totals``."""
    opts = instance.options
    out = [FleetSolution(i) for i, o in enumerate(opts) if o.role == "colocated"]
    out += [FleetSolution(p, ((d, opts[d].instances),)) for p, d, _ in instance.handover]
    summed = [(s, totals(instance, s)) for s in out]
    return [(s, t) for s, t in summed if not _problems(instance, s, t)]
