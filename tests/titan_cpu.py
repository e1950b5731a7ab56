"""Run torchtitan's own trainer (``python -m torchtitan.train``, release 0.2.2) on CPU
processes with gloo: what tests/integration/test_foreign.py sweeps as a command workload.

torchtitan 0.2.x has no device option and no CPU path as shipped. This launcher changes only
device selection and the reduce op, before torchtitan is imported, then runs its ``train``
module as ``__main__`` with the command line unchanged (every other argument is torchtitan's):

1. ``torchtitan.tools.utils`` picks its device as ``_get_available_device_type() or "cuda"``;
   on a host without an accelerator that is "cuda", and ``torch.cuda.set_device`` dies. The
   probe is made to answer "cpu" where it answers nothing (an accelerator still wins).
2. ``torch.cpu.current_device()`` returns the string "cpu", which torchtitan passes to
   ``barrier(device_ids=[...])``, and ``barrier`` refuses a string: it returns device index 0.
3. torchtitan 0.2.x sets FSDP2's gradient divide factor to 1.0 (it scales gradients by the
   global token count itself); FSDP2 turns that factor into ``ReduceOp.PREMUL_SUM``, which
   gloo refuses. ``FSDPModule.set_force_sum_reduction_for_comms(True)`` makes the same
   reduce-scatter a plain sum: with a factor of 1.0 the sums are the same.
4. torch.cpu has no memory statistics: the ``DeviceMemoryMonitor`` of torchtitan reads
   ``torch.cpu.get_device_name`` / ``get_device_properties`` / ``memory_stats``, which do not
   exist; they answer "no statistics" (an empty dict, as a device without an allocator does),
   so torchtitan prints ``memory: -0.00GiB(-100.00%)``: unmeasured, which the ``torchtitan``
   metrics preset reads as such (no number).

5. ``--profiling.enable_profiling``: torchtitan lists the profiler's activities as ``[CPU,
   <the accelerator's>]``, which is ``None`` on a host without one, and ``torch.profiler``
   refuses ``None``: the profiler is given the list without it (the CPU activity alone).

Nothing else changes: model, data loader, optimizer, FSDP2, logging, the profiler's schedule
and trace files are torchtitan's.
"""

from __future__ import annotations

import runpy
import sys
import types

import torch
import torch._utils
from torch.distributed.fsdp import FSDPModule

# 1. device selection: "cpu" where no accelerator answers (torchtitan imports the name later)
_probe = torch._utils._get_available_device_type
torch._utils._get_available_device_type = lambda: _probe() or "cpu"

# 2. a device index barrier(device_ids=...) accepts
torch.cpu.current_device = lambda: 0

# 3. the reduce op: a divide factor of 1.0 as plain sums (gloo has no PREMUL_SUM)
_set_factor = FSDPModule.set_gradient_divide_factor


def _set_gradient_divide_factor(self, factor: float) -> None:
    _set_factor(self, factor)
    if factor == 1.0:
        self.set_force_sum_reduction_for_comms(True)


FSDPModule.set_gradient_divide_factor = _set_gradient_divide_factor

# 4. no memory statistics on CPU: a device name, a capacity of 1 byte, no counters
if not hasattr(torch.cpu, "memory_stats"):
    torch.cpu.get_device_name = lambda device=None: "cpu"
    torch.cpu.get_device_properties = lambda device=None: types.SimpleNamespace(total_memory=1)
    torch.cpu.memory_stats = lambda device=None: {}
    torch.cpu.reset_peak_memory_stats = lambda device=None: None
    torch.cpu.empty_cache = lambda: None

# 5. the profiler's activities without the missing accelerator's (None)
_profile_init = torch.profiler.profile.__init__


def _profile_without_none(self, *args, activities=None, **kwargs):
    if activities is not None:
        activities = [a for a in activities if a is not None]
    _profile_init(self, *args, activities=activities, **kwargs)


torch.profiler.profile.__init__ = _profile_without_none

if __name__ == "__main__":
    sys.argv[0] = "torchtitan.train"
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
