"""The reference data in tests/data (see tests/data/README.md), and the rule results are
compared with (``assert_close``). Pure numpy.

A transformer case is ``transformer/<name>.json`` (config, seeds, chunk pattern, tolerance) plus,
for most cases, ``transformer/<name>.npz`` (inputs and expected outputs). Its weights are not
stored: they are regenerated here from the config and ``weights_seed``, and checked against the
json's ``weights_sha256``. The codec files are used as they are, from ``support.paths.CODEC_DIR``.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from support.paths import TRANSFORMER_DIR

# Cases with arrays (npz); gqa must be refused (kv_repeat=2).
NUMERIC_CASES = ["small_rope", "small_sin_rms_gated", "mimi"]


def _where(mask: np.ndarray, limit: int = 5) -> str:
    """The first ``limit`` indices where ``mask`` holds, for a failure message."""
    idx = np.argwhere(mask)[:limit]
    more = "" if mask.sum() <= limit else f" (and {int(mask.sum()) - limit} more)"
    return ", ".join(str(tuple(int(i) for i in ix)) for ix in idx) + more


def _check_finite(actual: np.ndarray, expected: np.ndarray, what: str) -> np.ndarray:
    """Fails where ``actual`` is NaN or infinite and ``expected`` is finite, or where the two
    differ in which non-finite value they hold; returns where ``expected`` is finite. A NaN
    compares false with everything, so a bound checked as ``err > bound`` alone passes it."""
    finite = np.isfinite(expected)
    bad = finite & ~np.isfinite(actual)
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} non-finite values where the reference is finite, at {_where(bad)}"
    )
    odd = ~finite & ~((np.isnan(actual) & np.isnan(expected)) | (actual == expected))
    assert not odd.any(), (
        f"{what}: {int(odd.sum())} values differ from the reference's non-finite ones, at {_where(odd)}"
    )
    return finite


def assert_close(actual, expected, atol=1e-4, rtol=1e-4, what=""):
    """The fixtures' rule: |actual - expected| <= atol + rtol * |expected|, elementwise. A NaN
    or infinity in ``actual`` fails where ``expected`` is finite (and says where)."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    finite = _check_finite(actual, expected, what)
    a, e = actual[finite].astype(np.float64), expected[finite].astype(np.float64)
    err = np.abs(a - e)
    bad = ~(err <= atol + rtol * np.abs(e))
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} of {bad.size} values out of tolerance; "
        f"max abs err {err.max():.3g} (atol={atol}, rtol={rtol})"
    )


def assert_same(actual, expected, what=""):
    """Equal values of equal shape, and (for floats) every value finite where ``expected`` is:
    numpy's ``assert_array_equal`` takes two NaN for equal, so two paths that both return NaN
    would pass it."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if np.issubdtype(actual.dtype, np.inexact) or np.issubdtype(expected.dtype, np.inexact):
        finite = _check_finite(actual, expected, what)
        assert np.isfinite(expected).all(), (
            f"{what}: the reference holds non-finite values at {_where(~finite)}"
        )
    differ = actual != expected
    assert not differ.any(), (
        f"{what}: {int(differ.sum())} of {differ.size} values differ, first at {_where(differ)}"
    )


# Every field of candle's mimi::transformer::Config, in its order; each case json lists them all.
CONFIG_FIELDS = (
    "d_model",
    "num_heads",
    "num_layers",
    "causal",
    "norm_first",
    "bias_ff",
    "bias_attn",
    "layer_scale",
    "positional_embedding",
    "use_conv_block",
    "cross_attention",
    "conv_kernel_size",
    "use_conv_bias",
    "gating",
    "norm",
    "context",
    "max_period",
    "max_seq_len",
    "kv_repeat",
    "dim_feedforward",
    "conv_layout",
)


def case_names() -> list[str]:
    """Names of all transformer cases (json stems), sorted."""
    return sorted(p.stem for p in TRANSFORMER_DIR.glob("*.json"))


def case_json(name: str) -> dict:
    """The parsed ``transformer/<name>.json``."""
    return json.loads((TRANSFORMER_DIR / f"{name}.json").read_text())


def case_config(meta: dict) -> dict:
    """A copy of a case's ``config``, checked to name exactly the fields of CONFIG_FIELDS."""
    cfg = dict(meta["config"])
    if set(cfg) != set(CONFIG_FIELDS):
        raise ValueError(f"config fields differ from CONFIG_FIELDS: {sorted(set(cfg) ^ set(CONFIG_FIELDS))}")
    return cfg


