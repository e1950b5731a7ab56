"""Models of performance, all pure: FLOPs and parameter counts (``flops``), the hardware
description (``hardware``), memory per device (``memory``), step time (``stepmodel``, the
assembly of ``terms_compute`` and ``terms_comm`` at the ``rates`` of ``hardware`` or of
measurements, corrected by ``host`` on a CPU host; its result: ``breakdown``), and their uses:
predictions at scale (``frontier``, ``anchor``, ``validation``)."""
