"""A CPU host's calibration in slices across the sweep: the study's own model timed piece by
piece, the cost of sharing the cores and the wait at a synchronisation, a few rounds per
slice, each slice a job of its own that the workflow runs between the training runs (rule
``calibrate_slice``), pooled into ``calibration.json`` (rule ``calibration``).

    python -m scalestudy host-slices --blocks-json JSON --core-sharing K ... --out FILE

On a shared host the same blocks run up to ~1.7x faster or slower from one minute to the next
(the 4-sequence micro-batch's forward + backward: 4.7-7.8 ms in 30 calibrations of one day),
and the study's runs sample the host over the whole sweep: blocks timed in one moment are one
draw of its speed, common to every prediction of the sweep. Slices spread over the sweep
sample it as the runs do; the model takes the median over all their rounds
(``rates.blocks_from_rows``, ``rates.core_sharing_from_rows``,
``rates.sync_wait_from_rows``).
"""

from __future__ import annotations

import datetime as _dt
import os
import socket

#: Slices of a sweep's host calibration, and rounds in each: 5 x 9 rounds of the blocks, 5 x 2
#: of the core sharing and of the synchronisation wait. On this project's 2-core host one round
#: of the 4-sequence forward + backward moves with a log-sd of ~0.2 from one to the next and
#: rounds ~1 s apart are nearly independent (autocorrelation 0.27 at 0.2 s, 0.08 at 1 s), so
#: the pooled median's own noise falls as 1/sqrt(rounds): ~0.07 with 5 x 3 rounds (the
#: slice-to-slice log-sd was 0.15), ~0.04 with 5 x 9. A slice takes ~18 s instead of ~12.
SLICES = 5
BLOCK_ROUNDS = 9
SHARING_ROUNDS = 2

#: The calibration fields that slices measure (rows of ``blocks.bench_blocks``,
#: ``host_sharing.bench_core_sharing`` and ``host_sharing.bench_sync_wait``).
SLICED = ("blocks", "core_sharing", "sync_wait")


def measure_slice(specs: list[dict], procs: list[int], block_rounds: int = BLOCK_ROUNDS,
                  sharing_rounds: int = SHARING_ROUNDS) -> dict:
    """One slice, in this process (its threads as set): ``blocks`` (``block_rounds`` rounds of
    every ``blocks.block_spec`` in ``specs``), ``core_sharing`` and ``sync_wait``
    (``sharing_rounds`` rounds each at the process counts ``procs``; none without counts),
    ``measured_at`` (UTC) and ``load_1m`` (the 1-minute load average before the slice)."""
    from scalestudy.measure.blocks import bench_blocks
    from scalestudy.measure.host_sharing import bench_core_sharing, bench_sync_wait

    load = os.getloadavg()[0]
    at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")
    blocks = bench_blocks(specs, samples=block_rounds) if specs else []
    sharing = (bench_core_sharing(tuple(sorted({1, *procs})), samples=sharing_rounds)
               if procs else [])
    waits = bench_sync_wait(tuple(procs), samples=sharing_rounds) if procs else []
    return {"host": socket.gethostname(), "measured_at": at, "load_1m": load,
            "blocks": blocks, "core_sharing": sharing, "sync_wait": waits}


def with_slices(calibration: dict, slices: list[dict]) -> dict:
    """``calibration`` (a ``scalestudy.measure.calibrate`` record) with the rows of every
    slice pooled into its ``blocks`` and ``core_sharing``: each row tagged with its ``slice``
    (the index in ``slices``) and its ``sample`` renumbered across slices, so that a round's
    pieces stay paired and two slices' rounds stay apart; ``slices`` lists when each slice
    was measured and the load it saw. A field no slice measured is left as it was."""
    out = dict(calibration)
    for field in SLICED:
        rows, offset = [], 0
        for k, s in enumerate(slices):
            got = s.get(field) or []
            rows += [{**r, "slice": k, "sample": offset + int(r["sample"])} for r in got]
            offset += 1 + max((int(r["sample"]) for r in got), default=-1)
        if rows:
            out[field] = rows
    out["slices"] = [{"slice": k, "measured_at": s.get("measured_at"),
                      "load_1m": s.get("load_1m")} for k, s in enumerate(slices)]
    return out


def write_calibration(calibration_path: str, slice_paths: list[str], out: str,
                      log: str | None = None) -> dict:
    """``with_slices`` of the files, written atomically to ``out`` (and a line saying so to
    ``log``); returns the record."""
    from scalestudy.record.io import read_json, write_json, write_text

    rec = with_slices(read_json(calibration_path), [read_json(p) for p in slice_paths])
    write_json(out, rec)
    if log:
        write_text(log, f"{out}: {len(slice_paths)} host slices pooled\n")
    return rec
