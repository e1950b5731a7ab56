"""What a study's or a profile's ``site`` settings may do, and what of them reaches the records.

A study file may come from someone else, and its ``platform.site`` reaches the launch: the
ranks' environment (``site.env``), torchrun's command line (``site.torchrun_extra``), srun's
(``site.srun_extra``) and sbatch's (``site.extra``). Without care that is a way to run any
program (``LD_PRELOAD``, ``PYTHONPATH``, ``SCALESTUDY_STEP_HOOK``, ``torchrun --no-python``,
``srun --task-prolog``, ``sbatch --wrap``). So (docs/security.md, "Site settings"):

- ``site.env``: names on :data:`ENV_PREFIXES` / :data:`ENV_NAMES` (the communication,
  threading and accelerator runtimes), except names that load code or name files
  (:data:`ENV_CODE_OR_FILE`, e.g. ``NCCL_NET_PLUGIN``, ``CUDA_INJECTION64_PATH``,
  ``NCCL_DEBUG_FILE``) unless listed in :data:`ENV_EXEMPT`; anything else only with
  ``--trust-site`` (``scalestudy run --trust-site``, Snakemake ``--config trust_site=true``).
- ``torchrun_extra``, ``srun_extra``, ``extra``: options of that program only, each from an
  allow-list (:data:`TORCHRUN_OPTIONS`, :data:`SRUN_OPTIONS`, :data:`SBATCH_OPTIONS`); never
  a positional argument (it would become the program), never an option scalestudy sets itself
  or that picks the program (:data:`TORCHRUN_NEVER`, ...), other options of the program only
  with ``--trust-site``.
- Secrets: the value of every ``site.env`` variable whose name looks like a token, key,
  password or secret (:func:`is_secret`) is replaced by :data:`REDACTED` in every record
  (``study.json``, ``point.json``, the command line in ``stdout.log`` and ``env.json``); the
  real value travels to the launch outside the results, in the environment of Snakemake's jobs
  (:data:`SECRETS_ENV`, set by ``scalestudy.run.workflow`` from the study and profile the
  Snakefile reads), and is put back by :func:`resolve_env` when the point starts.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Mapping

#: The value that stands for a secret in a record.
REDACTED = "<redacted>"
#: Environment variable (of Snakemake's jobs, never of the ranks) holding the secret site.env
#: values as JSON: {name: value}.
SECRETS_ENV = "SCALESTUDY_SITE_SECRETS"

#: Prefixes of the variables a site may set without --trust-site: collective libraries and
#: their transports, threading and math libraries, accelerator runtimes.
ENV_PREFIXES = (
    "NCCL_", "RCCL_", "TORCH_NCCL_", "GLOO_", "FI_", "CXI_", "UCX_", "MPICH_", "OMP_", "KMP_",
    "MKL_", "OPENBLAS_", "CUDA_", "CUBLAS_", "CUDNN_", "HIP_", "ROCR_", "HSA_", "MIOPEN_",
    "HIPBLASLT_",
)
#: Single variables a site may set without --trust-site.
ENV_NAMES = frozenset({
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "TORCH_DISTRIBUTED_DEBUG", "TORCH_CPP_LOG_LEVEL", "TORCH_SHOW_CPP_STACKTRACES",
    "NVIDIA_TF32_OVERRIDE",
})
#: Names (within the prefixes) that load code or read/write a file of the study's choosing.
ENV_CODE_OR_FILE = re.compile(
    r"PLUGIN|INJECTION|TOOLS?_LIB|TOOL_LIBRAR|(_PATH|_FILE|_LIB|_LIBS|_LIBRARY|_LIBRARIES|_DIR"
    r"|_DIRS|_MODULES?|_CONF|_CONFIG)$|^NCCL_COMM_ID$")
#: Exceptions to :data:`ENV_CODE_OR_FILE`: settings, or caches of fixed file names.
ENV_EXEMPT = frozenset({
    "MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR", "CUBLAS_WORKSPACE_CONFIG",
})
#: A variable name that looks like a secret: its value is redacted in every record.
SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSW|PASSPHRASE|PWD|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|SIGNATURE"
    r"|API_?KEY|ACCESS_?KEY|(^|_)KEYS?(_|$)", re.IGNORECASE)

# Options: {name: takes a value}. Short options are '-x'; long ones are matched exactly (no
# abbreviations, which argparse would accept: '--no-pyth' is '--no-python' to torchrun).
TORCHRUN_OPTIONS = {
    "--monitor-interval": True, "--start-method": True, "--role": True, "--redirects": True,
    "-r": True, "--tee": True, "-t": True, "--local-ranks-filter": True,
    "--duplicate-stdout-filters": True, "--duplicate-stderr-filters": True,
    "--numa-binding": True, "--signals-to-handle": True, "--shutdown-timeout": True,
    "--virtual-local-rank": False,
}
#: With --trust-site only: they write files or load handlers by name.
TORCHRUN_TRUSTED = {"--log-dir": True, "--logs-specs": True, "--event-log-handler": True}
#: Never: the program, the shape and the rendezvous are scalestudy's.
TORCHRUN_NEVER = {
    "-m", "--module", "--no-python", "--run-path", "--nnodes", "--nproc-per-node",
    "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf", "--standalone",
    "--max-restarts", "--node-rank", "--master-addr", "--master-port", "--local-addr", "-h",
    "--help",
}
SRUN_OPTIONS = {
    "--cpu-bind": True, "--mem-bind": True, "--gpu-bind": True, "--distribution": True,
    "-m": True, "--hint": True, "--network": True, "--cpus-per-gpu": True,
    "--gpus-per-task": True, "--ntasks-per-socket": True, "--ntasks-per-core": True,
    "--sockets-per-node": True, "--cores-per-socket": True, "--threads-per-core": True,
    "--mem": True, "--mem-per-cpu": True, "--mem-per-gpu": True, "--switches": True,
    "--gres-flags": True, "--cpu-freq": True, "--core-spec": True, "-S": True,
    "--thread-spec": True, "--gpu-freq": True, "--signal": True, "--wait": True, "-W": True,
    "--mpi": True, "--label": False, "-l": False, "--unbuffered": False, "-u": False,
    "--overlap": False, "--exact": False, "--quiet": False, "-Q": False, "--verbose": False,
    "-v": False, "--exclusive": False,
}
SRUN_NEVER = {
    "--nodes", "-N", "--ntasks", "-n", "--ntasks-per-node", "--cpus-per-task", "-c",
    "--kill-on-bad-exit", "-K", "--job-name", "-J", "--jobid", "--gres", "--gpus-per-node",
    "-h", "--help",
}
SBATCH_OPTIONS = {
    "--reservation": True, "--signal": True, "--network": True, "--time-min": True,
    "--mail-type": True, "--mail-user": True, "--switches": True, "--core-spec": True,
    "-S": True, "--thread-spec": True, "--hint": True, "--mem-bind": True, "--gres-flags": True,
    "--licenses": True, "-L": True, "--nice": True, "--begin": True, "-b": True,
    "--comment": True, "--wckey": True, "--distribution": True, "-m": True, "--gpu-freq": True,
    "--cpu-freq": True, "--gpus-per-task": True, "--cpus-per-gpu": True, "--mem-per-gpu": True,
    "--mem-per-cpu": True, "--sockets-per-node": True, "--cores-per-socket": True,
    "--threads-per-core": True, "--ntasks-per-socket": True, "--ntasks-per-core": True,
    "--nodelist": True, "-w": True, "--exclude": True, "-x": True, "--gpu-bind": True,
    "--tmp": True, "--prefer": True, "--deadline": True, "--delay-boot": True,
    "--exclusive": False, "--contiguous": False, "--overcommit": False, "-O": False,
    "--spread-job": False, "--use-min-nodes": False, "--requeue": False, "--no-requeue": False,
}
SBATCH_NEVER = {
    "--wrap", "--nodes", "-N", "--ntasks", "-n", "--ntasks-per-node", "--cpus-per-task", "-c",
    "--mem", "--job-name", "-J", "--output", "-o", "--error", "-e", "--array", "-a",
    "--parsable", "--test-only", "--wait", "-W", "--gres", "--gpus-per-node", "--time", "-t",
    "--partition", "-p", "--account", "-A", "-h", "--help",
}
_PROGRAMS = {
    "torchrun_extra": ("torchrun", TORCHRUN_OPTIONS, TORCHRUN_TRUSTED, TORCHRUN_NEVER),
    "srun_extra": ("srun", SRUN_OPTIONS, {}, SRUN_NEVER),
    "extra": ("sbatch", SBATCH_OPTIONS, {}, SBATCH_NEVER),
}
#: The site keys that hold options of a program (``torchrun_extra``, ``srun_extra``, ``extra``).
OPTION_KEYS = tuple(_PROGRAMS)


class SiteError(ValueError):
    """Site settings that may not be used; ``str()`` is one line naming the setting."""


def is_secret(name: str) -> bool:
    """Whether an environment variable's name looks like it holds a secret."""
    return bool(SECRET_NAME.search(str(name)))


