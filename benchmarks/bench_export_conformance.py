"""Every export of a fixed set of plans, fed to its framework's own parser and validator (issue 32, item 3).

perfmodel checks each flag and key against the names vendored in ``perfmodel/exports/flags``; this
script checks more: that the framework, at the version the export names, parses the launch line and
accepts it in its own validators. It writes the exports of PLANS (Llama 3.1 8B / 70B / 405B and
Mixtral 8x7B training, Llama 3.1 70B and DeepSeek-V3 serving, on dgx-h100 and gb200-nvl72), runs
each launch script under bash with the launchers (``torchrun``, ``python``, ``deepspeed``, ``vllm``,
``trtllm-serve``) replaced by a recorder, and hands the recorded command line (and the files it
names) to a checker run in that framework's scratch environment.

The frameworks are never dependencies of perfmodel, of its tests or of CI. They live in scratch
virtual environments under ENVS (default /tmp/conformance), made once by ``--setup`` from the pinned
lists in ``benchmarks/conformance/`` (installed with ``--no-deps``; ``--torch`` names a CPU torch wheel):

    python benchmarks/bench_export_conformance.py --setup --torch torch-2.13.0+cpu-cp311-...whl   # Python 3.11
    python benchmarks/bench_export_conformance.py              # the table; exits 0 and says so without ENVS

ENVS/train: torch (CPU), DeepSpeed 0.19.5, torchtitan 0.2.2; ENVS/src/Megatron-LM: a checkout of
Megatron-LM at core_v0.19.0 (not on PyPI), run from that train environment. ENVS/sglang: SGLang 0.5.23
and sglang-router 0.3.2. ENVS/vllm: vLLM 0.33.0. ENVS/dynamo: ai-dynamo 1.6.1 with the vLLM it pins,
0.31.0. The serving engines are installed without their GPU kernels; their parsers and validators are
pure Python.

Stubs, the smallest that let the checks run without a GPU (each checker's source repeats its own):

- launchers: ``torchrun``, ``python``, ``python3``, ``deepspeed``, ``vllm``, ``trtllm-serve`` on PATH
  record their argv and the environment the script exported, and run nothing;
- the operator's variables the scripts require (NODE_RANK, MASTER_ADDR, TOKENIZER, DATA_PATH, ...),
  set to placeholder values (no address is contacted);
- Megatron-LM: WORLD_SIZE/RANK as torchrun would set them; the device's compute capability
  (``get_device_arch_version``: 9 on H100, 10 on GB200) that ``validate_args`` reads from CUDA;
  ``typing.override`` (Python 3.12) on the Python 3.11 of the CPU torch wheel;
- DeepSpeed: ``deepspeed.comm``'s rank and world size as ``deepspeed.init_distributed`` would give
  them, and for tensor-parallel configs the model-parallel unit the script tells the user to pass
  (its data-parallel size, world / autotp_size);
- torchtitan: ``pipeline_llm`` runs to its module split (the mesh and the model are not built);
- SGLang, vLLM, Dynamo: a local folder holding the model's Hugging Face ``config.json`` (written from
  perfmodel's catalog) in place of the hub id; ``torch.cuda`` answering as one host of the system
  (name, capability, memory, GPUs per host); SGLang: an empty ``torchvision`` (vision configs import
  it); vLLM (and Dynamo's): its CUDA kernel extensions and their ``torch.ops`` namespaces empty, its
  own ``NonNvmlCudaPlatform`` as the platform, the model class inspected in process;
- instances across hosts: vLLM and SGLang scripts launched as the first host and as the last (NODE_RANK);
  vLLM's engine handshake check that a remote engine runs ``--headless`` (it needs running engines) is
  restated after ``create_engine_config``, and a ``--headless`` host gets run_headless's config;
  Dynamo's multinode workers get the flags its operator adds on the leader pod and on a worker pod
  (``conformance_multinode.operator_roles``), the operator itself not being run.

Not installable here, so checked against the rules vendored from their source (reported as "source"):
Megatron-Bridge v0.6.0 (PyPI has megatron-bridge up to 0.3.1; v0.6.0 needs Transformer Engine from a git
commit and Megatron-Core built for CUDA) and TensorRT-LLM (PyPI's tensorrt-llm 1.2.1 is a stub that
downloads the wheel from NVIDIA's index, unreachable here; its repository snapshot, 2.5 GB, is over the
fetch limit, so no source tree to import the LLM API models from). TensorRT-LLM's scripts are still run
under bash (under srun and under mpirun across hosts) and each launch checked by
``conformance_multinode.trtllm_verdict``: MPI ranks = tp x pp, every trtllm-serve option and YAML key a
vendored name, the load balancer's slots a multiple of the EP size and at least the experts.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conformance_multinode import check_trtllm, dynamo_pods, experts_of, node_ranks  # noqa: E402

SYSTEMS = ("dgx-h100", "gb200-nvl72")
TRAINING = ("megatron", "nemo", "torchtitan", "deepspeed")
SERVING = ("vllm", "sglang", "trtllm", "dynamo")
# (model, devices) trained; (model, plan serve options) served. DeepSeek-V3 also disaggregated, so
# that its router and prefill/decode servers are exported.
TRAIN_PLANS = (("llama-3.1-8b", 8), ("llama-3.1-70b", 64), ("llama-3.1-405b", 1024), ("mixtral-8x7b", 64))
SERVE_PLANS = (("llama-3.1-70b", ()), ("llama-3.1-70b", ("--modes", "colocated")), ("deepseek-v3", ()),
               ("deepseek-v3", ("--modes", "disaggregated")))
ARCH = {"dgx-h100": 9, "gb200-nvl72": 10}   # CUDA compute capability major of the system's GPU
# What torch.cuda reports on one host of the system (name, capability, HBM bytes, GPUs per host).
GPUS = {"dgx-h100": {"name": "NVIDIA H100 80GB HBM3", "capability": 9, "memory_bytes": 85520809984, "count": 8},
        "gb200-nvl72": {"name": "NVIDIA GB200", "capability": 10, "memory_bytes": 199715979264, "count": 4}}

VERSIONS = {"megatron": "core_v0.19.0", "deepspeed": "0.19.5", "torchtitan": "0.2.2", "sglang": "0.5.23",
            "sglang-router": "0.3.2", "vllm": "0.33.0", "ai-dynamo": "1.6.1"}
LAUNCHERS = ("torchrun", "python", "python3", "deepspeed", "vllm", "trtllm-serve", "srun", "mpirun")
OPERATOR_ENV = {"NODE_RANK": "0", "MASTER_ADDR": "node0", "MASTER_PORT": "29500", "TOKENIZER": "tokenizer",
                "DATA_PATH": "data", "CHECKPOINT_DIR": "checkpoints", "TRAIN_SCRIPT": "train.py",
                "HOSTFILE": "hostfile", "PORT": "8000", "BOOTSTRAP_PORT": "8998"}


@dataclass(frozen=True)
class Export:
    """One plan's launch files for one framework, or the framework's refusal of the plan."""

    plan: str
    system: str
    framework: str
    folder: Path | None
    refusal: str | None


@dataclass(frozen=True)
class Row:
    plan: str
    system: str
    framework: str
    item: str       # the file (or launch) checked
    verdict: str    # pass, fail, refused, skipped, source
    message: str


# --------------------------------------------------------------------------- exports

def _perfmodel(argv: list[str]) -> tuple[int, str]:
    """Run perfmodel's command line in process: (exit code, stderr's last line)."""
    from perfmodel.cli.app import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    return code, (lines[-1] if lines else "")


def write_exports(out: Path) -> list[Export]:
    """Every export of the fixed set under ``out``; refusals kept with their line."""
    exports = []
    jobs = []
    for system in SYSTEMS:
        for model, devices in TRAIN_PLANS:
            for fw in TRAINING:
                jobs.append((f"train {model} x{devices}", system, fw,
                             ["plan", "train", "--model", model, "--system", system, "--devices", str(devices)]))
        for model, options in SERVE_PLANS:
            for fw in SERVING:
                name = f"serve {model}" + (" " + " ".join(options).replace("--modes ", "") if options else "")
                jobs.append((name, system, fw, ["plan", "serve", "--model", model, "--system", system, "--rate", "20",
                                                *options]))
    for plan, system, fw, argv in jobs:
        folder = out / f"{system}_{plan.replace(' ', '_')}_{fw}"
        code, last = _perfmodel([*argv, "--export", fw, "--out", str(folder)])
        exports.append(Export(plan, system, fw, folder if code == 0 else None, None if code == 0 else last))
    return exports


# --------------------------------------------------------------------------- recording the launch

RECORDER = '''#!{python}
import json, os, sys
with open(os.environ["CONFORMANCE_RECORD"], "a") as f:
    f.write(json.dumps({{"launcher": os.path.basename(sys.argv[0]), "argv": sys.argv[1:],
                         "env": dict(os.environ)}}) + "\\n")
'''


def recorder_bin(folder: Path) -> Path:
    """A folder of launchers that record their argv and environment instead of running."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in LAUNCHERS:
        path = folder / name
        path.write_text(RECORDER.format(python=sys.executable))
        path.chmod(0o755)
    return folder


