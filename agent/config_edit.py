"""Edit one pipeline's zones, lines and masks in agent.yaml, keeping the rest of the file as written
(the zone editor's save: agent/web/editor.py; docs/web.md, The zone editor).

The file is read with ruamel.yaml's round-trip loader (comments, key order, quoting and flow style
kept on its nodes), the pipeline's `zones`, `lines`, `motion.masks` and `filters.masks` are changed
on those nodes, and the document is dumped. Only the blocks of the keys that changed are taken from
that dump and spliced into the original text by line, so every other byte of the file stays as it
was, whatever a dump of it would have made of it (ruamel writes `null` as nothing, re-indents, ...).
The spliced text must read back as the intended document, then passes the very checks `edge-agent
config validate` makes (the loader's, then the labels against the model: agent/label_check.py);
each problem is mapped to the shape its key path names (`pipelines[0].zones[2].points` -> zone 2).
Only then is the file replaced, atomically, with its mode and owner."""

from __future__ import annotations

import copy
import hashlib
import io
import os
import re
import threading
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError as RuamelError

from agent.config import AgentConfig, PipelineConfig
from agent.config_loader import parse_config
from agent.errors import ConfigError, EdgeAgentError
from agent.fsutil import atomic_write_bytes

Point = tuple[float, float]

# The shapes the editor draws, each kind at its keys below the pipeline.
KINDS = ("zones", "lines", "motion_masks", "object_masks")
PLACES: dict[str, tuple[str, ...]] = {
    "zones": ("zones",),
    "lines": ("lines",),
    "motion_masks": ("motion", "masks"),
    "object_masks": ("filters", "masks"),
}
NAMED = ("zones", "lines")  # the kinds whose shapes have a name
DECIMALS = 3  # points are written as the editor's table shows them

CHANGED_ON_DISK = "the file changed since you opened it: reload the page to edit what it holds now"

_save_lock = threading.Lock()  # one save at a time: the hash check and the write are one step


@dataclass(frozen=True)
class Drawn:
    """A shape as the editor sends it: its points in fractions of the frame. `origin`: its index
    among the file's shapes of its kind (its other keys are kept: labels, dwell_s, ...); None: a
    new one. `moved`: its points changed (else the file's points stay, in their own units).
    `labels`: with `set_labels`, the labels it counts (None: every one; not for motion masks)."""

    points: tuple[Point, ...]
    name: str | None = None
    origin: int | None = None
    moved: bool = True
    labels: tuple[str, ...] | None = None
    set_labels: bool = False


Shapes = Mapping[str, Sequence[Drawn]]  # kind -> its shapes, in the order they are to be written


class Refused(EdgeAgentError):
    """A save refused: `problems` about the file or the pipeline as a whole, `by_shape` those of
    one shape ((kind, index in the editor's list) -> messages, each starting at its key: `points:
    ...`)."""

    def __init__(
        self, problems: list[str] | None = None, by_shape: dict[tuple[str, int], list[str]] | None = None
    ) -> None:
        self.problems = problems or []
        self.by_shape = by_shape or {}
        every = self.problems + [f"{k}[{i}]: {m}" for (k, i), ms in self.by_shape.items() for m in ms]
        super().__init__(every[0] if len(every) == 1 else f"{len(every)} problems: " + "; ".join(every))


@dataclass(frozen=True)
class Saved:
    path: Path
    sha256: str  # of the file now (the editor's next save compares it)
    changed: bool  # False: the shapes were what the file held; nothing was written


def file_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- what the file holds ----------------------------------------------------------------------------


def shapes_of(pipeline: PipelineConfig) -> dict[str, list[dict[str, Any]]]:
    """The pipeline's shapes as the editor shows them: kind -> [{name, units, points, ...}] (points
    as configured, in their units; the page turns pixels into fractions by the frame's size)."""
    motion = pipeline.motion.masks if pipeline.motion is not None else []
    filters = pipeline.filters.masks if pipeline.filters is not None else []
    return {
        "zones": [
            {"name": z.name, "units": z.units, "points": z.points, "labels": z.labels} for z in pipeline.zones
        ],
        "lines": [
            {"name": ln.name, "units": ln.units, "points": ln.points, "labels": ln.labels, "in": ln.in_}
            for ln in pipeline.lines
        ],
        "motion_masks": [{"units": m.units, "points": m.points} for m in motion],
        "object_masks": [{"units": m.units, "points": m.points, "labels": m.labels} for m in filters],
    }


