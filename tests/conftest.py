"""Shared fixtures: the built-in database and catalog are loaded once per session."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import settings

# Every property test draws the same examples on every run and machine (derived from the test, not
# the clock), and keeps no example database: a property holds on them or fails every time.
# benchmarks/bench_fuzz.py explores further.
settings.register_profile("deterministic", derandomize=True, database=None)
settings.load_profile("deterministic")


def pytest_configure(config):
    """The tests cache the validated database in a folder of their own, never the user's ~/.cache."""
    if "PERFMODEL_CACHE_DIR" not in os.environ:
        folder = tempfile.mkdtemp(prefix="perfmodel-test-cache-")
        os.environ["PERFMODEL_CACHE_DIR"] = folder
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


@pytest.fixture(scope="session")
def db():
    from perfmodel.hardware_db.loader import load_database

    return load_database()


@pytest.fixture(scope="session")
def catalog():
    from perfmodel.catalog import builtin_models

    return builtin_models()
