"""torchrun, with its c10d stores listening on the rendezvous address only.

    scalestudy torchrun -- [torchrun's options] -m scalestudy.train POINT RUN_DIR  (scalestudy.commands.torchrun)

What torch does by itself (torch 2.x, read in ``torch/distributed/elastic/rendezvous/`` and
seen with ``ss -ltnp`` while a 2-process point runs): the launcher (torchrun's agent) of the
store host starts two ``TCPStore`` servers, the c10d rendezvous backend's store
(``--rdzv-endpoint HOST:PORT``, ``c10d_rendezvous_backend._create_tcp_store``) and the store it
shares with the workers (``MASTER_ADDR``/``MASTER_PORT``,
``DynamicRendezvousHandler._create_tcp_store_server``). Both listen on the wildcard address
(``*:port``: every interface, IPv4 and IPv6), whatever host name they are given, and neither
authenticates or encrypts anything: whoever reaches the port can read and write the
rendezvous state and the workers' keys, join the job or stall it.

This wrapper makes both servers listen on a socket bound to the address they are given
(``127.0.0.1`` for a single-node point, the first node's address for a multi-node point) and
hands it to the store as ``master_listen_fd``, a documented argument of
``torch.distributed.TCPStore``; everything else is torchrun unchanged
(``torch.distributed.run.main``). A multi-node point's first node may bind the rendezvous
socket before torchrun starts (``scalestudy.run.nodes``: the port is then the kernel's free
choice at job start) and pass it in, inheritable, as ``SCALESTUDY_RDZV_LISTEN_FD``.

The workers' own sockets are not torchrun's: gloo listens on the interface of
``GLOO_SOCKET_IFNAME`` and NCCL's bootstrap on ``NCCL_SOCKET_IFNAME``
(``scalestudy.run.launch.env_additions`` sets both to ``lo`` for points on one host).

Each rank dies with this torchrun and holds the point's lock (:func:`install_rank_lifetime`,
``scalestudy.run.lifetime``).
"""

from __future__ import annotations

import inspect
import os
import signal
import socket
import subprocess
import sys
from datetime import timedelta

from scalestudy.run import forked_ranks, lifetime

#: An inherited, bound (not yet listening) socket for the rendezvous store: its fd number.
LISTEN_FD_ENV = "SCALESTUDY_RDZV_LISTEN_FD"


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host`` (a name or address; its first address) and ``port``
    (0: a free port the kernel picks)."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    return sock


def _inherited(port: int) -> int | None:
    """The inherited socket's fd when it is bound to ``port`` (taken once), else None."""
    text = os.environ.get(LISTEN_FD_ENV, "")
    if not text.isdigit():
        return None
    fd = int(text)
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    bound = sock.getsockname()[1]
    sock.detach()
    if bound != port:
        return None
    del os.environ[LISTEN_FD_ENV]  # neither the second store nor the workers see it
    return fd


def tcp_store(host_name, port, world_size=None, is_master=False,
              timeout=timedelta(seconds=300), wait_for_workers=True, multi_tenant=False,
              master_listen_fd=None, use_libuv=True):
    """``torch.distributed.TCPStore`` whose server listens on ``host_name`` only."""
    from torch.distributed import TCPStore

    if is_master and master_listen_fd is None:
        master_listen_fd = _inherited(int(port))
        if master_listen_fd is None:
            try:
                sock = bind_socket(host_name, int(port))
            except OSError as e:  # what torch raises when its own bind fails
                raise RuntimeError(f"TCPStore on {host_name}:{port}: {e}") from e
            port = sock.getsockname()[1]
            master_listen_fd = sock.detach()  # the store owns (and closes) it now
    return TCPStore(host_name, int(port), world_size, is_master, timeout, wait_for_workers,
                    multi_tenant, master_listen_fd, use_libuv)


def install() -> list[str]:
    """Route torchrun's two store servers through :func:`tcp_store`. Returns what could not
    be patched in this torch (empty when both were)."""
    missing = []
    try:
        from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as backend
        if not hasattr(backend, "TCPStore"):
            raise AttributeError("TCPStore")
        backend.TCPStore = tcp_store
    except (ImportError, AttributeError):
        missing.append("c10d_rendezvous_backend.TCPStore")
    try:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
            DynamicRendezvousHandler)
        if _params(getattr(DynamicRendezvousHandler, "_create_tcp_store_server", None)) != \
                ["self", "master_addr", "master_port"]:
            raise AttributeError("_create_tcp_store_server")

        def _create_tcp_store_server(self, master_addr, master_port):
            return tcp_store(host_name=master_addr, port=master_port, is_master=True,
                             multi_tenant=True)

        DynamicRendezvousHandler._create_tcp_store_server = _create_tcp_store_server
    except (ImportError, AttributeError):
        missing.append("DynamicRendezvousHandler._create_tcp_store_server")
    return missing


def _params(fn) -> list[str] | None:
    """The parameter names of a torch internal this module replaces (None: not there), so a
    release whose internal changed shape is left alone, not patched wrongly."""
    try:
        return list(inspect.signature(fn).parameters) if fn is not None else None
    except (TypeError, ValueError):
        return None


def rank_popen_kwargs(environ=os.environ) -> dict:
    """What each rank's ``Popen`` gets beyond torch's own arguments: it dies with this torchrun
    (SIGKILL: a rank holds nothing to clean up, and a stopped rank takes no SIGTERM), and it
    holds the point's lock (``scalestudy.run.lifetime``) when the runner handed one down."""
    kwargs: dict = {"preexec_fn": lifetime.dies_with_parent(signal.SIGKILL)}
    fd = environ.get(lifetime.POINT_LOCK_FD_ENV, "")
    if fd.isdigit():
        kwargs["pass_fds"] = (int(fd),)
    return kwargs


def install_rank_lifetime(zygote=None) -> bool:
    """Start torchrun's ranks with :func:`rank_popen_kwargs`, each in a session of its own as
    torch does (its shutdown signals each rank's group); a built-in trainer's rank forked by
    ``zygote`` (``scalestudy.run.forked_ranks``) where one is given, exec'd where it is gone.
    False when this torch's ``SubprocessHandler`` is not the one read here (torch 2.6-2.13;
    2.11's and 2.13's are the same: ``_popen(self, args, env)`` with
    ``_stdout``/``_stderr``)."""
    try:
        from torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler \
            import SubprocessHandler
    except ImportError:
        return False
    if _params(getattr(SubprocessHandler, "_popen", None)) != ["self", "args", "env"]:
        return False

    def _popen(self, args, env):
        kwargs = rank_popen_kwargs()
        if zygote is not None and forked_ranks.is_trainer_argv(args):
            try:
                return zygote.start_rank(args, env, self._stdout, self._stderr,
                                         kwargs.get("pass_fds", ()))
            except OSError as e:
                print(f"scalestudy torchrun: warning: {e}; the rank starts exec'd",
                      file=sys.stderr, flush=True)
        return subprocess.Popen(args=args, env=env, stdout=self._stdout, stderr=self._stderr,
                                start_new_session=True, **kwargs)

    SubprocessHandler._popen = _popen
    return True