def check_text(text: str, source: str) -> AgentConfig:
    """What `edge-agent config validate` checks, on config text: the loader (file:line: key.path:
    message), then the labels against the model where it is at hand. ConfigError with them all."""
    from agent.label_check import check_config

    config = parse_config(text, source=source)
    labels = check_config(config)
    if labels.problems:
        raise ConfigError(labels.problems, hint="; ".join(dict.fromkeys(labels.hints)))
    return config


# --- the edit ---------------------------------------------------------------------------------------


def edited_text(text: str, pipeline: str, shapes: Shapes) -> str:
    """`text` with `pipeline`'s shapes of the kinds in `shapes` replaced: only the blocks of the
    keys that change are new (module docstring). Refused for what cannot be edited so."""
    check_order(shapes)
    loader = _round_trip()
    try:
        doc = loader.load(text)
    except RuamelError as exc:
        raise Refused([f"the file cannot be read for editing: {exc}"]) from None
    index, item = _pipeline_node(doc, pipeline)
    _indent_as(loader, doc, index, text.splitlines())
    for kind in shapes:
        if kind not in PLACES:
            raise Refused([f"{kind!r} is no kind of shape ({', '.join(KINDS)})"])
    before = copy.deepcopy(_plain(item))
    nested = {kind for kind in shapes if _block_map(item, PLACES[kind][:-1])}
    for kind in shapes:
        _drop_trailing_comments(item, PLACES[kind] if kind in nested else PLACES[kind][:1])
    for kind, drawn in shapes.items():
        _replace(item, kind, drawn)
    after = _plain(item)
    # The block each kind changes: its own key where its parent (motion, filters) stays a mapping
    # of the file, else the pipeline's key.
    paths: list[tuple[str, ...]] = []
    for kind in shapes:
        path = PLACES[kind] if kind in nested and _block_map(item, PLACES[kind][:-1]) else PLACES[kind][:1]
        paths += [] if path in paths else [path]
    changed = [path for path in paths if _get(before, path) != _get(after, path)]
    if not changed:
        return text
    dumped = io.StringIO()
    loader.dump(doc, dumped)
    new_text = dumped.getvalue()
    result = _splice(text, _round_trip().load(text), loader.load(new_text), new_text, index, changed)
    intended = yaml.safe_load(text)
    for path in changed:  # the file as the agent reads it, with what changed as it should be now
        _put(intended["pipelines"][index], path, _get(after, path))
    if yaml.safe_load(result) != intended:
        where = f"pipeline {pipeline}"
        raise Refused([f"{where}: the editor cannot keep the file's layout there: edit it by hand"])
    return result


_MISSING = object()


