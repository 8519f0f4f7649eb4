"""The config file as the settings read it: YAML refused where it cannot mean a config
(duplicate keys, any tag, an empty file, a top level that is not a mapping, bytes that are not
UTF-8), each refusal one message naming the file, line, column and key path, and the line of
every key kept so that a validation error can point at it too."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from shared.errors import ConfigError

KeyPath = tuple[str | int, ...]
"""Where a value sits in the config, as pydantic reports it: `("metrics", 0, "grace")`."""

_TAG = "tag:yaml.org,2002:"
_PLAIN_TAGS = frozenset(_TAG + t for t in ("null", "bool", "int", "float", "str"))
"""What an untagged scalar may resolve to (a collection always resolves to a list or mapping)."""
_MERGE_TAG = _TAG + "merge"
_YAML_HINT = (
    "fix the YAML there: check the indentation, closing brackets and quotes, and quote a value "
    "that contains ': ' or ' #'"
)


def dotted(path: KeyPath) -> str:
    return ".".join(str(part) for part in path) or "(top level)"


def _short_tag(tag: str) -> str:
    return "!!" + tag.removeprefix(_TAG) if tag.startswith(_TAG) else tag


def _position(text: str, index: int) -> str:
    """`line:column`, both from 1, of a character of `text`."""
    line = text.count("\n", 0, index) + 1
    column = index - text.rfind("\n", 0, index)
    return f"{line}:{column}"


class ConfigLoader(yaml.SafeLoader):
    """`yaml.safe_load` keeps the last of two equal keys without a word, reads an empty file
    as no settings and fails with a traceback that names no setting. This loader refuses what
    a config cannot mean, says where (file, line, column, key path) and what to write, and
    records the line of every key so a validation error can point at it too."""

    def __init__(self, text: str, path: str) -> None:
        super().__init__(text)
        self.text = text
        self.path = path
        self.lines: dict[KeyPath, int] = {}
        self._checked: set[int] = set()
        self._tags: dict[int, str] = {}
        """The tag written before a node (`!!python/tuple`, `!!str`, `!custom`), by id: the
        composed node keeps no mark of whether its tag was written or resolved."""

    def load_config(self) -> dict[str, Any]:
        try:
            root = self.get_single_node()
            if root is None:
                raise ConfigError(
                    f"{self.path}:1: the file is empty; write the settings as a YAML mapping "
                    "(`sources:`, `metrics:`... as in lambda.yaml), or unset LAMBDA_CONFIG "
                    "to run with the defaults"
                )
            self._check(root, ())
            if not isinstance(root, yaml.MappingNode):
                found = "a list" if isinstance(root, yaml.SequenceNode) else f"{root.value!r}"
                raise self._refusal(
                    root,
                    (),
                    f"the file holds {found}, but it must be a mapping of settings: "
                    "`sources:`, `metrics:`, `batch:`... each at the start of a line",
                )
            data: dict[str, Any] = self.construct_document(root)
            return data
        except yaml.MarkedYAMLError as exc:
            raise ConfigError(self._describe_yaml_error(exc)) from None
        finally:
            self.dispose()

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()
        tag = getattr(event, "tag", None)  # an alias (`*name`) has none of its own
        node = super().compose_node(parent, index)
        if tag is not None and node is not None:
            self._tags[id(node)] = tag
        return node

    def _describe_yaml_error(self, exc: yaml.MarkedYAMLError) -> str:
        mark = exc.problem_mark or exc.context_mark
        where = f"{self.path}:{mark.line + 1}:{mark.column + 1}" if mark else self.path
        problem = exc.problem or exc.context or "unreadable YAML"
        if exc.context and exc.problem and exc.context_mark:
            problem = f"{exc.context} (line {exc.context_mark.line + 1}): {exc.problem}"
        return f"{where}: invalid YAML: {problem}; {_YAML_HINT}"

    def _refusal(self, node: yaml.Node, path: KeyPath, problem: str) -> ConfigError:
        mark = node.start_mark
        where = f" {dotted(path)}:" if path else ""
        return ConfigError(f"{self.path}:{mark.line + 1}:{mark.column + 1}:{where} {problem}")

    def _check(self, node: yaml.Node, path: KeyPath) -> None:
        """Refuse every tag written in the file (a `!!python/...` tag is also how a YAML file
        runs code, and a config needs none), values YAML reads as something no setting takes,
        non-string and duplicate keys."""
        if id(node) in self._checked:
            return
        self._checked.add(id(node))
        tag = self._tags.get(id(node))
        if tag is not None:
            raise self._refusal(
                node,
                path,
                f"YAML tags are not allowed (found {_short_tag(tag)!r}); write plain values "
                "(quote one meant as text)",
            )
        if isinstance(node, yaml.ScalarNode):
            self._check_scalar(node, path)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self.lines[(*path, index)] = item.start_mark.line + 1
                self._check(item, (*path, index))
        elif isinstance(node, yaml.MappingNode):
            self._check_mapping(node, path)

    def _check_scalar(self, node: yaml.ScalarNode, path: KeyPath) -> None:
        """An untagged value YAML resolves to a kind no setting takes (`2026-01-01`, a
        timestamp) or cannot construct (`0b_`, an int without digits)."""
        kind = node.tag.removeprefix(_TAG)
        if node.tag not in _PLAIN_TAGS:
            raise self._refusal(
                node,
                path,
                f"{node.value} reads as a {kind}, which no setting takes; "
                f"quote it if it is text ('{node.value}')",
            )
        try:
            self.construct_object(node)
        except ValueError:
            raise self._refusal(
                node,
                path,
                f"{node.value!r} reads as a {kind} but is not a valid one; quote it if it is "
                f"text ('{node.value}')",
            ) from None

    def _check_mapping(self, node: yaml.MappingNode, path: KeyPath) -> None:
        first_line: dict[str, int] = {}
        merges_first = sorted(node.value, key=lambda pair: pair[0].tag != _MERGE_TAG)
        for key_node, value_node in merges_first:
            if key_node.tag == _MERGE_TAG:
                merged = (
                    value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                )
                for source in merged:
                    self._check(source, path)
                continue
            if key_node.tag == _TAG + "bool" and isinstance(key_node, yaml.ScalarNode):
                # YAML 1.1 reads a plain `on`, `yes` or `off` as a boolean; a key is a name
                # (a lookup's `on:`), so it keeps its text.
                key_node.tag = _TAG + "str"
            self._check(key_node, path)
            key = self.construct_object(key_node)
            if not isinstance(key, str):
                written = self.text[key_node.start_mark.index : key_node.end_mark.index]
                raise self._refusal(
                    key_node,
                    path,
                    f"the key {written} reads as a {type(key).__name__}, not as a name; "
                    f"quote it ('{written}') or rename it",
                )
            line = key_node.start_mark.line + 1
            if key in first_line:
                raise self._refusal(
                    key_node,
                    (*path, key),
                    f"duplicate key {key!r}, also set at line {first_line[key]}; YAML would "
                    f"silently keep only the last one: keep one `{key}:` and delete the other",
                )
            first_line[key] = line
            self.lines[(*path, key)] = line
            self._check(value_node, (*path, key))


@dataclass(frozen=True)
class ConfigFile:
    """A config file as the settings read it, and the line of every key in it."""

    path: str
    data: dict[str, Any]
    lines: Mapping[KeyPath, int]

    @classmethod
    def read(cls, path: str) -> ConfigFile:
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(
                f"{path}: cannot be read ({exc.strerror}); point LAMBDA_CONFIG at a readable "
                "YAML file"
            ) from None
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            where = _position(raw.decode("latin-1"), exc.start)
            raise ConfigError(
                f"{path}:{where}: byte 0x{raw[exc.start]:02x} is not UTF-8 text; the config "
                "must be a YAML file saved as UTF-8 (is this a binary file?)"
            ) from None
        try:
            loader = ConfigLoader(text, path)
        except yaml.reader.ReaderError as exc:
            raise ConfigError(
                f"{path}:{_position(text, exc.position)}: character U+{exc.character:04X} is "
                "not allowed in YAML; the config must be UTF-8 text without control characters"
            ) from None
        return cls(path, loader.load_config(), loader.lines)

    def line_of(self, loc: KeyPath) -> int | None:
        """The line of `loc` or of its nearest enclosing key: a missing field is reported at
        the mapping that lacks it."""
        for end in range(len(loc), 0, -1):
            line = self.lines.get(loc[:end])
            if line is not None:
                return line
        return None
