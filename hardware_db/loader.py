"""Load the hardware database: the built-in YAML files, then the user's directories over them.

A YAML file maps entry kinds (``accelerators``, ``cpus``, ``memory``, ``links``, ``systems``) to
lists of entries. A user's entry with the name of a built-in one replaces it; ``extends: NAME``
starts from another entry of the same kind and changes only the keys it gives. Files are read
through :mod:`hardware_db.files` only (a safe loader with size, depth and alias limits).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .errors import SpecError, UnknownNameError
from .files import read_yaml, short
from .schema import ENTRY_KINDS, Accelerator, Calibration, Constant, Cpu, Entry, Link, Memory, System

BUILTIN_DIR = Path(__file__).parent / "data"
ENV_VAR = "PERFMODEL_HARDWARE_DB"


@dataclass(frozen=True)
class Level:
    """One resolved topology level of a sized system (SI units).

    ``group_size`` is the number of devices a group of this level holds, capped at the system's
    size; ``bytes_per_s`` what one device sends in one direction across it; ``latency_s`` one hop.
    """

    name: str
    link: str
    group_size: int
    bytes_per_s: float
    latency_s: float


@dataclass(frozen=True)
class MemoryTier:
    """A memory tier below HBM as one device sees it: its share of capacity and bandwidth (SI).
    ``read_bytes_per_s`` / ``write_bytes_per_s`` are what reaches the device over its path;
    ``host_bytes_per_s`` is the device's share of the memory's own bandwidth, what the host CPU
    reads it at when it works on the data in place (an optimizer step on the CPU)."""

    name: str
    kind: str
    bytes_per_device: float
    read_bytes_per_s: float
    write_bytes_per_s: float
    latency_s: float
    host_bytes_per_s: float = 0.0


def format_validation_error(err: ValidationError, where: str) -> str:
    """One line from a pydantic error: ``where:field: message``, every problem of the entry (the
    first ten, with a count of the rest), so that a file is fixed in one pass."""
    problems = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check its spelling and unit suffix)"
        elif e["type"] == "missing":
            msg = "missing field"
        problems.append(f"{loc}: {msg}" if loc else msg)
    more = len(problems) - 10
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more > 0 else ""
    return f"{where}:" + "; ".join(problems[:10]) + tail


def validate_all(entries: Iterable[tuple[Any, dict, str]], context: dict | None = None) -> list:
    """Each (model, entry, where) validated (under the schema's validation ``context``); every
    failing entry's problems raised together as one SpecError line (a file's mistakes all at once,
    not one per run)."""
    out, problems = [], []
    for model, entry, where in entries:
        try:
            out.append(model.model_validate(entry, context=context))
        except ValidationError as exc:
            problems.append(format_validation_error(exc, where))
    if problems:
        raise SpecError("; ".join(problems))
    return out


def _raw_entries(path: Path) -> Iterable[tuple[str, dict]]:
    data = read_yaml(path)
    if data is None:
        return []
    if not isinstance(data, Mapping):
        raise SpecError(f"{path}: needs a mapping of {', '.join(ENTRY_KINDS)} to lists, has {type(data).__name__}")
    out = []
    for kind, entries in data.items():
        if kind not in ENTRY_KINDS:
            raise UnknownNameError(f"entry kind in {path}", str(kind), ENTRY_KINDS)
        if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
            raise SpecError(f"{path}:{kind}: needs a list of mappings")
        for e in entries:
            name = e.get("name")
            if not isinstance(name, str) or not 0 < len(name.strip()) <= 100:
                raise SpecError(f"{path}:{kind}: every entry needs a 'name' of 1 to 100 characters, has {short(name)}")
            if "extends" in e and not isinstance(e["extends"], str):
                raise SpecError(f"{path}:{kind}.{name}.extends: needs the name of an entry, has {short(e['extends'])}")
            out.append((kind, dict(e)))
    return out


MAX_DIRECTORY_ENTRIES = 10_000  # a database folder, not a home directory or a file system


def _yaml_files(directory: Path) -> list[Path]:
    """The .yaml / .yml files under ``directory`` (any case), refused when it holds over 10,000 entries."""
    if not directory.is_dir():
        raise SpecError(f"hardware database directory not found: {directory}")
    found = []
    for seen, path in enumerate(directory.rglob("*")):
        if seen >= MAX_DIRECTORY_ENTRIES:
            raise SpecError(f"hardware database directory {directory}: over {MAX_DIRECTORY_ENTRIES:,} entries; "
                            "give the folder that holds your YAML files")
        if path.suffix.lower() in (".yaml", ".yml") and path.is_file():
            found.append(path)
    return sorted(found)


@dataclass(frozen=True)
class Database:
    """All entries by kind and name; names are lowercase and unique across kinds."""

    accelerators: Mapping[str, Accelerator]
    cpus: Mapping[str, Cpu]
    memory: Mapping[str, Memory]
    links: Mapping[str, Link]
    systems: Mapping[str, System]
    calibrations: Mapping[str, Calibration]
    constants: Mapping[str, Constant]
    files: tuple[str, ...] = field(default=())

    def _find(self, kind: str, key: str):
        table = getattr(self, kind)
        if key in table:
            return table[key]
        return next((e for e in table.values() if key in e.aliases), None)

    def _known(self, kind: str) -> list[str]:
        table = getattr(self, kind)
        return sorted({*table, *(a for e in table.values() for a in e.aliases)})

    def _get(self, kind: str, name: str):
        found = self._find(kind, str(name).strip().lower())
        if found is None:
            raise UnknownNameError("memory" if kind == "memory" else kind.rstrip("s"), str(name), self._known(kind))
        return found

    def accelerator(self, name: str) -> Accelerator:
        return self._get("accelerators", name)

    def cpu(self, name: str) -> Cpu:
        return self._get("cpus", name)

    def link(self, name: str) -> Link:
        return self._get("links", name)

    def memory_entry(self, name: str) -> Memory:
        return self._get("memory", name)

    def system(self, name: str, nodes: int | None = None) -> System:
        system = self._get("systems", name)
        return system if nodes is None else system.scaled(nodes)

    def constant(self, name: str) -> float:
        """The value of a named constant (SI units, as its ``unit`` states)."""
        return self._get("constants", name).value

    def calibration(self, device: str) -> Calibration:
        """The achievable fractions measured on ``device``; fields it lacks come from ``default``.

        ``matmul_fraction`` stays the device's own (possibly empty): a precision it lacks should
        follow the device's nearest measured precision before any default (see perfmodel.machine).
        """
        default = self._get("calibrations", "default")
        acc = self.accelerator(device)
        own = next((c for c in self.calibrations.values() if c.device == acc.name), None)
        if own is None and acc.calibration_from:
            source = self.accelerator(acc.calibration_from)
            own = next((c for c in self.calibrations.values() if c.device == source.name), None)
            if own is not None and acc.scale_up_bytes_per_s != source.scale_up_bytes_per_s:
                # Kernels measured on the same silicon transfer; collectives measured over other links do not.
                own = own.model_copy(update={"collectives": None, "scale_up_fraction": None, "dispatch": None})
        if own is None:
            return default.model_copy(update={"matmul_fraction": {}})
        return own.model_copy(update={
            k: getattr(own, k) if getattr(own, k) is not None else getattr(default, k)
            for k in ("hbm_fraction", "scale_up_fraction", "scale_out_fraction")})

    def calibration_default(self, vendor: str | None = None) -> Calibration:
        """The fractions a device without its own measurement takes: its vendor's prior where the
        default lists one (``vendor_matmul_fraction``), else the default's own."""
        default = self._get("calibrations", "default")
        own = {k.lower(): v for k, v in default.vendor_matmul_fraction.items()}.get(str(vendor).lower())
        return default if own is None else default.model_copy(update={"matmul_fraction": own})

    def entry(self, name: str) -> Entry:
        """Any entry by name or alias, whatever its kind."""
        key = str(name).strip().lower()
        for kind in ENTRY_KINDS:
            found = self._find(kind, key)
            if found is not None:
                return found
        raise UnknownNameError("hardware entry", str(name), [n for kind in ENTRY_KINDS for n in self._known(kind)])

    def names(self) -> list[str]:
        return sorted(n for kind in ENTRY_KINDS for n in getattr(self, kind))

    def levels(self, system: System) -> tuple[Level, ...]:
        """The system's topology levels with link defaults filled in and groups capped at its size."""
        levels = []
        for tier in system.tiers:
            link = self.link(tier.link)
            bandwidth = tier.gb_per_s_per_direction or tier.gbit_per_s_per_direction or link.bytes_per_s
            latency = link.latency_s if tier.latency_us is None else tier.latency_us
            size = min(tier.group_size or system.devices, system.devices)
            levels.append(Level(tier.name, link.name, max(size, 1), bandwidth, latency))
        return tuple(levels)

    def memory_tiers(self, system: System, devices: int | None = None) -> tuple[MemoryTier, ...]:
        """Memory below HBM as one device sees it when every device of the job streams at once.

        A device's share of a tier is capacity / sharers and bandwidth / sharers, the bandwidth
        further capped by the path (a PCIe link, the scale-up fabric) between it and the tier. A
        job of ``devices`` fewer than a node's shares the node's memory among its own devices only
        (one GPU of a DGX A100 sees all 2 TB of host memory, over its own PCIe link).
        """
        tiers = []
        in_node = min(devices or system.devices_per_node, system.devices_per_node)
        for m in system.memory_tiers:
            mem, path = self.memory_entry(m.memory), self.link(m.path)
            sharers = m.shared_by or in_node / m.count_per_node
            tiers.append(MemoryTier(
                name=mem.name, kind=mem.kind, bytes_per_device=mem.capacity_bytes / sharers,
                read_bytes_per_s=min(mem.read_bytes_per_s / sharers, path.bytes_per_s),
                write_bytes_per_s=min(mem.write_bytes_per_s / sharers, path.bytes_per_s),
                latency_s=mem.latency_s, host_bytes_per_s=min(mem.read_bytes_per_s, mem.write_bytes_per_s) / sharers))
        return tuple(tiers)


