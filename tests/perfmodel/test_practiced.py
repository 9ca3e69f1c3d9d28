"""Published training configurations that ran on 80 GB GPUs fit in the memory model.

The configurations (tests/data/practiced_training.yaml) carry their sources; they check memory
only and are never used to fit a time constant. One that the plan fields cannot express is kept
with ``modelled: false`` and its reason, and expected to fail until it is modelled.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from perfmodel.catalog import find_model
from perfmodel.machine import build_machine
from perfmodel.training import TrainPlan, TrainWorkload, estimate_training

CONFIGS = yaml.safe_load((Path(__file__).parents[1] / "data" / "practiced_training.yaml").read_text())["configs"]


def test_at_least_eight_cited_configurations():
    modelled = [c for c in CONFIGS if c.get("modelled", True)]
    assert len(modelled) >= 8
    assert all(c["source"] and c["notes"] for c in CONFIGS)
    for c in CONFIGS:
        p = c["plan"]
        assert p["tp"] * p["pp"] * p["cp"] * p["dp"] == c["devices"], c["id"]


@pytest.mark.parametrize("config", [
    pytest.param(c, id=c["id"], marks=() if c.get("modelled", True) else
                 pytest.mark.xfail(strict=True, reason=" ".join(c["why_not"].split())))
    for c in CONFIGS])
def test_published_configuration_fits(db, config):
    machine = build_machine(db, config["system"], config["devices"])
    r = estimate_training(find_model(config["model"]), machine, TrainPlan(**config["plan"]),
                          TrainWorkload(config["global_batch"], config["seq_len"]))
    assert str(r.binding) == "", f"{config['id']}: {r.binding} needs {float(r.hbm_used_bytes) / 1e9:.1f} GB"
    assert 0 < float(r.mfu) < 1
