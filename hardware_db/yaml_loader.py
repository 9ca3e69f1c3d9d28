"""The safe YAML loaders :func:`hardware_db.files.parse_yaml` reads with (see that module): a
composer that bounds depth, values and alias expansion over libyaml's parser when present, or
PyYAML's pure-Python one. Imported only when a YAML file is parsed (not when the data comes from
the cache)."""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, SequenceNode
from yaml.resolver import Resolver

from .limits import MAX_DEPTH, MAX_NODES


class LimitError(yaml.YAMLError):
    """One of the project's own limits (depth, values), raised by its composer: the same message
    whichever parser produced the events."""


class _BoundedComposer(Composer):
    """PyYAML's composer with the project's limits checked while it composes: depth at most
    ``MAX_DEPTH`` and at most ``MAX_NODES`` values. A document that may hold aliases (its text has
    a ``*``) is also measured with its aliases expanded (values, depth, cycles) before anything
    constructs or walks it; one without aliases is a tree, which the counts already bound."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self._depth = 0
        self._nodes = 0
        self._may_alias = "*" in text

    def compose_node(self, parent, index):
        self._depth += 1
        self._nodes += 1
        if self._depth > MAX_DEPTH:
            raise LimitError(f"nested deeper than {MAX_DEPTH} levels")
        if self._nodes > MAX_NODES:
            raise LimitError(f"more than {MAX_NODES:,} values")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self):
        node = super().compose_document()
        if self._may_alias:
            if _expanded_size(node, {}) > MAX_NODES:
                raise LimitError(f"aliases expand to more than {MAX_NODES:,} values")
            if _height(node, {}) > MAX_DEPTH:
                raise LimitError(f"aliases nest deeper than {MAX_DEPTH} levels")
        return node


def _children(node) -> list:
    if isinstance(node, SequenceNode):
        return node.value
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _expanded_size(node, memo: dict) -> int:
    """Values ``node`` stands for once every alias inside it is expanded; a cycle is an error."""
    key = id(node)
    if key in memo:
        if memo[key] is None:
            raise LimitError("an alias refers to a node that contains it")
        return memo[key]
    memo[key] = None
    size = 1 + sum(_expanded_size(child, memo) for child in _children(node))
    memo[key] = min(size, MAX_NODES + 1)
    return memo[key]


def _height(node, memo: dict) -> int:
    key = id(node)
    if key not in memo:
        memo[key] = MAX_DEPTH + 2  # a cycle reads as too deep
        memo[key] = 1 + max((_height(child, memo) for child in _children(node)), default=0)
    return memo[key]


class _Reader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser):
    """PyYAML's pure-Python reader, scanner and parser."""

    def __init__(self, stream) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)


def _safe_loader(parser: type) -> type:
    """A safe loader (plain data only) with the project's limits over ``parser``'s events."""

    def __init__(self, text: str) -> None:
        parser.__init__(self, text)
        _BoundedComposer.__init__(self, text)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)

    return type(f"BoundedSafeLoader{parser.__name__}", (_BoundedComposer, parser, SafeConstructor, Resolver),
                {"__init__": __init__, "__doc__": "Safe YAML with bounded depth, values and alias expansion."})


PURE_LOADER = _safe_loader(_Reader)
try:
    from yaml.cyaml import CParser  # libyaml: 3.5x faster than yaml.safe_load on a 3 MB file
    BoundedSafeLoader = _safe_loader(CParser)
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    BoundedSafeLoader = PURE_LOADER


def load_with(loader_cls: type, text: str) -> Any:
    """The one document of ``text``, read by a loader of ``loader_cls``."""
    loader = loader_cls(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