def record(script: Path, bin_dir: Path, extra_env: dict[str, str]) -> list[dict]:
    """The launches ``script`` makes, run by bash in its own folder with the recorders first on PATH."""
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl", delete=False) as f:
        log = Path(f.name)
    base = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), **OPERATOR_ENV, **extra_env,
            "CONFORMANCE_RECORD": str(log)}
    done = subprocess.run(["bash", script.name], cwd=script.parent, env=base, capture_output=True, text=True,
                          timeout=60)
    launches = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    log.unlink()
    for launch in launches:
        launch["env"] = {k: v for k, v in launch["env"].items() if base.get(k) != v and k != "_"
                         and k not in ("PWD", "SHLVL", "OLDPWD", "LC_CTYPE")}
    if done.returncode != 0 and not launches:
        raise RuntimeError(f"bash {script.name} exited {done.returncode}: {done.stderr.strip()[-300:]}")
    return launches


def torchrun_split(argv: list[str]) -> tuple[int, list[str]]:
    """(world size, the program's arguments) of a torchrun command line."""
    nproc = nnodes = 1
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--nproc-per-node", "--nproc_per_node"):
            nproc = int(argv[i + 1])
        elif arg in ("--nnodes",):
            nnodes = int(argv[i + 1].split(":")[-1])
        if arg == "-m":
            return nproc * nnodes, argv[i + 2:]
        if arg.endswith(".py") and not arg.startswith("-"):
            return nproc * nnodes, argv[i + 1:]
        i += 1
    raise ValueError(f"no program in torchrun {argv}")