def _merge_extends(raw: dict[str, dict[str, dict]], where: dict[tuple[str, str], str]) -> None:
    """Resolve ``extends`` chains in place (parents first); cycles and unknown parents are errors."""

    def resolve(kind: str, name: str, seen: tuple[str, ...]) -> dict:
        entry = raw[kind][name]
        parent = entry.get("extends")
        if parent is None:
            return entry
        if parent in seen:
            raise SpecError(f"{where[kind, name]}:{name}.extends: cycle through {' -> '.join(seen + (parent,))}")
        if parent not in raw[kind]:
            raise UnknownNameError(f"{kind} entry to extend ({where[kind, name]}:{name})", str(parent), raw[kind])
        base = dict(resolve(kind, parent, seen + (parent,)))
        base.pop("aliases", None)
        merged = {**base, **{k: v for k, v in entry.items() if k != "extends"}}
        raw[kind][name] = merged
        return merged

    for kind in raw:
        for name in list(raw[kind]):
            resolve(kind, name, (name,))


def check_references(db: Database) -> None:
    for s in db.systems.values():
        where = f"system {s.name}"
        for ref, getter in ((s.accelerator, db.accelerator),):
            _ref(where, "accelerator", ref, getter)
        for h in s.hosts:
            _ref(where, "hosts.cpu", h.cpu, db.cpu)
        for m in s.memory_tiers:
            _ref(where, "memory_tiers.memory", m.memory, db.memory_entry)
            _ref(where, "memory_tiers.path", m.path, db.link)
        for t in s.tiers:
            _ref(where, f"tiers.{t.name}.link", t.link, db.link)
    for a in db.accelerators.values():
        if a.host_link:
            _ref(f"accelerator {a.name}", "host_link", a.host_link, db.link)
        if a.calibration_from:
            _ref(f"accelerator {a.name}", "calibration_from", a.calibration_from, db.accelerator)
    for c in db.calibrations.values():
        if c.device:
            _ref(f"calibration {c.name}", "device", c.device, db.accelerator)
    for m in db.memory.values():
        if m.interface:
            _ref(f"memory {m.name}", "interface", m.interface, db.link)


