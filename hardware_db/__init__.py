"""Hardware database: typed schema and YAML data of accelerators, CPUs, memory, links and systems.

Names are imported lazily, so that importing ``hardware_db.errors`` alone stays cheap.
"""

from importlib import import_module

_EXPORTS = {
    "InfeasibleError": "errors", "PerfmodelError": "errors", "SpecError": "errors",
    "UnknownNameError": "errors", "UnsupportedPrecisionError": "errors",
    "BUILTIN_DIR": "loader", "ENV_VAR": "loader", "Database": "loader", "Level": "loader",
    "MemoryTier": "loader", "load_database": "loader", "user_dirs_from_env": "loader", "check_file": "loader",
    "BYTES_PER_ELEMENT": "schema", "PRECISIONS": "schema", "Accelerator": "schema", "Cpu": "schema",
    "Link": "schema", "Memory": "schema", "System": "schema",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
