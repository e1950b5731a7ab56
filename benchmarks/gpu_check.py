"""The GPU check: every figure a GPU user relies on, in two calls of the device tool, each
whole on its own (a machine starts bare for every call), each part in its own process under
its own watchdog (``scripts/gpu_check.sh``; the parts: ``benchmarks/gpu_parts.py``).

    python -m benchmarks.gpu_check --call 1|2 --out OUT [--work DIR] [--smoke]
    python -m benchmarks.gpu_check --rehearse --out DIR     # both calls' smoke, limits enforced
    python -m benchmarks.gpu_check --dry-run                # the schedule

- call 1 (``CALLS[1]``, at most 240 s on the device): ``probe``, ``trainer`` (MFU, eager
  first, compiled second), ``memory`` (the memory model against the allocator);
- call 2 (at most 360 s): ``layouts`` (parity against one rank), ``energy``, ``trace``,
  ``stepmodel`` (the step model against this call's measured single-device points).

Each call first checks, in seconds, that torch sees CUDA (not in a smoke run) and that the
modules the call needs import (``CALL_NEEDS``); otherwise it writes why and exits 3.

What comes back (the device returns at most 8 files of 16 MiB, 64 MiB in all, no deeper than
``OUT/a/b/file``, names of letters, digits, ``._-``): at most ``FILES_PER_CALL`` files directly
under ``OUT``, named in ``out_names``: ``callN.json`` (every part's record, rewritten after
every point a part finishes and after every part), ``callN.log`` (this process's lines),
``callN-records.tar.gz`` (the run folders' records, rewritten after every part, left out
when over 16 MiB) and ``callN-trace.json.gz`` (a CUDA trace, when one fits). Run folders,
logs and the compile caches live in the work folder, never under ``OUT``. A part killed by
its watchdog keeps the points it finished (``state: timeout``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

#: call -> ((part, watchdog s on a GPU, watchdog s in the CPU smoke run), ...), in order.
CALLS = {
    1: (("probe", 15, 60), ("trainer", 140, 260), ("memory", 45, 120)),
    2: (("layouts", 140, 200), ("energy", 40, 60), ("trace", 55, 60), ("stepmodel", 45, 60)),
}
#: call -> (its whole budget on a GPU, in the CPU smoke run), seconds: the preflight, every
#: part and the packing of what comes back.
BUDGET = {1: (240, 480), 2: (360, 480)}
#: The preflight's bound (s): a cold ``import torch`` and ``torch.cuda.is_available()``.
PREFLIGHT_S = 30
#: Modules each call imports (a missing one aborts the call in seconds); ``GPU_NEEDS`` only
#: on a GPU (NVML's energy counter; a CPU has none).
CALL_NEEDS = {1: ("torch", "numpy", "yaml", "pandas"),
              2: ("torch", "numpy", "yaml", "pandas", "jsonschema")}
GPU_NEEDS = {1: (), 2: ("pynvml",)}
#: The device's limits on what comes back from OUT.
OUT_LIMITS = {"files": 8, "file_bytes": 16 * 2**20, "total_bytes": 64 * 2**20, "folders": 2}
#: Files one call may leave directly under OUT (two calls' files fit the device's 8 only one
#: call at a time: each call has its own OUT).
FILES_PER_CALL = 6
NAME_OK = re.compile(r"^[A-Za-z0-9._-]+$")
#: Keys every part's record has.
COMMON = ("part", "state", "reason", "device", "smoke", "started", "wall_s", "points_done")
#: Keys of each part's record beyond ``COMMON`` (the fixed shape a test checks).
SHAPES = {
    "probe": ("python", "torch", "cuda", "cuda_available", "devices", "driver", "nvidia_smi",
              "disk_free_gb", "modules", "missing", "carried", "pip_list"),
    "trainer": ("records", "calibration", "target_mfu", "below_target", "profile",
                "compile_cache"),
    "layouts": ("backend", "tolerance", "reference", "layouts", "left_out", "gloo_cuda",
                "columns_missing", "pipeline"),
    "memory": ("points", "within", "reserved_over_allocated", "headroom", "capacity"),
    "stepmodel": ("calibration", "points", "median_ratio", "median_ratio_preset", "goal"),
    "energy": ("nvml", "smi", "ratio"),
    "trace": ("run", "terms", "step_time_s", "traced_step_s", "unattributed_s", "hta",
              "not_shown", "trace_file"),
}
#: ``part:k,…``: the part holds after its k-th saved point (the rehearsal's kill lands there).
HOLD_ENV = "SCALESTUDY_GPU_CHECK_HOLD"
#: running: a part's record while it works (saved after every point).
STATES = ("ok", "failed", "timeout", "skipped", "running")


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def call_of(part: str) -> int:
    return next(c for c, rows in CALLS.items() if part in [p for p, *_ in rows])


def out_names(call: int) -> dict:
    """The files call ``call`` may leave directly under OUT: role -> name."""
    return {"json": f"call{call}.json", "log": f"call{call}.log",
            "records": f"call{call}-records.tar.gz", "trace": f"call{call}-trace.json.gz"}


def blank(part: str, smoke: bool, state: str, reason: str, started: str, wall: float) -> dict:
    """A part's record with every key of its shape (None where it knows nothing)."""
    return {"part": part, "state": state, "reason": reason,
            "device": "cpu" if smoke else "cuda", "smoke": smoke, "started": started,
            "wall_s": round(wall, 2), "points_done": 0, **dict.fromkeys(SHAPES[part])}


