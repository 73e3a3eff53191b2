"""An ONNX file's small top-level fields (metadata_props, opset_import) read from the protobuf wire
format field by field, seeking past the graph. The daemon reads them on every start; parsing the file
with the onnx package would import it (~60 ms, ~11 MB resident) and hold the whole graph in memory.

Field numbers from onnx/onnx.proto3: ModelProto has `repeated OperatorSetIdProto opset_import = 8`
(`string domain = 1; int64 version = 2`) and `repeated StringStringEntryProto metadata_props = 14`
(`string key = 1; string value = 2`). Each reader raises ValueError when the file is not a
well-formed protobuf message.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

_OPSET_IMPORT, _METADATA_PROPS = 8, 14
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


def onnx_metadata_props(path: Path) -> dict[str, str]:
    """The file's `metadata_props` as a dict."""
    props: dict[str, str] = {}
    for entry in _top_level(path, _METADATA_PROPS):
        fields = _fields(entry)
        key, value = fields.get(1, b""), fields.get(2, b"")
        if not isinstance(key, bytes) or not isinstance(value, bytes):
            raise ValueError("a metadata_props entry holds a number where ONNX has a string")
        props[key.decode()] = value.decode()
    return props


def onnx_default_opset(path: Path) -> int | None:
    """The opset of the default (ai.onnx) domain the file imports; None when it names none."""
    for entry in _top_level(path, _OPSET_IMPORT):
        fields = _fields(entry)
        domain, version = fields.get(1, b""), fields.get(2)
        if domain in (b"", b"ai.onnx") and isinstance(version, int):
            return version
    return None


def _top_level(path: Path, wanted: int) -> Iterator[bytes]:
    """The bytes of each length-delimited top-level field numbered `wanted`; the rest is skipped."""
    with open(path, "rb") as stream:
        size = os.fstat(stream.fileno()).st_size
        while stream.tell() < size:
            field, wire_type = _split_key(_read_varint(stream))
            if wire_type == _VARINT:
                _read_varint(stream)
            elif wire_type in (_FIXED64, _FIXED32):
                stream.seek(8 if wire_type == _FIXED64 else 4, os.SEEK_CUR)
            elif wire_type == _LENGTH:
                length = _read_varint(stream)
                if stream.tell() + length > size:
                    raise ValueError(f"field {field} runs past the end of the file")
                if field == wanted:
                    yield stream.read(length)
                else:
                    stream.seek(length, os.SEEK_CUR)
            else:
                raise ValueError(f"field {field} has wire type {wire_type}, which ONNX files do not use")


def _fields(message: bytes) -> dict[int, int | bytes]:
    """A small message's fields (the last of a repeated one): varints as ints, strings as bytes."""
    stream = io.BytesIO(message)
    fields: dict[int, int | bytes] = {}
    while stream.tell() < len(message):
        field, wire_type = _split_key(_read_varint(stream))
        if wire_type == _VARINT:
            fields[field] = _read_varint(stream)
        elif wire_type == _LENGTH:
            length = _read_varint(stream)
            if stream.tell() + length > len(message):
                raise ValueError(f"field {field} runs past the end of its message")
            fields[field] = stream.read(length)
        else:
            raise ValueError(f"field {field} has wire type {wire_type} inside a small message")
    return fields


def _split_key(key: int) -> tuple[int, int]:
    return key >> 3, key & 7


def _read_varint(stream: BinaryIO) -> int:
    value = 0
    for shift in range(0, 64, 7):
        byte = stream.read(1)
        if not byte:
            raise ValueError("the file ends inside a field")
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
    raise ValueError("a varint longer than 10 bytes")