def weight_specs(cfg: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{tensor name: (shape, kind)}`` of a StreamingTransformer with config ``cfg``.

    Names are those candle's ``StreamingTransformer::new`` reads (no prefix). ``kind`` is one of
    ``linear``, ``bias``, ``norm`` (layer-norm weight or rms ``alpha``) and ``scale`` (layer
    scale); it decides how the values are drawn in ``rebuild_weights``. Cross attention and the
    conv block are not used by any case and are refused.
    """
    if cfg["cross_attention"] or cfg["use_conv_block"]:
        raise NotImplementedError("no case uses cross_attention or use_conv_block")
    d, ff = cfg["d_model"], cfg["dim_feedforward"]
    kv = (cfg["num_heads"] // cfg["kv_repeat"]) * (d // cfg["num_heads"])  # k/v rows
    if cfg["gating"] is not None:  # candle's hidden width for the gated MLP
        hidden = 11 * d // 4 if ff == 4 * d else 2 * ff // 3
    specs: dict[str, tuple[tuple[int, ...], str]] = {}
    for i in range(cfg["num_layers"]):
        layer = []  # (name within the layer, shape, kind)
        for proj, rows in (("q_proj", d), ("k_proj", kv), ("v_proj", kv), ("o_proj", d)):
            layer.append((f"self_attn.{proj}.weight", (rows, d), "linear"))
            if cfg["bias_attn"]:
                layer.append((f"self_attn.{proj}.bias", (rows,), "bias"))
        if cfg["gating"] is None:
            layer += [("mlp.fc1.weight", (ff, d), "linear"), ("mlp.fc2.weight", (d, ff), "linear")]
            if cfg["bias_ff"]:
                layer += [("mlp.fc1.bias", (ff,), "bias"), ("mlp.fc2.bias", (d,), "bias")]
        else:  # the gated MLP never has biases
            layer += [
                ("gating.linear_in.weight", (2 * hidden, d), "linear"),
                ("gating.linear_out.weight", (d, hidden), "linear"),
            ]
        for norm in ("input", "post_attention"):
            if cfg["norm"] == "layer_norm":
                layer += [
                    (f"{norm}_layernorm.weight", (d,), "norm"),
                    (f"{norm}_layernorm.bias", (d,), "bias"),
                ]
            elif cfg["norm"] == "rms_norm":
                layer.append((f"{norm}_rmsnorm.alpha", (1, 1, d), "norm"))
            else:
                raise ValueError(f"norm: {cfg['norm']!r}")
        if cfg["layer_scale"] is not None:
            layer += [
                ("self_attn_layer_scale.scale", (d,), "scale"),
                ("mlp_layer_scale.scale", (d,), "scale"),
            ]
        for name, shape, kind in layer:
            specs[f"layers.{i}.{name}"] = (shape, kind)
    return specs


def rebuild_weights(cfg: dict, seed: int) -> dict[str, np.ndarray]:
    """The float32 weights of a case, regenerated from its config and ``weights_seed``.

    One ``np.random.default_rng(seed)`` is drawn from for each tensor in sorted name order
    (float64 draws, cast to float32 at the end): layer scales ``U(0.2, 0.4)``; otherwise a
    standard normal ``z`` scaled to ``z / sqrt(fan_in)`` (linear), ``1 + 0.1 z`` (norm) or
    ``0.1 z`` (bias). q/k rows come out in the interleaved rotary layout.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for name, (shape, kind) in sorted(weight_specs(cfg).items()):
        if kind == "scale":
            v = rng.uniform(0.2, 0.4, size=shape)
        else:
            z = rng.standard_normal(size=shape)
            if kind == "linear":
                v = z / np.sqrt(shape[-1])
            elif kind == "norm":
                v = 1.0 + 0.1 * z
            else:
                v = 0.1 * z
        out[name] = np.ascontiguousarray(v, dtype=np.float32)
    return out


def weights_digest(weights: dict[str, np.ndarray]) -> str:
    """The ``weights_sha256`` of a case: sha256 of, for each name in sorted order, the name, the
    ``repr`` of its shape tuple and its little-endian float32 bytes."""
    h = hashlib.sha256()
    for name in sorted(weights):
        a = np.ascontiguousarray(weights[name], dtype="<f4")
        for part in (name.encode(), repr(tuple(a.shape)).encode(), a.tobytes()):
            h.update(part)
    return h.hexdigest()


def load_case(name: str):
    """``(meta, cfg, weights, arrays)`` of a transformer case.

    ``meta`` is the parsed json, ``cfg`` its config, ``weights`` the rebuilt weights (checked
    against ``weights_sha256``) and ``arrays`` the npz arrays as a dict, or None for a json-only
    case.
    """
    meta = case_json(name)
    cfg = case_config(meta)
    weights = rebuild_weights(cfg, meta["weights_seed"])
    digest = weights_digest(weights)
    if digest != meta["weights_sha256"]:
        raise AssertionError(f"{name}: rebuilt weights digest {digest} != {meta['weights_sha256']}")
    arrays = None
    npz = TRANSFORMER_DIR / f"{name}.npz"
    if npz.exists():
        with np.load(npz) as z:
            arrays = {k: z[k] for k in z.files}
    return meta, cfg, weights, arrays


def chunk_slices(chunks) -> list[slice]:
    """Consecutive time slices for a chunk pattern: ``[2, 3]`` -> ``[slice(0, 2), slice(2, 5)]``."""
    ends = np.cumsum([int(c) for c in chunks]).tolist()
    return [slice(end - int(c), end) for c, end in zip(chunks, ends)]


def to_hf_layout(weights: dict[str, np.ndarray], cfg: dict) -> dict[str, np.ndarray]:
    """A copy of ``weights`` with q/k rows (weights and biases) moved from the interleaved rotary
    layout to the half-split layout of Hugging Face checkpoints.

    Within each head of ``hd`` rows, interleaved row ``2j + c`` (rotary pair ``j``, member ``c``)
    becomes row ``c * hd / 2 + j``. k has ``num_heads / kv_repeat`` heads.
    """
    hd = cfg["d_model"] // cfg["num_heads"]
    n_heads = {"q_proj": cfg["num_heads"], "k_proj": cfg["num_heads"] // cfg["kv_repeat"]}

    def rows(n):  # for each new row (head, c, j): the interleaved row it comes from
        h, c, j = np.meshgrid(np.arange(n), np.arange(2), np.arange(hd // 2), indexing="ij")
        return (h * hd + 2 * j + c).ravel()

    out = {}
    for name, w in weights.items():
        proj = next((p for p in n_heads if f".self_attn.{p}." in name), None)
        out[name] = w if proj is None else np.ascontiguousarray(np.asarray(w)[rows(n_heads[proj])])
    return out
