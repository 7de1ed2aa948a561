import psycopg
import eventstore.postgres_store as ps
from tests.eventstore.test_concurrency import test_a_tailing_reader_never_skips_an_event_that_commits_late as gap
from tests.conftest import pg_url, pg_server_url  # noqa

def test_broken(pg_url, monkeypatch):
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute("CREATE SEQUENCE gap_seq")
    broken = ps.CREATE_STREAM_AND_INSERT.replace(
        "UPDATE qlflow_position SET last = last + %(count)s WHERE EXISTS (SELECT 1 FROM head) RETURNING last",
        "SELECT max(n) AS last FROM (SELECT nextval('gap_seq') AS n FROM generate_series(1, %(count)s)) s WHERE EXISTS (SELECT 1 FROM head)")
    assert broken != ps.CREATE_STREAM_AND_INSERT
    monkeypatch.setattr(ps, "_INSERT_EVENTS", broken)
    gap(pg_url)
