"""The memory-bound kernels of one transformer layer and of the loss, per architecture and per
fusion level of the framework that runs them. Pure functions; traffic in elements per token
(multiply by the activation width in bytes), kernels as launch counts.

A kernel here is one launch that reads and writes activations without a matrix product: norms,
residual adds, the activation function, rotary embeddings, relayouts, casts. Each entry is
``(name, elements read + written per token in the forward pass, forward launches)``; its
backward moves ``BACKWARD_TRAFFIC`` × the forward's traffic in ``BACKWARD_LAUNCHES`` × the
launches (autograd's backward of an elementwise op reads its input and the output gradient and
writes the input gradient: 3 elements against the forward's 2; a norm's backward also reduces
over the row for its weight gradient; a residual add's backward only accumulates the branch
gradients: 3 against 3). Elements are counted at the activation width, so an fp32 upcast of a
bf16 activation counts 2 elements per value moved in fp32.

Fusion levels (``Framework.fusion``, read from each framework's code):

- ``eager`` — PyTorch eager (scalestudy's trainer, torchtitan without ``torch.compile``):
  ``nn.LayerNorm`` is one kernel; Llama's RMSNorm is composite (upcast to fp32, square, mean,
  rsqrt, scale, cast back, weight: torchtitan ``models/norms.py`` / ``torch.nn.RMSNorm``'s
  composite path); rotary embeddings through complex multiplication in fp32 (torchtitan
  ``apply_rotary_emb``: ``view_as_complex(x.float())``, multiply, ``view_as_real``,
  ``type_as``); grouped-query keys and values repeated to every head before SDPA
  (``repeat_kv``); SwiGLU as ``silu(w1 x) * w3 x`` (two kernels); the loss over fp32 logits
  (``logits.float()``, ``log_softmax``, its backward, the cast of the gradient back).
- ``fused`` — Megatron (Megatron-LM, Megatron-DeepSpeed, Megatron-Core with Transformer Engine):
  one fused LayerNorm/RMSNorm kernel (apex ``FusedLayerNorm`` / TE), bias + GeLU and bias +
  SwiGLU fused (``bias_gelu_impl``, ``bias_swiglu_impl``), bias + dropout + residual add fused
  (``bias_dropout_add_fused_train``), fused rotary embeddings (``apply_rotary_pos_emb`` with
  ``apply_rope_fusion``), grouped-query attention inside the attention kernel, the
  vocabulary-parallel cross-entropy over the logits in place.
- ``compiled`` — ``torch.compile`` (Inductor fuses each chain of pointwise ops and reductions
  into one kernel that reads its inputs and writes its outputs once): the traffic of ``fused``.
"""

from __future__ import annotations

from scalestudy.config.parts import Model
from scalestudy.config.vocab import Arch, MLPKind

FUSION_LEVELS = ("eager", "fused", "compiled")
#: Backward traffic and launches as multiples of the forward's (module doc).
BACKWARD_TRAFFIC = 2.0
BACKWARD_LAUNCHES = 2.0


def _check(fusion: str) -> str:
    if fusion not in FUSION_LEVELS:
        raise ValueError(f"fusion={fusion!r}: use one of {', '.join(FUSION_LEVELS)}")
    return fusion


def layer_kernels(model: Model, fusion: str, tp: int = 1, sp: bool = False,
                  dropout: bool = False, bias_add: bool = False) -> list[tuple]:
    """The memory-bound kernels of one layer's forward pass on one TP rank as ``(name,
    elements per token, launches)``. Hidden-wide tensors (norms, residuals) are split over TP
    only with sequence parallelism; the attention and MLP intermediates always are.
    ``dropout``: eager hidden dropouts after the attention and the MLP (read, write, mask: 3
    elements each); fused frameworks apply them inside bias-dropout-add. ``bias_add``: the
    framework adds each linear layer's bias in a kernel of its own (``Framework.bias_add``):
    q/k/v and MLP-up outputs per TP rank, the row-parallel outputs hidden-wide after their
    all-reduce, one launch each with q/k/v (and SwiGLU's gate and up) fused as Megatron
    fuses them; 1 element per value here, so that with the backward's 2 × it counts the
    forward's read and write and the bias gradient's reduction (3)."""
    fusion = _check(fusion)
    h, f, kv = model.hidden, model.ffn, model.kv_dim
    hw_ = h / (tp if sp else 1)  # hidden-wide, per TP rank
    q, k, ff = h / tp, kv / tp, f / tp  # column-parallel widths per TP rank
    llama = model.arch == Arch.LLAMA
    swiglu = model.mlp == MLPKind.SWIGLU
    out: list[tuple] = []
    if fusion == "eager" and llama:
        # composite RMSNorm in fp32: upcast (1 + 2), square (2 + 2), mean (2), scale (2 + 2),
        # cast back (2 + 1), weight (1 + 1): 18 elements, 6 launches; twice per layer
        out.append(("rmsnorm x2", 2 * 18 * hw_, 12))
        # rotary on q and k in fp32: upcast (1 + 2), complex multiply (2 + 2), cast back (2 + 1)
        out.append(("rotary q,k", 10 * (q + k), 6))
        if kv < h:  # repeat_kv: keys and values expanded to every query head
            out.append(("repeat_kv", 2 * (k + q), 2))
    else:
        out.append(("norm x2", 2 * 2 * hw_, 2))
        if llama:
            out.append(("rotary q,k", 2 * (q + k), 1 if fusion != "eager" else 2))
    out.append(("attention output relayout", 2 * q, 1))
    out.append(("residual add x2", 2 * 3 * hw_, 2))
    if dropout and fusion == "eager":
        out.append(("dropout x2", 2 * 3 * hw_, 2))
    if bias_add and model.bias:
        up = model.mlp_matrices - 1
        out.append(("bias add", q + 2 * k + up * ff + 2 * hw_, 4))
    if swiglu:
        out.append(("swiglu", (5 if fusion == "eager" else 3) * ff, 2 if fusion == "eager" else 1))
    else:
        out.append(("gelu", 2 * ff, 1))
    return out


