"""Hypothesis strategies for hostile input files: what a careless user or a broken tool hands the
perfmodel CLI in place of each file it reads.

Every target mixes near-valid files (a real entry, config or table of this repository with zero,
one or two mutations; zero mutations is the valid baseline) and attacks (alias bombs, deep
nesting, huge or malformed containers, odd file names). ``why`` names the hostile class: a format
prefix and the mutations joined by "+", e.g. ``yaml-nan+truncated``, ``npz-deflate-bomb``.

    from tests.hostile_files import hostile_files, write

    @given(f=hostile_files("routing"))
    def test_routing_files(tmp_path_factory, f):
        path = write(f, tmp_path_factory.mktemp("in"))
        main(["place-experts", "--model", "mixtral-8x7b", "--devices", "8", "--routing", str(path)])
"""

from __future__ import annotations

import copy
import io
import json
import math
import pickle
import re
import struct
import zipfile
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import yaml
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("hardware-db", "model-yaml", "config-json", "routing",
           "gemm-table", "attention-table", "collectives-table", "dispatch-table")
TABLE_SAMPLES = {"gemm-table": "gemm_h100_sample.csv", "attention-table": "attention_h100_sample.csv",
                 "collectives-table": "nccl_h100_sample.csv", "dispatch-table": "deepep_ll_h100_sample.csv"}
ROUTING_SHAPES = {"mixtral-8x7b": (32, 8), "deepseek-v3": (58, 256)}   # MoE layers x routed experts
DEPTHS = (500, 1000, 100_000)


@dataclass(frozen=True)
class HostileFile:
    """One input file: the CLI input that reads it, its name with suffix, its bytes, its hostile class.

    A name ending in "/" is a directory of that name holding the bytes in a file of the same name.
    """

    target: str
    name: str
    data: bytes
    why: str


def write(f: HostileFile, folder: Path) -> Path:
    """Write ``f`` into the empty ``folder``; return what the CLI is given (``folder`` for hardware-db)."""
    path = folder / f.name
    if f.name.endswith("/"):
        path.mkdir(parents=True, exist_ok=True)
        (path / path.name).write_bytes(f.data)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f.data)
    return folder if f.target == "hardware-db" else path


def hostile_files(target: str | None = None) -> st.SearchStrategy[HostileFile]:
    """Hostile files for ``target`` (one of TARGETS), or for every target when None."""
    if target is None:
        return st.one_of(*(hostile_files(t) for t in TARGETS))
    if target not in TARGETS:
        raise ValueError(f"target needs one of {', '.join(TARGETS)}, has {target!r}")
    return _STRATEGIES[target]()


# --- the repository's own files, read once -------------------------------------------------------

@lru_cache(maxsize=None)
def _hardware_entries() -> tuple[tuple[str, dict], ...]:
    """(kind, entry) of every built-in hardware database entry."""
    out = []
    for path in sorted((ROOT / "hardware_db" / "data").glob("*.yaml")):
        for kind, entries in yaml.safe_load(path.read_text(encoding="utf-8")).items():
            out += [(kind, e) for e in entries]
    return tuple(out)


@lru_cache(maxsize=None)
def _models() -> tuple[dict, ...]:
    return tuple(yaml.safe_load((ROOT / "perfmodel" / "catalog" / "models.yaml").read_text(encoding="utf-8"))["models"])


@lru_cache(maxsize=None)
def _hf_configs() -> tuple[dict, ...]:
    paths = sorted((ROOT / "tests" / "data" / "hf").glob("*.json"))
    return tuple(json.loads(p.read_text(encoding="utf-8")) for p in paths)


