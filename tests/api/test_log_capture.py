"""The executor's capture, when the store cannot keep up: what it leaves out is
counted in the stored log's marker (never a note the cap itself would drop)."""

from __future__ import annotations

import qlflow
from eventstore import logs
from qlflow.executor.capture import LogCapture


def test_what_the_capture_left_out_is_counted_by_the_stored_marker(sqlite_url, tmp_path):
    with qlflow.open(sqlite_url) as rt:
        cap = rt.log_cap_bytes
        capture = LogCapture(rt, "wta:capture", tmp_path / "a.log", flush_interval_s=3600)
        written = 0
        chunk = b"y" * 4096
        # the reader's feed, faster than any send (no flusher runs): past 4 caps waiting,
        # only the two ends are kept
        while written < 10 * cap:
            capture._feed(logs.STDOUT, chunk)
            written += len(chunk)
        capture.close()

        state = logs.state(rt.store, "wta:capture")
        markers = [c for c in logs.chunks(rt.store, "wta:capture") if c.stream == logs.DROPPED]
    assert state is not None
    assert state.stored_bytes + state.dropped_bytes == written
    assert state.stored_bytes <= cap
    [marker] = markers
    assert f"{written - state.stored_bytes} bytes of output dropped".encode() in marker.data
    assert (tmp_path / "a.log").stat().st_size == written  # the file keeps everything
