"""perfmodel: closed-form cost models of transformer training and serving on real hardware.

The public API (see the README): model specs and the catalog, hardware comparison, and the
database it reads. Everything is a pure function of frozen specs.
"""

from hardware_db import load_database  # noqa: F401  (re-exported: the database the models run on)

from .catalog import builtin_models, find_model, load_model, spec_from_hf_config
from .compare import compare, profile
from .machine import Machine, build_machine
from .model import MlaSpec, MoeSpec, TransformerSpec, model_summary
from .serving import ServePlan, ServeResult, ServeWorkload, estimate_serving
from .training import TrainPlan, TrainResult, TrainWorkload, estimate_training
from .validation import load_cases, validate

__all__ = [
    "Machine", "MlaSpec", "MoeSpec", "ServePlan", "ServeResult", "ServeWorkload", "TrainPlan", "TrainResult",
    "TrainWorkload", "TransformerSpec", "build_machine", "builtin_models", "compare", "estimate_serving",
    "estimate_training", "find_model", "load_cases", "load_database", "load_model", "model_summary", "profile",
    "spec_from_hf_config", "validate",
]