def env_allowed(name: str) -> bool:
    """Whether ``site.env`` may set ``name`` without --trust-site."""
    if name in ENV_EXEMPT or name in ENV_NAMES:
        return True
    return name.startswith(ENV_PREFIXES) and not ENV_CODE_OR_FILE.search(name)


def check_site_env(env: Mapping, *, trusted: bool = False, where: str = "site") -> None:
    """Raise :class:`SiteError` for a ``site.env`` entry that is not allowed."""
    for name, value in (env or {}).items():
        field = f"{where}.env.{name}"
        if "\0" in str(value) or len(str(value)) > 32768:
            raise SiteError(f"{field}: the value is not allowed (text without NUL, at most "
                            "32768 characters)")
        if not trusted and not env_allowed(str(name)):
            raise SiteError(
                f"{field}: not allowed without --trust-site (variables of the communication, "
                "threading and accelerator runtimes: NCCL_*, GLOO_*, FI_*, UCX_*, OMP_*, CUDA_*, "
                "HIP_*, ..., none that loads code or names a file; docs/security.md, 'Site "
                "settings')")


def _option(token: str) -> tuple[str, str | None]:
    """(option name, attached value or None) of a token: '--x=v', '--x', '-xV', '-x'."""
    if token.startswith("--"):
        name, eq, value = token.partition("=")
        return name.replace("_", "-"), (value if eq else None)
    return token[:2], (token[2:] or None)


