"""The records of an offline W&B run's ``run-<id>.wandb`` file, as ``wandb.proto`` messages.

The file is W&B's transaction log: a 7-byte header (``:W&B``, magic 0xBEE1, version 0), then
LevelDB log blocks of 32 KiB, each record a 7-byte header (CRC-32C, length, type: full,
first, middle, last) and its bytes; a record that does not fit a block's end continues in the
next, and a block's last < 7 bytes are padding. Each record's bytes are one serialised
``wandb.proto.wandb_internal_pb2.Record``. (The wandb package's Python reader of this format,
``wandb.sdk.internal.datastore``, left the package when its core moved to Go; this is that
reader's format, parsed with the package's own protocol buffers.)
"""

from __future__ import annotations

import struct
from pathlib import Path

HEADER = struct.Struct("<4sHB")  # ident, magic, version
RECORD = struct.Struct("<IHB")  # crc32c, length, type
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list:
    """Every ``Record`` of the transaction log at ``path``, in order."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    ident, magic, version = HEADER.unpack_from(data, 0)
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    out, pos, pending = [], HEADER.size, b""
    while pos + RECORD.size <= len(data):
        left = BLOCK - pos % BLOCK
        if left < RECORD.size:  # padding at a block's end
            pos += left
            continue
        _, length, kind = RECORD.unpack_from(data, pos)
        if length == 0 and kind == 0:  # zero padding
            pos += left
            continue
        chunk = data[pos + RECORD.size:pos + RECORD.size + length]
        pos += RECORD.size + length
        if kind == FULL:
            pending = chunk
        elif kind == FIRST:
            pending = chunk
            continue
        elif kind == MIDDLE:
            pending += chunk
            continue
        else:
            assert kind == LAST, kind
            pending += chunk
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(pending)
        out.append(rec)
        pending = b""
    return out


def read_run(run_dir: Path) -> dict:
    """An offline run folder's run (id, name, group, job type, tags), config, history rows
    and summary, each value decoded from its JSON."""
    import json

    (log,) = Path(run_dir).glob("run-*.wandb")
    out = {"config": {}, "history": [], "summary": {}, "files": [], "exit_code": None}
    for rec in records(log):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            r = rec.run
            out.update(id=r.run_id, name=r.display_name, group=r.run_group,
                       job_type=r.job_type, project=r.project, tags=list(r.tags))
            out["config"].update({i.key: json.loads(i.value_json) for i in r.config.update})
        elif kind == "config":
            out["config"].update({i.key: json.loads(i.value_json) for i in rec.config.update})
        elif kind == "history":
            out["history"].append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                                   for i in rec.history.item})
        elif kind == "summary":
            out["summary"].update({(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                                   for i in rec.summary.update})
        elif kind == "files":
            out["files"] += [f.path for f in rec.files.files]
        elif kind == "exit":
            out["exit_code"] = rec.exit.exit_code
    return out
