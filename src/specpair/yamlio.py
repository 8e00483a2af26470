"""Every YAML input specpair reads (health policies, release files, inventories), with limits.

``load_yaml(path)`` reads at most MAX_BYTES of a regular file (specpair.files) and parses it
with a SafeLoader that refuses, before anything is constructed:

- more than MAX_ALIASES aliases (``*name``), and nesting deeper than MAX_DEPTH;
- a document whose nodes, counted with every alias expanded, exceed MAX_NODES: the
  "billion laughs" (nine anchors of nine aliases of the one before) is refused after composing
  its ~100 nodes, not after building 10^9;
- a recursive alias (an anchor used inside itself).

Errors are one ``YamlRefused`` naming the file, what is wrong and where (line, column), never
the value itself; ``excerpt`` gives error messages a bounded repr of a loaded value.
"""

from __future__ import annotations

import reprlib
from pathlib import Path
from typing import Any

import yaml

from specpair.errors import SpecpairError
from specpair.files import FileRefused, read_small

__all__ = ["MAX_BYTES", "MAX_ALIASES", "MAX_DEPTH", "MAX_NODES", "YamlRefused", "load_yaml",
           "loads_yaml", "excerpt"]

MAX_BYTES = 1 << 20  # 1 MiB: the largest YAML file read
MAX_ALIASES = 100  # aliases per document
MAX_DEPTH = 64  # nested collections
MAX_NODES = 200_000  # nodes of a document with every alias expanded


class YamlRefused(SpecpairError, ValueError):
    """A YAML input is unreadable, malformed or over one of the limits."""


def _where(mark: Any) -> str:
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""


class _Loader(yaml.SafeLoader):
    """SafeLoader that counts aliases and depth while composing, and expanded nodes after."""

    def __init__(self, stream: bytes | str) -> None:
        super().__init__(stream)
        self.aliases = 0
        self.depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise YamlRefused(f"more than {MAX_ALIASES} aliases"
                                  f"{_where(self.peek_event().start_mark)}")
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise YamlRefused(f"nested deeper than {MAX_DEPTH}"
                                  f"{_where(self.peek_event().start_mark)}")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def compose_document(self) -> Any:
        node = super().compose_document()
        _check_expanded(node)
        return node


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_expanded(root: yaml.Node) -> None:
    """Refuse a recursive alias, or more than MAX_NODES nodes once aliases are expanded."""
    size: dict[int, int] = {}  # id(node) -> nodes under it, aliases expanded
    open_: set[int] = set()  # nodes on the current path (a cycle comes back to one)
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in _children(node))
            if size[key] > MAX_NODES:
                raise YamlRefused(f"more than {MAX_NODES} nodes once aliases are expanded"
                                  f"{_where(node.start_mark)}")
        elif key not in size:
            if key in open_:
                raise YamlRefused(f"a recursive alias{_where(node.start_mark)}")
            open_.add(key)
            stack.append((node, True))
            stack.extend((c, False) for c in _children(node))


def loads_yaml(data: bytes | str, where: str) -> Any:
    """Parse one YAML document (bytes or text) under the limits; ``where`` names its source."""
    if len(data) > MAX_BYTES:
        raise YamlRefused(f"{where}: {len(data)} bytes of YAML; at most {MAX_BYTES}")
    loader = None
    try:
        loader = _Loader(data)
        return loader.get_single_data()
    except YamlRefused as e:
        raise YamlRefused(f"{where}: {e}") from None
    except yaml.MarkedYAMLError as e:
        what = " ".join(x for x in (e.context, e.problem) if x)
        raise YamlRefused(f"{where}: not valid YAML: {what}{_where(e.problem_mark)}") from None
    except yaml.YAMLError as e:
        raise YamlRefused(f"{where}: not valid YAML: {' '.join(str(e).split())[:200]}") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml(path: str | Path, what: str = "YAML file") -> Any:
    """Read and parse the YAML file ``path`` under the limits (``what`` names it in errors)."""
    try:
        data = read_small(path, MAX_BYTES, what)
    except FileRefused as e:
        raise YamlRefused(str(e)) from None
    return loads_yaml(data, f"{what} {path}")


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 60, 60


def excerpt(value: Any, limit: int = 80) -> str:
    """A repr of ``value`` for an error message, at most ``limit`` characters."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