# --------------------------------------------------------------------------- checkers

CHECKERS: dict[str, str] = {}

# A stand-in for packages a checker's import chain touches but no validator uses (GPU-only or vision code).
STUB_MODULES = r'''
import importlib.abc, importlib.machinery, sys
from unittest import mock
class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots): self.roots = roots
    def find_spec(self, name, path=None, target=None):
        if name in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec):
        m = mock.MagicMock(name=spec.name); m.__path__ = []; m.__spec__ = spec; return m
    def exec_module(self, module): pass
def stub_cuda(gpu):
    """torch.cuda answering as the system's GPU would: gpu = {name, capability, memory_bytes, count}."""
    import types, torch
    props = types.SimpleNamespace(name=gpu["name"], major=gpu["capability"], minor=0, total_memory=gpu["memory_bytes"],
                                  multi_processor_count=132, L2_cache_size=50 * 2**20)
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: gpu["count"]
    torch.cuda.get_device_capability = lambda *a, **k: (gpu["capability"], 0)
    torch.cuda.get_device_name = lambda *a, **k: gpu["name"]
    torch.cuda.get_device_properties = lambda *a, **k: props
    torch.cuda.mem_get_info = lambda *a, **k: (gpu["memory_bytes"], gpu["memory_bytes"])
    torch.cuda.current_device = lambda: 0
def stub_modules(*roots):
    sys.meta_path.insert(0, _StubFinder(set(roots)))
'''

CHECKERS["megatron"] = r'''
# Stubs: WORLD_SIZE/RANK as torchrun sets them; get_device_arch_version (CUDA capability) of the system;
# typing.override (Python 3.12) on Python 3.11, where the CPU torch wheel is.
import json, os, sys
inp = json.load(open(sys.argv[1]))
sys.path.insert(0, inp["megatron_src"])
os.environ.update(inp["env"]); os.environ["WORLD_SIZE"] = str(inp["world_size"]); os.environ["RANK"] = "0"
os.environ["LOCAL_RANK"] = "0"
import typing
if not hasattr(typing, "override"):   # Python 3.12's typing.override, for the 3.11 CPU torch wheel
    typing.override = lambda f: f
import megatron.training.arguments as A
A.get_device_arch_version = lambda: inp["arch"]
import torch
torch.cuda.get_device_capability = lambda *a, **k: (inp["arch"], 0)
sys.argv = ["pretrain_gpt.py"] + inp["args"]
args = A.parse_args(None)
A.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
print("CONFORMANCE-OK parse_args + validate_args")
'''

