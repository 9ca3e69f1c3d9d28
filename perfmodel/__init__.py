"""perfmodel: closed-form cost models of transformer training and serving on real hardware.

The public API (see the README): the searches (``plan_train``, ``plan_serve``, ``place_experts``,
each taking its command's request), the estimates, model specs and the catalog, hardware
comparison, the database they read and the frameworks' launch files. Everything is a pure function
of frozen specs.
"""

import importlib

# Loaded on first use (PEP 562), so that importing one submodule (the command line reads
# ``perfmodel.defaults`` at start-up) does not load numpy, pydantic and the database.
_EXPORTS = {
    "load_database": ".hardware_db", "builtin_models": ".catalog", "find_model": ".catalog", "load_model": ".catalog",
    "spec_from_hf_config": ".catalog", "compare": ".comparison", "profile": ".comparison", "Machine": ".machine",
    "build_machine": ".machine", "MlaSpec": ".model", "MoeSpec": ".model", "TransformerSpec": ".model",
    "model_summary": ".model", "ServePlan": ".serving", "ServeResult": ".serving", "ServeWorkload": ".serving",
    "estimate_serving": ".serving", "TrainPlan": ".training", "TrainResult": ".training",
    "TrainWorkload": ".training", "estimate_training": ".training", "load_cases": ".validation",
    "validate": ".validation", "TrainRequest": ".requests", "ServeRequest": ".requests",
    # The searches (the public API the CLI's plan and place-experts commands render):
    "plan_train": "perfmodel.search.api", "plan_serve": "perfmodel.search.api", "place_experts": "perfmodel.search.api",
    "PlanTrainRequest": "perfmodel.search.requests", "PlanServeRequest": "perfmodel.search.requests",
    "PlaceExpertsRequest": "perfmodel.search.requests", "training_files": ".exports", "serving_files": ".exports",
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'perfmodel' has no attribute {name!r}")
    module = _EXPORTS[name]
    return getattr(importlib.import_module(module, __name__ if module.startswith(".") else None), name)


__all__ = [
    "Machine", "MlaSpec", "MoeSpec", "PlaceExpertsRequest", "PlanServeRequest", "PlanTrainRequest", "ServeRequest",
    "TrainRequest", "place_experts", "plan_serve", "plan_train", "serving_files", "training_files", "ServePlan", "ServeResult", "ServeWorkload", "TrainPlan", "TrainResult",
    "TrainWorkload", "TransformerSpec", "build_machine", "builtin_models", "compare", "estimate_serving",
    "estimate_training", "find_model", "load_cases", "load_database", "load_model", "model_summary", "profile",
    "spec_from_hf_config", "validate",
]
