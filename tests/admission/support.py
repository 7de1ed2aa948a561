"""Helpers shared by the admission and publishing tests: a migrated store, the
example package, and a census of what the log and the read models hold."""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import eventstore
from actors import admission, publishing
from domain.values import AdmissionReceipt, Publication
from projections import registry

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "nightly"
T0 = 1_700_000_000_000


@contextmanager
def migrated_store(url: str) -> Iterator[Any]:
    """Open the store at `url` with every projection schema in place."""
    store = eventstore.open_store(url)
    try:
        registry.migrate_all(store)
        yield store
    finally:
        store.close()


def copy_example(tmp_path: Path, name: str = "nightly") -> Path:
    folder = tmp_path / name
    shutil.copytree(EXAMPLE, folder)
    return folder


def manifest(
    *,
    name: str = "demo",
    publisher: str = "acme",
    steps: tuple[tuple[str, tuple[str, ...]], ...] = (("a", ()), ("b", ("a",))),
    workflow: str = "flow",
    command: tuple[str, ...] = ("true",),
    workflow_enabled: bool = True,
    extra_package: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A manifest dict: one Task per step key, one Workflow."""
    return {
        "package": {"name": name, "publisher": publisher, **(extra_package or {})},
        "tasks": {key: {"command": list(command)} for key, _ in steps},
        "workflows": {
            workflow: {
                "steps": [{"key": key, "task": key, "needs": list(needs)} for key, needs in steps],
                "enabled": workflow_enabled,
            }
        },
    }


def publish(store, source: Any, now_ms: int = T0) -> Publication:
    """Publish a folder or manifest dict in one transaction."""
    from qlflow.packages import load

    loaded = load(source)
    with store.transaction() as tx:
        return publishing.publish_in_tx(tx, loaded, now_ms)


def admit(
    store,
    package: str,
    workflow: str,
    key: str | None = None,
    *,
    run_id: str | None = None,
    timeout_ms: int | None = None,
    now_ms: int = T0,
) -> AdmissionReceipt:
    """Admit in one transaction of its own."""
    with store.transaction() as tx:
        return admission.admit_in_tx(tx, package, workflow, key, run_id, timeout_ms, now_ms)


def census(store) -> dict[str, int]:
    """Counts of records per stream kind and of read-model rows."""
    records = store.read_all()
    kinds = Counter(record.stream_id.split("-", 1)[0] for record in records)
    return {
        "events": len(records),
        "run_events": kinds["run"],
        "mutations": kinds["steps"],
        "receipt_events": kinds["admission"],
        "publication_events": kinds["publication"],
        "publisher_events": kinds["publisher"],
        "runs": store.query("SELECT COUNT(*) FROM runs")[0][0],
        "step_runs": store.query("SELECT COUNT(*) FROM step_runs")[0][0],
        "receipts": store.query("SELECT COUNT(*) FROM admission_receipts")[0][0],
        "publications": store.query("SELECT COUNT(*) FROM publications")[0][0],
    }


def table_rows(store, table: str, order_by: str) -> list[tuple]:
    return [tuple(row) for row in store.query(f"SELECT * FROM {table} ORDER BY {order_by}")]
