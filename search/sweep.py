"""Design-space sweeps: hypothetical hardware, each point with its own optimal plan (``perfmodel sweep``).

A spec (YAML) names a base system, the hardware parameters to vary and how to sample them (a grid,
or a Latin hypercube or Sobol design of N points; scipy.stats.qmc), and the workloads (``plan
train`` or ``plan serve`` requests). Each point applies its parameter values to a copy of the
database (``apply_point``), then runs the full search for every workload: one pure function of
(spec, point), so that any engine (a local process pool, a Ray cluster) gives the same table, in
point order. Points run in batches (``batches``) to amortise scheduling; a table already written
is resumed, its finished rows skipped.

Spec errors are one line naming the spec's line (``SweepSpecError``, exit 2).
"""

from __future__ import annotations

import functools

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from perfmodel.hardware_db.errors import SpecError

GIGA, TERA, GIBI = 1e9, 1e12, 2.0 ** 30      # HBM capacity is binary (hardware_db.schema)

# Parameter -> (unit, lowest, highest allowed): what a point may set on the base system.
# Each parameter's unit and range: the hardware database schema's bounds for the field it sets
# (hardware_db.schema: HbmGB, HbmTBps, the dense peaks, Watts, LinkGBps, LinkGbitps, CapacityGB, MemGBps,
# DollarsPerHour), so a spec asks only for what-ifs the database can hold and is refused up front
# otherwise; a point whose derived values leave them (flops_scale of a large peak) is an INVALID row.
PARAMETERS: dict[str, tuple[str, float, float]] = {
    "hbm_gb": ("GB per device", 1.0, 4096.0),
    "hbm_tb_per_s": ("TB/s per device", 0.05, 50.0),
    "flops_scale": ("x every dense peak", 0.01, 100.0),
    **{f"{p}_tflops": (f"dense {p} TFLOP/s per device", 0.01, 40_000.0) for p in ("fp64", "fp32", "tf32", "bf16",
                                                                                   "fp16", "fp8", "int8", "fp4")},
    "tdp_w": ("W per device", 1.0, 200_000.0),
    "scale_up_domain": ("devices in one scale-up domain", 2, 1_000_000),
    "scale_up_gb_per_s": ("GB/s per device and direction", 0.1, 10_000.0),
    "scale_out_gbit_per_s": ("Gbit/s per device and direction", 1.0, 20_000.0),
    "pool_gb": ("GB of pooled memory per device", 1.0, 10_000_000.0),
    "pool_tb_per_s": ("TB/s of pooled memory per device", 0.001, 10.0),
    "price_usd_per_hour": ("USD per device-hour", 0.01, 10_000.0),
}
SAMPLING = ("grid", "latin", "sobol")
KINDS = ("train", "serve")


class SweepSpecError(SpecError):
    """A sweep spec the tool cannot run: one line, naming the spec's line."""


@dataclass(frozen=True)
class Parameter:
    name: str
    values: tuple[float, ...] = ()       # grid values
    low: float | None = None             # range (sampled designs, or a grid of ``steps``)
    high: float | None = None
    steps: int | None = None
    log: bool = False                    # sample the range on a log scale


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str                            # "train" or "serve"
    fields: dict                         # the plan request's fields


