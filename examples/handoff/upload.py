"""A flaky upload: fails the first $QLFLOW_PARAM_FAILURES times for a Run, then
succeeds. The step's retry policy (3 attempts, 200 ms doubling) absorbs it."""

import json
import os
import sys

with open(os.environ["QLFLOW_INPUTS"]) as handle:
    inputs = json.load(handle)
count = inputs["needs"]["count"]
# how often it ran for this Run: a scratch file beside the Run's step outputs
tries_file = os.path.join(os.path.dirname(os.environ["QLFLOW_OUTPUT"]), "upload.tries")
tries = 0
if os.path.exists(tries_file):
    with open(tries_file) as handle:
        tries = int(handle.read())
with open(tries_file, "w") as handle:
    handle.write(str(tries + 1))
if tries < int(os.environ["QLFLOW_PARAM_FAILURES"]):
    print(f"upload of {count['items']} items failed: connection reset (try {tries + 1})")
    sys.exit(1)
print(f"uploaded {count['items']} items for {count['date']} (try {tries + 1})")
with open(os.environ["QLFLOW_OUTPUT"], "w") as out:
    json.dump({"uploaded": count["items"], "tries": tries + 1}, out)
