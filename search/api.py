"""The searches as Python functions: ``perfmodel.plan_train``, ``plan_serve`` and ``place_experts``.

Each takes its command's request (or the request's fields as keywords) and returns the typed result
the command line renders. A user mistake raises a ``PerfmodelError`` with the CLI's one-line message;
a request no plan can meet raises ``InfeasibleError`` naming the binding constraint.

    >>> import perfmodel
    >>> result = perfmodel.plan_train(model="llama-3.1-8b", devices=(8,), global_batch=64)
    >>> result.best.plan.tp, result.evidence.status
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from dataclasses import fields as dataclass_fields
from typing import Callable

from .requests import PlaceExpertsRequest, PlanServeRequest, PlanTrainRequest


def _request(cls, request, fields: dict):
    """The command's request from a request object and/or its fields; a repeatable field
    (``system``, ``devices``) given one value, as ``devices=64``, is that one value repeated once."""
    repeatable = {f.name for f in dataclass_fields(cls) if isinstance(f.default, tuple)}
    fields = {k: (v,) if k in repeatable and isinstance(v, (str, int, float)) else v for k, v in fields.items()}
    if request is None:
        return cls(**fields)
    if not isinstance(request, cls):
        raise TypeError(f"expected a {cls.__name__}, got {type(request).__name__}")
    return replace(request, **fields) if fields else request


def _database(db):
    if db is not None:
        return db
    from perfmodel.hardware_db.loader import load_database, user_dirs_from_env

    return load_database(user_dirs_from_env())


@dataclass(frozen=True)
class TrainPlanning:
    """A training search: what was asked, the resolved inputs and the search's result with its proof."""

    request: PlanTrainRequest
    spec: object                       # TransformerSpec
    candidates: list                   # [(system, devices)]
    work: object                       # TrainWorkload
    options: object                    # SearchOptions
    result: object                     # SearchResult
    baseline: object = None            # SearchResult of the named heuristic (request.baseline), on the best's system

    @property
    def best(self):
        """The optimal plan's TrainRow: system, devices, plan, step time, MFU, cost, energy."""
        return self.result.best

    @property
    def recommended(self):
        """The TrainRow recommended by ``search.train.RECOMMENDATION`` among those within the optimum's
        range, with the frameworks that run it (``runs_on``); the optimum under ``any_plan``."""
        return self.result.recommended or self.result.best

    @property
    def evidence(self):
        return self.result.evidence

    def machine_of(self, row):
        """The Machine a listed plan (a TrainRow) runs on."""
        return self.result.machines[(row.system, row.devices)]

    @property
    def machine(self):
        """The Machine the optimal plan runs on."""
        return self.machine_of(self.best)

    def estimate(self, row=None):
        """A listed plan (a TrainRow; default: the optimum) evaluated on its own (``perfmodel estimate
        train``): a TrainResult."""
        from perfmodel.training import estimate_training

        row = row or self.best
        return estimate_training(self.spec, self.machine_of(row), row.plan, self.work)

    def export(self, framework: str) -> dict[str, str]:
        """The recommended plan as ``framework``'s launch files (name -> text), as ``--export`` writes
        them; ``ExportError`` when the framework cannot run it (search with ``framework=`` to get the
        best plan it can)."""
        from perfmodel.exports import training_files

        row = self.recommended
        return training_files(framework, self.spec, self.machine_of(row), row.plan, self.work, self.request.model)


def plan_train(request: PlanTrainRequest | None = None, /, *, db=None,
               progress: Callable[[int, int], None] | None = None, threads: int | None = None,
               **fields) -> TrainPlanning:
    """The optimal training plan over the declared space (``perfmodel plan train``); ``progress`` is
    called with (candidates searched, candidates); ``threads``: the threads evaluating the plans (None:
    every core)."""
    from .train import raise_if_infeasible, search_training

    request = _request(PlanTrainRequest, request, fields)
    db = _database(db)
    spec, pairs, work, options = request.resolve(db)
    options = replace(options, threads=threads)
    done = iter(range(1, len(pairs) + 1))  # search_training reports once per candidate
    result = search_training(spec, db, pairs, work, options,
                             progress=(lambda _plans: progress(next(done), len(pairs))) if progress else None)
    raise_if_infeasible(result, options)
    baseline = None
    if request.baseline:
        from .baselines import train_options

        where = (result.best.system, result.best.devices)
        restricted = train_options(request.baseline, options, db.system(where[0]).devices_per_launch_host)
        baseline = search_training(spec, db, [where], work, restricted)
    return TrainPlanning(request, spec, pairs, work, options, result, baseline)


