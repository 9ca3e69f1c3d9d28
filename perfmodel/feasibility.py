"""The first rule each plan breaks: one accumulator, one encoding, for training and serving alike.

Rules are checked in the order a planner reads them (the device count, then divisibility, then
memory). Each plan records the first rule it breaks as an integer code, 0 where it breaks none and
1 + the rule's index otherwise, with the amount by which it breaks it (what the one-line error
and the search's evidence print); names are materialized only when asked (``binding``).
"""

from __future__ import annotations

import numpy as np


class FirstBroken:
    """Accumulates, per plan of ``shape``, the first rule broken (``code``) and by how much
    (``shortfall``); ``names`` lists every rule checked, in order."""

    def __init__(self, shape):
        self.code = np.zeros(shape, dtype=np.int16)
        self.shortfall = np.zeros(shape)
        self.names: list[str] = []

    def rule(self, broken, name: str, amount) -> None:
        """Check the rule ``name``: where ``broken`` holds and no earlier rule broke, it binds by ``amount``."""
        self.names.append(name)
        if not np.any(broken):                # most rules hold everywhere: nothing to record
            return
        new = np.asarray(broken) & (self.code == 0)
        self.code = np.where(new, len(self.names), self.code)
        self.shortfall = np.where(new, amount, self.shortfall)

    @property
    def binding(self) -> np.ndarray:
        """The name of the rule each plan breaks first ("" where it breaks none)."""
        names = np.asarray(("",) + tuple(self.names), dtype=object)
        return names[np.ravel(self.code)].reshape(np.shape(self.code))     # an array at every shape, 0-d too