def shape_problem(rec: dict) -> str | None:
    """Why a part's record is not of its fixed shape, or None."""
    part = rec.get("part")
    if part not in SHAPES:
        return f"unknown part {part!r}"
    missing = [k for k in COMMON + SHAPES[part] if k not in rec]
    if missing:
        return f"{part}: missing {', '.join(missing)}"
    if rec["state"] not in STATES:
        return f"{part}: state {rec['state']!r} is not one of {', '.join(STATES)}"
    if not isinstance(rec["wall_s"], (int, float)) or rec["wall_s"] < 0:
        return f"{part}: wall_s {rec['wall_s']!r} is not seconds"
    return None


def schedule(call: int, smoke: bool) -> list[tuple[str, float]]:
    """``[(part, watchdog s)]`` of ``call``; ``ValueError`` when the preflight and the parts'
    watchdogs exceed the call's budget."""
    rows = [(p, float(cpu if smoke else gpu)) for p, gpu, cpu in CALLS[call]]
    budget = BUDGET[call][1 if smoke else 0]
    total = PREFLIGHT_S + sum(s for _, s in rows)
    if total > budget:
        raise ValueError(f"call {call}: the preflight and the parts' watchdogs add up to "
                         f"{total:g} s, more than its {budget:g} s")
    return rows


def out_problems(out: Path, per_call: int | None = FILES_PER_CALL) -> list[str]:
    """What of ``out`` would not come back from the device (``OUT_LIMITS``), and more than
    ``per_call`` files directly under it. Empty when all of it would."""
    files = sorted(p for p in out.rglob("*") if not p.is_dir())
    bad = []
    if len(files) > OUT_LIMITS["files"]:
        bad.append(f"{len(files)} files, more than {OUT_LIMITS['files']}")
    top = [p for p in files if p.parent == out]
    if per_call is not None and len(top) > per_call:
        bad.append(f"{len(top)} files directly under OUT, more than {per_call}")
    total = 0
    for p in files:
        rel = p.relative_to(out)
        size = p.stat().st_size if p.is_file() else 0
        total += size
        if not p.is_file() or p.is_symlink():
            bad.append(f"{rel}: not a plain file")
        if len(rel.parts) - 1 > OUT_LIMITS["folders"]:
            bad.append(f"{rel}: deeper than OUT/a/b/file")
        if not all(NAME_OK.match(x) for x in rel.parts):
            bad.append(f"{rel}: a name outside letters, digits, '.', '_', '-'")
        if size > OUT_LIMITS["file_bytes"]:
            bad.append(f"{rel}: {size} bytes, more than 16 MiB")
    if total > OUT_LIMITS["total_bytes"]:
        bad.append(f"{total} bytes in all, more than 64 MiB")
    return bad