def check_options(text: str | None, key: str, *, trusted: bool = False,
                  where: str = "site") -> list[str]:
    """The tokens of ``site.<key>`` (``torchrun_extra``, ``srun_extra`` or ``extra``) after
    checking that every one is an allowed option of its program; :class:`SiteError` otherwise.

    With ``trusted`` (--trust-site), torchrun's file and handler options are allowed too, and
    any other option of srun or sbatch in its ``--name=value`` form (its arity is unknown
    here, and a following word would be a positional argument); never a positional argument
    or an option of the never-lists."""
    program, allowed, trusted_only, never = _PROGRAMS[key]
    field = f"{where}.{key}"
    try:
        tokens = shlex.split(text or "")
    except ValueError as e:
        raise SiteError(f"{field}: {e} (options of {program}, quoted as in a shell)") from None
    table = {**allowed, **(trusted_only if trusted else {})}
    listed = ", ".join(sorted(allowed))
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in ("-", "--") or not token.startswith("-"):
            raise SiteError(f"{field}: {token!r} is not an option of {program} (options only: "
                            f"a positional argument would become the program {program} runs)")
        name, value = _option(token)
        if name in never:
            raise SiteError(f"{field}: {name} is not allowed (scalestudy sets the program, "
                            f"shape and rendezvous of a point; allowed: {listed})")
        if name not in table:
            if trusted and key != "torchrun_extra" and token.startswith("--"):
                i += 1  # any option of srun/sbatch, as --name or --name=value
                continue
            needs = name in trusted_only or key != "torchrun_extra"
            raise SiteError(f"{field}: {name} is not allowed"
                            f"{' without --trust-site' if needs else ''} (allowed: {listed})")
        if table[name] and value is None:  # the value is the next word
            if i + 1 >= len(tokens) or tokens[i + 1].startswith("-"):
                raise SiteError(f"{field}: {name} needs a value (e.g. {name}=VALUE)")
            i += 1
        elif not table[name] and value is not None:
            raise SiteError(f"{field}: {name} takes no value")
        i += 1
    return tokens


# --- secrets ------------------------------------------------------------------------------------

def split_secrets(env: Mapping) -> tuple[dict, dict]:
    """(``site.env`` with every secret-looking value replaced by :data:`REDACTED`,
    {name: real value} of those)."""
    secrets = {k: str(v) for k, v in env.items() if is_secret(k) and str(v) != REDACTED}
    return {k: (REDACTED if k in secrets else v) for k, v in env.items()}, secrets


def secrets_from(environ: Mapping) -> dict:
    """The secret values handed to this job (:data:`SECRETS_ENV`), or {}."""
    try:
        data = json.loads(environ.get(SECRETS_ENV) or "{}")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def resolve_env(site_env: Mapping, environ: Mapping) -> dict:
    """``site_env`` with each :data:`REDACTED` value put back: from :data:`SECRETS_ENV`, else
    the caller's own variable of that name. A secret with neither is an error (the point would
    run without it)."""
    secrets = secrets_from(environ)
    out = {}
    for name, value in site_env.items():
        if value == REDACTED:
            if name in secrets:
                value = secrets[name]
            elif name in environ:
                value = environ[name]
            else:
                raise SiteError(f"site.env.{name}: the value is redacted in point.json and this "
                                f"launch was given none (run the study through scalestudy run "
                                f"or snakemake, or export {name})")
        out[name] = value
    return out


_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=([^,\s]*)")


def redact_text(text: str, secrets: Mapping | None = None) -> str:
    """``text`` with ``NAME=value`` of secret-looking names, and every literal secret value of
    ``secrets`` (4 characters or more), replaced by :data:`REDACTED`."""
    for value in sorted((v for v in (secrets or {}).values() if len(str(v)) >= 4), key=len,
                        reverse=True):
        text = text.replace(str(value), REDACTED)
    return _ASSIGNMENT.sub(lambda m: f"{m[1]}={REDACTED}" if is_secret(m[1]) else m[0], text)


def redact_argv(argv: list[str], secrets: Mapping | None = None) -> list[str]:
    """A command line for the records: :func:`redact_text` of every argument."""
    return [redact_text(str(a), secrets) for a in argv]


def redact_environ(env: Mapping) -> dict:
    """An environment for display: secret-looking values and :data:`SECRETS_ENV` hidden."""
    return {k: (REDACTED if is_secret(k) or k == SECRETS_ENV else v) for k, v in env.items()}