def _get(node: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return _MISSING
        node = node[key]
    return node


def _put(node: dict[str, Any], path: Sequence[str], value: Any) -> None:
    for key in path[:-1]:
        node = node[key]
    node.pop(path[-1], None)
    if value is not _MISSING:
        node[path[-1]] = value


def _block_map(item: CommentedMap, path: Sequence[str]) -> bool:
    """Whether `path` below the pipeline is a mapping written as a block (keys on lines of their
    own), so that one key of it can be replaced alone."""
    node = _get(item, path)
    return bool(path) and isinstance(node, CommentedMap) and bool(node) and not node.fa.flow_style()


def check_order(shapes: Shapes) -> None:
    """The file's shapes first, in their order (some may be gone), then the new ones: the editor
    never reorders, and the problems name each shape by its place in that list."""
    for kind, drawn in shapes.items():
        origins = [d.origin for d in drawn]
        kept = [o for o in origins if o is not None]
        if kept != sorted(set(kept)) or origins[: len(kept)] != kept:
            raise Refused([f"{kind}: the file's shapes must come first, in their order, then the new ones"])


def _round_trip() -> YAML:
    loader = YAML(typ="rt")
    loader.version = (1, 1)  # as the agent's loader (PyYAML) reads it: a name `off` is written 'off'
    loader.preserve_quotes = True
    loader.width = 4096  # never fold a long flow list of points
    loader.brace_single_entry_mapping_in_flow_sequence = True  # [{points: ...}] stays so
    # `labels: null` stays so (ruamel writes None as nothing: `labels:`)
    loader.representer.add_representer(type(None), _null)
    return loader


def _null(representer: Any, value: None) -> Any:
    return representer.represent_scalar("tag:yaml.org,2002:null", "null")


def _indent_as(loader: YAML, doc: CommentedMap, index: int, lines: list[str]) -> None:
    """Dump with the indentation the file uses for its pipelines: a list's dash and items as under
    `pipelines:`, a mapping's keys as in the pipeline's first nested mapping."""
    pipelines = doc["pipelines"]
    parent = doc.lc.key("pipelines")[1]
    line, column = pipelines.lc.item(index)
    dash = lines[line].rfind("-", 0, column)
    mapping = 2
    item = pipelines[index]
    for key, value in item.items():
        if isinstance(value, CommentedMap) and value and not value.fa.flow_style():
            mapping = value.lc.key(next(iter(value)))[1] - item.lc.key(key)[1]
            break
    if dash < parent:  # not a block list (checked before): the defaults
        return
    loader.indent(mapping=mapping, sequence=column - parent, offset=dash - parent)


def _pipeline_node(doc: Any, name: str) -> tuple[int, CommentedMap]:
    pipelines = doc.get("pipelines") if isinstance(doc, CommentedMap) else None
    if isinstance(pipelines, CommentedSeq):
        for index, item in enumerate(pipelines):
            if isinstance(item, CommentedMap) and item.get("name") == name:
                if item.fa.flow_style():
                    raise Refused([f"pipeline {name} is written as one {{...}}: edit it by hand"])
                return index, item
    raise Refused([f"the file has no pipeline {name!r} (under pipelines:)"])


def _replace(item: CommentedMap, kind: str, drawn: Sequence[Drawn]) -> None:
    """Put `drawn` at `kind`'s keys below the pipeline `item`: the file's shapes kept (their other
    keys, comments and style), changed where drawn so, the new ones appended; none: the key goes."""
    *parents, key = PLACES[kind]
    holder: Any = item
    for parent in parents:  # motion / filters: a mapping (true, false or absent: made one)
        value = holder.get(parent)
        if not isinstance(value, CommentedMap):
            if not drawn:
                return
            value = CommentedMap()
            holder[parent] = value
        holder = value
    old = holder.get(key)
    old_items = list(old) if isinstance(old, CommentedSeq) else []
    keep = {d.origin for d in drawn if d.origin is not None}
    if any(o >= len(old_items) for o in keep):
        raise Refused([f"{kind}: the file has {len(old_items)} of them; reload the page"])
    if not drawn:
        holder.pop(key, None)
        return
    seq = old if isinstance(old, CommentedSeq) else _flow_seq([], flow=False)
    for i in sorted(set(range(len(old_items))) - keep, reverse=True):
        del seq[i]
    for d in drawn:
        if d.origin is not None:
            _update(old_items[d.origin], d)
        else:
            seq.append(_new(kind, d))
    holder[key] = seq


def _update(node: Any, drawn: Drawn) -> None:
    if drawn.name is not None and node.get("name") != drawn.name:
        node["name"] = drawn.name
    _set_labels(node, drawn)
    if drawn.moved:
        points = node.get("points")
        new = [_flow_seq(list(p)) for p in _rounded(drawn.points)]
        if isinstance(points, CommentedSeq):
            points[:] = new  # its style and its comments stay
        else:
            node["points"] = _flow_seq(new)
        if node.get("units") == "pixels":  # the editor's points are fractions, the default units
            del node["units"]


def _new(kind: str, drawn: Drawn) -> CommentedMap:
    node = CommentedMap()
    if kind in NAMED:
        node["name"] = drawn.name
    node["points"] = _flow_seq([_flow_seq(list(p)) for p in _rounded(drawn.points)])
    _set_labels(node, drawn)
    return node


def _set_labels(node: Any, drawn: Drawn) -> None:
    if not drawn.set_labels or list(node.get("labels") or []) == list(drawn.labels or []):
        return
    if drawn.labels:
        node["labels"] = _flow_seq(list(drawn.labels))
    else:
        node.pop("labels", None)  # none: every label, as null says


def _rounded(points: Sequence[Point]) -> list[Point]:
    return [(round(float(x), DECIMALS), round(float(y), DECIMALS)) for x, y in points]


def _flow_seq(items: list[Any], flow: bool = True) -> CommentedSeq:
    seq = CommentedSeq(items)
    if flow:
        seq.fa.set_flow_style()
    return seq


def _drop_trailing_comments(item: CommentedMap, path: Sequence[str]) -> None:
    """The comment lines after the block at `path` (ruamel keeps them on the block's last node) are
    left where they are in the file (`_splice` keeps them there): taken off the node, so that a shape
    appended after that node does not carry them into the block, written twice."""
    node: Any = _get(item, path[:-1]) if len(path) > 1 else item
    if not isinstance(node, CommentedMap) or path[-1] not in node:
        return
    last: Any = path[-1]
    while True:
        value = node[last]
        if not isinstance(value, (CommentedMap, CommentedSeq)) or not value or value.fa.flow_style():
            break
        node, last = value, (list(value)[-1] if isinstance(value, CommentedMap) else len(value) - 1)
    entry = node.ca.items.get(last)
    if not entry:
        return
    for slot, token in enumerate(entry):
        if token is None or not hasattr(token, "value"):
            continue
        first, _, _ = token.value.partition("\n")
        # An end-of-line comment (`dwell_s: 4  # ...`) stays; the lines after it go.
        entry[slot] = None if not first.strip() else _with_value(token, first + "\n")


def _with_value(token: Any, value: str) -> Any:
    token.value = value
    return token


def _plain(node: Any) -> Any:
    """Ruamel's nodes as plain data (what PyYAML, the agent's loader, reads)."""
    if isinstance(node, Mapping):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_plain(v) for v in node]
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return node


