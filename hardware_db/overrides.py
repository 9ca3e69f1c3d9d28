"""What-ifs on the hardware database: entries changed or added, validated as a file's entries are.

``with_overrides(db, {"accelerators": {"h100-sxm": {"hbm_bytes_per_s": 6e12}}})`` is the database
with that field changed. Values are in the database's own units (SI, by attribute name, as the
entries hold them); each changed entry is rebuilt from its fields and the changes and validated
with the schema's context ``SI`` (every range and rule of the schema, the values kept exactly), and
the cross-references of the whole database are checked again. A change that makes an entry invalid
raises the loader's one-line ``SpecError``, naming the entry and the field in its YAML spelling.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pydantic import BaseModel

from .loader import Database, check_references, validate_all
from .schema import ENTRY_KINDS as KINDS, SI


def _plain(value: Any) -> Any:
    """A field's value as validation input: models (and tuples of them) dumped under their YAML keys."""
    if isinstance(value, BaseModel):
        return value.model_dump(by_alias=True)
    if isinstance(value, (tuple, list)):
        return type(value)(_plain(v) for v in value)
    return value


def _fields(model: type[BaseModel], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``changes`` (attribute name -> SI value) under the keys the model reads (its aliases)."""
    unknown = [k for k in changes if k not in model.model_fields]
    if unknown:
        from .errors import SpecError

        raise SpecError(f"what-if: {model.__name__} has no field {', '.join(sorted(unknown))}")
    return {model.model_fields[k].alias or k: _plain(v) for k, v in changes.items()}


def with_overrides(db: Database, changes: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> Database:
    """``db`` with ``changes[kind][name]`` (attribute name -> SI value) applied to each named entry
    (an entry not in ``db`` is added: its changes are all its fields, besides its name), every
    changed entry validated; SpecError (one line) for any that is invalid or refers to no entry."""
    pending = []
    for kind, entries in changes.items():
        if kind not in KINDS:
            from .errors import UnknownNameError

            raise UnknownNameError("entry kind of a what-if", kind, KINDS)
        model = KINDS[kind]
        table = getattr(db, kind)
        for name, fields in entries.items():
            base = table[name].model_dump(by_alias=True) if name in table else {"name": name}
            pending.append((kind, name, {**base, **_fields(model, fields)}))
    valid = validate_all(((KINDS[kind], data, f"what-if {kind}.{name}") for kind, name, data in pending), SI)
    tables = {kind: dict(getattr(db, kind)) for kind in changes}
    for (kind, name, _), entry in zip(pending, valid):
        tables[kind][name] = entry
    out = replace(db, **tables)
    check_references(out)
    return out
