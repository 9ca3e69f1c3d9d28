"""Validated entries back to their YAML files: each key by its alias, each quantity in the unit its
key names (``launch_us``, ``link_gb_per_s``, ``hbm_gb``). The schema's quantities scale a YAML value
to SI once on loading (schema.quantity); this is the one place that scales it back for writing."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

from pydantic import BaseModel


def file_units(value, *, exclude_none: bool = False, exclude_defaults: bool = False):
    """A validated entry, a block of one, or a dict / list of them (SI inside) as its YAML file
    writes it: keys by alias, each quantity divided by its schema scale (12 significant digits,
    which undo the SI round trip: 11.255 us loads as 11.254999999999999e-6 s), tuples as lists.
    Plain values pass through; ``exclude_*`` as pydantic's ``model_dump``, at every depth."""
    options = {"exclude_none": exclude_none, "exclude_defaults": exclude_defaults}
    if isinstance(value, dict):
        return {k: file_units(v, **options) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [file_units(v, **options) for v in value]
    if not isinstance(value, BaseModel):
        return value
    dumped = value.model_dump(mode="json", by_alias=True, **options)   # YAML's types: tuples as lists
    out = {}
    for name, field in type(value).model_fields.items():
        key = field.alias or name
        if key not in dumped:
            continue
        scale = _scale(field.metadata) or _scale(get_args(field.annotation))
        if scale not in (None, 1.0):
            out[key] = _in_file_unit(dumped[key], scale)
        elif _holds_entries(getattr(value, name)):
            out[key] = file_units(getattr(value, name), **options)
        else:
            out[key] = dumped[key]
    return out


def write_entries(directory: Path, file_name: str, kind: str, entries: list) -> Path:
    """Write ``entries`` (validated entries or dicts already in the file's units) as one
    hardware YAML file ``directory/file_name`` under ``kind`` (``calibrations``, ...), keys in
    their order; the path written."""
    import yaml

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / file_name
    path.write_text(yaml.safe_dump({kind: file_units(list(entries))}, sort_keys=False, width=110))
    return path


def _scale(metadata) -> float | None:
    """The SI scale of a schema quantity among ``metadata`` (a field's validators, or the
    arguments of its type: ``dict[Op, LatencyUs]``, ``LinkGbitps | None``), or None."""
    for item in metadata:
        scale = getattr(getattr(item, "func", None), "scale", None)
        if scale is not None:
            return scale
        found = _scale(getattr(item, "__metadata__", ())) or _scale(get_args(item))
        if found is not None:
            return found
    return None


def _in_file_unit(value, scale: float):
    """An SI value (or a dict of them) in its key's unit."""
    factor = float(f"{1 / scale:.12g}")
    if isinstance(value, dict):
        return {k: _in_file_unit(v, scale) for k, v in value.items()}
    return None if value is None else float(f"{value * factor:.12g}")


def _holds_entries(value) -> bool:
    """Whether ``value`` is a validated block, or a dict or tuple of them, whose own quantities convert."""
    if isinstance(value, dict):
        return any(_holds_entries(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_entries(v) for v in value)
    return isinstance(value, BaseModel)