# --- what comes back -------------------------------------------------------------------------


def publish(out: Path, work: Path, call: int) -> Path:
    """``OUT/callN.json`` from the call's head (``work/head.json``) and every part's latest
    record (``work/parts/PART.json``), in schedule order: what a part saves after a point
    reaches OUT at once (one writer at a time: a part while it runs, this process between)."""
    from scalestudy.record.io import write_json

    head = _load(work / "head.json")
    parts = {}
    for part, *_ in CALLS[call]:
        rec = _load(work / "parts" / f"{part}.json")
        if rec:
            parts[part] = rec
    path = out / out_names(call)["json"]
    write_json(path, {**head, "parts": parts})
    return path


def pack_records(out: Path, work: Path, call: int, skip_bytes: int = 2**20) -> str:
    """``OUT/callN-records.tar.gz``: the run folders' files under ``work`` (each under
    ``skip_bytes``; the compile caches, the traces (one comes back on its own) and logs of a MiB
    and more stay behind), removed when
    over 16 MiB. Returns what happened, in words."""
    path = out / out_names(call)["records"]
    tmp = path.with_name("." + path.name)
    with tarfile.open(tmp, "w:gz") as tar:
        for p in sorted(work.rglob("*")):
            rel = p.relative_to(work)
            if p.is_file() and not p.is_symlink() and rel.parts[0] != "cache" \
                    and "traces" not in rel.parts and p.stat().st_size < skip_bytes:
                tar.add(p, arcname=str(rel))
    size = tmp.stat().st_size
    if size > OUT_LIMITS["file_bytes"]:
        tmp.unlink()
        path.unlink(missing_ok=True)
        return f"records left out: {size} bytes compressed, more than 16 MiB"
    os.replace(tmp, path)
    return f"{path.name}: {size} bytes"


