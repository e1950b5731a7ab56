"""The pieces of the process-lifetime contract one by one (``scalestudy.run.lifetime``,
``scalestudy.run.capture``, ``scalestudy.run.guard``'s stale Snakemake locks): the parent-death
signal, the subreaper's orphans, the point's lock, the capped log. Processes are real; every
wait is bounded and on an event (a pid file, a process gone), never on a clock."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalestudy import cli
from scalestudy.run import capture, guard, lifetime

linux = pytest.mark.skipif(lifetime._PRCTL is None, reason="prctl is Linux's")


def _gone(pid: int, timeout: float = 30.0) -> bool:
    """Whether ``pid`` no longer runs (gone, or a zombie) within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def _pid_from(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not path.exists():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    return int(path.read_text())


@linux
def test_a_child_dies_with_its_parent(tmp_path):
    """A parent killed with SIGKILL takes its child along (``dies_with_parent``)."""
    code = ("import subprocess, signal, sys, pathlib\n"
            "from scalestudy.run.lifetime import dies_with_parent\n"
            "c = subprocess.Popen(['sleep', '600'], preexec_fn=dies_with_parent(signal.SIGKILL))\n"
            f"pathlib.Path({str(tmp_path / 'child')!r}).write_text(str(c.pid))\n"
            "c.wait()\n")
    parent = subprocess.Popen([sys.executable, "-c", code])
    child = _pid_from(tmp_path / "child", parent)
    parent.kill()
    parent.wait()
    assert _gone(child), "the child outlived its parent"


@linux
def test_a_cluster_jobs_snakemake_dies_with_its_batch_script(tmp_path):
    """As a Slurm batch script's Snakemake: its shell killed by SIGTERM (a job being ended),
    the process (here deaf to SIGTERM, as a Snakemake stuck in its handler is) gets SIGKILL
    instead of living on, re-parented to init (``as_cluster_job``)."""
    code = ("import signal, pathlib, time\n"
            "from scalestudy.run import lifetime\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "lifetime.as_cluster_job()\n"
            f"pathlib.Path({str(tmp_path / 'job')!r}).write_text(str(__import__('os').getpid()))\n"
            "time.sleep(600)\n")
    script = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "$0"; echo done', code])
    job = _pid_from(tmp_path / "job", script)
    script.terminate()
    assert script.wait(timeout=30) == -15
    gone = _gone(job)
    if not gone:
        os.kill(job, 9)
    assert gone, "the job's Snakemake outlived its batch script"


@linux
def test_the_subreaper_ends_the_orphans_of_a_launch(tmp_path):
    """A background child whose parent exited comes back to the subreaper, which ends it, and
    only it (``keep``: the children from before)."""
    code = ("import subprocess, sys, pathlib\n"
            "from scalestudy.run import lifetime\n"
            "assert lifetime.become_subreaper()\n"
            "mine = subprocess.Popen(['sleep', '600'])\n"
            "keep = lifetime.children()\n"
            "subprocess.run(['sh', '-c', 'sleep 600 & echo $! > orphan'], check=True)\n"
            "orphan = int(pathlib.Path('orphan').read_text())\n"
            "assert orphan in lifetime.children(), 'not re-parented'\n"
            "print(lifetime.end_orphans(keep) == [orphan], mine.poll() is None)\n"
            "mine.kill()\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True"]
    assert _gone(int((tmp_path / "orphan").read_text()))


def test_the_point_lock_is_one_training_at_a_time(tmp_path):
    held = lifetime.try_lock(tmp_path / lifetime.POINT_LOCK)
    assert held is not None
    with pytest.raises(lifetime.PointBusy, match=r"another training of this point is still "
                                                 r"running .*\.point\.lock.*; end them"):
        lifetime.hold_point(tmp_path, wait_s=0.3)
    os.close(held)  # its last process ended
    fd = lifetime.hold_point(tmp_path, wait_s=0.3)
    assert os.get_inheritable(fd)  # handed down to the launch
    assert (tmp_path / lifetime.POINT_LOCK).read_text() == f"pid {os.getpid()}\n"
    os.close(fd)


def test_a_runner_finding_its_point_busy_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    from scalestudy.config.point import Point
    from scalestudy.config.parts import Model

    run_dir = tmp_path / "s" / "runs" / "p"
    run_dir.mkdir(parents=True)
    (run_dir / "point.json").write_text(Point.for_layout(Model(), point_id="p").json_text())
    held = lifetime.try_lock(run_dir / lifetime.POINT_LOCK)
    monkeypatch.setattr(lifetime, "POINT_LOCK_WAIT_S", 0.3)
    assert cli.main(["run-point", str(run_dir / "point.json"), str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("scalestudy: error: ")
    assert "another training of this point is still running" in err
    assert not (run_dir / "status.json").exists()  # nothing written into the other's folder
    os.close(held)


def _through_pipe(chunks: list[bytes], log_path: Path, head: int, tail: int) -> capture.CappedLog:
    read_fd, write_fd = os.pipe()
    with open(log_path, "wb") as log:
        log.write(b"$ cmd\n")
        cap = capture.CappedLog(read_fd, log, head=head, tail=tail).start()
        for chunk in chunks:
            os.write(write_fd, chunk)
        os.close(write_fd)
        assert cap.join(timeout=60)
    return cap


def test_the_log_keeps_its_head_and_tail_and_states_the_cut(tmp_path):
    stream = b"".join(f"line {i:06d}\n".encode() for i in range(20000))  # 240,000 bytes
    chunks = [stream[i:i + 4096] for i in range(0, len(stream), 4096)]
    cap = _through_pipe(chunks, tmp_path / "log", head=1000, tail=3000)
    data = (tmp_path / "log").read_bytes()
    marker = capture.cut_marker(cap.cut)
    assert data.startswith(b"$ cmd\n" + stream[:1000] + marker)
    assert data.endswith(stream[-3000:])
    kept = len(data) - len(b"$ cmd\n") - 1000 - len(marker)
    assert 3000 <= kept <= 2 * 3000
    assert cap.cut == len(stream) - 1000 - kept > 0
    assert b"bytes of output cut here" in marker and cap.error is None


def test_a_short_log_is_whole(tmp_path):
    cap = _through_pipe([b"hello\n", b"world\n"], tmp_path / "log", head=1000, tail=3000)
    assert cap.cut == 0
    assert (tmp_path / "log").read_bytes() == b"$ cmd\nhello\nworld\n"


def test_stale_snakemake_locks_are_the_ones_naming_the_study(tmp_path):
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.input.lock").write_text(f"{tmp_path}/mine/runs/a/point.json\n")
    (locks / "0.output.lock").write_text("mine/plan.tsv\nmine/runs/a/status.json\n")  # relative
    (locks / "1.output.lock").write_text(f"{tmp_path}/other/plan.tsv\n")
    (locks / "2.output.lock").write_text(f"{tmp_path}/mine-2/plan.tsv\n")  # a prefix, not inside
    stale = guard.stale_snakemake_locks(tmp_path / "mine", workdir=tmp_path)
    assert [p.name for p in stale] == ["0.input.lock", "0.output.lock"]
    assert guard.stale_snakemake_locks(tmp_path / "none", workdir=tmp_path) == []
    assert guard.stale_snakemake_locks(tmp_path / "mine", workdir=tmp_path / "x") == []