CHECKERS["deepspeed"] = r'''
# Stubs: deepspeed.comm rank 0 of world_size (as init_distributed gives); for autotp configs the model-parallel
# unit the script requires (data-parallel size = world / autotp_size).
import json, sys
inp = json.load(open(sys.argv[1]))
import deepspeed.comm as dist
dist.get_rank = lambda *a, **k: 0
dist.get_world_size = lambda *a, **k: inp["world_size"]
dist.is_initialized = lambda: True
from deepspeed.runtime.config import DeepSpeedConfig
cfg = json.load(open(inp["config"]))
tp = (cfg.get("tensor_parallel") or {}).get("autotp_size", 1)
class MPU:
    def get_data_parallel_world_size(self): return inp["world_size"] // tp
    def get_model_parallel_world_size(self): return tp
    def get_model_parallel_rank(self): return 0
    def get_data_parallel_rank(self): return 0
    def get_sequence_parallel_world_size(self): return 1
c = DeepSpeedConfig(inp["config"], mpu=MPU() if tp > 1 else None)
print(f"CONFORMANCE-OK DeepSpeedConfig (world {inp['world_size']}" + (f", mpu dp {inp['world_size'] // tp})" if tp > 1 else ")"))
'''

CHECKERS["torchtitan"] = r'''
# Stubs: pipeline_llm runs to its module split (pipeline_module_split replaced by a recorder); no mesh, no model.
import json, os, sys
inp = json.load(open(sys.argv[1]))
os.chdir(inp["cwd"])
from torchtitan.config import ConfigManager
from torchtitan.distributed import ParallelDims
from torchtitan.protocols.train_spec import get_train_spec
cfg = ConfigManager().parse_args(inp["args"])
p = cfg.parallelism
dims = ParallelDims(dp_shard=p.data_parallel_shard_degree, dp_replicate=p.data_parallel_replicate_degree,
                    cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                    ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree, world_size=inp["world_size"])
spec = get_train_spec(cfg.model.name)
model_args = spec.model_args[cfg.model.flavor]
checked = "ConfigManager + ParallelDims"
if dims.pp > 1:
    import torchtitan.distributed.pipeline_parallel as PP
    seen = {}
    class Split(Exception): pass
    def split(model, pp_mesh, schedule, device, names, *a, **k):
        seen["names"] = names
        schedule_class = PP.get_schedule_class(schedule)
        stages = len(names)
        assert stages % dims.pp == 0, f"num_stages {stages} must be evenly divisible by pp_degree {dims.pp}"
        raise Split()
    PP.pipeline_module_split = split
    dims.get_mesh = lambda name: None
    try:
        PP.pipeline_llm(None, dims, cfg, "cpu", model_args, None, None)
    except Split:
        pass
    n = len(seen["names"])
    stages_per_rank = n // dims.pp
    mb = p.pipeline_parallel_microbatch_size
    if cfg.training.local_batch_size % mb:
        raise ValueError(f"Batch size {cfg.training.local_batch_size} must be divisible by microbatch_size {mb}.")
    checked += f" + pipeline_llm ({n} stages, {stages_per_rank} per rank)"
print("CONFORMANCE-OK " + checked)
'''

CHECKERS["sglang"] = STUB_MODULES + r'''
# Stubs: --model-path is a local folder with the model's config.json (no weights, no tokenizer files);
# torchvision (imported by the vision models' configs; no build of it matches the CPU torch wheel) is an empty
# stand-in, put in after transformers has recorded that torchvision is not installed.
import transformers.utils.import_utils
stub_modules("torchvision", "torchvision.transforms", "torchvision.transforms.functional", "torchvision.io")
import json, sys
inp = json.load(open(sys.argv[1]))
stub_cuda(inp["gpu"])
from sglang.srt.server_args import prepare_server_args
args = prepare_server_args(inp["args"])
args.resolve_once()    # the resolution pipeline: every handler's checks, as launch_server runs them
print("CONFORMANCE-OK prepare_server_args + resolve_once")
'''

