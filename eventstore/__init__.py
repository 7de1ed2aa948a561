"""Append-only event store: one contract (`api`), SQLite and PostgreSQL adapters."""
