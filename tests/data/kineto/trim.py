"""Trim a public Kineto trace to its first profiled steps, for the test data beside this file.

    python tests/data/kineto/trim.py SOURCE.json[.gz] DEST.json.gz [STEPS]

Keeps the trace's own fields (``distributedInfo``, ``deviceProperties``,
``baseTimeNanoseconds``, ...), its metadata events (``ph: M``), every host event that starts
within the first ``STEPS`` (default 1) ``ProfilerStep#k`` ranges of the thread that ran them,
and the device events launched from a kept host launch (by ``correlation``) or, without a
launch, starting within those steps. Nothing is rewritten: the kept events are the
source's, byte for byte as JSON values. Written gzip'd with a zero mtime (reproducible)."""

from __future__ import annotations

import gzip
import json
import sys


def trim(doc: dict, steps: int) -> dict:
    events = doc["traceEvents"]
    marks = sorted((e for e in events if e.get("ph") == "X"
                    and str(e.get("name", "")).startswith("ProfilerStep#")
                    and not str(e.get("cat", "")).startswith("gpu")), key=lambda e: e["ts"])
    main = marks[0]["tid"]
    kept_steps = [e for e in marks if e["tid"] == main][:steps]
    t0, t1 = kept_steps[0]["ts"], max(e["ts"] + e["dur"] for e in kept_steps)
    host, device, other = [], [], []
    for e in events:
        if e.get("ph") != "X":
            other.append(e)
        elif e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"):
            device.append(e)
        elif t0 <= e["ts"] < t1 and not (e in marks and e not in kept_steps):
            host.append(e)
    launched = {(e.get("args") or {}).get("correlation") for e in host} - {None}
    device = [e for e in device if (e.get("args") or {}).get("correlation") in launched
              or ((e.get("args") or {}).get("correlation") is None and t0 <= e["ts"] < t1)]
    other = [e for e in other if e.get("ph") == "M"]
    return {**{k: v for k, v in doc.items() if k != "traceEvents"},
            "traceEvents": other + host + device}


def main(argv: list[str]) -> None:
    src, dest = argv[0], argv[1]
    steps = int(argv[2]) if len(argv) > 2 else 1
    opener = gzip.open if src.endswith(".gz") else open
    with opener(src, "rt") as f:
        doc = json.load(f)
    out = json.dumps(trim(doc, steps)).encode()
    with open(dest, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as z:
        z.write(out)


if __name__ == "__main__":
    main(sys.argv[1:])
