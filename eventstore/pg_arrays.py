"""Arrays sent to PostgreSQL in its binary array format, built in one pass, and rows
sent as one jsonb value.

Every write sends its events as arrays, one per column (`qlflow_append`'s batch).
psycopg's own list dumper looks up a dumper for the list, then for each element, and
writes the array element by element in Python: for the short arrays of a write that
was a fifth of the client's time in a `cancel` or a `complete` on PostgreSQL. A list
of one of the classes here says its element type, so its array is written directly
(`struct` and `bytes.join`).

The read models' upserts send their rows as one jsonb array of arrays (`JsonRows`,
by orjson), each value read back with `->>` and a cast: a row of forty columns is one
`orjson.dumps`, not forty arrays (a tenth of the client's time). A table with a
column of another type (bytea) keeps the arrays.

A connection sends them once `register(conn)` has added the dumpers.
"""

from __future__ import annotations

import struct
from typing import Any

import orjson
import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

_NULL = b"\xff\xff\xff\xff"
_HEADER = struct.Struct("!iiIii")  # dimensions, has nulls, element oid, length, lower bound
_EMPTY = struct.Struct("!iiI")  # an empty array has no dimension
_LENGTH = struct.Struct("!i")
_INT8 = b"\x00\x00\x00\x08"
_INT4 = b"\x00\x00\x00\x04"
_BOOL = (b"\x00\x00\x00\x01\x00", b"\x00\x00\x00\x01\x01")


class TextArray(list[Any]):
    """A list of str (or None) sent as text[]."""


class Int8Array(list[Any]):
    """A list of int (or None) sent as bigint[]."""


class Int4Array(list[Any]):
    """A list of int (or None) sent as integer[]."""


class BoolArray(list[Any]):
    """A list of bool (or None) sent as boolean[]."""


class ByteaArray(list[Any]):
    """A list of bytes (or None) sent as bytea[]."""


class JsonRows(list[Any]):
    """Rows (sequences of str, int, bool or None) sent as one jsonb array of arrays."""


def _text(value: Any) -> bytes:
    data: bytes = value.encode()
    return _LENGTH.pack(len(data)) + data


def _int8(value: Any) -> bytes:
    return _INT8 + int.to_bytes(value, 8, "big", signed=True)


def _int4(value: Any) -> bytes:
    return _INT4 + int.to_bytes(value, 4, "big", signed=True)


def _bool(value: Any) -> bytes:
    return _BOOL[bool(value)]


def _bytea(value: Any) -> bytes:
    data = bytes(value)
    return _LENGTH.pack(len(data)) + data


class _ArrayDumper(Dumper):
    format = Format.BINARY
    element_oid = 0
    encode_element = staticmethod(_text)

    def dump(self, obj: Any) -> bytes:
        if not obj:
            return _EMPTY.pack(0, 0, self.element_oid)
        encode = self.encode_element
        try:
            parts = [_NULL if value is None else encode(value) for value in obj]
        except (AttributeError, TypeError, OverflowError) as exc:
            raise psycopg.DataError(
                f"{type(obj).__name__}: an element is not of the array's type ({exc})"
            ) from exc
        header = _HEADER.pack(1, None in obj, self.element_oid, len(obj), 1)
        return header + b"".join(parts)


class _TextArrayDumper(_ArrayDumper):
    oid, element_oid, encode_element = 1009, 25, staticmethod(_text)


class _Int8ArrayDumper(_ArrayDumper):
    oid, element_oid, encode_element = 1016, 20, staticmethod(_int8)


class _Int4ArrayDumper(_ArrayDumper):
    oid, element_oid, encode_element = 1007, 23, staticmethod(_int4)


class _BoolArrayDumper(_ArrayDumper):
    oid, element_oid, encode_element = 1000, 16, staticmethod(_bool)


class _ByteaArrayDumper(_ArrayDumper):
    oid, element_oid, encode_element = 1001, 17, staticmethod(_bytea)


class _JsonRowsDumper(Dumper):
    format = Format.BINARY
    oid = 3802  # jsonb: its binary form is a version byte, then the text

    def dump(self, obj: Any) -> bytes:
        return b"\x01" + orjson.dumps(obj)


# the column types whose values a JSON array carries exactly (`->>` then a cast)
JSON_COLUMN_TYPES = frozenset({"text", "bigint", "integer", "boolean"})

_DUMPERS: dict[type, type[Dumper]] = {
    TextArray: _TextArrayDumper,
    Int8Array: _Int8ArrayDumper,
    Int4Array: _Int4ArrayDumper,
    BoolArray: _BoolArrayDumper,
    ByteaArray: _ByteaArrayDumper,
    JsonRows: _JsonRowsDumper,
}
# a column's type as the catalog names it (format_type) -> the array class for it
BY_COLUMN_TYPE: dict[str, type[list[Any]]] = {
    "text": TextArray,
    "bigint": Int8Array,
    "integer": Int4Array,
    "boolean": BoolArray,
    "bytea": ByteaArray,
}


def register(conn: psycopg.Connection) -> None:
    """Let `conn` send the array classes of this module."""
    for kind, dumper in _DUMPERS.items():
        conn.adapters.register_dumper(kind, dumper)


def column_array(column_type: str, values: list[Any]) -> list[Any]:
    """`values` as the array class of a column of `column_type` (psycopg's own list
    for a type without one here)."""
    kind = BY_COLUMN_TYPE.get(column_type)
    return values if kind is None else kind(values)
