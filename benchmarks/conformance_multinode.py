"""The multi-host half of bench_export_conformance.py (issue 32, item 2): which hosts of an instance to
launch, the flags Dynamo's operator adds to a multinode vLLM worker on each pod, and TensorRT-LLM's
launches checked against the rules vendored from its source (it is not installable here).

Dynamo's operator (deploy/operator/internal/dynamo/backend_vllm.go, updateVLLMMultinodeArgs; commit
003d1ee5de27 of the public index, not the v1.6.1 tag) rewrites a worker's command on each pod of a
``multinode`` component: an engine (TP x PP) wider than the pod's GPUs gets the multiprocessing launch
(``--distributed-executor-backend mp --nnodes N --master-addr LEADER --master-port P --node-rank R``,
``--headless`` on the workers; Ray instead when its compatibility gate says so), data parallelism wider
than the pod gets ``--data-parallel-hybrid-lb --data-parallel-size-local GPUs/(TP x PP)
--data-parallel-start-rank R x local --data-parallel-address LEADER --data-parallel-rpc-port 13445``.
``operator_roles`` reproduces those two rewrites so that Dynamo's own parsers see what each pod runs.
"""

from __future__ import annotations

from pathlib import Path

LEADER = "leader-0"   # the leader pod's hostname (a placeholder; nothing is contacted)


def node_ranks(script: Path) -> list[str]:
    """NODE_RANK values to launch ``script`` with: 0 alone on one host; the first and the last host across hosts."""
    text = script.read_text()
    if "--nnodes" not in text:
        return ["0"]
    words = text.replace("\\\n", " ").split()
    nodes = int(words[words.index("--nnodes") + 1])
    return ["0", str(nodes - 1)]


def _flag(argv: list[str], flag: str, default: int = 1) -> int:
    return int(argv[argv.index(flag) + 1]) if flag in argv else default


def operator_roles(argv: list[str], gpus: int, nodes: int) -> list[tuple[str, list[str]]]:
    """(pod, argv as the operator rewrites it) for each kind of pod of a worker over ``nodes`` pods of ``gpus``."""
    if nodes <= 1:
        return [("", argv)]
    world = _flag(argv, "--tensor-parallel-size") * _flag(argv, "--pipeline-parallel-size")
    if world > gpus:
        mp = ["--distributed-executor-backend", "mp", "--nnodes", str(nodes), "--master-addr", LEADER,
              "--master-port", "29500"]
        return [("leader", argv + mp + ["--node-rank", "0"]),
                ("worker", argv + mp + ["--node-rank", str(nodes - 1), "--headless"])]
    local = gpus // world
    dp = ["--data-parallel-hybrid-lb"] + ([] if "--data-parallel-size" in argv else
                                          ["--data-parallel-size", str(local * nodes)])
    common = ["--data-parallel-size-local", str(local), "--data-parallel-address", LEADER,
              "--data-parallel-rpc-port", "13445"]
    return [("leader", argv + dp + common + ["--data-parallel-start-rank", "0"]),
            ("worker", argv + dp + common + ["--data-parallel-start-rank", str(local * (nodes - 1))])]