@dataclass(frozen=True)
class SweepSpec:
    name: str
    base_system: str
    parameters: tuple[Parameter, ...]
    workloads: tuple[Workload, ...]
    sampling: str = "grid"
    points: int = 0                      # for latin and sobol
    seed: int = 0

    def digest(self) -> str:
        """A short hash of what the table's rows depend on (resuming refuses another spec's table)."""
        text = json.dumps([self.base_system, [vars(p) for p in self.parameters],
                           [(w.name, w.kind, w.fields) for w in self.workloads], self.sampling, self.points,
                           self.seed], sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- the spec --------------------------------------------------------------------------------

def _lines(text: str) -> Callable[[tuple], int]:
    """Line number (1-based) of a key path in the YAML text, for error messages."""
    import yaml

    from perfmodel.hardware_db.files import BoundedSafeLoader

    loader = BoundedSafeLoader(text)
    try:
        root = loader.get_single_node()
    finally:
        loader.dispose()
    spots: dict[tuple, int] = {}

    def walk(node, path):
        spots[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                spots[path + (k.value,)] = k.start_mark.line + 1
                walk(v, path + (k.value,))
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                walk(v, path + (i,))

    if root is not None:
        walk(root, ())

    def line(path: tuple) -> int:
        while path and path not in spots:
            path = path[:-1]
        return spots.get(path, 1)
    return line


def parse_spec(text: str, where: str = "spec") -> SweepSpec:
    """A spec from its YAML text; a one-line error naming the line of anything wrong."""
    from perfmodel.hardware_db.files import parse_yaml

    raw = parse_yaml(text, where)      # one bounded safe parser for every YAML the tool reads
    line = _lines(text)

    def fail(path: tuple, message: str):
        raise SweepSpecError(f"{where}:{line(path)}: {message}")

    if not isinstance(raw, dict):
        fail((), "a sweep spec is a mapping (name, base_system, parameters, workloads, sampling)")
    known = {"name", "base_system", "parameters", "workloads", "sampling"}
    for key in raw:
        if key not in known:
            fail((key,), f"unknown key {key!r}; a spec has {', '.join(sorted(known))}")
    for key in ("base_system", "parameters", "workloads"):
        if key not in raw:
            fail((), f"the spec needs {key}")
    params = raw["parameters"]
    if not isinstance(params, dict) or not params:
        fail(("parameters",), "parameters needs at least one parameter to vary")
    parameters = tuple(_parameter(name, body, ("parameters", name), fail) for name, body in params.items())
    sampling = raw.get("sampling") or {"method": "grid"}
    if not isinstance(sampling, dict):
        fail(("sampling",), "sampling is a mapping: method (grid, latin, sobol), points, seed")
    method = sampling.get("method", "grid")
    if method not in SAMPLING:
        fail(("sampling", "method"), f"unknown sampling method {method!r}; one of {', '.join(SAMPLING)}")
    for key in sampling:
        if key not in ("method", "points", "seed"):
            fail(("sampling", key), f"unknown sampling key {key!r} (method, points, seed)")
    points = sampling.get("points", 0)
    if method != "grid":
        if not isinstance(points, int) or not 1 <= points <= 1_000_000:
            fail(("sampling", "points"), f"{method} sampling needs points from 1 to 1,000,000, has {points!r}")
        for p in parameters:
            if p.low is None:
                fail(("parameters", p.name), f"{method} sampling needs a range (low, high) for {p.name}, not values")
    seed = sampling.get("seed", 0)
    if not isinstance(seed, int):
        fail(("sampling", "seed"), f"seed needs an integer, has {seed!r}")
    names = [p.name for p in parameters]
    if ("pool_gb" in names) != ("pool_tb_per_s" in names):
        fail(("parameters",), "pool_gb and pool_tb_per_s vary together (a pooled tier needs its size and bandwidth)")
    workloads = raw["workloads"]
    if not isinstance(workloads, list) or not workloads:
        fail(("workloads",), "workloads needs at least one workload (kind: train or serve, with its plan flags)")
    parsed = tuple(_workload(i, w, ("workloads", i), fail) for i, w in enumerate(workloads))
    if len({w.name for w in parsed}) < len(parsed):
        fail(("workloads",), "workload names must differ")
    spec = SweepSpec(name=str(raw.get("name", "sweep")), base_system=str(raw["base_system"]), parameters=parameters,
                     workloads=parsed, sampling=method, points=int(points or 0), seed=seed)
    total = len(design(spec))
    if total > 1_000_000:
        fail(("parameters",), f"the design has {total:,} points; at most 1,000,000")
    return spec


def _number(value, path, fail, name) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        fail(path, f"{name} needs numbers, has {value!r}")
    unit, low, high = PARAMETERS[name]
    if not low <= value <= high:
        fail(path, f"{name} needs {low:g} to {high:g} ({unit}), has {value:g}")
    return float(value)


def _parameter(name, body, path, fail) -> Parameter:
    if name not in PARAMETERS:
        fail(path, f"unknown parameter {name!r}; one of {', '.join(PARAMETERS)}")
    if isinstance(body, list):
        body = {"values": body}
    if not isinstance(body, dict):
        fail(path, f"{name} takes values: [...] or low, high (and steps for a grid)")
    for key in body:
        if key not in ("values", "low", "high", "steps", "log"):
            fail(path + (key,), f"unknown key {key!r} for {name} (values, low, high, steps, log)")
    if "values" in body:
        values = body["values"]
        if not isinstance(values, list) or not values:
            fail(path + ("values",), f"{name} needs a non-empty list of values")
        return Parameter(name, tuple(_number(v, path + ("values", i), fail, name) for i, v in enumerate(values)))
    if "low" not in body or "high" not in body:
        fail(path, f"{name} needs values: [...] or a range low, high")
    low, high = (_number(body[k], path + (k,), fail, name) for k in ("low", "high"))
    if not low < high:
        fail(path + ("high",), f"{name}: an empty range (low {low:g}, high {high:g})")
    steps = body.get("steps")
    if steps is not None and (not isinstance(steps, int) or not 2 <= steps <= 10_000):
        fail(path + ("steps",), f"{name}: steps needs 2 to 10,000, has {steps!r}")
    return Parameter(name, (), low, high, steps, bool(body.get("log", False)))


def _workload(i, body, path, fail) -> Workload:
    from perfmodel.search.requests import PlanServeRequest, PlanTrainRequest

    if not isinstance(body, dict):
        fail(path, "a workload is a mapping: kind (train or serve), name, and its plan flags")
    kind = body.get("kind")
    if kind not in KINDS:
        fail(path + ("kind",), f"a workload needs kind: train or serve, has {kind!r}")
    cls = PlanTrainRequest if kind == "train" else PlanServeRequest
    allowed = {f for f in cls.__dataclass_fields__ if f not in ("system", "baseline", "framework")}
    fields = {}
    for key, value in body.items():
        if key in ("kind", "name"):
            continue
        if key.replace("-", "_") not in allowed:
            fail(path + (key,), f"unknown {kind} flag {key!r}; the plan {kind} fields are {', '.join(sorted(allowed))}")
        name = key.replace("-", "_")
        kind_of = str(cls.__dataclass_fields__[name].type)
        if isinstance(value, str) and kind_of.split(" ")[0] in ("float", "int"):
            try:   # YAML reads 15.6e12 (no sign in the exponent) as text
                value = float(value) if kind_of.startswith("float") else int(float(value))
            except ValueError:
                fail(path + (key,), f"{key} needs a number, has {value!r}")
        fields[name] = tuple(value) if isinstance(value, list) else value
    if kind == "train" and isinstance(fields.get("devices"), int):
        fields["devices"] = (fields["devices"],)
    try:
        request = cls(**fields)
    except TypeError as exc:
        fail(path, f"{kind} workload: {exc}")
    return Workload(str(body.get("name", f"{kind}-{i}")), kind, {k: getattr(request, k) for k in fields})


# --- the design ------------------------------------------------------------------------------

def design(spec: SweepSpec) -> list[dict[str, float]]:
    """Every point's parameter values, in point order: the grid's product (the first parameter
    varying slowest), or ``points`` draws of a Latin hypercube or scrambled Sobol design (seeded)
    over the ranges (log-scaled where asked). Integer parameters (scale_up_domain) are rounded."""
    import itertools

    import numpy as np

    if spec.sampling == "grid":
        axes = []
        for p in spec.parameters:
            if p.values:
                axes.append(p.values)
            else:
                n = p.steps or 5
                grid = np.geomspace(p.low, p.high, n) if p.log else np.linspace(p.low, p.high, n)
                axes.append(tuple(float(v) for v in grid))
        rows = [dict(zip([p.name for p in spec.parameters], combo)) for combo in itertools.product(*axes)]
    else:
        from scipy.stats import qmc

        d = len(spec.parameters)
        sampler = qmc.LatinHypercube(d=d, seed=spec.seed) if spec.sampling == "latin" else \
            qmc.Sobol(d=d, scramble=True, seed=spec.seed)
        unit = sampler.random(spec.points)
        rows = []
        for u in unit:
            row = {}
            for p, x in zip(spec.parameters, u):
                row[p.name] = float(np.exp(np.log(p.low) + x * (np.log(p.high) - np.log(p.low)))) if p.log else \
                    float(p.low + x * (p.high - p.low))
            rows.append(row)
    for row in rows:
        if "scale_up_domain" in row:
            row["scale_up_domain"] = float(max(2, round(row["scale_up_domain"])))
    return rows


# --- one point -------------------------------------------------------------------------------

def apply_point(db, base: str, values: dict[str, float]):
    """(database, system name): the base system with the point's values, under the same names (so
    the device keeps its measured kernel fits, which scale with its peaks and bandwidth). Measured
    collective and expert-exchange fits are dropped when the scale-up domain changes: they belong
    to the measured links. The changed entries are validated as a hardware file's are
    (``hardware_db.overrides``): a point the schema refuses raises its one-line SpecError."""
    from perfmodel.hardware_db.overrides import with_overrides

    system = db.system(base)
    acc = db.accelerator(system.accelerator)
    a: dict[str, Any] = {}
    if "hbm_gb" in values:
        a["hbm_bytes"] = values["hbm_gb"] * GIBI
    if "hbm_tb_per_s" in values:
        a["hbm_bytes_per_s"] = values["hbm_tb_per_s"] * TERA
    peaks = dict(acc.peak_flops)
    if "flops_scale" in values:
        peaks = {p: f * values["flops_scale"] for p, f in peaks.items()}
    peaks.update({name[:-len("_tflops")]: v * TERA for name, v in values.items() if name.endswith("_tflops")})
    if peaks != acc.peak_flops:
        a["peak_flops"] = peaks
    if "tdp_w" in values:
        a["tdp_w"] = values["tdp_w"]
        if acc.idle_w is not None and acc.idle_w >= values["tdp_w"]:
            a["idle_w"] = None
    if "price_usd_per_hour" in values:
        a["cloud_usd_per_hour"] = values["price_usd_per_hour"]
    tiers = list(system.tiers)
    kinds = [db.link(t.link).kind for t in tiers]
    scale_up = next((i for i, k in enumerate(kinds) if k == "scale-up"), None)
    scale_out = next((i for i, k in enumerate(kinds) if k == "scale-out"), None)
    if "scale_up_domain" in values or "scale_up_gb_per_s" in values:
        if scale_up is None:
            raise SweepSpecError(f"{system.name} has no scale-up tier to vary")
        update: dict[str, Any] = {}
        if "scale_up_domain" in values:
            update["group_size"] = int(values["scale_up_domain"])
            inner = [t.group_size for t in tiers[:scale_up] if t.group_size]
            if inner and update["group_size"] % max(inner):
                raise SweepSpecError(f"scale_up_domain {update['group_size']} does not nest over {system.name}'s "
                                     f"inner tier of {max(inner)} devices")
        if "scale_up_gb_per_s" in values:
            update.update(gb_per_s_per_direction=values["scale_up_gb_per_s"] * GIGA, gbit_per_s_per_direction=None)
            a["scale_up_bytes_per_s"] = values["scale_up_gb_per_s"] * GIGA
        tiers[scale_up] = tiers[scale_up].model_copy(update=update)
        size = tiers[scale_up].group_size
        # Outer levels that no longer nest over the domain go; the outermost spans the system.
        tiers = tiers[:scale_up + 1] + [t for t in tiers[scale_up + 1:]
                                        if t.group_size is None or (t.group_size > size and t.group_size % size == 0)]
    if "scale_out_gbit_per_s" in values:
        if scale_out is None:
            raise SweepSpecError(f"{system.name} has no scale-out tier to vary")
        i = next(j for j, t in enumerate(tiers) if db.link(t.link).kind == "scale-out")
        tiers[i] = tiers[i].model_copy(update={"gbit_per_s_per_direction": values["scale_out_gbit_per_s"] * GIGA / 8,
                                               "gb_per_s_per_direction": None})
        a["nic_bytes_per_s"] = values["scale_out_gbit_per_s"] * GIGA / 8
    s: dict[str, Any] = {"tiers": tuple(tiers)}
    changes: dict[str, dict[str, dict[str, Any]]] = {"accelerators": {acc.name: a}, "systems": {system.name: s}}
    if "pool_gb" in values:
        pool = {"display_name": "swept pooled memory", "sources": ("perfmodel sweep point",), "kind": "pooled",
                "capacity_bytes": values["pool_gb"] * GIGA, "read_bytes_per_s": values["pool_tb_per_s"] * TERA,
                "write_bytes_per_s": values["pool_tb_per_s"] * TERA, "latency_s": 1e-6}
        path = {"display_name": "swept pool path", "sources": ("perfmodel sweep point",), "kind": "host",
                "latency_s": 1e-6, "gb_per_s_per_direction": values["pool_tb_per_s"] * TERA}
        changes.update(memory={"sweep-pool": pool}, links={"sweep-pool-path": path})
        attach = {"memory": "sweep-pool", "count_per_node": system.devices_per_node, "shared_by": 1,
                  "path": "sweep-pool-path"}
        s["memory_tiers"] = tuple(m for m in system.memory_tiers
                                  if m.memory not in db.memory or db.memory[m.memory].kind != "pooled") + (attach,)
    if "scale_up_domain" in values or "scale_up_gb_per_s" in values:
        changes["calibrations"] = {key: {"collectives": None, "dispatch": None}
                                   for key, cal in db.calibrations.items() if cal.device == acc.name}
    return with_overrides(db, changes), system.name


TRAIN_METRICS = ("step_time_s", "tokens_per_s", "mfu", "cost_per_million_tokens_usd", "energy_per_token_j",
                 "run_cost_usd", "hbm_used_bytes", "power_w")
SERVE_METRICS = ("devices", "usd_per_hour", "ttft_p90_s", "tpot_p90_s", "latency_s", "power_w")
# Serving rows carry the training rows' names for what both measure (one --metric vocabulary):
# a deployment's cost per million output tokens and energy per output token.
SERVE_SHARED = {"cost_per_million_tokens_usd": "usd_per_million_tokens", "energy_per_token_j": "joules_per_token"}


def evaluate_point(spec: SweepSpec, index: int, values: dict[str, float], db, threads: int | None = None
                   ) -> list[dict]:
    """The rows of one point: each workload's optimal plan and metrics (status INFEASIBLE, with the
    reason, when nothing fits; a point the hardware cannot take is a row with status INVALID).
    ``threads``: the threads a training search evaluates its plans on (None: every core)."""
    from perfmodel.hardware_db.errors import PerfmodelError

    rows = []
    try:
        point_db, system = apply_point(db, spec.base_system, values)
    except PerfmodelError as exc:
        return [{"point": index, "workload": w.name, **values, "status": "INVALID", "reason": str(exc)}
                for w in spec.workloads]
    for w in spec.workloads:
        row: dict[str, Any] = {"point": index, "workload": w.name, **values}
        try:
            row.update(_train_row(w, point_db, system, threads) if w.kind == "train"
                       else _serve_row(w, point_db, system))
        except PerfmodelError as exc:
            row.update(status="INFEASIBLE" if getattr(exc, "exit_code", 2) == 3 else "INVALID", reason=str(exc))
        rows.append(row)
    return rows


def _tokens_per_usd(cost_per_million) -> float | None:
    return 1e6 / cost_per_million if cost_per_million and math.isfinite(cost_per_million) else None


def _train_row(w: Workload, db, system: str, threads: int | None) -> dict:
    from .api import plan_train

    planning = plan_train(db=db, threads=threads, **{**w.fields, "system": (system,)})
    best = planning.best
    row = {"status": planning.evidence.status, "devices": best.devices,
           **{k: getattr(best, k) for k in TRAIN_METRICS},
           **{f"plan_{k}": getattr(best.plan, k) for k in PLAN_COLUMNS},
           "space_size": planning.evidence.declared_space}
    row["tokens_per_usd"] = _tokens_per_usd(row["cost_per_million_tokens_usd"])
    return row


def _serve_row(w: Workload, db, system: str) -> dict:
    from .api import plan_serve

    planning = plan_serve(db=db, **{**w.fields, "system": (system,)})
    best = planning.best
    row = {"status": planning.evidence.status, "mode": best.mode, **{k: getattr(best, k) for k in SERVE_METRICS},
           **{shared: getattr(best, own) for shared, own in SERVE_SHARED.items()},
           "pools": ";".join(f"{p.role}:{p.instances}x{p.devices_per_instance}" for p in best.pools)}
    row["tokens_per_usd"] = _tokens_per_usd(row["cost_per_million_tokens_usd"])
    return row


# --- engines ---------------------------------------------------------------------------------

@functools.lru_cache(maxsize=8)
def _database(dirs: tuple[str, ...]):
    """A worker's database: loaded once per process (a pure function of the folders, memoized)."""
    from perfmodel.hardware_db.loader import load_database

    return load_database(list(dirs))


@functools.lru_cache(maxsize=8)
def _spec(spec_text: str) -> SweepSpec:
    return parse_spec(spec_text)


def evaluate_batch(spec_text: str, dirs: tuple[str, ...], batch: list[tuple[int, dict]]) -> list[dict]:
    """Rows of a batch of (index, values) points: the task every engine runs (pure, picklable). Each
    point's search runs on one thread: the engine spreads the points over the cores."""
    spec, db = _spec(spec_text), _database(dirs)
    return [row for index, values in batch for row in evaluate_point(spec, index, values, db, threads=1)]


def batches(todo: list[tuple[int, dict]], workers: int, most: int = 200) -> list[list[tuple[int, dict]]]:
    """Tasks of consecutive points: first one point per worker, so that progress and its rate (and the
    time left) show after one point's search, then at most ``most`` each and about eight per worker,
    so that the pool stays busy to the end and scheduling costs little against a point's search."""
    first, rest = todo[:workers], todo[workers:]
    size = max(1, min(most, math.ceil(len(rest) / max(workers * 8, 1))))
    return [[point] for point in first] + [rest[i:i + size] for i in range(0, len(rest), size)]


@dataclass
class SweepRun:
    spec: SweepSpec
    rows: list[dict] = field(default_factory=list)
    evaluated: int = 0                   # points evaluated in this run (the rest were resumed)
    seconds: float = 0.0
    engine: str = "process"
    workers: int = 1


def run_sweep(spec_text: str, dirs: tuple[str, ...] = (), engine: str = "process", workers: int | None = None,
              address: str | None = None, done: list[dict] | None = None,
              progress: Callable[[int, int], None] | None = None,
              on_rows: Callable[[list[dict]], None] | None = None) -> SweepRun:
    """Every point of the spec's design not already in ``done`` (rows of an earlier run), on a local
    process pool (``workers``, default all cores) or a Ray cluster (``address``, default a local
    instance); rows sorted by point and workload."""
    import os
    import time

    spec = parse_spec(spec_text)
    points = design(spec)
    per_point: dict[int, set] = {}
    for r in done or []:
        if r.get("status") not in (None, ""):
            per_point.setdefault(int(r["point"]), set()).add(r["workload"])
    # A point is done when every workload has its row (an interrupted run may leave half a point).
    finished = {p for p, names in per_point.items() if names >= {w.name for w in spec.workloads}}
    todo = [(i, values) for i, values in enumerate(points) if i not in finished]
    workers = max(1, workers or os.cpu_count() or 1)
    tasks = batches(todo, workers)
    started = time.perf_counter()
    seen: set = set()
    rows = []
    for r in done or []:
        key = (int(r["point"]), r["workload"])
        if int(r["point"]) in finished and key not in seen:
            seen.add(key)
            rows.append(r)
    if progress is not None:
        progress(len(points) - len(todo), len(points))
    count = len(points) - len(todo)

    def collect(result):
        nonlocal count
        rows.extend(result)
        if on_rows is not None:
            on_rows(result)
        count += len({r["point"] for r in result})
        if progress is not None:
            progress(count, len(points))

    if engine == "ray":
        _run_ray(spec_text, dirs, tasks, address, workers, collect)
    elif engine == "process" and workers > 1 and len(tasks) > 1:
        from concurrent.futures import ProcessPoolExecutor, as_completed
        import multiprocessing

        with ProcessPoolExecutor(max_workers=workers, mp_context=_context(multiprocessing)) as pool:
            futures = [pool.submit(evaluate_batch, spec_text, dirs, t) for t in tasks]
            for f in as_completed(futures):
                collect(f.result())
    elif engine in ("process", "serial"):
        for t in tasks:
            collect(evaluate_batch(spec_text, dirs, t))
    else:
        raise SpecError(f"unknown engine {engine!r}; one of process, ray")
    rows.sort(key=lambda r: (int(r["point"]), [w.name for w in spec.workloads].index(r["workload"])))
    return SweepRun(spec, rows, len(todo), time.perf_counter() - started, engine, workers)


def _context(multiprocessing):
    """Worker processes forked from a server that has imported the cost model and the search already
    (no start-up per worker, and no fork of this process's threads); spawn where fork does not exist."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["perfmodel.search.sweep", "perfmodel.search.train", "perfmodel.search.serve",
                                    "perfmodel.training", "perfmodel.serving", "ortools.sat.python.cp_model"])
    return context


def _run_ray(spec_text, dirs, tasks, address, workers, collect) -> None:
    try:
        import ray
    except ImportError:
        raise SpecError("--engine ray needs Ray: pip install 'perfmodel[ray]'") from None
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, num_cpus=None if address else workers, include_dashboard=False,
                 log_to_driver=False, ignore_reinit_error=True)
    try:
        remote = ray.remote(evaluate_batch)
        pending = [remote.remote(spec_text, dirs, t) for t in tasks]
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            collect(ray.get(ready[0]))
    finally:
        if started_here:
            ray.shutdown()


# --- the table's columns ------------------------------------------------------------------

PLAN_COLUMNS = ("tp", "pp", "dp", "cp", "ep", "interleave", "micro_batch", "zero", "recompute", "precision",
                "optimizer_place")


def columns(spec: SweepSpec) -> list[str]:
    """The table's columns, fixed by the spec (so that rows can be appended as batches finish)."""
    kinds = {w.kind for w in spec.workloads}
    train = ["devices", *TRAIN_METRICS, *(f"plan_{k}" for k in PLAN_COLUMNS), "space_size"] if "train" in kinds else []
    serve = ["mode", *SERVE_METRICS, "pools"] if "serve" in kinds else []
    return list(dict.fromkeys(["point", "workload", *(p.name for p in spec.parameters), "status", "tokens_per_usd",
                               *train, *serve, "reason"]))


# --- sensitivity -----------------------------------------------------------------------------

METRICS = ("tokens_per_usd", "tokens_per_s", "step_time_s", "mfu", "energy_per_token_j", "cost_per_million_tokens_usd",
           "devices", "ttft_p90_s", "tpot_p90_s", "latency_s")


@dataclass(frozen=True)
class Sensitivity:
    """Elasticities d ln(metric) / d ln(parameter) of one workload's metrics, fitted by least squares
    on the logs over every point that has the metric (a log-log linear model; its R^2 says how well
    constant elasticities describe the design), and the parameter moving each metric most."""

    workload: str
    parameters: tuple[str, ...]
    elasticities: dict[str, dict[str, float]]     # metric -> parameter -> elasticity
    r2: dict[str, float]
    points: dict[str, int]

    def strongest(self, metric: str) -> tuple[str, float] | None:
        e = self.elasticities.get(metric)
        if not e:
            return None
        name = max(e, key=lambda k: abs(e[k]))
        return name, e[name]


def sensitivity(meta: dict, rows: list[dict]) -> list[Sensitivity]:
    import numpy as np

    out = []
    for workload in meta.get("workloads", []):
        mine = [r for r in rows if r.get("workload") == workload and r.get("status") in ("OPTIMAL", "FEASIBLE")]
        params = tuple(p for p in meta["parameters"]
                       if len({r.get(p) for r in mine}) > 1 and all((r.get(p) or 0) > 0 for r in mine))
        elasticities, r2, counts = {}, {}, {}
        for metric in METRICS:
            use = [r for r in mine if isinstance(r.get(metric), (int, float)) and r[metric] > 0]
            if len(use) <= len(params) + 1 or not params:
                continue
            x = np.column_stack([np.ones(len(use))] + [np.log([float(r[p]) for r in use]) for p in params])
            y = np.log([float(r[metric]) for r in use])
            if float(np.ptp(y)) < 1e-9:
                continue   # the metric does not move over the design
            coef, *_ = np.linalg.lstsq(x, y, rcond=None)
            fitted = x @ coef
            total = float(((y - y.mean()) ** 2).sum())
            elasticities[metric] = {p: float(c) for p, c in zip(params, coef[1:])}
            r2[metric] = 1.0 - float(((y - fitted) ** 2).sum()) / total if total > 0 else 1.0
            counts[metric] = len(use)
        out.append(Sensitivity(workload, params, elasticities, r2, counts))
    return out


def pareto_points(rows: list[dict], workload: str) -> tuple[str, str, list[dict]]:
    """(time metric, cost metric, the points no other beats on both): step time and cost per
    million tokens for training, request latency and cost per million output tokens for serving."""
    from .pareto import pareto_front

    mine = [r for r in rows if r.get("workload") == workload and r.get("status") in ("OPTIMAL", "FEASIBLE")]
    serve = any(r.get("latency_s") is not None for r in mine)
    time_key, cost_key = ("latency_s" if serve else "step_time_s"), "cost_per_million_tokens_usd"
    usable = [r for r in mine if isinstance(r.get(time_key), (int, float)) and isinstance(r.get(cost_key), (int, float))]
    if not usable:
        return time_key, cost_key, []
    front = pareto_front([[r[time_key], r[cost_key]] for r in usable])
    return time_key, cost_key, sorted((usable[i] for i in front), key=lambda r: r[time_key])


def grid_of(rows: list[dict], workload: str, x: str, y: str, metric: str):
    """(x values, y values, mean metric per cell; NaN where no point) of two parameters."""
    import numpy as np

    mine = [r for r in rows if r.get("workload") == workload and isinstance(r.get(metric), (int, float))]
    xs = sorted({r[x] for r in mine if r.get(x) is not None})
    ys = sorted({r[y] for r in mine if r.get(y) is not None})
    grid = np.full((len(ys), len(xs)), np.nan)
    for j, yv in enumerate(ys):
        for i, xv in enumerate(xs):
            cell = [r[metric] for r in mine if r.get(x) == xv and r.get(y) == yv]
            if cell:
                grid[j, i] = float(np.mean(cell))
    return xs, ys, grid