# --- the splice -------------------------------------------------------------------------------------


def _splice(
    text: str, doc_before: Any, doc_after: Any, new_text: str, index: int, paths: Sequence[Sequence[str]]
) -> str:
    """`text` with the lines of each of `paths` below pipelines[index] replaced by those lines of
    `new_text` (the dump), re-indented to the original's column."""
    old_lines = text.splitlines(keepends=True)
    new_lines = new_text.splitlines(keepends=True)
    if old_lines and not old_lines[-1].endswith("\n"):
        old_lines[-1] += "\n"
    old_item, new_item = doc_before["pipelines"][index], doc_after["pipelines"][index]
    old_end = _item_end(doc_before, index, old_lines)
    new_end = _item_end(doc_after, index, new_lines)
    edits: list[tuple[int, int, list[str]]] = []
    for path in paths:
        start, end, column = _block_at(old_item, path, old_end, old_lines)
        block: list[str] = []
        if _get(new_item, path) is not _MISSING:
            new_start, new_stop, new_column = _block_at(new_item, path, new_end, new_lines)
            block = [_shifted(line, column - new_column) for line in new_lines[new_start:new_stop]]
        edits.append((start, end, block))
    for start, end, block in sorted(edits, key=lambda e: e[0], reverse=True):
        old_lines[start:end] = block
    return "".join(old_lines)


def _block_at(
    node: CommentedMap, path: Sequence[str], node_end: int, lines: list[str]
) -> tuple[int, int, int]:
    """Lines [start, end) of the block at `path` in the mapping `node` (ending before `node_end`),
    and the column of its key; a key `node` lacks: where it goes, after the mapping's last block."""
    key = path[0]
    if len(path) > 1:
        return _block_at(node[key], path[1:], _key_range(node, key, node_end, lines)[1], lines)
    column = int(node.lc.key(next(iter(node)))[1])
    if key not in node:
        at = _key_range(node, list(node)[-1], node_end, lines)[1]
        return at, at, column
    return (*_key_range(node, key, node_end, lines), column)


def _item_end(doc: Any, index: int, lines: list[str]) -> int:
    """The line after pipelines[index]'s block (0-based, exclusive)."""
    pipelines = doc["pipelines"]
    if index + 1 < len(pipelines):
        return int(pipelines.lc.item(index + 1)[0])
    keys = list(doc)
    after = keys.index("pipelines") + 1
    return int(doc.lc.key(keys[after])[0]) if after < len(keys) else len(lines)


def _key_range(node: CommentedMap, key: str, node_end: int, lines: list[str]) -> tuple[int, int]:
    """Lines [start, end) of `key`'s block in the mapping `node` (which ends before `node_end`),
    without the comment and blank lines after it (they belong to what follows)."""
    keys = list(node)
    at = keys.index(key)
    start = int(node.lc.key(key)[0])
    end = int(node.lc.key(keys[at + 1])[0]) if at + 1 < len(keys) else node_end
    return start, max(start + 1, _trimmed(lines, end))


def _trimmed(lines: list[str], end: int) -> int:
    while end > 0 and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")):
        end -= 1
    return end


def _shifted(line: str, shift: int) -> str:
    if shift >= 0 or not line.strip():
        return " " * shift + line if line.strip() else line
    strip = min(-shift, len(line) - len(line.lstrip(" ")))
    return line[strip:]


# --- the save ---------------------------------------------------------------------------------------


_PROBLEM_AT = re.compile(
    r"^.*?:\d+(?::\d+)?: pipelines\[(?P<pipeline>\d+)\]\."
    r"(?P<kind>zones|lines|motion\.masks|filters\.masks)\[(?P<index>\d+)\]"
    r"(?:\.(?P<rest>\S+?))?: (?P<message>.*)$",
    re.DOTALL,
)
_KIND_OF = {
    "zones": "zones",
    "lines": "lines",
    "motion.masks": "motion_masks",
    "filters.masks": "object_masks",
}


