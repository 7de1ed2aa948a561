"""Fixtures of the least-privilege role tests: a fresh schema with its roles set up
(`actors.roles`), dropped with its roles afterwards, and runtimes opened as
those roles."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

import qlflow
from actors import roles as pg_roles
from eventstore import faults


def migrate_as_owner(owner_url: str) -> None:
    """Create every table as the owner: opening the runtime migrates each component."""
    qlflow.open(owner_url).close()


@pytest.fixture
def roles(pg_server_url: str) -> Iterator[pg_roles.RoleUrls]:
    """A fresh schema whose tables belong to its owner role, with every role set up."""
    suffix = uuid.uuid4().hex[:12]
    schema, prefix = f"r_{suffix}", f"q{suffix}"
    try:
        yield pg_roles.setup_roles(pg_server_url, schema, prefix, migrate=migrate_as_owner)
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '10s'")
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        pg_roles.drop_roles(pg_server_url, prefix)


class RoleSplitRuntime:
    """The public API with each call made as the role a deployment would use:
    publishing and publisher trust as publisher-admin, everything else (admission,
    the cycle, workers, reads) as the runtime role."""

    PUBLISHER_CALLS = ("publish", "withdraw", "quarantine", "revoke_publisher")

    def __init__(self, runtime, publisher) -> None:
        self.runtime = runtime
        self.publisher = publisher

    def __getattr__(self, name: str):
        if name in self.PUBLISHER_CALLS:
            return getattr(self.publisher, name)
        return getattr(self.runtime, name)

    def close(self) -> None:
        self.runtime.close()
        self.publisher.close()


@pytest.fixture
def rt(roles) -> Iterator[RoleSplitRuntime]:
    """A runtime on the runtime role, publishing through the publisher-admin role."""
    runtime = RoleSplitRuntime(qlflow.open(roles.runtime), qlflow.open(roles.publisher))
    try:
        yield runtime
    finally:
        runtime.close()
        faults.disarm()


class OwnerChecks(RoleSplitRuntime):
    """`RoleSplitRuntime` with verify and rebuild as the owner (the runtime role may
    not read the publications some read models fold)."""

    OWNER_CALLS = ("verify_projections", "rebuild_projections")

    def __init__(self, runtime, publisher, owner) -> None:
        super().__init__(runtime, publisher)
        self.owner = owner

    def __getattr__(self, name: str):
        if name in self.OWNER_CALLS:
            return getattr(self.owner, name)
        return super().__getattr__(name)

    def close(self) -> None:
        super().close()
        self.owner.close()


@pytest.fixture
def rt_owner_checks(roles) -> Iterator[OwnerChecks]:
    """`rt`, with verify and rebuild made as the owner."""
    runtime = OwnerChecks(
        qlflow.open(roles.runtime), qlflow.open(roles.publisher), qlflow.open(roles.owner)
    )
    try:
        yield runtime
    finally:
        runtime.close()
        faults.disarm()
