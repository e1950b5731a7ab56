"""scalestudy: weak and strong scaling studies of distributed LLM training."""

__version__ = "0.1.0"