def sorted_problems(problems: Sequence[str], index: int) -> Refused:
    """The validator's problems (`file:line: key.path: message`) of a config whose pipelines[index]
    was edited: each one about a shape of it by that shape, the others as they are."""
    general: list[str] = []
    by_shape: dict[tuple[str, int], list[str]] = {}
    for problem in problems:
        match = _PROBLEM_AT.match(problem)
        if match is None or int(match["pipeline"]) != index:
            general.append(problem)
            continue
        where = (_KIND_OF[match["kind"]], int(match["index"]))
        rest = f"{match['rest']}: " if match["rest"] else ""
        by_shape.setdefault(where, []).append(rest + match["message"])
    return Refused(general, by_shape)


def save_shapes(path: Path, pipeline: str, shapes: Shapes, expected_sha256: str) -> Saved:
    """Replace `pipeline`'s shapes in the config file at `path`, checked as `config validate` checks
    and written atomically (mode and owner kept); Refused with the problems (by shape where they
    are a shape's), the file untouched. `expected_sha256`: the file's hash when the editor read it
    (a file changed since is refused: CHANGED_ON_DISK)."""
    with _save_lock:
        try:
            data = path.read_bytes()
            text = data.decode("utf-8")
        except OSError as exc:
            raise Refused([f"{path}: cannot read it: {exc.strerror or exc}"]) from None
        except UnicodeDecodeError:
            raise Refused([f"{path}: not UTF-8 text"]) from None
        if file_hash(data) != expected_sha256:
            raise Refused([CHANGED_ON_DISK])
        new_text = edited_text(text, pipeline, shapes)
        if new_text == text:
            return Saved(path, expected_sha256, changed=False)
        index = _pipeline_node(_round_trip().load(new_text), pipeline)[0]
        try:
            config = check_text(new_text, str(path))
        except ConfigError as exc:
            raise sorted_problems(exc.problems, index) from None
        _gate_unchanged(parse_config(text, source=str(path)), config, pipeline)
        encoded = new_text.encode("utf-8")
        write_keeping_mode(path, encoded)
        return Saved(path, file_hash(encoded), changed=True)


def _gate_unchanged(old: AgentConfig, new: AgentConfig, name: str) -> None:
    """Motion masks must not turn a gate on where none ran (a video file's pipeline, no `motion:`)."""
    before = next(p for p in old.pipelines if p.name == name).motion_gate
    after = next(p for p in new.pipelines if p.name == name).motion_gate
    if before is None and after is not None:
        why = f"pipeline {name} runs no motion gate, so motion masks would turn one on"
        raise Refused([f"{why}: write motion: true (docs/analytics.md, Motion gate) first"])


def write_keeping_mode(path: Path, data: bytes) -> None:
    """Replace the file atomically, keeping its mode and owner (refused before writing when its
    owner could not be kept)."""
    try:
        st = path.stat()
    except OSError as exc:
        raise Refused([f"{path}: {exc.strerror or exc}"]) from None
    root = os.geteuid() == 0
    if not root and (st.st_uid != os.geteuid() or st.st_gid not in (os.getegid(), *os.getgroups())):
        owner = f"uid {st.st_uid} gid {st.st_gid}"
        how = "edit it by hand, or let the editor save there: scripts/install.sh --editable-config"
        raise Refused([f"{path} belongs to {owner}: the daemon could not keep that owner: {how}"])
    mode = st.st_mode & 0o7777
    try:
        atomic_write_bytes(path, data, mode=mode)
        os.chmod(path, mode)  # the umask took bits off the new file's mode
        if (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
            os.chown(path, st.st_uid, st.st_gid)
    except OSError as exc:
        why = f"the daemon must be able to write its folder {path.parent}: docs/web.md, The zone editor"
        raise Refused([f"cannot write {path}: {exc.strerror or exc} ({why})"]) from None


def replace_in(pipeline: MutableMapping[str, Any], shapes: Shapes) -> dict[str, Any]:
    """A pipeline as plain data (a fleet document's) with its shapes replaced, the same way the file
    is edited (the shapes' other keys kept): the snippet the editor offers where the fleet's desired
    state runs the pipeline."""
    node = _to_ruamel(pipeline)
    for kind, drawn in shapes.items():
        _replace(node, kind, drawn)
    result: dict[str, Any] = _plain(node)
    return result


def _to_ruamel(value: Any) -> Any:
    if isinstance(value, Mapping):
        node = CommentedMap()
        for k, v in value.items():
            node[k] = _to_ruamel(v)
        return node
    if isinstance(value, (list, tuple)):
        return CommentedSeq([_to_ruamel(v) for v in value])
    return value