def softmax_elements(fusion: str, dropout: bool = False) -> tuple[float, float]:
    """``(forward, backward)`` elements moved per attention score (``s × s`` per head) by
    unfused attention's softmax: fused (Megatron's ``FusedScaleMaskSoftmax``: read the scores,
    write the probabilities; backward read both, write one) 2 and 3; eager (scale 2, mask 3,
    softmax 2 forward; their backwards 2, 2, 3) 7 and 7; a dropout over the probabilities
    (Megatron's ``attention_dropout`` after the softmax, its own kernel) 3 more each way (read,
    write, and its mask)."""
    fwd, bwd = (2.0, 3.0) if _check(fusion) != "eager" else (7.0, 7.0)
    return (fwd + 3.0, bwd + 3.0) if dropout else (fwd, bwd)


def loss_bytes_per_logit(fusion: str, act_bytes: int) -> float:
    """Bytes the loss moves per logit, forward and backward: over fp32 logits (or fused, as
    Megatron's ``vocab_parallel_cross_entropy`` computes max, exp-sum and the gradient over
    fp32 values in place) ``log_softmax`` reads and writes (8), its backward reads two and
    writes one (12): 20; eager over 16-bit logits also upcasts them (2 + 4) and casts the
    gradient back (4 + 2): 32."""
    return 32.0 if (_check(fusion) == "eager" and act_bytes < 4) else 20.0


#: How a framework adds each micro-batch's gradients to the step's
#: (``Framework.grad_accumulation``).
GRAD_ACCUMULATION = ("autograd", "hp_grad_copy", "fsdp2", "fused")


def grad_accumulation_bytes(mode: str, grad_bytes: int) -> tuple[float, float]:
    """``(bytes moved per parameter for a micro-batch, for the first micro-batch of a step)``
    when adding its gradients (``grad_bytes`` wide, as the backward produces them) to the
    step's:

    - ``autograd`` — PyTorch's ``AccumulateGrad`` adds the new gradient into ``param.grad`` in
      place (``variable_grad += new_grad``: read 2, write 1 at ``grad_bytes``); the first
      backward after ``zero_grad(set_to_none=True)`` stores its gradient as it is (0).
    - ``hp_grad_copy`` — DeepSpeed's ``BF16_Optimizer.update_hp_grads`` after every backward:
      ``hp_grad.data.add_(lp.grad.data.to(hp_grad.dtype))``: the cast writes an fp32 copy (read
      ``grad_bytes``, write 4), the add reads it and the fp32 accumulator and writes the
      accumulator (12); the low-precision gradients are freed before each backward
      (``clear_lp_grads``), so the first micro-batch pays too.
    - ``fsdp2`` — FSDP2 without gradient sync keeps an fp32 copy of the unsharded gradient:
      the first micro-batch casts into it (``to_accumulated_grad_if_needed``: read
      ``grad_bytes``, write 4), later ones add to it (``accumulate_unsharded_grad_if_needed``:
      ``unsharded_accumulated_grad += unsharded_param.grad``: read 4 and ``grad_bytes``, write
      4) (torch ``distributed/fsdp/_fully_shard/_fsdp_param.py``).
    - ``fused`` — Megatron's ``gradient_accumulation_fusion``: the weight-gradient product
      accumulates into ``main_grad`` in its epilogue (``wgrad_gemm_accum_fp32``), inside a
      compute-bound product: nothing extra."""
    if mode == "autograd":
        return 3.0 * grad_bytes, 0.0
    if mode == "hp_grad_copy":
        return grad_bytes + 4.0 + 12.0, grad_bytes + 4.0 + 12.0
    if mode == "fsdp2":
        return 4.0 + grad_bytes + 4.0, grad_bytes + 4.0
    if mode == "fused":
        return 0.0, 0.0
    raise ValueError(f"grad_accumulation={mode!r}: use one of {', '.join(GRAD_ACCUMULATION)}")


def accumulated_grad_bytes(mode: str, grad_bytes: int) -> int:
    """Bytes per element of the gradient a step has accumulated: fp32 (4) for DeepSpeed's
    BF16_Optimizer (``weight._hp_grad``) and FSDP2's accumulator, ``grad_bytes`` otherwise."""
    return 4 if mode in ("hp_grad_copy", "fsdp2") else grad_bytes


def layer_traffic(model: Model, fusion: str, tp: int = 1, sp: bool = False,
                  dropout: bool = False, bias_add: bool = False) -> float:
    """Elements per token one layer's memory-bound kernels move, forward + backward."""
    return (1.0 + BACKWARD_TRAFFIC) * sum(
        e for _, e, _ in layer_kernels(model, fusion, tp, sp, dropout, bias_add))
