"""Checks of command-line values made before anything is opened or written, and
the options several commands share."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from domain.transitions import MAX_LEASE_TTL_MS, MIN_LEASE_TTL_MS
from qlflow.cli.exits import CliError

PackageDirOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--package-dir",
        help="Package folder whose Tasks this host runs (repeatable).",
    ),
]
TtlOption = Annotated[int, typer.Option(help="Lease TTL; renewed every TTL/3.")]
DrainOption = Annotated[int, typer.Option(help="On SIGTERM, time running steps get to finish.")]
KillAfterOption = Annotated[int, typer.Option(help="SIGKILL this long after SIGTERM.")]
LogDirOption = Annotated[Path | None, typer.Option(help="Where step logs go.")]
MetricsPortOption = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        help="Serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port).",
    ),
]
MetricsHostOption = Annotated[
    str, typer.Option("--metrics-host", help="Address the metrics server listens on.")
]
LogFormatOption = Annotated[
    str,
    typer.Option(
        "--log-format",
        help="human (the default) or json: one JSON object per line on stderr for every "
        "lease, completion, retry, interruption, schedule fire/skip, store error and drain.",
    ),
]
LOG_FORMATS = ("human", "json")
TracesOption = Annotated[
    bool,
    typer.Option(
        "--traces",
        help="Make an OpenTelemetry trace of every Run that ends (needs qlflow[otel] and a "
        "TracerProvider the host configures, e.g. opentelemetry-instrument).",
    ),
]


def package_folder(path: Path) -> Path:
    """A package folder (or its qlflow.toml) that exists; a clear error otherwise."""
    if not path.exists():
        raise CliError(f"package folder {str(path)!r} does not exist")
    folder = path.parent if path.is_file() else path
    return folder.resolve()


def split_list(values: list[str] | None) -> list[str] | None:
    """Repeatable, comma-separated values as one list (None when none were given)."""
    if not values:
        return None
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def at_least(name: str, value: int | None, low: int = 1) -> None:
    """Refuse an option below `low` (None: not given, fine)."""
    if value is not None and value < low:
        raise CliError(f"{name} must be at least {low}, got {value}")


def check_ttl(ttl_ms: int) -> None:
    """Refuse a lease TTL the domain would refuse, before anything is written."""
    if not MIN_LEASE_TTL_MS <= ttl_ms <= MAX_LEASE_TTL_MS:
        raise CliError(
            f"--ttl-ms must be between {MIN_LEASE_TTL_MS} and {MAX_LEASE_TTL_MS} "
            f"({MIN_LEASE_TTL_MS // 1000} s to {MAX_LEASE_TTL_MS // 60_000} min), got {ttl_ms}"
        )
