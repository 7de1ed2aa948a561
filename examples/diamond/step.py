"""Example Task of the diamond: print what it is, and fail when asked to (exit 1)."""

import os
import sys

name = sys.argv[1]
run_id = os.environ.get("QLFLOW_RUN_ID", "manual")
if "--fail" in sys.argv[2:]:
    print(f"step {name} of run {run_id}: failing on purpose", file=sys.stderr)
    sys.exit(1)
print(f"step {name} of run {run_id}: done")