def _load(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


# --- the call --------------------------------------------------------------------------------

_PREFLIGHT = """
import importlib.util, json, sys
needs, smoke = json.loads(sys.argv[1]), sys.argv[2] == "1"
info = {"python": sys.version.split()[0],
        "missing": [m for m in needs if importlib.util.find_spec(m) is None]}
if "torch" not in info["missing"]:
    import torch
    cuda = torch.cuda.is_available()
    info.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=cuda,
                device=torch.cuda.get_device_name(0) if cuda else None)
print(json.dumps(info))
"""


def preflight(call: int, smoke: bool, python: str = sys.executable) -> tuple[dict, str | None]:
    """``(what the device has, why the call cannot run or None)``, in one short process."""
    try:
        needs = CALL_NEEDS[call] + (() if smoke else GPU_NEEDS[call])
        r = subprocess.run([python, "-c", _PREFLIGHT, json.dumps(needs),
                            "1" if smoke else "0"], capture_output=True, text=True,
                           timeout=PREFLIGHT_S)
        info = json.loads(r.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        return {}, f"the preflight (import torch) took over {PREFLIGHT_S} s"
    except (ValueError, IndexError):
        return {}, f"the preflight failed: {(r.stderr.strip().splitlines() or ['?'])[-1][:200]}"
    return info, abort_reason(info, smoke)


def abort_reason(info: dict, smoke: bool) -> str | None:
    """Why a call cannot run on what the preflight found, or None."""
    if info.get("missing"):
        return (f"modules missing: {', '.join(info['missing'])} (carry them: make gpu-wheels, "
                "then scripts/gpu_check.sh installs them)")
    if not smoke and not info.get("cuda_available"):
        return (f"no CUDA device visible to torch {info.get('torch')} "
                f"(CUDA {info.get('cuda')}); --smoke runs the parts on the CPU")
    return None


def _watched(argv: list[str], limit: float, log: Path, progress: Path | None = None,
             kill_after: int | None = None, env: dict | None = None) -> tuple[str | None, str]:
    """Run a part in a session of its own; on its watchdog (or, rehearsing, once its saved
    record counts ``kill_after`` points) its process group is killed, and the launches it
    started in sessions of their own, orphaned back to this process (a subreaper:
    ``scalestudy.run.lifetime``), with it. ``(None, "")`` when it ended by itself, else
    ``("timeout", why)``; ``("failed", why)`` for a part that exits nonzero."""
    from scalestudy.run import lifetime

    lifetime.become_subreaper()
    keep = lifetime.children()
    with open(log, "ab") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
    t0, why = time.monotonic(), None
    while proc.poll() is None:
        if time.monotonic() - t0 > limit:
            why = f"over its watchdog of {limit:.0f} s"
        elif kill_after is not None and progress is not None and \
                (_load(progress).get("points_done") or 0) >= kill_after:
            why = f"killed as by its watchdog after {kill_after} point(s) (rehearsal)"
        if why:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            lifetime.end_orphans(keep)
            return "timeout", why
        time.sleep(0.2)
    if proc.returncode:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:]
        return "failed", f"exit {proc.returncode}: {tail[0][:200] if tail else 'no output'}"
    return None, ""


class _Log:
    def __init__(self, path: Path):
        self.path = path

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        with open(self.path, "a") as f:
            f.write(line + "\n")


def run_call(call: int, out: Path, work: Path, smoke: bool, python: str = sys.executable,
             kill_after: dict | None = None) -> dict:
    """Call ``call``: the preflight, then every part under its watchdog (its share plus what
    the earlier parts left of theirs, at most what is left of the call's budget), ``OUT/callN.json`` rewritten after every part (and by the parts
    after every point), the records packed after every part. Returns the head."""
    from scalestudy.record.io import write_json

    out.mkdir(parents=True, exist_ok=True)
    (work / "parts").mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(exist_ok=True)
    t0, budget = time.monotonic(), float(BUDGET[call][1 if smoke else 0])
    log = _Log(out / out_names(call)["log"])
    cache = work / "cache"  # Inductor's and Triton's caches, warm for the whole call
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
           "TRITON_CACHE_DIR": str(cache / "triton"), "PYTHONUNBUFFERED": "1",
           # on a 2-core CPU, Inductor's pool of compile workers (each importing torch) costs
           # more than it saves: compile in the rank itself
           **({"TORCHINDUCTOR_COMPILE_THREADS": "1"} if smoke else {})}
    # rehearsing a kill: the part holds after its k-th point until the kill comes (a point
    # that outlasts the watchdog), so the kill always lands mid-part
    env.update({HOLD_ENV: ",".join(f"{p}:{k}" for p, k in kill_after.items())}
               if kill_after else {})
    head = {"call": call, "smoke": smoke, "state": "running", "reason": "", "started": now(),
            "budget_s": budget, "schedule": schedule(call, smoke), "out_limits": OUT_LIMITS,
            "compile_cache": str(cache), "records": None, "wall_s": None}
    info, abort = preflight(call, smoke, python)
    head["preflight"] = info
    if abort:
        head.update(state="aborted", reason=abort, wall_s=round(time.monotonic() - t0, 2))
        write_json(work / "head.json", head)
        publish(out, work, call)
        log(f"gpu_check: call {call} aborted: {abort}")
        return head
    write_json(work / "head.json", head)
    planned = float(PREFLIGHT_S)  # the shares up to here: what earlier parts left goes on
    for part, share in head["schedule"]:
        started, t1 = now(), time.monotonic()
        share, planned = share + max(0.0, planned - (t1 - t0)), planned + share
        saved = work / "parts" / f"{part}.json"
        saved.unlink(missing_ok=True)
        left = budget - (t1 - t0) - 10  # 10 s to pack what comes back
        if left < 5:
            write_json(saved, blank(part, smoke, "skipped",
                                    f"the call's {budget:g} s budget is used up", started, 0))
        else:
            argv = [python, "-m", "benchmarks.gpu_parts", part, "--out", str(out), "--work",
                    str(work)] + (["--smoke"] if smoke else [])
            state, why = _watched(argv, min(share, left), work / "logs" / f"{part}.log", saved,
                                  (kill_after or {}).get(part), env)
            rec = _load(saved) or blank(part, smoke, "failed", "", started, 0)
            if state and (rec["state"] in ("running", "failed") or state == "timeout"):
                rec.update(state=state, reason=why if not rec.get("reason") or
                           state == "timeout" else rec["reason"])
            rec["wall_s"] = round(time.monotonic() - t1, 2)
            write_json(saved, rec)
        head["records"] = pack_records(out, work, call)
        write_json(work / "head.json", head)
        rec = json.loads(publish(out, work, call).read_text())["parts"][part]
        log(f"gpu_check: call {call}: {part}: {rec['state']} in {rec['wall_s']} s, "
            f"{rec.get('points_done', 0)} point(s) {rec['reason']}".rstrip())
    states = [r.get("state") for r in _load(out / out_names(call)["json"])["parts"].values()]
    head.update(state="ok" if all(s == "ok" for s in states) else "failed",
                wall_s=round(time.monotonic() - t0, 2))
    write_json(work / "head.json", head)
    publish(out, work, call)
    log(f"gpu_check: call {call}: {head['state']} in {head['wall_s']} s "
        f"(budget {budget:g} s); {head['records']}")
    return head


