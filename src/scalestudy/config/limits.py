"""Limits on a study file and on what it may ask for (docs/security.md).

A study file may come from someone else: it is read with libyaml's safe loader, never with a
constructor that builds objects, and within these bounds, so that no file (binary, deeply
nested, an alias bomb, gigabytes of device counts) can make ``scalestudy plan`` hang, run out
of memory or print a traceback. The declared settings take their bounds from here, and the
generated schema (``workflow/schemas/study.schema.json``, :mod:`scalestudy.config.schema_gen`)
states them as ``maximum``/``maxItems`` (``tests/unit/test_hostile.py`` checks they agree).
"""

from __future__ import annotations

# --- the file ---------------------------------------------------------------------------------
#: Largest study file read (bytes). Real studies are a few kB.
MAX_FILE_BYTES = 8 * 2**20
#: Deepest nesting of mappings and lists (the schema itself needs 5).
MAX_DEPTH = 32
#: YAML nodes (scalars, lists, mappings) in one file.
MAX_NODES = 200_000
#: Entries of one list or mapping.
MAX_ITEMS = 10_000
#: Largest integer anywhere in a study (2**53: exact in JSON and in a float).
MAX_INT = 2**53

# --- what a study may ask for -------------------------------------------------------------------
#: Devices (processes on a CPU host) of one point: the schema's ``gpus`` entries.
MAX_DEVICES = 2**20
#: Device counts swept by one series (the ``gpus`` list).
MAX_GPUS_LIST = 4096
#: Ranks on one node: ``platform.devices_per_node`` (GPUs of a node, processes on a CPU host).
MAX_DEVICES_PER_NODE = 1024
#: Nodes one point may use: ``platform.max_nodes``.
MAX_NODES_PER_POINT = 2**17
#: Separate measurements of every point: ``repeats``.
MAX_REPEATS = 100
#: Extra attempts of a crashed point: ``retries``.
MAX_RETRIES = 10
#: Tokens per sequence: ``models.*.seq_len``.
MAX_SEQ_LEN = 2**22
#: Optimizer steps of one point: ``train.steps``.
MAX_STEPS = 1_000_000
#: Seconds of ``platform.timeout_s`` and ``platform.collective_timeout_s`` (30 days).
MAX_TIMEOUT_S = 30 * 24 * 3600
#: Runs (points x repeats) of one study after every sweep axis is expanded.
MAX_RUNS = 50_000
#: Pipeline stages of all points of a study together (sum of pp over the points): the memory
#: model evaluates every stage of every point (~3 us each).
MAX_STAGE_EVALUATIONS = 1_000_000
#: Longest name: study, series, model (a folder name component, with the id's suffixes).
MAX_NAME = 64
#: Longest point id (a folder name: at most 255 bytes on common filesystems).
MAX_POINT_ID = 255
#: Bytes of memory per CPU process the memory check keeps for the runtime (interpreter, torch,
#: gloo buffers) besides the model's estimate.
CPU_PROCESS_BASELINE_BYTES = 0.3e9
