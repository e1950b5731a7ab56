"""Published model shapes (data, no trainer), for ``tune``, ``predict`` and study files
(``workflow/config/llama3.yaml`` repeats them; a test keeps the two equal).

Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models"): the architecture arguments of
Meta's ``models/sku_list.py`` (meta-llama/llama-models @364ed4ec, ``llama3_base_models`` and
``llama3_1_base_models``; the same values are torchtitan's ``llama3_configs``):

=========  ======  ======  =====  ========  ======  ==================  ===========
model      dim     layers  heads  kv_heads  vocab   ffn_dim_multiplier  multiple_of
=========  ======  ======  =====  ========  ======  ==================  ===========
8B         4096    32      32     8         128256  1.3                 1024
70B        8192    80      64     8         128256  1.3                 4096
405B       16384   126     128    8         128256  1.2                 4096
=========  ======  ======  =====  ========  ======  ==================  ===========

``rope_theta`` 500000, ``norm_eps`` 1e-5, untied embeddings, no biases, SwiGLU of width
14336 / 28672 / 53248 (Llama's rule, ``config.parts.swiglu_width``); sequence length 8192
(Llama 3's training length; Llama 3.1 extends it to 128k with scaled RoPE, not modelled
here). Parameters: 8,030,261,248 (published "8.03B"), 70,553,706,496 ("70.6B"),
405,853,388,800 (405B).
"""

from __future__ import annotations

from scalestudy.config.parts import Model

_LLAMA3 = dict(arch="llama", vocab=128256, seq_len=8192, rope_theta=500000.0, norm_eps=1e-5)

LLAMA3: dict[str, Model] = {
    "llama3-8b": Model(name="llama3-8b", layers=32, hidden=4096, heads=32, kv_heads=8,
                       multiple_of=1024, ffn_dim_multiplier=1.3, **_LLAMA3),
    "llama3-70b": Model(name="llama3-70b", layers=80, hidden=8192, heads=64, kv_heads=8,
                        multiple_of=4096, ffn_dim_multiplier=1.3, **_LLAMA3),
    "llama3-405b": Model(name="llama3-405b", layers=126, hidden=16384, heads=128, kv_heads=8,
                         multiple_of=4096, ffn_dim_multiplier=1.2, **_LLAMA3),
}

#: Published parameter counts, for the record and the tests.
LLAMA3_PARAMS = {"llama3-8b": 8_030_261_248, "llama3-70b": 70_553_706_496,
                 "llama3-405b": 405_853_388_800}