def rehearse(out: Path, python: str = sys.executable) -> list[str]:
    """Both calls' smoke runs as the device would run them: each into its own OUT
    (``out/callN``) and work folder, under its budget, the memory part killed as by its
    watchdog after its first point; then the limits on what comes back. Returns the
    problems (empty: the rehearsal passed)."""
    problems = []
    for call in CALLS:
        o = out / f"call{call}"
        with tempfile.TemporaryDirectory(prefix=f"gpu-check-work{call}-") as w:
            head = run_call(call, o, Path(w), True, python,
                            kill_after={"memory": 1} if call == 1 else None)
        doc = _load(o / out_names(call)["json"])
        problems += [f"call {call}: {p}" for p in out_problems(o)]
        if head["wall_s"] is None or head["wall_s"] > head["budget_s"]:
            problems.append(f"call {call}: {head['wall_s']} s, over its {head['budget_s']} s")
        for part, rec in doc.get("parts", {}).items():
            want = "timeout" if (call == 1 and part == "memory") else "ok"
            if rec.get("state") != want or shape_problem(rec):
                problems.append(f"call {call}: {part}: {rec.get('state')} (want {want}) "
                                f"{rec.get('reason')} {shape_problem(rec) or ''}".rstrip())
        if len(doc.get("parts", {})) != len(CALLS[call]):
            problems.append(f"call {call}: {doc.get('state')} {doc.get('reason')}")
    mem = _load(out / "call1" / out_names(1)["json"]).get("parts", {}).get("memory", {})
    if not mem.get("points") or mem.get("points_done", 0) < 1:
        problems.append("call 1: memory: the killed part's finished point is not in call1.json")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--call", type=int, choices=sorted(CALLS))
    ap.add_argument("--out", type=Path, default=Path("results/gpu-check"))
    ap.add_argument("--work", type=Path, default=None,
                    help="run folders, logs, compile caches (default: a new temp folder)")
    ap.add_argument("--smoke", action="store_true", help="the same logic on the CPU, tiny")
    ap.add_argument("--rehearse", action="store_true", help="both calls' smoke, limits checked")
    ap.add_argument("--dry-run", action="store_true", help="print the schedule, run nothing")
    a = ap.parse_args(argv)
    if a.dry_run:
        for call in CALLS:
            rows = schedule(call, a.smoke)
            print(f"call {call}: preflight {PREFLIGHT_S} s, " + ", ".join(
                f"{p} {s:.0f} s" for p, s in rows) + f"; budget {BUDGET[call][a.smoke]} s")
        return 0
    if a.rehearse:
        problems = rehearse(a.out)
        print("gpu_check: rehearsal " + ("passed" if not problems else
                                         "failed:\n  " + "\n  ".join(problems)), flush=True)
        return 0 if not problems else 1
    if a.call is None:
        ap.error("name --call 1 or 2 (or --rehearse, --dry-run)")
    work = a.work or Path(tempfile.mkdtemp(prefix=f"gpu-check-work{a.call}-"))
    head = run_call(a.call, a.out, work, a.smoke)
    return {"ok": 0, "aborted": 3}.get(head["state"], 1)


if __name__ == "__main__":
    sys.exit(main())
