"""Canonical JSON and domain-separated digests: what every qlflow digest hashes.

Canonical JSON follows RFC 8785 for the values qlflow hashes: object keys sorted
by their UTF-16 code units, no whitespace, UTF-8, strings escaped as ECMAScript
`JSON.stringify` does. Only integers in the I-JSON safe range are numbers:
floats (and NaN, infinities) are refused, because two encoders can print the same
float differently and a digest must never depend on the encoder.

Every digest qlflow computes is written `sha256:<64 lowercase hex>`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from json.encoder import encode_basestring
from typing import Any

from domain.errors import PlanError

DIGEST_PREFIX = "sha256:"
DIGEST_PATTERN = re.compile(r"sha256:[0-9a-f]{64}")
# Stands in for a digest not computed yet: a draft value is built with it, then
# digested without that field, then rebuilt with the digest it gives.
PLACEHOLDER_DIGEST = DIGEST_PREFIX + "0" * 64
MAX_SAFE_INTEGER = 2**53 - 1
MAX_DEPTH = 64


def canonical_bytes(value: Any) -> bytes:
    """Return the canonical JSON encoding of `value` as UTF-8 bytes.

    Accepts dicts (and other mappings) with str keys, lists and tuples, str, int,
    bool and None. Raises PlanError("float") for a float, PlanError("type") for any
    other type or a non-str key, PlanError("integer_range") for an integer outside
    ±(2**53 - 1), PlanError("unicode") for a lone surrogate and PlanError("depth")
    past 64 levels of nesting.
    """
    parts: list[str] = []
    _encode(value, parts, 0, "$")
    text = "".join(parts)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise PlanError("unicode", f"a string holds a lone surrogate: {error.reason}") from None


def domain_digest(domain: str, value: Any) -> str:
    """Return "sha256:" + hex SHA-256 of `domain`, a NUL and `canonical_bytes(value)`.

    The domain separator keeps digests of different kinds of document apart even
    when their canonical JSON happens to be equal.
    """
    return digest_of_canonical(domain, canonical_bytes(value))


def digest_of_canonical(domain: str, encoded: bytes) -> str:
    """`domain_digest` for a value already encoded with `canonical_bytes`."""
    if not isinstance(domain, str) or not domain or "\x00" in domain:
        raise PlanError("type", "a digest domain must be a non-empty string without NUL")
    hasher = hashlib.sha256(domain.encode("utf-8") + b"\x00")
    hasher.update(encoded)
    return DIGEST_PREFIX + hasher.hexdigest()


def is_digest(value: object) -> bool:
    """True when `value` is a digest in qlflow's format ("sha256:" + 64 lowercase hex)."""
    return isinstance(value, str) and DIGEST_PATTERN.fullmatch(value) is not None


def _encode(value: Any, parts: list[str], depth: int, path: str) -> None:
    if depth > MAX_DEPTH:
        raise PlanError("depth", f"{path}: nested deeper than {MAX_DEPTH} levels")
    if value is None:
        parts.append("null")
    elif value is True:
        parts.append("true")
    elif value is False:
        parts.append("false")
    elif isinstance(value, str):
        parts.append(_encode_string(value))
    elif isinstance(value, int):
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise PlanError("integer_range", f"{path}: integer {value} is outside ±(2**53 - 1)")
        parts.append(str(int(value)))
    elif isinstance(value, float):
        raise PlanError("float", f"{path}: {value!r} is a float; canonical JSON has integers only")
    elif isinstance(value, Mapping):
        _encode_object(value, parts, depth, path)
    elif isinstance(value, (list, tuple)):
        parts.append("[")
        for index, item in enumerate(value):
            if index:
                parts.append(",")
            _encode(item, parts, depth + 1, f"{path}[{index}]")
        parts.append("]")
    else:
        raise PlanError("type", f"{path}: {type(value).__name__} is not a JSON value")


def _encode_object(value: Mapping[Any, Any], parts: list[str], depth: int, path: str) -> None:
    for key in value:
        if not isinstance(key, str):
            raise PlanError("type", f"{path}: object key {key!r} is not a string")
    # RFC 8785 orders keys by UTF-16 code units, which differs from code point order
    # for characters above U+FFFF.
    keys = sorted(value, key=_utf16_sort_key)
    parts.append("{")
    for index, key in enumerate(keys):
        if index:
            parts.append(",")
        parts.append(_encode_string(key))
        parts.append(":")
        _encode(value[key], parts, depth + 1, f"{path}.{key}")
    parts.append("}")


def _utf16_sort_key(key: str) -> bytes:
    try:
        return key.encode("utf-16-be")
    except UnicodeEncodeError:
        raise PlanError("unicode", f"object key {key!r} holds a lone surrogate") from None


# The stdlib's non-ASCII string encoder escapes exactly like ECMAScript JSON.stringify:
# \b \f \n \r \t \" \\ short forms, other C0 controls as lowercase \u00xx, the rest as is.
_encode_string = encode_basestring
