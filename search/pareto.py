"""Non-dominated filtering of plans over several objectives, all to be minimized."""

from __future__ import annotations

import numpy as np


def pareto_front(objectives: np.ndarray) -> np.ndarray:
    """Indices of the rows of ``objectives`` (n x k, minimize every column) that no other row dominates.

    A row dominates another when it is no worse in every objective and better in one. Rows are
    swept in lexicographic order, so a row can only be dominated by one before it; each is checked
    against the front found so far (Kung, Luccio and Preparata, JACM 22(4), 1975). Identical rows
    are kept once (the first).
    """
    obj = np.asarray(objectives, dtype=float)
    if obj.ndim != 2 or len(obj) == 0:
        return np.zeros(0, dtype=int)
    order = np.lexsort(obj.T[::-1])
    if obj.shape[1] == 2:
        # Two objectives: sorted by the first (then the second), a row is on the front exactly when
        # its second objective is below every earlier row's (the staircase; O(n log n)).
        second = obj[order, 1]
        best_before = np.concatenate([[np.inf], np.minimum.accumulate(second)[:-1]])
        return order[second < best_before]
    front: list[int] = []
    values = np.empty((len(obj), obj.shape[1]))
    count = 0
    start, size = 0, 64   # small blocks first, so the front that filters later blocks forms early
    while start < len(order):
        block = order[start:start + size]
        start, size = start + size, min(4 * size, 4096)
        if count:  # drop the rows of this block that the front so far already dominates
            dominated = np.any(np.all(values[None, :count] <= obj[block][:, None, :], axis=2), axis=1)
            block = block[~dominated]
        for i in block:
            row = obj[i]
            if count and np.any(np.all(values[:count] <= row, axis=1)):
                continue  # dominated by (or equal to) a row already on the front
            front.append(int(i))
            values[count] = row
            count += 1
    return np.array(front, dtype=int)


def dominates(a: np.ndarray, b: np.ndarray) -> bool:
    """True when ``a`` is no worse than ``b`` everywhere and better somewhere."""
    return bool(np.all(a <= b) and np.any(a < b))