CHECKERS["sglang-router"] = r'''
import json, sys
inp = json.load(open(sys.argv[1]))
from sglang_router.launch_router import parse_router_args
from sglang_router.launch_router import Router
args = parse_router_args(inp["args"])
args._validate_router_args()
Router.from_args(args)   # the Rust router's config, built as launch_router builds it; .start() is not called
print(f"CONFORMANCE-OK parse_router_args + _validate_router_args + Router.from_args "
      f"({len(args.prefill_urls)} prefill, {len(args.decode_urls)} decode)")
'''

VLLM_STUBS = STUB_MODULES + r'''
# Stubs: the model argument is a local folder with the model's config.json; torch.cuda answers as the system's
# GPU; vLLM's CUDA kernel extensions (vllm._C_stable_libtorch, vllm._qutlass_C, vllm.vllm_flash_attn) and the
# torch.ops namespaces they register (_C, _moe_C, _C_cache_ops, _C_custom_ar, and
# torch.library.register_fake for them) are empty stand-ins; the platform is vLLM's own NonNvmlCudaPlatform (it asks torch.cuda, not NVML);
# the model class is inspected in process (vLLM forks a clean interpreter for it, without these stand-ins).
import json, sys
inp = json.load(open(sys.argv[1]))
stub_cuda(inp["gpu"])
stub_modules("vllm._C_stable_libtorch", "vllm._qutlass_C", "vllm._C", "vllm._moe_C_stable_libtorch", "vllm.vllm_flash_attn")
import torch
from unittest import mock
for ns in ("_C", "_moe_C", "_C_cache_ops", "_C_custom_ar"):   # the kernels' torch.ops namespaces
    setattr(torch.ops, ns, mock.MagicMock(name=f"torch.ops.{ns}"))
torch.library.register_fake = lambda *a, **k: (lambda f: f)   # fake kernels of those absent ops
import vllm.platforms
from vllm.platforms.cuda import NonNvmlCudaPlatform
vllm.platforms._current_platform = NonNvmlCudaPlatform()
vllm.platforms._current_platform.device_count = lambda: inp["gpu"]["count"]   # the host's GPUs, as torch.cuda says
import vllm.model_executor.models.registry as registry
registry._run_in_subprocess = lambda fn: fn()   # the model class is inspected here, under these stand-ins
'''

CHECKERS["vllm"] = VLLM_STUBS + r'''
from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.engine.arg_utils import AsyncEngineArgs
parser = make_arg_parser(FlexibleArgumentParser())
args = parser.parse_args(inp["args"])
validate_parsed_serve_args(args)
if getattr(args, "model_tag", None) is not None:   # as `vllm serve` does (vllm/entrypoints/cli/serve.py:56-57)
    args.model = args.model_tag
engine = AsyncEngineArgs.from_cli_args(args)
if args.headless:   # a host after the first: run_headless's config and check (vllm/entrypoints/cli/serve.py:181-203)
    parallel = engine.create_engine_config(headless=True).parallel_config
    if parallel.data_parallel_size_local <= 0:
        raise ValueError("data_parallel_size_local must be > 0 in headless mode")
    print(f"CONFORMANCE-OK make_arg_parser + validate_parsed_serve_args + create_engine_config(headless) "
          f"(node {parallel.node_rank}, {parallel.data_parallel_size_local} local engines)")
    sys.exit(0)
config = engine.create_engine_config()   # the engine's config validation, as the server builds it before any GPU work
p = config.parallel_config
if p.nnodes > 1 and p.node_rank > 0 and not (p.data_parallel_hybrid_lb or p.data_parallel_external_lb):
    # the engine handshake's own check (vllm/v1/engine/utils.py:1502-1514), which needs running engines
    raise RuntimeError(f"Remote engine {p.data_parallel_rank} must use --headless unless in external or hybrid "
                       "dp lb mode")
print("CONFORMANCE-OK make_arg_parser + validate_parsed_serve_args + create_engine_config")
'''