@dataclass(frozen=True)
class ServePlanning:
    """A serving search: the demand, the resolved inputs and the cheapest deployment with its proof."""

    request: PlanServeRequest
    spec: object                       # TransformerSpec
    systems: list[str]
    demand: object                     # Demand
    options: object                    # ServeSearchOptions
    result: object                     # ServeSearchResult
    machines: dict = field(default_factory=dict)   # system name -> Machine (one node), for cost bases
    baseline: object = None            # ServeSearchResult of the named heuristic (request.baseline)
    power_cap: dict | None = None      # under --power-cap-w: tail latencies capped vs not, oversubscription
    recommended: object = None         # the Deployment SERVE_RECOMMENDATION picks (the optimum under any_plan)
    runs_on: dict = field(default_factory=dict)   # each serving framework's answer to it: None when it runs it

    @property
    def best(self):
        """The optimal Deployment: its mode and pools (role, system, instances, parallel degrees, formats)."""
        return self.result.best

    @property
    def evidence(self):
        return self.result.evidence

    def export(self, framework: str) -> dict[str, str]:
        """The recommended deployment as ``framework``'s launch files, per pool (name -> text)."""
        from perfmodel.exports import serving_files

        return serving_files(framework, self.spec, self.pools(self.recommended), self.request.model)

    def pools(self, deployment) -> list:
        """A deployment's pools as the exporters take them."""
        from perfmodel.exports import deployment_pools

        return deployment_pools(self.spec, deployment, self.machines, self.demand, self.options.mtp_draft_tokens,
                                self.options.expert_balance)


# The recommendation among deployments the model cannot tell apart (README, "Which deployment plan serve recommends").
SERVE_RECOMMENDATION = ("among the listed deployments whose objective's range overlaps the optimum's, best first: the "
                        "first that a serving framework runs as written")


def _recommend_deployment(planning: ServePlanning, frameworks: tuple[str, ...] | None):
    """(deployment, each framework's answer to it) by SERVE_RECOMMENDATION; the optimum when no tie
    runs, or when ``frameworks`` is None (--any-plan)."""
    from perfmodel.exports import serving_frameworks

    from .serve import serving_ties

    best = planning.result.best
    answer = lambda d: serving_frameworks(planning.spec, planning.pools(d), planning.request.model,  # noqa: E731
                                          frameworks)
    first = answer(best)
    if frameworks is None or any(why is None for why in first.values()):
        return best, first
    ties = serving_ties(best, planning.result.top, planning.options.objective)
    for d, tie in zip(planning.result.top, ties):
        runs = answer(d) if tie else {}
        if any(why is None for why in runs.values()):
            return d, runs
    return best, first


def plan_serve(request: PlanServeRequest | None = None, /, *, db=None,
               progress: Callable[[int, int], None] | None = None, **fields) -> ServePlanning:
    """The cheapest deployment meeting the request rate within the latency targets (``perfmodel plan serve``);
    ``progress`` is called with (steps done, steps): each system evaluated, then the fleet solved."""
    from perfmodel.machine import build_machine

    from .serve import raise_if_infeasible, search_serving

    request = _request(PlanServeRequest, request, fields)
    db = _database(db)
    spec, systems, demand, options = request.resolve(db)
    result = search_serving(spec, db, systems, demand, options,
                            progress=(lambda done: progress(done, len(systems) + 1)) if progress else None)
    raise_if_infeasible(result)
    machines = {name: build_machine(db, name, None, options.pricing, options.prices) for name in systems}
    baseline = None
    if request.baseline:
        from .baselines import serve_options

        native = "bf16" if spec.native_precision == "fp16" else spec.native_precision
        baseline = search_serving(spec, db, systems, demand, serve_options(request.baseline, options, native))
    power_cap = None
    if request.power_cap_w is not None:
        from perfmodel.report import oversubscription

        from perfmodel.oversubscription import copies_held, exceed_probability

        from .serve import capped_p99, deployment_power

        # The same demand uncapped: the deployment a cap would be laid on, and the devices it needs.
        free = search_serving(spec, db, systems, demand, replace(options, device_power_cap_w=None))
        per_budget = {name: oversubscription(m, request.power_cap_w) for name, m in machines.items()}
        ratio = per_budget[free.best.pools[0].system] if free.best is not None else None
        power_cap = {"cap_w": request.power_cap_w, "devices_per_budget_vs_tdp": per_budget,
                     "devices_capped": result.best.devices,
                     "devices_uncapped": free.best.devices if free.best is not None else None,
                     # Demand one facility carries, capped over uncapped: more devices, each pool a bit larger.
                     "demand_per_budget_vs_tdp": (ratio * free.best.devices / result.best.devices
                                                  if free.best is not None else None),
                     "uncapped_optimum_under_cap": capped_p99(spec, machines, free.best, demand, options)
                     if free.best is not None else None}
        if free.best is not None:
            # POLCA's question: the facility's budget at TDP, shared by copies of the uncapped optimum,
            # capped only when their total exceeds it (perfmodel.oversubscription). A device is
            # provisioned at its TDP and node share, averaged over the deployment's devices (its pools
            # may run on several systems).
            provisioned = sum(p.devices * (machines[p.system].tdp_w + machines[p.system].overhead_w_per_device)
                              for p in free.best.pools) / free.best.devices
            budget = request.facility_devices * provisioned
            fleet = deployment_power(spec, machines, free.best, demand, options)
            copies = copies_held(fleet, budget, request.capping_risk)
            held = copies * free.best.devices
            per_copy_w = sum(p.mean_w * n for p, n in fleet)
            power_cap["facility"] = {
                "devices_provisioned": request.facility_devices, "budget_w": budget,
                "capping_risk": request.capping_risk, "deployment_copies": copies, "devices_held": held,
                "devices_held_vs_provisioned": held / request.facility_devices,
                "capping_probability": exceed_probability([(p, n * copies) for p, n in fleet], budget),
                "mean_w_per_device": per_copy_w / free.best.devices,
                "tdp_w_per_device": provisioned}
    planning = ServePlanning(request, spec, systems, demand, options, result, machines, baseline, power_cap)
    from perfmodel.exports import SERVING

    deployment, runs_on = _recommend_deployment(planning, None if request.any_plan else
                                                (request.framework,) if request.framework else SERVING)
    return replace(planning, recommended=deployment, runs_on=runs_on)