def dynamo_pods(doc: dict, commands) -> list[tuple[str, list[str]]]:
    """(component [pod], argv) of every pod kind of a DynamoGraphDeployment; ``commands`` lists (name, argv)."""
    out = []
    components = {c.get("name"): c for c in doc.get("spec", {}).get("components") or []}
    for name, argv in commands(doc):
        comp = components.get(name, {})
        nodes = int((comp.get("multinode") or {}).get("nodeCount", 1))
        containers = ((comp.get("podTemplate") or {}).get("spec") or {}).get("containers") or [{}]
        gpus = int(((containers[0].get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0))
        for pod, args in operator_roles(argv, gpus, nodes):
            out.append((f"{name} ({pod}, {nodes} pods of {gpus} GPUs)" if pod else name, args))
    return out


# --------------------------------------------------------------------------- TensorRT-LLM, from its source

def _options(argv: list[str]) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {}
    for i, word in enumerate(argv):
        if word.startswith("-"):
            value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else True
            out[word] = value
    return out


def _flat(config: dict, prefix: str = ""):
    for key, value in config.items():
        if isinstance(value, dict) and value:
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def trtllm_verdict(launch: dict, folder: Path, experts: int, gpus_per_host: int) -> tuple[str, str]:
    """(verdict, what was checked) of one recorded TensorRT-LLM launch against the vendored rules: MPI ranks
    = tp x pp (llm_mgmn_trtllm_serve.sh:17-19), every trtllm-serve option and YAML key a vendored name,
    MoeLoadBalancerConfig's num_slots a multiple of ep_size and at least the experts."""
    import yaml

    from perfmodel.exports.vendored import vendored

    v = vendored("trtllm")
    argv, launcher = launch["argv"], launch["launcher"]
    serve = argv[argv.index("trtllm-serve") + 1:] if "trtllm-serve" in argv else argv
    opts = _options(serve[1:])
    problems = [f"{name} is not a trtllm-serve option" for name in opts if name not in v.names]
    world = int(opts.get("--tp_size", 1)) * int(opts.get("--pp_size", 1))
    if launcher == "srun":
        o = _options(argv[:argv.index("trtllm-llmapi-launch")])
        ranks = int(o["-N"]) * int(o["--ntasks-per-node"]) if "--ntasks-per-node" in o else int(o["--ntasks"])
        how = f"srun {o['-N']} hosts, {ranks} ranks"
    elif launcher == "mpirun":
        ranks = int(_options(argv)["-n"])
        how = f"mpirun {ranks} ranks"
    else:
        ranks, how = world, "trtllm-serve on one host"
        if world > gpus_per_host:
            problems.append(f"world size {world} on one host of {gpus_per_host} GPUs")
    if ranks != world:
        problems.append(f"{ranks} MPI ranks for the world size tp x pp = {world}")
    if "--gpus_per_node" in opts and int(opts["--gpus_per_node"]) != gpus_per_host:
        problems.append(f"--gpus_per_node {opts['--gpus_per_node']} on hosts of {gpus_per_host} GPUs")
    options = yaml.safe_load((folder / str(opts["--extra_llm_api_options"])).read_text())
    keys = dict(_flat(options))
    problems += [f"{key} is not an LLM API option" for key in keys if key not in v.keys]
    balancer = (options.get("moe_config") or {}).get("load_balancer")
    checked = f"{how} = tp x pp {world}; {len(opts)} options and {len(keys)} YAML keys vendored"
    if balancer:
        slots, ep = int(balancer["num_slots"]), int(opts.get("--ep_size", 1))
        if slots % ep or slots < experts:
            problems.append(f"num_slots {slots} with ep_size {ep} and {experts} experts")
        checked += f"; load balancer {slots} slots = {slots // ep} per EP rank of {ep}, >= {experts} experts"
    return ("fail", "; ".join(problems)) if problems else ("source", checked)


def trtllm_disagg_verdict(folder: Path) -> tuple[str, str]:
    """disagg-config.yml: every key a vendored name of ``trtllm-serve disaggregated`` (disagg_utils.py)."""
    import yaml

    from perfmodel.exports.vendored import vendored

    keys = dict(_flat(yaml.safe_load((folder / "disagg-config.yml").read_text())))
    unknown = [k for k in keys if k not in vendored("trtllm").parts["disaggregated"]["keys"]]
    return ("fail", f"not disaggregated keys: {unknown}") if unknown else \
        ("source", f"{len(keys)} keys of trtllm-serve disaggregated vendored")


def trtllm_envs(script: Path) -> list[tuple[str, dict[str, str]]]:
    """(how, environment) to run a TensorRT-LLM script with: under Slurm and with mpirun's HOSTS across hosts."""
    model = {"MODEL": "checkpoint"}   # a pre-quantized checkpoint the script asks the operator for
    if "trtllm-llmapi-launch" not in script.read_text():
        return [("", model)]
    return [("srun", {"SLURM_JOB_ID": "1", **model}), ("mpirun", {"HOSTS": "host0,host1", **model})]


def experts_of(model: str) -> int:
    from perfmodel.catalog import find_model

    spec = find_model(model)
    return int(spec.moe.num_experts) if spec.moe else 0


def check_trtllm(folder: Path, record, row, experts: int, gpus_per_host: int) -> list:
    """TensorRT-LLM is not installable here: each script run under bash by ``record(script, env)`` (srun and
    mpirun recorded across hosts), its launch and YAML checked against the rules vendored from its source."""
    rows = []
    for script in sorted(folder.glob("trtllm*.sh")):
        for how, env in trtllm_envs(script):
            item = script.name + (f" ({how})" if how else "")
            try:
                [launch] = record(script, env)
            except Exception as exc:  # the script itself refused to run
                rows.append(row(item, "fail", str(exc)))
                continue
            rows.append(row(item, *trtllm_verdict(launch, folder, experts, gpus_per_host)))
    if (folder / "disagg-config.yml").exists():
        rows.append(row("disagg-config.yml", *trtllm_disagg_verdict(folder)))
    return rows
