"""The real-size Mimi of ``tests/data/codec/mimi_real_size*`` (tests/data/README.md): its seeded
random weights in Kyutai's moshi checkpoint layout, and the same weights in the Hugging Face
kyutai/mimi layout.

The weights are the benches' (``benches/common.py``: ``random_tensor`` over the shapes of
``kyutai_moshi_mimi_manifest.json``, one ``np.random.default_rng(seed)`` in sorted name order),
so the tests and the benches run the same model. ``weights_digest`` (support.reference) of them
is stored in the reference json: a change of the recipe or of numpy's draws fails the tests
loudly instead of comparing against other weights. Pure numpy; ``tests/data/make_real_size.py``
imports it too.
"""

from __future__ import annotations

import importlib.util
import re

import numpy as np

from support.paths import CODEC_DIR, REPO
from support.reference import to_hf_layout

REFERENCE_JSON = CODEC_DIR / "mimi_real_size.json"
REFERENCE_NPZ = CODEC_DIR / "mimi_real_size_io.npz"
MOSHI_MANIFEST = CODEC_DIR / "kyutai_moshi_mimi_manifest.json"
HF_MANIFEST = CODEC_DIR / "kyutai_mimi_manifest.json"

# The real Mimi transformer's attention shape (both transformers), for the q/k row permutation.
ATTENTION = {"d_model": 512, "num_heads": 8, "kv_repeat": 1}


def _benches_common():
    """``benches/common.py``, loaded by path (its folder is not on the tests' ``sys.path``)."""
    spec = importlib.util.spec_from_file_location("_benches_common", REPO / "benches" / "common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def moshi_weights(seed: int) -> dict[str, np.ndarray]:
    """The float32 weights of the real Mimi in the moshi layout (318 tensors, 32 codebooks):
    what ``benches/common.py``'s ``random_weights_file`` writes for the same seed."""
    common = _benches_common()
    shapes = common.manifest_shapes(MOSHI_MANIFEST)
    rng = np.random.default_rng(seed)
    return {name: common.random_tensor(name, shapes[name], rng) for name in sorted(shapes)}


# moshi name -> kyutai/mimi name, first matching rule wins; in_proj_weight is split apart.
_RENAMES = [
    (r"^(encoder|decoder)\.model\.(\d+)\.(block\.\d+\.)?conv\.conv\.", r"\1.layers.\2.\3conv."),
    (r"^decoder\.model\.(\d+)\.convtr\.convtr\.", r"decoder.layers.\1.conv."),
    (r"^downsample\.conv\.conv\.conv\.", "downsample.conv."),
    (r"^upsample\.convtr\.convtr\.convtr\.", "upsample.conv."),
    (r"^(\w+_transformer)\.transformer\.layers\.(\d+)\.", r"\1.layers.\2."),
    (r"^quantizer\.rvq_first\.", "quantizer.semantic_residual_vector_quantizer."),
    (r"^quantizer\.rvq_rest\.", "quantizer.acoustic_residual_vector_quantizer."),
]
_LAYER_PARTS = {
    "self_attn.out_proj.": "self_attn.o_proj.",
    "linear1.": "mlp.fc1.",
    "linear2.": "mlp.fc2.",
    "norm1.": "input_layernorm.",
    "norm2.": "post_attention_layernorm.",
    "layer_scale_1.": "self_attn_layer_scale.",
    "layer_scale_2.": "mlp_layer_scale.",
    "vq.layers.": "layers.",
    "._codebook.embedding_sum": ".codebook.embed_sum",
    "._codebook.cluster_usage": ".codebook.cluster_usage",
    "._codebook._initialized": ".codebook.initialized",
}


def hf_name(moshi_name: str) -> str:
    """The kyutai/mimi name of a moshi-layout tensor (not ``in_proj_weight``, which splits)."""
    name = moshi_name
    for pattern, repl in _RENAMES:
        name, n = re.subn(pattern, repl, name)
        if n:
            break
    for old, new in _LAYER_PARTS.items():
        name = name.replace(old, new)
    return name


def to_hf_checkpoint(
    moshi: dict[str, np.ndarray], attention: dict = ATTENTION, permute_qk: bool = True
) -> dict[str, np.ndarray]:
    """The same weights in the kyutai/mimi layout: names renamed, each ``in_proj_weight`` split
    into ``q_proj``/``k_proj``/``v_proj``, and q/k rows moved from moshi's interleaved rotary
    layout to the half-split one for heads of ``attention`` (``d_model``, ``num_heads``,
    ``kv_repeat``). ``permute_qk=False`` leaves them interleaved: the layout mistake a test
    shows the codes notice."""
    out = {}
    for name, w in moshi.items():
        if name.endswith(".self_attn.in_proj_weight"):
            base = hf_name(name.removesuffix("in_proj_weight"))
            for proj, rows in zip(("q_proj", "k_proj", "v_proj"), np.split(w, 3)):
                out[f"{base}{proj}.weight"] = np.ascontiguousarray(rows)
        else:
            out[hf_name(name)] = w
    return to_hf_layout(out, attention) if permute_qk else out