METHODS = ("round-robin", "greedy", "affinity")


@dataclass(frozen=True)
class ExpertPlacement:
    """Experts placed three ways (round-robin, greedy, and "affinity": the lexicographic objective of
    ``perfmodel.search.placement``) with each one's traffic and predicted MoE time."""

    request: PlaceExpertsRequest
    spec: object                       # TransformerSpec
    machine: object                    # Machine
    problem: object                    # PlacementProblem
    placements: dict                   # method -> Placement
    coactivation: object = None        # perfmodel.coactivation.Coactivation measured from the statistics, or None
    rerouting: object = None           # search.rerouting.Rerouting over round-robin (--reroute least-loaded), or None

    @property
    def best(self):
        """The lexicographic placement: ``best.as_map()`` is layer -> expert -> devices."""
        return self.placements["affinity"]

    def predicted_moe_time_s(self, method: str) -> float:
        """Seconds of all MoE layers under ``method`` (or "least-loaded": LLEP over round-robin)."""
        from .placement import layer_time
        from .rerouting import rerouted_time

        if method == "least-loaded":
            return rerouted_time(self.spec, self.machine, self.placements["round-robin"], self.rerouting,
                                 self.problem.devices)
        return layer_time(self.spec, self.machine, self.placements[method], self.problem.devices)

    def expert_memory(self):
        """Peak memory per device of standard EP, the static replicas and LLEP (None without --reroute)."""
        from .rerouting import expert_memory

        if self.rerouting is None:
            return None
        return expert_memory(self.spec, self.problem, self.placements["round-robin"], self.best, self.rerouting)

    def reduction(self, baseline: str, tokens: str = "cross_device_tokens") -> float | None:
        """The best placement's ``tokens`` ("cross_device_tokens" or "cross_node_tokens") below
        ``baseline``'s, as a share of the baseline's (None without transition counts)."""
        ours, theirs = getattr(self.best, tokens), getattr(self.placements[baseline], tokens)
        if ours is None or theirs is None:
            return None
        return 1.0 - ours / theirs if theirs > 0 else 0.0


def place_experts(request: PlaceExpertsRequest | None = None, /, *, db=None,
                  progress: Callable[[int, int], None] | None = None, **fields) -> ExpertPlacement:
    """Experts (with replicas of hot ones) placed on the devices of one expert-parallel group
    (``perfmodel place-experts``); ``progress`` is called with (layers placed, 3 x layers). Every
    placement passes ``placement.check`` (re-derived from the instance) before it is returned."""
    from perfmodel.coactivation import measure_coactivation

    from .placement import check, place
    from .rerouting import reroute

    request = _request(PlaceExpertsRequest, request, fields)
    spec, machine, problem = request.resolve(_database(db))
    layers = problem.stats.layers
    placements = {}
    for i, method in enumerate(METHODS):
        report = (lambda done, i=i: progress(i * layers + done, 3 * layers)) if progress else None
        placements[method] = place(problem, method, request.time_limit, report)
        check(problem, placements[method])
    coactivation = measure_coactivation(problem.stats, problem.slots)
    rerouting = None
    if request.reroute == "least-loaded":
        rerouting = reroute(problem, placements["round-robin"], request.llep_rule())
    return ExpertPlacement(request, spec, machine, problem, placements, coactivation, rerouting)
