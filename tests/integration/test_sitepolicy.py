"""Site settings: the ``site.env`` allow-list, the options torchrun/srun/sbatch may
get, ``--trust-site``, and secrets that reach the ranks but no record
(``scalestudy.config.sitepolicy``)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from scalestudy import cli
from scalestudy.run import snakemake
from scalestudy.config import sitepolicy as sp
from scalestudy.config.point import Point
from scalestudy.config.parts import Model
from scalestudy.config.identity import identify
from scalestudy.config.site import Site
from scalestudy.config.sitepolicy import REDACTED, SECRETS_ENV, SiteError
from scalestudy.run import launch

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name, ok", [
    ("NCCL_DEBUG", True), ("NCCL_SOCKET_IFNAME", True), ("NCCL_IB_HCA", True),
    ("FI_CXI_ATS", True), ("CUDA_DEVICE_MAX_CONNECTIONS", True), ("OMP_NUM_THREADS", True),
    ("MIOPEN_USER_DB_PATH", True), ("PYTORCH_CUDA_ALLOC_CONF", True),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", True), ("GLOO_SOCKET_IFNAME", True),
    ("LD_PRELOAD", False), ("LD_LIBRARY_PATH", False), ("LD_AUDIT", False),
    ("PYTHONPATH", False), ("PYTHONSTARTUP", False), ("PYTHONHOME", False), ("PATH", False),
    ("SCALESTUDY_STEP_HOOK", False), ("BASH_ENV", False), ("MASTER_ADDR", False),
    ("TORCHELASTIC_USE_AGENT_STORE", False), ("PET_NO_PYTHON", False), ("SLURM_TASK_PROLOG", False),
    ("NCCL_NET_PLUGIN", False), ("NCCL_TUNER_PLUGIN", False), ("CUDA_INJECTION64_PATH", False),
    ("HSA_TOOLS_LIB", False), ("OMP_TOOL_LIBRARIES", False), ("FI_PROVIDER_PATH", False),
    ("UCX_MODULE_DIR", False), ("NCCL_DEBUG_FILE", False), ("NCCL_TOPO_FILE", False),
    ("NCCL_COMM_ID", False), ("HF_TOKEN", False), ("TZ", False),
])
def test_env_allow_list(name, ok):
    assert sp.env_allowed(name) is ok
    if ok:
        sp.check_site_env({name: "1"})
    else:
        with pytest.raises(SiteError, match=f"site.env.{name}: not allowed without --trust-site"):
            sp.check_site_env({name: "1"})
        sp.check_site_env({name: "1"}, trusted=True)


def test_env_values_without_nul():
    with pytest.raises(SiteError, match="the value is not allowed"):
        sp.check_site_env({"NCCL_DEBUG": "a\0b"}, trusted=True)


@pytest.mark.parametrize("key, text, trusted, error", [
    ("torchrun_extra", "--numa-binding=node", False, None),
    ("torchrun_extra", "--numa-binding node --tee 3 -r3 --virtual-local-rank", False, None),
    ("torchrun_extra", "--no-python", True, "--no-python is not allowed (scalestudy sets"),
    ("torchrun_extra", "--no_python", False, "--no-python is not allowed"),
    ("torchrun_extra", "--no-pyth", True, "--no-pyth is not allowed (allowed:"),
    ("torchrun_extra", "-m", False, "-m is not allowed"),
    ("torchrun_extra", "-mevil", False, "-m is not allowed"),
    ("torchrun_extra", "--module", False, "--module is not allowed"),
    ("torchrun_extra", "--run-path", False, "--run-path is not allowed"),
    ("torchrun_extra", "--nproc-per-node=64", True, "--nproc-per-node is not allowed"),
    ("torchrun_extra", "--master-addr=203.0.113.1", True, "--master-addr is not allowed"),
    ("torchrun_extra", "--role x evil.py", False, "'evil.py' is not an option of torchrun"),
    ("torchrun_extra", "-- evil.py", True, "'--' is not an option of torchrun"),
    ("torchrun_extra", "--tee", False, "--tee needs a value"),
    ("torchrun_extra", "--virtual-local-rank=1", False, "--virtual-local-rank takes no value"),
    ("torchrun_extra", "--log-dir /tmp/x", False, "--log-dir is not allowed without --trust-site"),
    ("torchrun_extra", "--log-dir /tmp/x", True, None),
    ("torchrun_extra", "--role 'a b", False, "No closing quotation"),
    ("srun_extra", "--gpu-bind=closest --cpu-bind cores -l", False, None),
    ("srun_extra", "--export=ALL,LD_PRELOAD=/x.so", False, "--export is not allowed without"),
    ("srun_extra", "--export=ALL", True, None),
    ("srun_extra", "--task-prolog /tmp/x.sh", True, "'/tmp/x.sh' is not an option of srun"),
    ("srun_extra", "--ntasks=64", True, "--ntasks is not allowed (scalestudy sets"),
    ("srun_extra", "/bin/sh", True, "'/bin/sh' is not an option of srun"),
    ("extra", "--reservation=bench --signal=USR1@60 -S 0 --exclusive", False, None),
    ("extra", "--wrap=id", True, "--wrap is not allowed (scalestudy sets"),
    ("extra", "--chdir=/", False, "--chdir is not allowed without --trust-site"),
    ("extra", "-o /home/me/.bashrc", True, "-o is not allowed"),
])
def test_program_options(key, text, trusted, error):
    if error is None:
        sp.check_options(text, key, trusted=trusted)
        return
    with pytest.raises(SiteError) as e:
        sp.check_options(text, key, trusted=trusted)
    assert error in str(e.value) and f"site.{key}: " in str(e.value), str(e.value)


@pytest.mark.parametrize("profile", ["slurm", "frontier", "slurm-ci", "local"])
def test_shipped_profiles_need_no_trust(profile):
    site = snakemake.profile_site(str(REPO / "workflow" / "profiles" / profile))
    assert (site is None) == (profile == "local")
    Site.resolve(site).check()


def test_secret_names():
    for name in ("HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "MY_PASSWORD", "DB_PWD",
                 "GITHUB_AUTH", "SSH_PRIVATE_KEY", "KEY", "X_KEYS", "SESSION_COOKIE"):
        assert sp.is_secret(name), name
    for name in ("NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "OMP_NUM_THREADS", "MONKEY_PATCH"):
        assert not sp.is_secret(name), name


def test_secrets_are_split_redacted_and_put_back():
    site = Site.resolve({"partition": "gpu", "env": {"NCCL_DEBUG": "WARN",
                                                     "HF_TOKEN": "hf_s3cr3t"}})
    public, secrets = site.redacted()
    assert public == replace(site, env={"NCCL_DEBUG": "WARN", "HF_TOKEN": REDACTED})
    assert secrets == {"HF_TOKEN": "hf_s3cr3t"}
    assert site.env["HF_TOKEN"] == "hf_s3cr3t"  # the input is left alone
    assert public.redacted() == (public, {})  # a redacted value is no secret to split off
    environ = {SECRETS_ENV: json.dumps(secrets)}
    assert sp.resolve_env(public.env, environ) == site.env
    assert sp.resolve_env(public.env, {"HF_TOKEN": "from-shell"})["HF_TOKEN"] == "from-shell"
    with pytest.raises(SiteError, match="site.env.HF_TOKEN: the value is redacted in point.json"):
        sp.resolve_env(public.env, {})
    # command lines and environments for display
    argv = ["srun", "--export=ALL,HF_TOKEN=hf_s3cr3t,NCCL_DEBUG=INFO", "x", "--k=hf_s3cr3t"]
    assert sp.redact_argv(argv, secrets) == [
        "srun", f"--export=ALL,HF_TOKEN={REDACTED},NCCL_DEBUG=INFO", "x", f"--k={REDACTED}"]
    assert sp.redact_environ({"HF_TOKEN": "x", "A": "1", SECRETS_ENV: "{}"}) == {
        "HF_TOKEN": REDACTED, "A": "1", SECRETS_ENV: REDACTED}


def test_launch_env_puts_secrets_back_and_hides_the_rest():
    point = Point.for_layout(Model(), dp=1, device="cpu", devices_per_node=1,
                             site={"env": {"HF_TOKEN": REDACTED, "NCCL_DEBUG": "WARN"}})
    environ = {"PATH": "/usr/bin", SECRETS_ENV: json.dumps({"HF_TOKEN": "hf_s3cr3t",
                                                             "OTHER_TOKEN": "x"})}
    env = launch.launch_env(point, environ)
    assert env["HF_TOKEN"] == "hf_s3cr3t" and env["NCCL_DEBUG"] == "WARN"
    assert SECRETS_ENV not in env and "OTHER_TOKEN" not in env


# --- the command line ----------------------------------------------------------------------------

STUDY = """name: s
models:
  m: {layers: 2, hidden: 32, heads: 2, seq_len: 16, vocab: 64}
