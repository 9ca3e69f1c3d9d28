"""Shared fixtures: the built-in database and catalog are loaded once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def db():
    from perfmodel.hardware_db.loader import load_database

    return load_database()


@pytest.fixture(scope="session")
def catalog():
    from perfmodel.catalog import builtin_models

    return builtin_models()
