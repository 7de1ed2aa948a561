"""A child process for schedule crash and replica tests:

    python -m tests.schedules.child URL PROFILE SCRIPT_JSON   (PROFILE "default": the store's own)

SCRIPT_JSON: {"manifest": {...}, "published_at_ms": int, "cycles": [now_ms, ...]}.
It publishes (a no-op when the content is already the head) and runs the cycles in
order. Run again after a crash, it replays what was durable and finishes the rest:
each decision depends only on the log and the instant, so the final log is the one
of a run that never crashed. QLFLOW_FAULT may kill it at a commit point.
"""

from __future__ import annotations

import os
import sys

import orjson

import qlflow


def main(url: str, profile: str, script_json: str) -> int:
    script = orjson.loads(script_json)
    rt = qlflow.open(url, None if profile == "default" else profile)
    try:
        rt.publish(script["manifest"], now_ms=script["published_at_ms"])
        # resume at the last durable instant: a cycle never runs before what it follows
        resume_at = max((e.metadata["at_ms"] for e in rt.events()), default=0)
        errors = []
        for now_ms in script["cycles"]:
            if now_ms < resume_at:
                continue
            result = rt.cycle(now_ms=now_ms)
            # another replica holds a schedule: in wall time it is done long before the
            # next instant, so cycle again at this one (simulated time runs ahead)
            for _ in range(200):
                if not (result.schedule.blocked or result.schedule.conflicts):
                    break
                result = rt.cycle(now_ms=now_ms)
            if os.environ.get("CHILD_DEBUG"):
                print(now_ms, result.schedule, file=sys.stderr)
            errors += [
                error
                for phase in ("schedule", "frontier", "claim")
                for error in getattr(result, phase).errors
            ]
        if errors:
            print("\n".join(errors), file=sys.stderr)
    finally:
        rt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
