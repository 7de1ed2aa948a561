"""The command line's one reader and one writer of times: every option takes ISO-8601,
a duration ago or epoch ms; people read local time with a relative hint."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qlflow.cli import times
from qlflow.cli.exits import CliError

NOW = 1_714_600_000_000  # 2024-05-01T21:46:40Z


@given(st.integers(0, 2**53 - 1))
def test_epoch_ms_reads_as_itself(ms):
    assert times.parse_time("--since", str(ms), NOW) == ms


@given(st.integers(0, 10_000), st.sampled_from(["ms", "s", "m", "h", "d", "w"]))
def test_a_duration_reads_as_that_long_ago(number, unit):
    scale = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
    ago = number * scale[unit]
    if ago <= NOW:
        assert times.parse_time("--since", f"{number}{unit}", NOW) == NOW - ago
    assert times.parse_duration("--older-than", f"{number}{unit}") == ago


def test_durations_in_parts_and_iso_times():
    assert times.parse_duration("--x", "1h30m") == 90 * 60_000
    assert times.parse_duration("--x", "2D") == 2 * 86_400_000
    assert times.parse_time("--x", "2024-05-01T21:46:40Z", 0) == NOW
    assert times.parse_time("--x", "2024-05-01T23:46:40+02:00", 0) == NOW
    local = datetime(2024, 5, 1, 9, 30).astimezone()  # no zone: the machine's local time
    assert times.parse_time("--x", "2024-05-01T09:30", 0) == int(local.timestamp() * 1000)
    assert times.parse_time("--x", "2024-05-01", 0) == int(
        datetime(2024, 5, 1).astimezone().timestamp() * 1000
    )


@pytest.mark.parametrize("bad", ["", "yesterday", "10 minutes", "1.5h", "-5m", "2024-13-01", "m"])
def test_a_bad_time_names_its_option(bad):
    with pytest.raises(CliError, match="--since"):
        times.parse_time("--since", bad, NOW)


def test_people_read_local_time_with_a_relative_hint():
    stamp = datetime.fromtimestamp(NOW / 1000).strftime("%Y-%m-%d %H:%M:%S")
    assert times.when(NOW - 12_000, NOW) == f"{times.local(NOW - 12_000)} (12s ago)"
    assert times.when(NOW, NOW) == f"{stamp} (now)"
    assert times.relative(NOW + 245_000, NOW) == "in 4m05s"
    assert times.relative(NOW - 3 * 86_400_000, NOW) == "3d00h ago"
    assert times.when(None, NOW) == "-"
    assert datetime.fromtimestamp(NOW / 1000, UTC).hour == 21  # NOW is what it says
    assert times.duration(830) == "830ms" and times.duration(4_200) == "4.2s"