def run_checker(python: Path, checker: str, payload: dict, timeout: int = 300) -> tuple[bool, str]:
    """(accepted, the framework's message) of ``checker`` run by ``python`` on ``payload``."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "in.json").write_text(json.dumps(payload))
        (Path(tmp) / "check.py").write_text(checker)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        # The stubbed host's GPUs as the engines count them (none exists; nothing runs on them).
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(payload.get("gpu", {}).get("count", 0)))
        try:
            done = subprocess.run([str(python), str(Path(tmp) / "check.py"), str(Path(tmp) / "in.json")],
                                  capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return False, f"checker timed out after {timeout} s"
    for line in done.stdout.splitlines():
        if line.startswith("CONFORMANCE-OK"):
            return True, line.removeprefix("CONFORMANCE-OK ").strip()
    return False, framework_message(done.stderr)


def framework_message(stderr: str) -> str:
    """The framework's own words from a failed check: the exception's line or argparse's error."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if "error:" in line and not line.startswith("File "):
            return line[:400]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith(("File ", "Traceback")):
            return " ".join(lines[i + 1:])[-400:] or lines[-1][-400:]
    return (lines[-1] if lines else "no output")[-400:]


# --------------------------------------------------------------------------- per framework

def model_folder(model: str, root: Path) -> Path:
    """A folder holding ``model``'s Hugging Face config.json, written from perfmodel's catalog."""
    from perfmodel.catalog import find_model

    spec = find_model(model)
    folder = root / "models" / model
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf_config(spec), indent=1, sort_keys=True))
    return folder


