"""perfmodel.constants.ModelConstants: one field per CONSTANT_TERMS entry (and no other), built from
the database's values under their YAML names with CONSTANT_TERMS' defaults for what a database
lacks, read back by ``value(name)``; the shipped constants.yaml keeps every value in its range."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from perfmodel.constants import ModelConstants, entry_name
from perfmodel.hardware_db.loader import BUILTIN_DIR
from perfmodel.hardware_db.schema import CONSTANT_RANGES, CONSTANT_TERMS

FIELDS = [f.name for f in dataclasses.fields(ModelConstants)]


def test_fields_and_constant_terms_are_the_same_names():
    names = [entry_name(f) for f in FIELDS]
    assert len(set(names)) == len(names)
    assert set(names) == set(CONSTANT_TERMS)


def test_entry_name_spells_fields_as_yaml_does():
    assert entry_name("unfitted_kernel_launch_us") == "unfitted-kernel-launch-us"
    assert entry_name("pue") == "pue"
    assert all("_" not in entry_name(f) for f in FIELDS)


def test_empty_values_take_every_default():
    c = ModelConstants.of({})
    for f in FIELDS:
        assert getattr(c, f) == CONSTANT_TERMS[entry_name(f)][0], f


def test_given_values_win_and_missing_ones_fall_back():
    """Half the names given (distinct values, by YAML spelling), the other half from the defaults;
    names of no field are ignored and integers become floats."""
    given = {entry_name(f): 0.5 + i for i, f in enumerate(FIELDS) if i % 2 == 0}
    c = ModelConstants.of({**given, "not-a-constant": 123.0, "pue": 2})
    for i, f in enumerate(FIELDS):
        name = entry_name(f)
        want = 2.0 if name == "pue" else given[name] if name in given else CONSTANT_TERMS[name][0]
        assert getattr(c, f) == want, f
        assert isinstance(getattr(c, f), float)


def test_underscore_spelling_is_not_read():
    """The database's names are hyphenated: a value under the field's own spelling is not an entry."""
    c = ModelConstants.of({"framework_gemm_efficiency": 0.5})
    assert c.framework_gemm_efficiency == CONSTANT_TERMS["framework-gemm-efficiency"][0]


def test_of_takes_the_databases_values(db):
    c = ModelConstants.of({name: entry.value for name, entry in db.constants.items()})
    for f in FIELDS:
        name = entry_name(f)
        want = db.constant(name) if name in db.constants else CONSTANT_TERMS[name][0]
        assert getattr(c, f) == want, name
    # The database overrides defaults (else the check above could pass on defaults alone).
    assert any(db.constant(n) != CONSTANT_TERMS[n][0] for n in db.constants)


def test_value_reads_by_yaml_name():
    c = ModelConstants.of({entry_name(f): 0.25 + i for i, f in enumerate(FIELDS)})
    for i, f in enumerate(FIELDS):
        assert c.value(entry_name(f)) == 0.25 + i
    with pytest.raises(AttributeError):
        c.value("no-such-constant")


def test_constants_are_frozen():
    c = ModelConstants.of({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.pue = 2.0


def test_shipped_constants_lie_in_their_ranges():
    """Read from the YAML itself (not through the loader, whose validation this guards)."""
    entries = yaml.safe_load((BUILTIN_DIR / "constants.yaml").read_text())["constants"]
    assert {e["name"] for e in entries} <= set(CONSTANT_RANGES)
    assert len(entries) == len({e["name"] for e in entries})
    for e in entries:
        low, high = CONSTANT_RANGES[e["name"]]
        assert low <= float(e["value"]) <= high, e["name"]
