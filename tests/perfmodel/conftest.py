"""Machines the power and economics tests share (module-scoped, so hypothesis tests may take them)."""

from __future__ import annotations

import pytest

from perfmodel.machine import build_machine


@pytest.fixture(scope="module")
def m(db):
    """One DGX H100 node (8 GPUs) at cloud prices."""
    return build_machine(db, "dgx-h100", 8)


@pytest.fixture(scope="module")
def owned(db):
    """The same node, owned (purchase, power and facility over its depreciation)."""
    return build_machine(db, "dgx-h100", 8, "owned")