train: {steps: 3, warmup_steps: 1}
platform:
  device: cpu
  devices_per_node: 1
  site:
    env: {NCCL_DEBUG: WARN, MY_API_TOKEN: tok-1234-s3cr3t-5678}
series:
  - {name: w, mode: weak, model: m, gpus: [1], micro_batch: 2}
"""
SECRET = "tok-1234-s3cr3t-5678"


def test_trust_site_reaches_snakemake_as_config(tmp_path):
    argv = snakemake.snakemake_argv("s.yaml", str(tmp_path / "r"), None, [], trust_site=True)
    assert argv[argv.index("--config"):][-1] == "trust_site=true"
    assert "trust_site=true" not in snakemake.snakemake_argv("s.yaml", str(tmp_path / "r"), None, [])


def test_run_refuses_a_profile_site_with_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = tmp_path / "study.yaml"
    study.write_text(STUDY.replace(", MY_API_TOKEN: tok-1234-s3cr3t-5678", ""))
    prof = tmp_path / "prof"
    prof.mkdir()
    (prof / "config.yaml").write_text("executor: local\nconfigfile: site.yaml\n")
    (prof / "site.yaml").write_text("site:\n  env: {LD_PRELOAD: /tmp/evil.so}\n")
    rc = cli.main(["run", str(study), "--profile", str(prof), "--results", "r", "--no-report"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert "site.env.LD_PRELOAD: not allowed without --trust-site" in err
    assert set(tmp_path.iterdir()) == {study, prof}  # nothing written


def test_study_with_a_secret_needs_trust_and_plans_with_it(tmp_path, capsys):
    study = tmp_path / "study.yaml"
    study.write_text(STUDY)
    assert cli.main(["plan", str(study)]) == 2
    assert "MY_API_TOKEN: not allowed without --trust-site" in capsys.readouterr().err
    assert cli.main(["plan", str(study), "--trust-site"]) == 0
    assert SECRET not in capsys.readouterr().out


HOOK = '''
import hashlib, os
def make(point, rank):
    with open(os.path.join(os.environ["SECRET_PROBE_OUT"], f"rank{rank}.json"), "w") as f:
        f.write(repr((hashlib.sha256(os.environ.get("MY_API_TOKEN", "").encode()).hexdigest(),
                      os.environ.get("SCALESTUDY_SITE_SECRETS"))))
    return None
'''


def _hook_env(tmp_path: Path) -> dict:
    (tmp_path / "secret_hook.py").write_text(HOOK)
    probe = tmp_path / "probe"
    probe.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != SECRETS_ENV}
    env.update(SCALESTUDY_STEP_HOOK="secret_hook:make", SECRET_PROBE_OUT=str(probe),
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO / "src")]))
    return env


def _no_secret_under(root: Path):
    for path in root.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def _rank_saw_the_secret(tmp_path: Path):
    seen = eval((tmp_path / "probe" / "rank0.json").read_text())
    assert seen == (hashlib.sha256(SECRET.encode()).hexdigest(), None)


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_runner_gives_the_secret_to_the_ranks_and_to_no_record(tmp_path, monkeypatch):
    from scalestudy.run import runner

    env = _hook_env(tmp_path)
    public, secrets = Site.resolve({"env": {"NCCL_DEBUG": "WARN",
                                            "MY_API_TOKEN": SECRET}}).redacted()
    point = identify(Point.for_layout(Model(layers=2, hidden=32, heads=2, seq_len=16, vocab=64),
                                      dp=1, micro_batch=2, device="cpu", devices_per_node=1,
                                      steps=3, warmup_steps=1, site=public, series="w",
                                      study="s"))
    run_dir = tmp_path / "results" / "runs" / point.point_id
    run_dir.mkdir(parents=True)
    (run_dir / "point.json").write_text(point.json_text())
    env[SECRETS_ENV] = json.dumps(secrets)
    for key in list(os.environ):
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    status = runner.run_point(run_dir / "point.json", run_dir)
    assert status["state"] == "ok", status
    _rank_saw_the_secret(tmp_path)
    _no_secret_under(tmp_path / "results")
    assert REDACTED in (run_dir / "point.json").read_text()


@pytest.mark.workflow
@pytest.mark.timeout(600)
def test_secret_through_snakemake_reaches_the_rank_and_no_result(tmp_path):
    """The whole path: the study's site.env token is redacted in study.json, point.json,
    stdout.log and env.json, handed to the job through Snakemake's environment, and seen by
    the rank."""
    import subprocess

    from scalestudy.paths import profile

    study = tmp_path / "study.yaml"
    study.write_text(STUDY)
    results = tmp_path / "results"
    argv = snakemake.snakemake_argv(str(study), str(results), str(profile("local")), [],
                              trust_site=True)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=550, env=_hook_env(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = subprocess.run(argv + ["--report", str(results / "s" / "report.html")],
                            capture_output=True, text=True, timeout=300, env=_hook_env(tmp_path))
    assert report.returncode == 0 and (results / "s" / "report.html").stat().st_size > 0
    _rank_saw_the_secret(tmp_path)
    _no_secret_under(results)
    doc = json.loads((results / "s" / "study.json").read_text())
    assert doc["platform"]["site"]["env"] == {"NCCL_DEBUG": "WARN", "MY_API_TOKEN": REDACTED}
    (run,) = (results / "s" / "runs").iterdir()
    assert json.loads((run / "point.json").read_text())["platform"]["site"]["env"][
        "MY_API_TOKEN"] == REDACTED
    assert SECRET not in r.stdout + r.stderr