@lru_cache(maxsize=None)
def _sample_table(target: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """(comment lines, header, rows) of the sample CSV of a calibration target (no quoted cells)."""
    lines = (ROOT / "tests" / "data" / TABLE_SAMPLES[target]).read_text(encoding="utf-8").splitlines()
    header, *rows = [tuple(line.split(",")) for line in lines if line and not line.startswith("#")]
    return tuple(line for line in lines if line.startswith("#")), header, tuple(rows)


# --- dumping documents with text the safe dumpers will not write ----------------------------------

class Raw(str):
    """Text spliced verbatim into a dumped document (aliases, tags, 5,000-digit integers, ...)."""


def _splice(doc, dump) -> bytes:
    """``dump(doc)`` with every Raw node replaced by its text."""
    raws: list[Raw] = []

    def swap(node):
        if isinstance(node, Raw):
            raws.append(node)
            return f"RAWTOKEN{len(raws) - 1}X"
        if isinstance(node, dict):
            return {k: swap(v) for k, v in node.items()}
        if isinstance(node, list):
            return [swap(v) for v in node]
        return node

    text = dump(swap(doc))
    for i, raw in enumerate(raws):
        text = text.replace(f'"RAWTOKEN{i}X"', raw).replace(f"RAWTOKEN{i}X", raw)
    return text.encode("utf-8")


def _yaml(doc) -> bytes:
    return _splice(doc, lambda d: yaml.safe_dump(d, sort_keys=False, allow_unicode=True, width=1 << 20))


def _json(doc) -> bytes:
    return _splice(doc, lambda d: json.dumps(d, indent=2))


def _scalar(value) -> str:
    """``value`` as one YAML scalar."""
    return yaml.safe_dump(value).split("\n")[0]


def _laughs(anchor: str, depth: int = 10, width: int = 10) -> Raw:
    """A flow list whose last item is width ** depth strings through aliases (billion laughs)."""
    levels = [f"&{anchor}0 [{', '.join(['lol'] * width)}]"]
    levels += [f"&{anchor}{i} [{', '.join([f'*{anchor}{i - 1}'] * width)}]" for i in range(1, depth)]
    return Raw(f"[{', '.join(levels)}]")


def _anchor(path: tuple) -> str:
    return "a" + re.sub(r"\W", "_", "_".join(map(str, path)))


def _deep(style: str, depth: int) -> str:
    """A value nested ``depth`` levels deep: YAML flow seq/map or JSON array/object."""
    return {"seq": "[" * depth + "]" * depth, "map": "{a: " * depth + "1" + "}" * depth,
            "array": "[" * depth + "]" * depth, "object": '{"a": ' * depth + "1" + "}" * depth}[style]


# --- mutations of YAML and JSON documents ---------------------------------------------------------
# An op is (stage, fn): fn(draw, doc) -> (doc, label), label None when the op does not apply.
# Ops run by stage: -1 routing arrays, 0 entries (rows of a table), 1 leaves (cells), 2 the outer
# structure (header and columns of a table).

def _nodes(node, path=()):
    """(path, value) of every node below ``node``, in document order."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield path + (key,), child
        yield from _nodes(child, path + (key,))


def _pick(draw, doc, want):
    """A drawn (path, value) of a node satisfying ``want(path, value)``, or None."""
    found = [(p, v) for p, v in _nodes(doc) if want(p, v)]
    return draw(st.sampled_from(found)) if found else None


def _get(doc, path):
    for key in path:
        doc = doc[key]
    return doc


def _set(doc, path, value) -> None:
    _get(doc, path[:-1])[path[-1]] = value


def _number(path, value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _string(path, value) -> bool:
    return isinstance(value, str) and not isinstance(value, Raw)


def _named(key: str):
    return lambda path, value: path[-1] == key


def _leaf_op(label: str, want, make):
    """Replace one drawn node satisfying ``want`` by ``make(path, value)``."""
    def op(draw, doc):
        found = _pick(draw, doc, want)
        if found is None:
            return doc, None
        _set(doc, found[0], make(*found))
        return doc, label
    return 1, op


def _drop(draw, doc):
    found = _pick(draw, doc, lambda p, v: isinstance(p[-1], str))
    if found is None:
        return doc, None
    del _get(doc, found[0][:-1])[found[0][-1]]
    return doc, "drop-field"


def _extra(draw, doc):
    found = _pick(draw, doc, lambda p, v: isinstance(v, dict))
    target = found[1] if found else doc
    if not isinstance(target, dict):
        return doc, None
    target["colour_gb"] = "blue"
    return doc, "extra-field"


def _root(label: str, make, stage: int = 2):
    """Replace the whole document by ``make(doc)`` (None when it does not apply)."""
    def op(draw, doc):
        new = make(doc)
        return (doc, None) if new is None else (new, label)
    return stage, op


NUMBER_SWAPS = {
    "negative": lambda v: -v if v else -1,
    "zero": lambda v: 0,
    "huge": lambda v: 1e30,
    "1e308": lambda v: 1e308,
    "nan": lambda v: math.nan,
    "inf": lambda v: math.inf,
    "minus-inf": lambda v: -math.inf,
    "subnormal": lambda v: 5e-324,
    "int-400-digits": lambda v: Raw("9" * 400),
    "int-5000-digits": lambda v: Raw("9" * 5000),
    "string-number": lambda v: str(v),
    "string-with-unit": lambda v: f"{v} GB",
    "unit-x1000": lambda v: v * 1000,
    "unit-div1000": lambda v: v / 1000,
    "fraction-for-int": lambda v: v + 0.5,
    "bool-for-number": lambda v: True,
    "null-for-number": lambda v: None,
    "list-for-number": lambda v: [v, v],
    "dict-for-number": lambda v: {"a": 1},
}
STRING_SWAPS = {
    "dict-for-string": lambda s: {"a": 1},
    "list-for-string": lambda s: [s, s],
    "number-for-string": lambda s: 7,
    "empty-string": lambda s: "",
    "null-for-string": lambda s: None,
    "long-string": lambda s: (s or "x") * (100_000 // max(len(s), 1) + 1),
    "control-chars": lambda s: s + "\x00\x1b[2J\u202e",
}
YAML_NUMBERS = {   # numbers only YAML spells (1e308 without a dot is a string in YAML 1.1)
    "hex-int-5000-digits": "0x" + "f" * 5000,
    "exponent-without-dot": "1e308",
    "sexagesimal": "1:30:00",
    "leading-zero-octal": "0777",
    "nan-capitalized": ".NaN",
}
YAML_TAGS = {
    "python-apply-os-system": '!!python/object/apply:os.system ["true"]',
    "python-name": "!!python/name:os.system",
    "python-object-new": "!!python/object/new:builtins.dict {}",
    "python-module": "!!python/module:os",
    "unknown-tag": "!hostile x",
    "binary-tag": "!!binary aG9zdGlsZQ==",
    "set-tag": "!!set {a, b}",
    "timestamp": "2001-12-14t21:59:43.10-05:00",
}


def _tree_ops(strings: bool = True) -> dict:
    """Mutations any YAML or JSON document takes: swapped values, dropped or extra fields."""
    ops = {name: _leaf_op(name, _number, lambda p, v, f=f: f(v)) for name, f in NUMBER_SWAPS.items()}
    if strings:
        ops |= {name: _leaf_op(name, _string, lambda p, v, f=f: f(v)) for name, f in STRING_SWAPS.items()}
    return ops | {"drop-field": (1, _drop), "extra-field": (1, _extra),
                  "empty-container": _leaf_op("empty-container", lambda p, v: isinstance(v, (dict, list)),
                                              lambda p, v: type(v)())}


def _anchor_alias(draw, doc):
    """A number anchored and a later number its alias."""
    paths = [p for p, v in _nodes(doc) if _number(p, v)]
    if len(paths) < 2:
        return doc, None
    i = draw(st.integers(0, len(paths) - 2))
    j = draw(st.integers(i + 1, len(paths) - 1))
    _set(doc, paths[i], Raw(f"&{_anchor(paths[i])} {_scalar(_get(doc, paths[i]))}"))
    _set(doc, paths[j], Raw(f"*{_anchor(paths[i])}"))
    return doc, "anchor-alias"


def _yaml_ops() -> dict:
    """Mutations only YAML has: alias bombs, tags, anchors, YAML-only numbers, deep flow nesting."""
    ops = {
        "laughs-in-number": _leaf_op("laughs-in-number", _number, lambda p, v: _laughs(_anchor(p))),
        "laughs-in-string": _leaf_op("laughs-in-string", _string, lambda p, v: _laughs(_anchor(p))),
        "laughs-in-name": _leaf_op("laughs-in-name", _named("name"), lambda p, v: _laughs(_anchor(p))),
        "laughs-top-level": _root("laughs-top-level", lambda doc: _laughs("top")),
        "anchor-alias": (1, _anchor_alias),
    }
    ops |= {name: _leaf_op(name, lambda p, v: True, lambda p, v, t=t: Raw(t)) for name, t in YAML_TAGS.items()}
    ops |= {name: _leaf_op(name, _number, lambda p, v, t=t: Raw(t)) for name, t in YAML_NUMBERS.items()}
    return ops | {f"deep-flow-{style}-{n}": _leaf_op(f"deep-flow-{style}-{n}", lambda p, v: True,
                                                      lambda p, v, s=style, n=n: Raw(_deep(s, n)))
                  for style in ("seq", "map") for n in DEPTHS}


def _json_ops() -> dict:
    """Deep nesting at a drawn node of a JSON document."""
    return {f"deep-{style}-{n}": _leaf_op(f"deep-{style}-{n}", lambda p, v: True,
                                          lambda p, v, s=style, n=n: Raw(_deep(s, n)))
            for style in ("array", "object") for n in DEPTHS}


# --- mutations of bytes: fn(draw, data) -> data, None when it does not apply ----------------------

def _insert(draw, data: bytes, junk: bytes) -> bytes:
    at = draw(st.integers(0, len(data)))
    return data[:at] + junk + data[at:]


def _changed(new: bytes, old: bytes) -> bytes | None:
    return new if new != old else None


BINARY_OPS = {
    "truncated": lambda draw, data: data[: draw(st.integers(0, max(len(data) - 1, 0)))],
    "garbage-appended": lambda draw, data: data + draw(st.binary(min_size=1, max_size=64)),
    "crlf": lambda draw, data: _changed(data.replace(b"\n", b"\r\n"), data),
    "nul-byte": lambda draw, data: _insert(draw, data, b"\x00"),
}
TEXT_OPS = BINARY_OPS | {
    "bom": lambda draw, data: b"\xef\xbb\xbf" + data,
    "invalid-utf8": lambda draw, data: _insert(draw, data, b"\xff\xfe\xc3\x28"),
    "cr-only": lambda draw, data: _changed(data.replace(b"\n", b"\r"), data),
    "utf16": lambda draw, data: data.decode("utf-8", "replace").encode("utf-16"),
}
INDENTED_OPS = TEXT_OPS | {"tab-indented": lambda draw, data: _changed(data.replace(b"  ", b"\t"), data)}
YAML_TEXT_OPS = INDENTED_OPS | {"multi-document": lambda draw, data: data + b"---\n" + data}


def _json_duplicate_key(draw, data: bytes) -> bytes | None:
    key = re.search(rb'"([^"]+)"\s*:', data)
    body = data.rstrip()
    if key is None or not body.endswith(b"}"):
        return None
    return body[:-1] + b', "' + key.group(1) + b'": null}\n'


JSON_TEXT_OPS = INDENTED_OPS | {
    "duplicate-key": _json_duplicate_key,
    "trailing-comma": lambda draw, data: data.rstrip()[:-1] + b",}" if data.rstrip().endswith(b"}") else None,
    "comment-line": lambda draw, data: b"// exported by hand\n" + data,
    "single-quotes": lambda draw, data: _changed(data.replace(b'"', b"'"), data),
    "python-literals": lambda draw, data: _changed(
        data.replace(b"true", b"True").replace(b"false", b"False").replace(b"null", b"None"), data),
}


# --- assembling a target --------------------------------------------------------------------------

@st.composite
def _near_valid(draw, target: str, name: str, prefix: str, baseline, ops: dict, dump, byte_ops: dict):
    """A baseline drawn from ``baseline`` with zero, one or two of ``ops`` and ``byte_ops``, dumped."""
    doc = draw(baseline)
    count = draw(st.sampled_from((1, 1, 1, 1, 2, 2, 2, 2, 0)))   # about one file in nine stays valid
    chosen = draw(st.lists(st.sampled_from(sorted(ops) + sorted(byte_ops)), min_size=count, max_size=count,
                           unique=True))
    labels = []
    for op in sorted((o for o in chosen if o in ops), key=lambda o: ops[o][0]):
        doc, label = ops[op][1](draw, doc)
        labels += [label] if label else []
    data = dump(doc)
    for op in (o for o in chosen if o in byte_ops):
        new = byte_ops[op](draw, data)
        if new is not None:
            data, labels = new, labels + [op]
    return HostileFile(target, name, data, f"{prefix}-{'+'.join(labels) or 'valid'}")


def _static(target: str, name: str, builders: dict) -> st.SearchStrategy[HostileFile]:
    """Files built on draw by ``builders`` (why -> () -> bytes); a builder may return (name, bytes)."""
    def build(why):
        out = builders[why]()
        file_name, data = out if isinstance(out, tuple) else (name, out)
        return HostileFile(target, file_name, data, why)
    return st.sampled_from(sorted(builders)).map(build)


def _renamed(target: str, baseline, dump, names: dict) -> st.SearchStrategy[HostileFile]:
    """A valid baseline under an odd file name (``names``: label -> name)."""
    return st.tuples(baseline, st.sampled_from(sorted(names))).map(
        lambda t: HostileFile(target, names[t[1]], dump(t[0]), f"name-{t[1]}"))


def _target(near_valid, attacks: list) -> st.SearchStrategy[HostileFile]:
    """Half near-valid files, half attacks."""
    return st.booleans().flatmap(lambda near: near_valid if near else st.one_of(attacks))


# --- YAML attacks shared by the hardware database and model specs ---------------------------------

def _merge_bomb(list_key: str, depth: int = 9, width: int = 10) -> bytes:
    """Merge keys whose flattened mappings grow width ** depth (PyYAML copies merged pairs)."""
    lines = [f"{list_key}:", "- &m0 {name: bomb, k: 1}"]
    lines += [f"- &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * width)}]}}" for i in range(1, depth)]
    return ("\n".join(lines) + "\n").encode()


def _deep_block(list_key: str, style: str, depth: int) -> bytes:
    """Block-style nesting ``depth`` levels deep under ``list_key``: ``- - - x`` or indented mappings."""
    if style == "seq":
        return f"{list_key}:\n{'- ' * depth}x\n".encode()
    lines = [" " * (i + 1) + "a:" for i in range(depth - 1)] + [" " * depth + "a: 1"]
    return (f"{list_key}:\n" + "\n".join(lines) + "\n").encode()


def _bulk_entry(list_key: str) -> dict:
    if list_key == "models":
        entry = copy.deepcopy(_models()[0])
    else:
        entry = copy.deepcopy(next(e for k, e in _hardware_entries() if k == list_key))
    entry.pop("aliases", None)
    return entry


@lru_cache(maxsize=None)
def _big_yaml(list_key: str) -> bytes:
    """About 3 MB of valid-looking entries under ``list_key``, each with its own name."""
    item = yaml.safe_dump([{**_bulk_entry(list_key), "name": "bulk-nnn"}], sort_keys=False, width=1 << 20)
    return (f"{list_key}:\n" + "".join(item.replace("bulk-nnn", f"bulk-{i}")
                                       for i in range(3_000_000 // len(item) + 1))).encode()


def _merge_keys(list_key: str) -> bytes:
    """Valid anchors and merge keys: a second entry built from the first."""
    flow = yaml.safe_dump(_bulk_entry(list_key), default_flow_style=True, width=1 << 20).strip()
    return f"{list_key}:\n- &base {flow}\n- <<: *base\n  name: merged-copy\n".encode()


def _yaml_attacks(list_key: str) -> dict:
    """why -> builder of whole-file YAML attacks, entries under ``list_key``."""
    out = {
        "yaml-merge-bomb": lambda: _merge_bomb(list_key),
        "yaml-merge-keys": lambda: _merge_keys(list_key),
        "yaml-big-file": lambda: _big_yaml(list_key),
        "yaml-empty": lambda: b"# nothing here yet\n\n",
        "yaml-null-document": lambda: b"~\n",
        "yaml-python-tag-document": lambda: b'!!python/object/apply:os.system ["true"]\n',
        "zero-byte": lambda: b"",
    }
    out |= {f"yaml-deep-block-seq-{n}": lambda n=n: _deep_block(list_key, "seq", n) for n in DEPTHS}
    return out | {f"yaml-deep-block-map-{n}": lambda n=n: _deep_block(list_key, "map", n) for n in DEPTHS[:2]}


# --- hardware-db ----------------------------------------------------------------------------------

@st.composite
def _hardware_baseline(draw):
    """{kind: [entry]}: a built-in entry, overriding its namesake or renamed to a new entry."""
    kind, entry = draw(st.sampled_from(_hardware_entries()))
    entry = copy.deepcopy(entry)
    if draw(st.booleans()):
        entry.pop("aliases", None)
        entry["name"] = f"hostile-{kind}"
    return {kind: [entry]}


def _first(doc) -> tuple[str, dict]:
    kind = next(iter(doc))
    return kind, doc[kind][0]


def _extends(label: str, parent):
    """Set the first entry's ``extends`` to ``parent(draw, kind, entry)``."""
    def op(draw, doc):
        kind, entry = _first(doc)
        entry["extends"] = parent(draw, kind, entry)
        return doc, label
    return 0, op


def _extends_cycle(draw, doc):
    kind, entry = _first(doc)
    twin = {k: v for k, v in copy.deepcopy(entry).items() if k != "aliases"}
    entry["name"], twin["name"] = "hostile-a", "hostile-b"
    entry["extends"], twin["extends"] = "hostile-b", "hostile-a"
    doc[kind].append(twin)
    return doc, "extends-cycle"


def _duplicate_name(draw, doc):
    kind, entry = _first(doc)
    doc[kind].append(copy.deepcopy(entry))
    return doc, "duplicate-name"


def _name_in_other_kind(draw, doc):
    kind, entry = _first(doc)
    other, twin = draw(st.sampled_from([(k, e) for k, e in _hardware_entries() if k != kind]))
    doc.setdefault(other, []).append({**copy.deepcopy(twin), "name": entry.get("name", "x"), "aliases": []})
    return doc, "name-used-by-other-kind"


def _set_name(label: str, make):
    def op(draw, doc):
        kind, entry = _first(doc)
        if make is None:
            entry.pop("name", None)
        else:
            entry["name"] = make(entry.get("name", "x"))
        return doc, label
    return 0, op


def _rekind(doc):
    if not isinstance(doc, dict) or not doc:
        return None
    kind = next(iter(doc))
    return {"gpus": doc[kind], **{k: v for k, v in doc.items() if k != kind}}


def _first_list(doc, make):
    """``doc`` with its first list of entries replaced by ``make(entries)``, or None."""
    if not isinstance(doc, dict) or not doc or not isinstance(next(iter(doc.values())), list):
        return None
    kind = next(iter(doc))
    return {**doc, kind: make(doc[kind])}


HARDWARE_OPS = {
    "extends-self": _extends("extends-self", lambda draw, kind, e: e.get("name")),
    "extends-unknown": _extends("extends-unknown", lambda draw, kind, e: "no-such-entry"),
    "extends-dict": _extends("extends-dict", lambda draw, kind, e: {"a": 1}),
    "extends-list": _extends("extends-list", lambda draw, kind, e: [e.get("name"), "h100-sxm"]),
    "extends-number": _extends("extends-number", lambda draw, kind, e: 7),
    "extends-uppercase": _extends("extends-uppercase", lambda draw, kind, e: draw(st.sampled_from(
        [x["name"].upper() for k, x in _hardware_entries() if k == kind]))),
    "extends-other-kind": _extends("extends-other-kind", lambda draw, kind, e: draw(st.sampled_from(
        [x["name"] for k, x in _hardware_entries() if k != kind]))),
    "extends-laughs": _extends("extends-laughs", lambda draw, kind, e: _laughs("ext")),
    "extends-cycle": (0, _extends_cycle),
    "duplicate-name": (0, _duplicate_name),
    "name-used-by-other-kind": (0, _name_in_other_kind),
    "name-missing": _set_name("name-missing", None),
    "name-uppercase": _set_name("name-uppercase", lambda n: str(n).upper()),
    "name-too-long": _set_name("name-too-long", lambda n: "x" * 5000),
    "name-path": _set_name("name-path", lambda n: "../../etc/passwd"),
    "unknown-kind": _root("unknown-kind", _rekind),
    "kind-not-list": _root("kind-not-list", lambda doc: _first_list(doc, lambda es: es[0] if es else {})),
    "entry-not-mapping": _root("entry-not-mapping", lambda doc: _first_list(doc, lambda es: es + ["h100"])),
    "laughs-as-entries": _root("laughs-as-entries", lambda doc: _first_list(doc, lambda es: _laughs("ent"))),
    "top-level-list": _root("top-level-list", lambda doc: list(doc.values()) if isinstance(doc, dict) else None),
}
CONSTANT_VALUES = {"zero": 0, "negative": -1.0, "max": 1e6, "over-max": 1e7, "nan": math.nan, "inf": math.inf,
                   "subnormal": 5e-324, "string": "five", "int-400-digits": Raw("9" * 400)}
HARDWARE_NAMES = {"yml": "gpu.yml", "uppercase-suffix": "GPU.YAML", "hidden": ".gpu.yaml",
                  "nested": "nested/deeper/gpu.yaml", "directory": "gpu.yaml/", "backup": "gpu.yaml.bak",
                  "json-suffix": "gpu.json", "spaces-unicode": "my gpus ü.yaml"}


@st.composite
def _constant_file(draw):
    """A named constant (depreciation-years, framework-gemm-efficiency, ...) set to an odd value."""
    entry = copy.deepcopy(draw(st.sampled_from([e for k, e in _hardware_entries() if k == "constants"])))
    label = draw(st.sampled_from(sorted(CONSTANT_VALUES)))
    if draw(st.booleans()):
        entry = {"name": entry["name"], "extends": entry["name"]}
    entry["value"] = CONSTANT_VALUES[label]
    return HostileFile("hardware-db", "constants.yaml", _yaml({"constants": [entry]}), f"yaml-constant-{label}")


def _hardware_db():
    ops = _tree_ops() | _yaml_ops() | HARDWARE_OPS
    near = _near_valid("hardware-db", "gpu.yaml", "yaml", _hardware_baseline(), ops, _yaml, YAML_TEXT_OPS)
    return _target(near, [_static("hardware-db", "gpu.yaml", _yaml_attacks("accelerators")), _constant_file(),
                          _renamed("hardware-db", _hardware_baseline(), _yaml, HARDWARE_NAMES)])


# --- model-yaml -----------------------------------------------------------------------------------

@st.composite
def _model_baseline(draw):
    """A catalog model as a bare mapping or under ``models:``."""
    entry = copy.deepcopy(draw(st.sampled_from(_models())))
    return {"models": [entry]} if draw(st.booleans()) else entry


def _model_entry(doc) -> dict:
    return doc["models"][0] if "models" in doc else doc


def _change(label: str, change, part=lambda doc: doc):
    """Change ``part(doc)`` in place with ``change``; it returns False when it does not apply."""
    def op(draw, doc):
        return doc, (label if change(part(doc)) is not False else None)
    return 0, op


def _model_op(label: str, change):
    return _change(label, change, _model_entry)


def _moe_op(change):
    return lambda e: change(e) if isinstance(e.get("moe"), dict) else False


def _two_models(same: bool):
    def op(draw, doc):
        entry = _model_entry(doc)
        other = copy.deepcopy(entry if same else draw(st.sampled_from(_models())))
        if not same and other["name"] == entry.get("name"):
            other["name"] += "-other"
        return {"models": [entry, other]}, "same-model-twice" if same else "two-models"
    return 0, op


def _unlisted(doc):
    """``models:`` holding one mapping instead of a list of them."""
    entries = doc.get("models", [doc]) if isinstance(doc, dict) else None
    return {"models": entries[0]} if isinstance(entries, list) and entries else None


def _max_sizes(e: dict) -> None:
    e.update(hidden_size=10_000_000, ffn_hidden_size=10_000_000, vocab_size=10_000_000, num_heads=10_000_000,
             num_kv_heads=10_000_000, num_layers=10_000, max_seq_len=10_000_000)


MODEL_OPS = {
    "two-models": _two_models(False),
    "same-model-twice": _two_models(True),
    "heads-exceed-hidden": _model_op("heads-exceed-hidden", lambda e: e.update(num_heads=e["hidden_size"] * 2)),
    "kv-heads-exceed-heads": _model_op("kv-heads-exceed-heads", lambda e: e.update(num_kv_heads=e["num_heads"] * 2)),
    "kv-heads-not-dividing": _model_op("kv-heads-not-dividing",
                                       lambda e: e.update(num_kv_heads=max(e["num_heads"] - 1, 1))),
    "topk-exceeds-experts": _model_op("topk-exceeds-experts",
                                      _moe_op(lambda e: e["moe"].update(top_k=e["moe"]["num_experts"] + 1))),
    "first-dense-exceeds-layers": _model_op("first-dense-exceeds-layers", _moe_op(
        lambda e: e["moe"].update(first_dense_layers=e["num_layers"] + 1))),
    "moe-empty": _model_op("moe-empty", lambda e: e.update(moe={})),
    "mla-added": _model_op("mla-added", lambda e: e.update(mla={"kv_lora_rank": 512, "qk_nope_head_dim": 128,
                                                                "qk_rope_head_dim": 64, "v_head_dim": 128})),
    "window-every-exceeds-layers": _model_op("window-every-exceeds-layers", lambda e: e.update(
        sliding_window=128, sliding_window_every=e["num_layers"] + 1)),
    "max-sizes": _model_op("max-sizes", _max_sizes),
    "name-missing": _model_op("name-missing", lambda e: e.pop("name", None)),
    "name-uppercase": _model_op("name-uppercase", lambda e: e.update(name=str(e.get("name")).upper())),
    "name-too-long": _model_op("name-too-long", lambda e: e.update(name="x" * 5000)),
    "models-empty": _root("models-empty", lambda doc: {"models": []}),
    "models-not-list": _root("models-not-list", _unlisted),
    "laughs-as-models": _root("laughs-as-models", lambda doc: {"models": _laughs("mod")}),
    "top-level-list": _root("top-level-list", lambda doc: [doc]),
    "top-level-string": _root("top-level-string", lambda doc: "llama-3.1-8b"),
}
MODEL_NAMES = {"yml": "model.yml", "uppercase-suffix": "model.YAML", "directory": "model.yaml/",
               "no-suffix": "model", "txt": "model.txt", "nested": "a/b/c/model.yaml"}


def _model_yaml():
    ops = _tree_ops() | _yaml_ops() | MODEL_OPS
    near = _near_valid("model-yaml", "model.yaml", "yaml", _model_baseline(), ops, _yaml, YAML_TEXT_OPS)
    return _target(near, [_static("model-yaml", "model.yaml", _yaml_attacks("models")),
                          _renamed("model-yaml", _model_baseline(), _yaml, MODEL_NAMES)])


# --- config-json ----------------------------------------------------------------------------------

EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


def _experts(cfg: dict):
    return next((cfg[k] for k in EXPERT_KEYS if isinstance(cfg.get(k), int)), None)


def _layer_types(pattern: list):
    def change(cfg):
        layers = cfg["num_hidden_layers"]
        cfg.update(sliding_window=cfg.get("sliding_window") or 128,
                   layer_types=(pattern * layers)[:layers])
    return change


CONFIG_OPS = {
    "model-type-unknown": _change("model-type-unknown", lambda c: c.update(model_type="bert")),
    "model-type-missing": _change("model-type-missing", lambda c: c.pop("model_type", None)),
    "model-type-dict": _change("model-type-dict", lambda c: c.update(model_type={"llama": 1})),
    "heads-exceed-hidden": _change("heads-exceed-hidden",
                                      lambda c: c.update(num_attention_heads=c["hidden_size"] * 2)),
    "kv-heads-exceed-heads": _change("kv-heads-exceed-heads",
                                        lambda c: c.update(num_key_value_heads=c["num_attention_heads"] * 2)),
    "kv-heads-not-dividing": _change("kv-heads-not-dividing",
                                        lambda c: c.update(num_key_value_heads=max(c["num_attention_heads"] - 1, 1))),
    "topk-exceeds-experts": _change("topk-exceeds-experts", lambda c: False if _experts(c) is None
                                       else c.update(num_experts_per_tok=_experts(c) + 1)),
    "first-dense-exceeds-layers": _change("first-dense-exceeds-layers", lambda c: False if "first_k_dense_replace"
                                             not in c else c.update(first_k_dense_replace=c["num_hidden_layers"] + 1)),
    "layer-types-irregular": _change("layer-types-irregular",
                                        _layer_types(["sliding_attention", "sliding_attention", "full_attention"])),
    "layer-types-all-sliding": _change("layer-types-all-sliding", _layer_types(["sliding_attention"])),
    "layer-types-not-strings": _change("layer-types-not-strings", _layer_types([1, None])),
    "moe-layer-freq-string": _change("moe-layer-freq-string", lambda c: c.update(moe_layer_freq="1")),
    "decoder-sparse-step-zero": _change("decoder-sparse-step-zero", lambda c: c.update(decoder_sparse_step=0)),
    "quantization-config-list": _change("quantization-config-list", lambda c: c.update(quantization_config=[1])),
    "name-or-path-traversal": _change("name-or-path-traversal",
                                         lambda c: c.update(_name_or_path="../../../../etc/passwd")),
    "name-or-path-punctuation": _change("name-or-path-punctuation", lambda c: c.update(_name_or_path="!!!")),
    "name-or-path-dict": _change("name-or-path-dict", lambda c: c.update(_name_or_path={"a": 1})),
    "max-sizes": _change("max-sizes", lambda c: c.update(
        hidden_size=10_000_000, intermediate_size=10_000_000, vocab_size=10_000_000, num_attention_heads=10_000_000,
        num_key_value_heads=10_000_000, num_hidden_layers=10_000, max_position_embeddings=10_000_000)),
    "top-level-list": _root("top-level-list", lambda doc: [doc]),
    "top-level-string": _root("top-level-string", lambda doc: "llama"),
    "top-level-null": _root("top-level-null", lambda doc: Raw("null")),
}
CONFIG_NAMES = {"uppercase-suffix": "config.JSON", "directory": "config.json/", "no-suffix": "config",
                "backup": "config.json.bak", "nested": "org/model/config.json"}


@lru_cache(maxsize=None)
def _big_json() -> bytes:
    """A real config with about 3 MB of extra keys."""
    return json.dumps({**_hf_configs()[0], **{f"extra_{i}": i for i in range(200_000)}}).encode()


def _json_attacks() -> dict:
    out = {"json-empty": lambda: b" \n\n", "zero-byte": lambda: b"", "json-big-file": _big_json,
           "json-top-level-nan": lambda: b"NaN", "json-huge-int-document": lambda: b"9" * 5000}
    return out | {f"json-deep-{style}-{n}-document": lambda s=style, n=n: _deep(s, n).encode()
                  for style in ("array", "object") for n in DEPTHS}


def _config_json():
    baseline = st.sampled_from(_hf_configs()).map(copy.deepcopy)
    ops = _tree_ops() | _json_ops() | CONFIG_OPS
    near = _near_valid("config-json", "config.json", "json", baseline, ops, _json, JSON_TEXT_OPS)
    return _target(near, [_static("config-json", "config.json", _json_attacks()),
                          _renamed("config-json", baseline, _json, CONFIG_NAMES)])


# --- calibration tables (CSV) and routing CSV -----------------------------------------------------
# A table is {"comments", "columns", "header" (written or not), "rows", "sep"}.

def _csv(t: dict) -> bytes:
    header = [t["sep"].join(t["columns"])] if t["header"] else []
    lines = t["comments"] + header + [t["sep"].join(r) for r in t["rows"]]
    return ("\n".join(lines) + "\n").encode("utf-8")


def _floaty(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _scaled(text: str, factor: float) -> str:
    return repr(float(text) * factor) if _floaty(text) else text


def _cell_op(label: str, make, numeric: bool = True):
    """Replace one drawn cell (of a numeric column, or a text column) by ``make(text)``."""
    def op(draw, t):
        cols = [j for j, c in enumerate(t["columns"]) if t["rows"] and j < len(t["rows"][0])
                and _floaty(t["rows"][0][j]) == numeric]
        if not cols:
            return t, None
        i, j = draw(st.integers(0, len(t["rows"]) - 1)), draw(st.sampled_from(cols))
        t["rows"][i] = [make(c) if k == j else c for k, c in enumerate(t["rows"][i])]
        return t, label
    return 1, op


def _column_op(label: str, make):
    """Replace a drawn numeric column, every row, by ``make(text)``."""
    def op(draw, t):
        cols = [j for j in range(len(t["columns"])) if t["rows"] and _floaty(t["rows"][0][j])]
        if not cols:
            return t, None
        j = draw(st.sampled_from(cols))
        t["rows"] = [[make(c) if k == j else c for k, c in enumerate(r)] for r in t["rows"]]
        return t, label
    return 1, op


def _table_op(label: str, change, stage: int = 2):
    """Change the table in place with ``change(draw, t)``; it returns False when it does not apply."""
    def op(draw, t):
        return t, (label if change(draw, t) is not False else None)
    return stage, op


def _rows_op(label: str, make):
    return _table_op(label, lambda draw, t: False if not t["rows"] else t.update(rows=make(t["rows"])), stage=0)


def _drop_column(draw, t):
    j = draw(st.integers(0, len(t["columns"]) - 1))
    t["columns"] = t["columns"][:j] + t["columns"][j + 1:]
    t["rows"] = [r[:j] + r[j + 1:] for r in t["rows"]]


def _rename_column(make):
    def change(draw, t):
        j = draw(st.integers(0, len(t["columns"]) - 1))
        t["columns"] = [make(c) if k == j else c for k, c in enumerate(t["columns"])]
    return change


def _row_change(make):
    def change(draw, t):
        if not t["rows"]:
            return False
        i = draw(st.integers(0, len(t["rows"]) - 1))
        t["rows"][i] = make(t["rows"][i])
    return change


CELL_SWAPS = {
    "negative": lambda s: "-" + s, "zero": lambda s: "0", "nan": lambda s: "nan", "inf": lambda s: "inf",
    "minus-inf": lambda s: "-inf", "1e308": lambda s: "1e308", "overflow": lambda s: "1e999",
    "subnormal": lambda s: "5e-324", "int-400-digits": lambda s: "9" * 400, "int-5000-digits": lambda s: "9" * 5000,
    "non-numeric": lambda s: "abc", "empty-cell": lambda s: "", "unit-suffix": lambda s: s + "us",
    "hex": lambda s: "0x10", "underscore-digits": lambda s: "1_000", "padded": lambda s: f"  {s}  ",
    "comma-decimal": lambda s: s.replace(".", ",") if "." in s else s + ",5",
}
COLUMN_SWAPS = {
    "column-negative": lambda s: "-" + s, "column-zero": lambda s: "0", "column-nan": lambda s: "nan",
    "column-huge": lambda s: "1e300", "column-x1000": lambda s: _scaled(s, 1000),
    "column-div1000": lambda s: _scaled(s, 1e-3), "column-subnormal": lambda s: "5e-324",
}
CSV_OPS = {
    **{name: _cell_op(name, f) for name, f in CELL_SWAPS.items()},
    **{name: _column_op(name, f) for name, f in COLUMN_SWAPS.items()},
    "unknown-category": _cell_op("unknown-category", lambda s: "zzz", numeric=False),
    "header-only": _rows_op("header-only", lambda rows: []),
    "single-row": _rows_op("single-row", lambda rows: rows[:1]),
    "two-rows": _rows_op("two-rows", lambda rows: rows[:2]),
    "identical-rows": _rows_op("identical-rows", lambda rows: [list(rows[0]) for _ in rows]),
    "duplicate-rows": _rows_op("duplicate-rows", lambda rows: rows + [list(r) for r in rows]),
    "missing-header": _table_op("missing-header", lambda draw, t: t.update(header=False)),
    "comments-only": _table_op("comments-only", lambda draw, t: t.update(
        header=False, rows=[], comments=t["comments"] + ["# nothing measured"])),
    "missing-column": _table_op("missing-column", _drop_column),
    "header-renamed": _table_op("header-renamed", _rename_column(lambda c: c[:-1] or "x")),
    "header-padded": _table_op("header-padded", _rename_column(lambda c: f" {c} ")),
    "header-uppercase": _table_op("header-uppercase", _rename_column(str.upper)),
    "duplicate-column": _table_op("duplicate-column", lambda draw, t: t.update(
        columns=t["columns"] + [t["columns"][-1]], rows=[r + ["0"] for r in t["rows"]])),
    "extra-column": _table_op("extra-column", lambda draw, t: t.update(
        columns=t["columns"] + ["note"], rows=[r + ["x"] for r in t["rows"]])),
    "header-as-row": _table_op("header-as-row", lambda draw, t: False if not t["rows"] else t["rows"].insert(
        draw(st.integers(0, len(t["rows"]))), list(t["columns"]))),
    "ragged-row-short": _table_op("ragged-row-short", _row_change(lambda r: r[:-1])),
    "ragged-row-long": _table_op("ragged-row-long", _row_change(lambda r: r + ["1", "2"])),
    "unterminated-quote": _table_op("unterminated-quote", _row_change(lambda r: ['"' + r[0]] + r[1:])),
    "huge-cell": _table_op("huge-cell", _row_change(lambda r: r[:-1] + ["9" * 200_000])),
    "semicolon-delimited": _table_op("semicolon-delimited", lambda draw, t: t.update(sep=";")),
}
TABLE_NAMES = {"uppercase-suffix": "table.CSV", "parquet-suffix": "table.parquet", "no-suffix": "table",
               "directory": "table.csv/", "tsv": "table.tsv"}


@st.composite
def _table_baseline(draw, target: str):
    comments, header, rows = _sample_table(target)
    return {"comments": list(comments) if draw(st.booleans()) else [], "columns": list(header), "header": True,
            "rows": [list(r) for r in rows], "sep": ","}


def _million_rows(target: str, junk: bool) -> bytes:
    """A million rows, cheap to build: junk, or one measured row repeated."""
    _, header, rows = _sample_table(target)
    row = "junk,\u00a4,\x7f" if junk else ",".join(rows[0])
    return (",".join(header) + "\n" + (row + "\n") * 1_000_000).encode()


def _table_target(target: str):
    baseline = _table_baseline(target)
    near = _near_valid(target, "table.csv", "csv", baseline, CSV_OPS, _csv, TEXT_OPS)
    attacks = {"csv-million-junk-rows": lambda: _million_rows(target, True),
               "csv-million-valid-rows": lambda: _million_rows(target, False),
               "csv-binary-garbage": lambda: bytes(range(256)) * 64,
               "csv-empty": lambda: b"\n \n", "zero-byte": lambda: b""}
    return _target(near, [_static(target, "table.csv", attacks), _renamed(target, baseline, _csv, TABLE_NAMES)])


# --- routing --------------------------------------------------------------------------------------
# A routing baseline is {"loads": (layers x experts), "transitions": optional ((layers-1) x e x e)}
# arrays; array ops change it before it becomes JSON, a CSV table or an NPZ archive.

@st.composite
def _routing_baseline(draw):
    layers, experts = ROUTING_SHAPES[draw(st.sampled_from(sorted(ROUTING_SHAPES)))]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    doc = {"loads": rng.integers(1, 20_000, (layers, experts)).astype(float)}
    if experts <= 8 and draw(st.booleans()):
        doc["transitions"] = rng.integers(0, 1_000, (layers - 1, experts, experts)).astype(float)
    return doc


def _array_op(label: str, make, key: str = "loads", drop_transitions: bool = False):
    """Replace the array ``key`` (loads only while 2-D) by ``make(draw, array)`` (None when it does not apply)."""
    def op(draw, doc):
        if key not in doc or (key == "loads" and doc[key].ndim != 2):
            return doc, None
        new = make(draw, doc[key])
        if new is None:
            return doc, None
        doc = {**doc, key: new}
        if drop_transitions:
            doc.pop("transitions", None)
        return doc, label
    return -1, op


def _one_cell(value):
    def make(draw, a):
        if a.size == 0:
            return None
        a = a.copy()
        a[draw(st.integers(0, a.shape[0] - 1)), draw(st.integers(0, a.shape[1] - 1))] = value
        return a
    return make


def _transitions_wrong_shape(draw, doc):
    """Transitions for one layer pair too many (and, past 8 experts, too few targets)."""
    loads = doc["loads"]
    if loads.ndim != 2:
        return doc, None
    shape = (loads.shape[0], loads.shape[1], min(loads.shape[1], 8))
    return {**doc, "transitions": np.ones(shape)}, "transitions-wrong-shape"


ROUTING_2D_OPS = {
    "negative-load": _array_op("negative-load", _one_cell(-1.0)),
    "nan-load": _array_op("nan-load", _one_cell(math.nan)),
    "inf-load": _array_op("inf-load", _one_cell(math.inf)),
    "huge-load": _array_op("huge-load", _one_cell(1e308)),
    "huge-loads": _array_op("huge-loads", lambda draw, a: np.full_like(a, 1e308)),
    "all-zero-loads": _array_op("all-zero-loads", lambda draw, a: np.zeros_like(a)),
    "subnormal-loads": _array_op("subnormal-loads", lambda draw, a: np.full_like(a, 5e-324)),
    "fractional-loads": _array_op("fractional-loads", lambda draw, a: a + 0.5),
    "one-layer": _array_op("one-layer", lambda draw, a: a[:1], drop_transitions=True),
    "double-layers": _array_op("double-layers", lambda draw, a: np.vstack([a, a]), drop_transitions=True),
    "too-few-experts": _array_op("too-few-experts", lambda draw, a: a[:, :-1], drop_transitions=True),
    "too-many-experts": _array_op("too-many-experts", lambda draw, a: np.hstack([a, a]), drop_transitions=True),
    "empty-experts": _array_op("empty-experts", lambda draw, a: np.zeros((1, 0)), drop_transitions=True),
    "no-layers": _array_op("no-layers", lambda draw, a: np.zeros((0, a.shape[1])), drop_transitions=True),
    "transposed": _array_op("transposed", lambda draw, a: a.T, drop_transitions=True),
}
ROUTING_ARRAY_OPS = ROUTING_2D_OPS | {
    "loads-3d": _array_op("loads-3d", lambda draw, a: a[None], drop_transitions=True),
    "loads-1d": _array_op("loads-1d", lambda draw, a: a[0], drop_transitions=True),
    "loads-0d": _array_op("loads-0d", lambda draw, a: np.array(5.0), drop_transitions=True),
    "transitions-negative": _array_op("transitions-negative", lambda draw, t: -t, key="transitions"),
    "transitions-nan": _array_op("transitions-nan", lambda draw, t: np.where(t > 500, np.nan, t), key="transitions"),
    "transitions-wrong-shape": (-1, _transitions_wrong_shape),
}


def _lists(doc):
    """A routing baseline as JSON values (anything else unchanged)."""
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in doc.items()} if isinstance(doc, dict) else doc


def _on(convert, ops: dict) -> dict:
    """``ops`` applied to ``convert(doc)``."""
    return {name: (stage, lambda draw, doc, fn=fn: fn(draw, convert(doc))) for name, (stage, fn) in ops.items()}


def _object_op(label: str, make):
    """Replace a JSON object document by ``make(doc)``."""
    return _root(label, lambda doc: make(doc) if isinstance(doc, dict) else None)


ROUTING_JSON_OPS = {
    "loads-missing": _object_op("loads-missing", lambda doc: {k: v for k, v in doc.items() if k != "loads"}),
    "loads-string": _object_op("loads-string", lambda doc: {**doc, "loads": "abc"}),
    "loads-dict": _object_op("loads-dict", lambda doc: {**doc, "loads": {"0": doc.get("loads")}}),
    "loads-null": _object_op("loads-null", lambda doc: {**doc, "loads": None}),
    "transitions-null": _object_op("transitions-null", lambda doc: {**doc, "transitions": None}),
    "top-level-list": _object_op("top-level-list", lambda doc: doc.get("loads")),
    "empty-object": _root("empty-object", lambda doc: {}),
    "ragged-rows": _leaf_op("ragged-rows", lambda p, v: p == ("loads", 0) and isinstance(v, list) and len(v) > 0,
                            lambda p, v: v[:-1]),
}


def _routing_table(doc) -> dict:
    """A routing baseline as a CSV table (a table unchanged)."""
    if "columns" in doc:
        return doc
    loads = doc["loads"]
    rows = [[str(i), str(j), repr(float(loads[i, j]))] for i in range(loads.shape[0]) for j in range(loads.shape[1])]
    return {"comments": [], "columns": ["layer", "expert", "tokens"], "header": True, "rows": rows, "sep": ","}


def _index_op(label: str, column: int, value: str, every: bool = False):
    """Set column ``column`` of a drawn row (or of every row) to ``value``."""
    def change(draw, t):
        if not t["rows"]:
            return False
        picked = range(len(t["rows"])) if every else [draw(st.integers(0, len(t["rows"]) - 1))]
        for i in picked:
            t["rows"][i][column] = value
    return _table_op(label, change, stage=1)


ROUTING_CSV_OPS = {k: v for k, v in CSV_OPS.items() if k != "unknown-category"} | {
    "index-100000": _index_op("index-100000", 0, "100000"),
    "index-10000000": _index_op("index-10000000", 1, "10000000"),
    "both-indices-10000000": _table_op("both-indices-10000000", lambda draw, t: t["rows"].append(
        ["10000000", "10000000", "1"]), stage=1),
    "negative-index": _index_op("negative-index", 1, "-1"),
    "all-negative-indices": _index_op("all-negative-indices", 0, "-3", every=True),
    "float-index": _index_op("float-index", 0, "1.5"),
    "index-5000-digits": _index_op("index-5000-digits", 1, "9" * 5000),
    "tokens-1e308-twice": _table_op("tokens-1e308-twice", lambda draw, t: t["rows"].extend(
        [["0", "0", "1e308"], ["0", "0", "1e308"]]), stage=1),
}


def _npz_bytes(arrays: dict, compressed: bool = False) -> bytes:
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return buf.getvalue()


def _npz(doc) -> bytes:
    return _npz_bytes({k: v for k, v in doc.items() if not k.startswith("_")}, bool(doc.get("_compressed")))


def _quietly(make):
    with np.errstate(all="ignore"):
        return make()


def _dtype_op(label: str, convert):
    """Convert float ``loads`` with ``convert``."""
    def op(draw, doc):
        loads = doc.get("loads")
        if not isinstance(loads, np.ndarray) or loads.dtype != np.float64:
            return doc, None
        return {**doc, "loads": convert(loads)}, label
    return 1, op


NPZ_DTYPES = {
    "object-dtype": lambda a: a.astype(object),
    "dtype-complex": lambda a: a + 1j,
    "dtype-bool": lambda a: a > 0,
    "dtype-str": lambda a: a.astype(str),
    "dtype-bytes": lambda a: a.astype("S8"),
    "dtype-datetime": lambda a: a.astype("datetime64[s]"),
    "dtype-structured": lambda a: np.zeros(a.shape, dtype=[("tokens", "<f8"), ("x", "<i4")]),
    "dtype-float16-overflow": lambda a: _quietly(lambda: (a * 1e6).astype(np.float16)),
    "dtype-int8-wrapped": lambda a: _quietly(lambda: a.astype(np.int64).astype(np.int8)),
    "big-endian": lambda a: a.astype(">f8"),
    "fortran-order": np.asfortranarray,
}
NPZ_OPS = {name: _dtype_op(name, convert) for name, convert in NPZ_DTYPES.items()} | {
    "missing-loads": _root("missing-loads", lambda doc: {("load" if k == "loads" else k): v for k, v in doc.items()},
                           1),
    "extra-array": _root("extra-array", lambda doc: {**doc, "junk": np.arange(3)}, 1),
    "compressed": _root("compressed", lambda doc: {**doc, "_compressed": True}, 1),
}


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, allow_pickle=True)
    return buf.getvalue()


