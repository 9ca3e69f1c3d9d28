"""Column specs: one list of columns draws a view's table and writes its CSV from the same records.

A ``Column`` says what the table shows of a record (its header and text, formatted for people) and
what the CSV writes of it (its keys and raw values: SI numbers, names as in the JSON). ``table_of``
and ``csv_of`` walk the same list over the same records, so the two stay in step: the same records in
the same order, each table cell the text of the CSV cells beside it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


def _no_cells(record: Any) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Column:
    """One column of a view. ``header`` and ``text`` give the table's cell of a record (no header: the
    column is the CSV's only); ``csv`` gives the record's CSV cells, key -> raw value (none: the
    column is the table's only); ``justify``, ``whole`` and ``style`` are ``Table.add_column``'s."""

    header: str | None
    text: Callable[[Any], str] | None = None
    csv: Callable[[Any], dict[str, Any]] = _no_cells
    justify: str = "right"
    whole: bool | None = None
    style: str | None = None


def column(header: str, key: str, text: Callable[[Any], str] = str, value: Callable[[Any], Any] | None = None,
           **layout) -> Column:
    """A column whose table cell is ``text`` of the one CSV cell ``key`` (the record's ``value``, by
    default its item ``key``)."""
    get = value or (lambda record: record[key])
    return Column(header, lambda record: text(get(record)), lambda record: {key: get(record)}, **layout)


def csv_only(*keys: str, value: Callable[[Any, str], Any] | None = None) -> Column:
    """CSV cells the table does not show: each ``key`` the record's ``value(record, key)`` (by
    default its item ``key``)."""
    get = value or (lambda record, key: record[key])
    return Column(None, csv=lambda record: {key: get(record, key) for key in keys})


def table_of(columns: list[Column], records: list, table, order: tuple[str, ...] | None = None):
    """``table`` (an empty ``render.Table``) with the columns that have a header, in their order (or
    in ``order``, headers listed, where the table's order differs from the CSV's), and a row per
    record."""
    shown = [c for c in columns if c.header is not None]
    if order is not None:
        by_header = {c.header: c for c in shown}
        shown = [by_header[h] for h in order]
    for c in shown:
        table.add_column(c.header, justify=c.justify, whole=c.whole, **({"style": c.style} if c.style else {}))
    for record in records:
        table.add_row(*(c.text(record) for c in shown))
    return table


def csv_of(columns: list[Column], records: list) -> list[dict[str, Any]]:
    """The CSV rows of ``records``: one each, the columns' cells in the columns' order."""
    return [{key: value for c in columns for key, value in c.csv(record).items()} for record in records]


def texts(columns: list[Column], record) -> dict[str, str]:
    """The table's texts of one record by header, for a view that prints them as lines."""
    return {c.header: c.text(record) for c in columns if c.header is not None}


@dataclass(frozen=True)
class Listed:
    """A record of a list of plans: its ``rank`` in the list it comes from (None when that list does
    not hold it), its ``role`` (``recommended``, ``optimum``, ``fastest``, ``top``, ``tie``,
    ``pareto``), whether it ties with the optimum, and the plan's ``row``."""

    rank: int | None
    role: str
    row: Any
    tie: bool = False


def listed(rows: list, role: str, ties: list[bool] | None = None) -> list[Listed]:
    """``rows`` ranked 1, 2, ... in their order, each with ``role`` (and its tie mark)."""
    return [Listed(i, role, row, bool(ties and ties[i - 1])) for i, row in enumerate(rows, start=1)]


def each_once(items: list[Listed], same: Callable[[Any, Any], bool]) -> list[Listed]:
    """``items`` with each plan once (``same`` tells two rows of one plan apart from others): at its
    first place, with its first role, and ranked by the first rank it has among ``items``."""
    kept: list[Listed] = []
    for item in items:
        place = next((i for i, k in enumerate(kept) if same(k.row, item.row)), None)
        if place is None:
            kept.append(item)
        elif kept[place].rank is None and item.rank is not None:
            kept[place] = Listed(item.rank, kept[place].role, kept[place].row, kept[place].tie or item.tie)
    return kept


def rank_column(header: str = "#", **layout) -> Column:
    """The rank (with `` ≈`` where the plan ties with the optimum) and, in the CSV, the role."""
    return Column(header, lambda item: "-" if item.rank is None else f"{item.rank}{' ≈' if item.tie else ''}",
                  lambda item: {"rank": item.rank, "role": item.role}, **layout)
