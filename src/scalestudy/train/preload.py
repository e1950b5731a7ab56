"""What a rank of the built-in trainer imports, in one call: a process that forks ranks
(``scalestudy.run.forked_ranks``' zygote) runs it once so that each rank starts with its
imports done."""


def preload() -> None:
    """Import the trainer with every module its layouts import lazily, and torch._dynamo
    (imported at the optimizer's and DDP's first call, ``torch._disable_dynamo``): ~1.8 s CPU
    on the 2-core dev host, ~1.5 s of it torch._dynamo."""
    import torch._dynamo  # noqa: F401
    import torch.distributed.algorithms._checkpoint.checkpoint_wrapper  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.optim  # noqa: F401
    import torch.distributed.pipelining  # noqa: F401
    import torch.distributed.tensor.experimental  # noqa: F401
    import torch.distributed.tensor.parallel  # noqa: F401
    import torch.nn.parallel  # noqa: F401
    import torch.utils.checkpoint  # noqa: F401

    import scalestudy.models.gpt  # noqa: F401
    import scalestudy.models.llama  # noqa: F401
    import scalestudy.train.loop  # noqa: F401