def _ref(where: str, field_name: str, name: str, getter) -> None:
    try:
        getter(name)
    except UnknownNameError as exc:
        raise SpecError(f"{where}:{field_name}: {exc}") from None


def load_database(user_dirs: Sequence[os.PathLike | str] = ()) -> Database:
    """Load the built-in database, then each user directory over it, and validate every entry.
    The validated database is cached by the files' content hash (``PERFMODEL_CACHE_DIR``; ``off``
    disables it), so a run on unchanged files skips parsing and validation."""
    from .cache import cached

    files = _yaml_files(BUILTIN_DIR) + [p for d in user_dirs for p in _yaml_files(Path(d))]
    code = [Path(__file__).with_name(m) for m in ("loader.py", "schema.py", "files.py", "yaml_loader.py")]
    return cached("db", code, files, lambda: _validated(files), Database)


def _validated(files: list[Path]) -> Database:
    raw: dict[str, dict[str, dict]] = {kind: {} for kind in ENTRY_KINDS}
    where: dict[tuple[str, str], str] = {}
    for path in files:
        seen_here: set[str] = set()
        for kind, entry in _raw_entries(path):
            name = entry["name"].strip().lower()
            if name in seen_here:
                raise SpecError(f"{path}:{kind}: '{name}' is defined twice in one file")
            seen_here.add(name)
            entry["name"] = name
            if str(entry.get("extends", "")).strip().lower() == name:  # refine the earlier definition
                if name not in raw[kind]:
                    raise UnknownNameError(f"{kind} entry to extend ({path}:{name})", name, raw[kind])
                entry = {**raw[kind][name], **{k: v for k, v in entry.items() if k != "extends"}}
            raw[kind][name] = entry
            where[kind, name] = str(path)
    _merge_extends(raw, where)
    owner: dict[str, str] = {}
    pending = []
    for kind, model in ENTRY_KINDS.items():
        for name, entry in raw[kind].items():
            if name in owner:
                raise SpecError(f"{where[kind, name]}: name '{name}' is used by a {owner[name]} entry too")
            owner[name] = kind
            pending.append((kind, name, model, entry))
    valid = validate_all((model, entry, f"{where[kind, name]}:{kind}.{name}") for kind, name, model, entry in pending)
    tables = {kind: {} for kind in ENTRY_KINDS}
    for (kind, name, _, _), entry in zip(pending, valid):
        tables[kind][name] = entry
    db = Database(**tables, files=tuple(str(p) for p in files))
    check_references(db)
    return db


def user_dirs_from_env(environ: Mapping[str, str] = os.environ) -> list[str]:
    """Directories named by the PERFMODEL_HARDWARE_DB variable (os.pathsep separated)."""
    return [d for d in environ.get(ENV_VAR, "").split(os.pathsep) if d.strip()]


def check_file(path: os.PathLike | str) -> list[Entry]:
    """Validate every entry of one YAML file on its own: ``extends`` resolves within the file; an
    entry extending one of another file, and cross-references, are load_database's to check."""
    raw = _raw_entries(Path(path))
    own = {(kind, e["name"]): e for kind, e in raw}
    out = []
    for kind, entry in raw:
        parent = entry.get("extends")
        if parent is not None:
            if (kind, parent) not in own:
                continue
            inherited = {k: v for k, v in own[kind, parent].items() if k != "aliases"}  # aliases stay the parent's
            entry = {**inherited, **{k: v for k, v in entry.items() if k != "extends"}}
        out.append((ENTRY_KINDS[kind], entry, f"{path}:{kind}.{entry['name']}"))
    return validate_all(out)
