"""Snakemake, started for a study: its command line (:func:`snakemake_argv`), its life tied to
ours (:func:`run_snakemake`), the profile's site checked first (:func:`check_profile_site`), and
the checks before a study's results folder is run (:func:`launch`: ``scalestudy run`` and
``scalestudy tune --measure`` alike)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from scalestudy import paths
from scalestudy.config.study_yaml import StudyError
from scalestudy.config.studyspec import Study


def profile_site(profile: str | None) -> dict | None:
    """The ``site`` mapping a Snakemake profile brings (its ``configfile:`` files, as the
    shipped profiles do, and its ``config:``), or None."""
    import yaml

    if not profile:
        return None
    folder = Path(profile)
    try:
        conf = yaml.safe_load((folder / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    files = conf.get("configfile") or conf.get("configfiles") or []
    site: dict = {}
    for name in [files] if isinstance(files, str) else list(files):
        try:
            data = yaml.safe_load((folder / str(name)).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise StudyError(f"{folder / str(name)}: cannot read the profile's config file "
                             f"({type(e).__name__}); check the profile") from None
        if isinstance(data, dict) and isinstance(data.get("site"), dict):
            site.update(data["site"])
    config = conf.get("config")
    if isinstance(config, dict) and isinstance(config.get("site"), dict):
        site.update(config["site"])
    return site or None


def check_profile_site(study: Study, profile: str | None, trust_site: bool) -> None:
    """The site the Snakefile will run with (the study's, then the profile's), checked now so
    that a refused setting ends with one line before Snakemake starts."""
    from scalestudy.config.sitepolicy import SiteError

    layer = profile_site(profile)
    if not layer:
        return
    where = f"{Path(profile) / 'site'}"
    try:
        study.platform.site.merged(layer).check(trusted=trust_site, where=where)
    except SiteError as e:
        raise StudyError(str(e)) from None
    except ValueError as e:  # Site.resolve: an unknown key or a bad number
        raise StudyError(f"{where}: {e}") from None


def snakemake_argv(study: str, results: str, profile: str | None, extra: list[str],
                   trust_site: bool = False) -> list[str]:
    # Snakemake's metadata and locks live beside the results (one .snakemake per results root)
    Path(results).mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "snakemake", "--snakefile", str(paths.snakefile()),
            "--directory", str(Path(results).resolve())]
    if profile:
        argv += ["--profile", profile]
    # the caller's arguments before --config, whose values would take a target as one more
    return argv + extra + ["--config", f"study={Path(study).resolve()}",
                           f"results={Path(results).resolve()}",
                           *(["trust_site=true"] if trust_site else [])]


#: How long Snakemake may take to stop its jobs after a Ctrl-C (s) before it is terminated.
STOP_GRACE_S = 60.0


#: Snakemake's report step (9.x, ``snakemake.rules``) evaluates a job's default resources
#: without awaiting their input-size coroutine, and Python says so at exit, once per rule:
#: Snakemake's own slip, with nothing for a user to do; its report is complete. Only that one
#: warning is silenced, and only in the report step.
REPORT_WARNINGS = ("ignore:coroutine 'InputFiles._predicated_size_files.<locals>.sizes' was "
                   "never awaited:RuntimeWarning")


def report_env(environ=os.environ) -> dict:
    """The environment of the report step: ``environ`` with :data:`REPORT_WARNINGS` added to
    any ``PYTHONWARNINGS`` already set."""
    old = environ.get("PYTHONWARNINGS")
    return {**environ, "PYTHONWARNINGS": ",".join(filter(None, [old, REPORT_WARNINGS]))}


def run_snakemake(argv: list[str], env: dict | None = None) -> int:
    """Run Snakemake to its end; its exit status. Snakemake and its jobs run in a process group
    of their own. On Ctrl-C, SIGTERM or a lost terminal (SIGHUP) here, the group gets one SIGINT
    (each job's runner stops its point: ``scalestudy.run.lifetime``; Snakemake then releases its
    lock) and :data:`STOP_GRACE_S` to end, then SIGKILL; a KeyboardInterrupt goes on. Killed
    (SIGKILL) here, Snakemake is killed with us and its jobs' runners end their points."""
    from scalestudy.run.lifetime import dies_with_parent, kill_group

    def interrupt(*_):
        raise KeyboardInterrupt

    from scalestudy.run.guard import LOCK_FD_ENV

    lock = (os.environ if env is None else env).get(LOCK_FD_ENV, "")
    proc = subprocess.Popen(argv, process_group=0, preexec_fn=dies_with_parent(signal.SIGKILL),
                            env=env, pass_fds=(int(lock),) if lock.isdigit() else ())
    handlers = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return proc.wait()
    except KeyboardInterrupt:
        for sig, grace in ((signal.SIGINT, STOP_GRACE_S), (signal.SIGKILL, None)):
            kill_group(proc.pid, sig)
            try:
                proc.wait(timeout=grace)
                break
            except (subprocess.TimeoutExpired, KeyboardInterrupt):  # a second Ctrl-C: on
                continue
        raise
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


#: The study locks this process holds (study folder -> descriptor), kept until it exits.
_HELD: dict[Path, int] = {}


def hold_study(study_dir: Path) -> int:
    """Take ``study_dir``'s lock for the rest of this process's life (once per study) and
    hand it down to the Snakemake runs it starts (``guard.LOCK_FD_ENV`` in the environment,
    the descriptor passed on), whose Snakefile then takes no second lock: a launcher started
    at the same instant as another is refused here, before Snakemake starts.
    :class:`guard.StudyLocked` when another holds it."""
    from scalestudy.run import guard

    key = study_dir.resolve()
    if key not in _HELD:
        fd = guard.lock_study(study_dir)
        os.set_inheritable(fd, True)
        _HELD[key] = fd
    os.environ[guard.LOCK_FD_ENV] = str(_HELD[key])
    return _HELD[key]


def launch(study_file: str, study: Study, results: str, profile: str, extra: list[str],
           trust_site: bool = False) -> int:
    """Run ``study`` (loaded from ``study_file``) through Snakemake with ``profile`` and the
    caller's Snakemake arguments ``extra`` (targets, options); its exit status. Refuses first,
    with one line: a profile site the policy refuses, links out of the results folder, a folder
    another study file made, a study another launcher holds (:func:`hold_study`)."""
    from scalestudy.record.source import refuse_other_source
    from scalestudy.run import guard

    check_profile_site(study, profile, trust_site)
    study_dir = Path(results) / study.name
    guard.refuse_escaping_links(study_dir)  # (the Snakefile checks again, and takes the lock)
    # an unwritable results folder (read-only, full): one line here, not Snakemake's trace
    study_dir.mkdir(parents=True, exist_ok=True)
    refuse_other_source(study_dir, study_file, study.to_json())
    hold_study(study_dir)
    return run_snakemake(snakemake_argv(study_file, results, profile, extra, trust_site))
