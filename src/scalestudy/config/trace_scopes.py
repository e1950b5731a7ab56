"""The names of the built-in trainer's profiler scopes (``torch.profiler.record_function``),
a contract between the trainer (``scalestudy.distributed.engine``) and the trace reader
(``scalestudy.record.timeline``): time inside ``CLIP`` is the optimizer's, inside ``DATA``
the batch's move to the device; ``FORWARD_BACKWARD`` holds the step's micro-batches (or its
pipeline schedule), a scope inside which a rank waits for its transfers."""

CLIP = "scalestudy::clip_grad_norm"
DATA = "scalestudy::data"
FORWARD_BACKWARD = "scalestudy::forward_backward"
