"""Read both outputs from $QLFLOW_INPUTS and report."""

import json
import os

with open(os.environ["QLFLOW_INPUTS"]) as handle:
    inputs = json.load(handle)
count, upload = inputs["needs"]["count"], inputs["needs"]["upload"]
line = (
    f"{inputs['params']['date']}: {count['items']} items counted, "
    f"{upload['uploaded']} uploaded after {upload['tries']} tries"
)
print(line)
with open(os.environ["QLFLOW_OUTPUT"], "w") as out:
    json.dump({"report": line}, out)
