"""Example Task: work for WORK_SECONDS, a line a second; on SIGTERM stop and exit 143.

If LONG_PID_FILE is set, the process writes its pid there first (tests use it to
prove the process is gone after a cancellation).
"""

import os
import signal
import sys
import time

tick = 0


def on_term(signum, frame):
    print(f"SIGTERM after {tick} s: stopping", flush=True)
    sys.exit(143)


signal.signal(signal.SIGTERM, on_term)
pid_file = os.environ.get("LONG_PID_FILE")
if pid_file:
    with open(pid_file + ".tmp", "w", encoding="ascii") as handle:
        handle.write(str(os.getpid()))
    os.replace(pid_file + ".tmp", pid_file)  # readers never see a half-written file

seconds = int(os.environ.get("WORK_SECONDS", "600"))
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    print(f"working: {tick} s", flush=True)
    tick += 1
    time.sleep(1)
print("work done", flush=True)
