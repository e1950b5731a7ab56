"""Models of performance, all pure: FLOPs and parameter counts (``flops``), the hardware
description (``hardware``), memory per device (``memory``), step time (``stepmodel``), and
their uses: predictions at scale (``predict``) and the search for a layout (``tune``)."""
