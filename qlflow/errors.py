"""Typed errors of the public API. Every one says what was wrong and
what to do; catch `QlflowError` for all of them."""

from domain.errors import (
    AdmissionCollision,
    AmbiguousId,
    CorruptionError,
    DurabilityWarning,
    FenceError,
    IdempotencyConflict,
    InvalidInput,
    ManifestError,
    NotFound,
    PlanError,
    QlflowError,
    SchemaError,
    StartGuardError,
    StoreUnavailable,
    VersionConflict,
)

__all__ = [
    "AdmissionCollision",
    "AmbiguousId",
    "CorruptionError",
    "DurabilityWarning",
    "FenceError",
    "IdempotencyConflict",
    "InvalidInput",
    "ManifestError",
    "NotFound",
    "PlanError",
    "QlflowError",
    "SchemaError",
    "StartGuardError",
    "StoreUnavailable",
    "VersionConflict",
]