def _npy_header(shape: tuple, descr: str = "<f8") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _zip(members: dict[str, bytes], method: int = zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def _valid_loads() -> np.ndarray:
    return np.full(ROUTING_SHAPES["mixtral-8x7b"], 1000.0)


def _zip_member(data: bytes, crc: int, size: int, method: int = zipfile.ZIP_STORED) -> bytes:
    """A hand-written archive of one member ``loads.npy``: ``data`` as given, headers claiming ``crc`` and ``size``."""
    name = b"loads.npy"
    local = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, method, 0, 0, crc, len(data), size, len(name), 0) + name
    central = struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, method, 0, 0, crc, len(data), size, len(name),
                          0, 0, 0, 0, 0, 0) + name
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, len(central), len(local) + len(data), 0)
    return local + data + central + end


def _stored_loads(crc_flip: int = 0, size: int | None = None) -> bytes:
    """Valid loads, stored, with a wrong CRC or a claimed uncompressed ``size``."""
    data = _npy(_valid_loads())
    return _zip_member(data, zlib.crc32(data) ^ crc_flip, len(data) if size is None else size)


@lru_cache(maxsize=None)
def _deflate_bomb(copies: int = 200) -> bytes:
    """``loads.npy`` of 32 x 819,200 zeros (210 MB) deflated to about 200 kB: a full flush after each
    megabyte makes every compressed megabyte alike, so one is compressed and repeated."""
    header, chunk = _npy_header((32, 819_200)), bytes(1 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = deflate.compress(header) + deflate.flush(zlib.Z_FULL_FLUSH)
    block = deflate.compress(chunk) + deflate.flush(zlib.Z_FULL_FLUSH)
    crc = zlib.crc32(header)
    for _ in range(copies):
        crc = zlib.crc32(chunk, crc)
    return _zip_member(head + block * copies + deflate.flush(), crc, len(header) + len(chunk) * copies,
                       zipfile.ZIP_DEFLATED)


@lru_cache(maxsize=None)
def _big_routing_json() -> bytes:
    """About 3 MB of loads: 256 layers x 1,400 experts."""
    return json.dumps({"loads": np.full((256, 1_400), 1234.5).tolist()}).encode()


ROUTING_ATTACKS = {
    "npz-zero-byte": lambda: ("routing.npz", b""),
    "npz-not-a-zip": lambda: ("routing.npz", bytes(range(256)) * 8),
    "npz-truncated-zip": lambda: ("routing.npz", _npz_bytes({"loads": _valid_loads()})[:300]),
    "npz-empty-zip": lambda: ("routing.npz", _zip({})),
    "npz-npy-huge-shape": lambda: ("routing.npz",
                                   _zip({"loads.npy": _npy_header((1_000_000, 1_000_000)) + bytes(64)})),
    "npz-npy-negative-shape": lambda: ("routing.npz", _zip({"loads.npy": _npy_header((-1, 8)) + bytes(64)})),
    "npz-npy-bad-header": lambda: ("routing.npz", _zip({"loads.npy": b"\x93NUMPY\x01\x00\x10\x00{'descr': zz}  \n"})),
    "npz-npy-bad-descr": lambda: ("routing.npz", _zip({"loads.npy": _npy_header((32, 8), "<q99") + bytes(64)})),
    "npz-npy-data-short": lambda: ("routing.npz", _zip({"loads.npy": _npy_header((32, 8)) + bytes(10)})),
    "npz-zip-claims-huge-size": lambda: ("routing.npz", _stored_loads(size=0xFFFFFFFE)),
    "npz-deflate-bomb": lambda: ("routing.npz", _deflate_bomb()),
    "npz-zip-bad-crc": lambda: ("routing.npz", _stored_loads(crc_flip=1)),
    "npz-member-not-npy": lambda: ("routing.npz", _zip({"loads.npy": b"layer,expert,tokens\n0,0,1\n"})),
    "npz-npy-not-npz": lambda: ("routing.npz", _npy(_valid_loads())),
    "npz-pickle-file": lambda: ("routing.npz", pickle.dumps({"loads": _valid_loads().tolist()})),
    "csv-million-rows": lambda: ("routing.csv", b"layer,expert,tokens\n" + b"0,0,1\n" * 1_000_000),
    "csv-zero-byte": lambda: ("routing.csv", b""),
    "json-zero-byte": lambda: ("routing.json", b""),
    "json-big-file": lambda: ("routing.json", _big_routing_json()),
    "json-top-level-nan": lambda: ("routing.json", b"NaN"),
    **{f"json-deep-{n}": lambda n=n: ("routing.json", ('{"loads": ' + _deep("array", n) + "}").encode())
       for n in DEPTHS},
}
ROUTING_NAMES = {"uppercase-suffix": "routing.JSON", "txt": "routing.txt", "no-suffix": "routing",
                 "directory": "routing.json/", "gz": "routing.json.gz"}


def _routing():
    baseline = _routing_baseline()
    json_ops = _on(_lists, _tree_ops(strings=False) | _json_ops() | ROUTING_JSON_OPS)
    near = st.one_of(
        _near_valid("routing", "routing.json", "json", baseline, ROUTING_ARRAY_OPS | json_ops,
                    lambda doc: _json(_lists(doc)), JSON_TEXT_OPS),
        _near_valid("routing", "routing.csv", "csv", baseline,
                    ROUTING_2D_OPS | _on(_routing_table, ROUTING_CSV_OPS),
                    lambda doc: _csv(_routing_table(doc)), TEXT_OPS),
        _near_valid("routing", "routing.npz", "npz", baseline, ROUTING_ARRAY_OPS | NPZ_OPS, _npz, BINARY_OPS),
    )
    return _target(near, [_static("routing", "routing.npz", ROUTING_ATTACKS),
                          _renamed("routing", baseline, lambda doc: _json(_lists(doc)), ROUTING_NAMES)])


_STRATEGIES = {"hardware-db": _hardware_db, "model-yaml": _model_yaml, "config-json": _config_json,
               "routing": _routing, **{t: (lambda t=t: _table_target(t)) for t in TABLE_SAMPLES}}