def hf_config(spec) -> dict:
    """The config.json fields the serving engines read, for a catalog model."""
    d = spec.model_dump() if hasattr(spec, "model_dump") else dict(spec)
    get = lambda *names, default=None: next((d[n] for n in names if d.get(n) is not None), default)  # noqa: E731
    hidden = int(get("hidden_size", "d_model"))
    heads = int(get("num_heads", "num_attention_heads", "n_heads"))
    cfg = {"hidden_size": hidden, "num_attention_heads": heads,
           "num_key_value_heads": int(get("num_kv_heads", "num_key_value_heads", default=heads)),
           "num_hidden_layers": int(get("num_layers", "n_layers")),
           "intermediate_size": int(get("ffn_hidden_size", "intermediate_size", "d_ff", default=4 * hidden)),
           "vocab_size": int(get("vocab_size", default=128256)),
           "max_position_embeddings": int(get("max_seq_len", "max_position_embeddings", default=131072)),
           "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
    name = str(get("name", default=""))
    if "deepseek" in name:
        cfg.update(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", n_routed_experts=256,
                   num_experts_per_tok=8, n_shared_experts=1, moe_intermediate_size=2048, first_k_dense_replace=3,
                   kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                   n_group=8, topk_group=4, routed_scaling_factor=2.5, num_nextn_predict_layers=1,
                   topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True, moe_layer_freq=1,
                   rope_theta=10000.0, rope_scaling={"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                                                     "mscale": 1.0, "mscale_all_dim": 1.0,
                                                     "original_max_position_embeddings": 4096},
                   max_position_embeddings=163840, vocab_size=129280, intermediate_size=18432,
                   quantization_config={"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                        "weight_block_size": [128, 128]})
    else:
        cfg.update(architectures=["LlamaForCausalLM"], model_type="llama",
                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    return cfg


def check_export(export: Export, envs: Path, bin_dir: Path) -> list[Row]:
    """The rows of one export: each launch it makes, checked by its framework."""
    row = lambda item, verdict, message: Row(export.plan, export.system, export.framework, item, verdict, message)  # noqa: E731
    if export.folder is None:
        return [row("-", "refused", export.refusal or "")]
    fw = export.framework
    model = export.plan.split()[1]
    if fw == "nemo":
        return [row(", ".join(sorted(p.name for p in export.folder.iterdir())), "source",
                    "not installable here (see the docstring): checked by the exporter against the rules vendored "
                    "from its source")]
    if fw == "trtllm":
        return check_trtllm(export.folder, lambda script, env: record(script, bin_dir, env), row, experts_of(model),
                            GPUS[export.system]["count"])
    rows = []
    if fw == "dynamo":
        return check_dynamo(export, envs, row, model)
    models = envs / "scratch"
    for script in sorted(export.folder.glob("*.sh")):
        ranks = node_ranks(script) if fw in ("sglang", "vllm") else ["0"]
        for rank in ranks:   # across hosts: the first host and the last
            extra = {"NODE_RANK": rank}
            if script.name.startswith("sglang-router"):
                extra = router_env(script)
            elif fw in ("sglang", "vllm"):
                extra["MODEL"] = str(model_folder(model, models))
            item = script.name + (f" (node {rank})" if len(ranks) > 1 else "")
            try:
                launches = record(script, bin_dir, extra)
            except Exception as exc:  # the script itself refused to run
                rows.append(row(item, "fail", str(exc)))
                continue
            for launch in launches:
                rows.append(row(item, *check_launch(fw, launch, export, envs, model)))
    return rows


def router_env(script: Path) -> dict[str, str]:
    """The URL lists sglang-router.sh asks for, as many as the plan's instances (read from its check line)."""
    import re

    m = re.search(r'\[ "\$\{#prefill\[@\]\}" -eq (\d+) \].*\[ "\$\{#decode\[@\]\}" -eq (\d+) \]', script.read_text())
    n_prefill, n_decode = (int(m.group(1)), int(m.group(2))) if m else (1, 1)
    return {"PREFILL_URLS": " ".join(f"http://prefill{i}:8000" for i in range(n_prefill)),
            "PREFILL_BOOTSTRAP_PORTS": " ".join(str(8998 + i) for i in range(n_prefill)),
            "DECODE_URLS": " ".join(f"http://decode{i}:8000" for i in range(n_decode))}


def check_launch(fw: str, launch: dict, export: Export, envs: Path, model: str) -> tuple[str, str]:
    """(verdict, message) of one recorded launch."""
    argv, launcher = launch["argv"], launch["launcher"]
    if fw == "megatron":
        src = envs / "src" / "Megatron-LM"
        if not src.exists():
            return "skipped", f"no Megatron-LM checkout at {src}"
        world, args = torchrun_split(argv)
        payload = {"megatron_src": str(src), "env": launch["env"], "world_size": world, "args": args,
                   "arch": ARCH[export.system]}
        return verdict(envs / "train", "megatron", payload)
    if fw == "torchtitan":
        world, args = torchrun_split(argv)
        return verdict(envs / "train", "torchtitan", {"world_size": world, "args": args, "cwd": str(export.folder)})
    if fw == "deepspeed":
        nodes = int(argv[argv.index("--num_nodes") + 1]) if "--num_nodes" in argv else 1
        gpus = int(argv[argv.index("--num_gpus") + 1])
        config = export.folder / argv[argv.index("--deepspeed_config") + 1]
        return verdict(envs / "train", "deepspeed", {"world_size": nodes * gpus, "config": str(config)})
    if fw == "sglang":
        module = argv[1] if argv[:1] == ["-m"] else ""
        if module.startswith("sglang_router"):
            return verdict(envs / "sglang", "sglang-router", {"args": argv[2:]})
        return verdict(envs / "sglang", "sglang", {"args": argv[2:], "gpu": GPUS[export.system]})
    if fw == "vllm":
        assert launcher == "vllm" and argv[0] == "serve", argv
        return verdict(envs / "vllm", "vllm", {"args": argv[1:], "gpu": GPUS[export.system]})
    return "skipped", f"no checker for {fw}"


def verdict(env: Path, checker: str, payload: dict) -> tuple[str, str]:
    python = env / "bin" / "python"
    if not python.exists():
        return "skipped", f"no scratch environment {env}"
    ok, message = run_checker(python, CHECKERS[checker], payload)
    return ("pass" if ok else "fail"), message


def check_dynamo(export: Export, envs: Path, row, model: str) -> list[Row]:
    """Each worker of the DynamoGraphDeployment: its command line through Dynamo's own parsers."""
    import yaml

    python = envs / "dynamo" / "bin" / "python"
    doc = yaml.safe_load((export.folder / "dynamo-deployment.yaml").read_text())
    rows = []
    for name, argv in dynamo_pods(doc, dynamo_commands):   # a multinode worker: each pod as the operator starts it
        if not python.exists():
            rows.append(row(name, "skipped", f"no scratch environment {envs / 'dynamo'}"))
            continue
        argv = [str(model_folder(model, envs / "scratch")) if i and argv[i - 1] in ("--model", "--model-path") else a
                for i, a in enumerate(argv)]
        ok, message = run_checker(python, CHECKERS["dynamo"], {"args": argv, "gpu": GPUS[export.system]})
        rows.append(row(name, "pass" if ok else "fail", message))
    return rows


def dynamo_commands(doc: dict) -> list[tuple[str, list[str]]]:
    """(component name, python -m argv) of each component of a DynamoGraphDeployment."""
    import shlex

    out = []
    spec = doc.get("spec", {})
    components = spec.get("components") or [dict(v, name=k) for k, v in (spec.get("services") or {}).items()]
    for comp in components:
        containers = ((comp.get("podTemplate") or {}).get("spec") or {}).get("containers") or []
        main = containers[0] if containers else (comp.get("extraPodSpec") or {}).get("mainContainer") or {}
        command = list(main.get("command") or []) + list(main.get("args") or [])
        if len(command) == 1 or (command[:2] in (["/bin/sh", "-c"], ["sh", "-c"])):
            command = shlex.split(command[-1])
        out.append((comp.get("name", "?"), command))
    return out


CHECKERS["dynamo"] = VLLM_STUBS + r'''
# Dynamo's own parsers: dynamo.frontend's parse_args; dynamo.vllm's parse_args (Dynamo's flags, then vLLM's
# AsyncEngineArgs on the rest, Config.validate and its cross-checks), then the engine's create_engine_config.
argv = inp["args"]
if argv[:2] in (["python3", "-m"], ["python", "-m"]):
    argv = argv[2:]
module, rest = argv[0], argv[1:]
if module == "dynamo.frontend":
    import dynamo.frontend.main as frontend
    sys.argv = ["dynamo.frontend"] + rest
    frontend.parse_args()
    print("CONFORMANCE-OK dynamo.frontend parse_args + FrontendConfig.validate")
elif module == "dynamo.vllm":
    from dynamo.vllm.args import parse_args
    config = parse_args(rest)
    config.engine_args.create_engine_config()
    print("CONFORMANCE-OK dynamo.vllm parse_args (+ vLLM 0.31.0 AsyncEngineArgs, Config.validate) + create_engine_config")
else:
    raise SystemExit(f"error: no checker for {module}")
'''


# --------------------------------------------------------------------------- setup and report

def setup(envs: Path, torch_spec: str) -> None:
    """The scratch environments, one pip install at a time: torch (``torch_spec``, a CPU build), then the
    pinned packages of ``benchmarks/conformance/ENV.txt`` without their dependencies (the engines' GPU
    kernels are left out; their argument modules are pure Python)."""
    pins = Path(__file__).resolve().parent / "conformance"
    for env in ("train", "sglang", "vllm", "dynamo"):
        python = envs / env / "bin" / "python"
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(envs / env)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", torch_spec], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "-r", str(pins / f"{env}.txt")],
                       check=True)
    if not (envs / "src" / "Megatron-LM").exists():
        print(f"Megatron-LM is not on PyPI at {VERSIONS['megatron']}: clone it into {envs / 'src' / 'Megatron-LM'} "
              f"(git clone --depth 1 --branch {VERSIONS['megatron']} https://github.com/NVIDIA/Megatron-LM)",
              file=sys.stderr)


def table(rows: list[Row]) -> str:
    """The conformance table, one line per checked launch (markdown)."""
    lines = ["| system | plan | framework | launch | verdict | framework's message |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.system} | {r.plan} | {r.framework} | {r.item} | {r.verdict} | "
                     f"{r.message.replace('|', '/')} |")
    counts = {}
    for r in rows:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    lines.append("")
    lines.append(", ".join(f"{n} {v}" for v, n in sorted(counts.items())))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=Path, default=Path("/tmp/conformance"), help="scratch environments")
    parser.add_argument("--setup", action="store_true", help="create the scratch environments and exit")
    parser.add_argument("--torch", default="torch", help="pip requirement or wheel of a CPU torch for --setup")
    parser.add_argument("--only", default="", help="comma-separated frameworks to check (default all)")
    opts = parser.parse_args(argv)
    if opts.setup:
        setup(opts.envs, opts.torch)
        return 0
    present = [e for e in ("train", "sglang", "vllm", "dynamo") if (opts.envs / e / "bin" / "python").exists()]
    if not present:
        print(f"no scratch environments under {opts.envs}: run with --setup first (frameworks are never "
              "perfmodel dependencies); nothing checked")
        return 0
    only = set(filter(None, opts.only.split(",")))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        bin_dir = recorder_bin(out / "bin")
        rows = []
        for export in write_exports(out / "exports"):
            if only and export.framework not in only:
                continue
            rows.extend(check_export(export, opts.envs, bin_dir))
            r = rows[-1]
            print(f"{r.system} {r.plan} {r.framework}: {r.verdict}", file=sys.stderr)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
