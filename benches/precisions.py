"""Precisions in benches/run.py: mimi_py's precision modes, torch's own reduced-precision switch
for moshi, and the labels and like-for-like pairs of the rows they give.

mimi_py's modes are `MimiCodec(precision=...)`, named once in `mimi_py.options.PRECISIONS`
(run.py's `--precisions` takes a subset). moshi runs in float32 (torch's defaults) and, when
`--precisions` has a mode whose like in torch is bf16 ("medium"), also in torch's bf16 mode:
oneDNN's float32 products in bfloat16 (`torch.backends.mkldnn.matmul.fp32_precision` and
`torch.backends.mkldnn.conv.fp32_precision` = "bf16" where torch has them, torch >= 2.9; else
`torch.set_float32_matmul_precision("medium")`, products only). [torch_switch] sets it in the
worker process, before the model loads, and records what it set and what the CPU supports.

Importable without mimi_py or torch (the worker of a torch peer does not load mimi_py).
"""

from __future__ import annotations

# A results file from before the precision names labels mimi_py's rows by `weights_dtype`.
OLD_WEIGHTS = {"float32": "highest", "bfloat16": "high"}

TORCH_FLOAT32, TORCH_BF16 = "float32", "bf16"
# mimi_py's precision -> the torch mode that computes alike: float32 products, or bfloat16
# products with float32 sums. "high" (bfloat16 weights, float32 products) has no like in torch.
LIKE_FOR_LIKE = {"highest": TORCH_FLOAT32, "medium": TORCH_BF16}
# The peers run in torch's bf16 mode too (transformers' MimiModel, a random init, only in float32).
TORCH_MODE_ENGINES = ("moshi",)
BF16_SWITCH = (
    'torch.backends.mkldnn.matmul.fp32_precision = torch.backends.mkldnn.conv.fp32_precision = "bf16"'
)
BF16_FALLBACK = 'torch.set_float32_matmul_precision("medium")'


def precision_of(row: dict) -> str | None:
    """A mimi_py row's precision: its `precision`, or its `weights_dtype` in an older file."""
    if row.get("precision"):
        return row["precision"]
    wd = row.get("weights_dtype") or "float32"
    return OLD_WEIGHTS.get(wd, wd)


def torch_modes(precisions) -> list[str]:
    """moshi's modes for these mimi_py precisions: float32, and bf16 where one's like is it."""
    bf16 = any(LIKE_FOR_LIKE.get(p) == TORCH_BF16 for p in precisions)
    return [TORCH_FLOAT32] + ([TORCH_BF16] if bf16 else [])


def variants(engine: str, precisions) -> list[dict]:
    """The rows one engine (`NAME` or `NAME+malloc`) gives: one per mimi_py precision, one per
    torch mode of moshi, else one. Each is `{"label", "precision"}` or `{"label", "torch_mode"}`."""
    base = engine.split("+")[0]
    if base == "mimi_py":
        return [{"label": f"{engine} {p}", "precision": p} for p in precisions]
    if base in TORCH_MODE_ENGINES:
        return [{"label": label(engine, None, m), "torch_mode": m} for m in torch_modes(precisions)]
    return [{"label": engine}]


def label(engine: str, precision: str | None = None, torch_mode: str | None = None) -> str:
    """How a row is named in the tables: `mimi_py medium`, `moshi`, `moshi (torch bf16)`."""
    if precision:
        return f"{engine} {precision}"
    return f"{engine} (torch bf16)" if torch_mode == TORCH_BF16 else engine


def row_label(row: dict) -> str:
    """A row's label; an older file's rows have none (mimi_py's were float32: highest)."""
    if row.get("label"):
        return row["label"]
    eng = row.get("engine", "mimi_py")
    return label(eng, precision_of(row) if eng.split("+")[0] == "mimi_py" else None, row.get("torch_mode"))


def like_for_like(precision: str, peer: dict) -> bool:
    """Whether a peer's row computes as mimi_py does at `precision` (rustymimi, transformers
    and moshi's default mode: float32; mimi_py+malloc: its own precision)."""
    if peer.get("precision"):
        return peer["precision"] == precision
    return LIKE_FOR_LIKE.get(precision) == peer.get("torch_mode", TORCH_FLOAT32)


# ---------------------------------------------------------------------------------------------
# the worker's side: torch's switch, set before the model loads


def _call(f):
    try:
        return f()
    except Exception:  # an older torch without the query: unknown
        return None


def torch_cpu_bf16(torch) -> dict:
    """What torch says of the CPU's bfloat16 support (None: this torch cannot say)."""
    cpu = getattr(torch._C, "_cpu", None)
    return {
        "mkldnn_bf16_supported": _call(lambda: bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())),
        "cpu_capability": _call(torch.backends.cpu.get_cpu_capability),
        "avx512_bf16": _call(lambda: bool(cpu._is_avx512_bf16_supported())),
        "amx_tile": _call(lambda: bool(cpu._is_amx_tile_supported())),
    }


def torch_settings(torch) -> dict:
    """torch's float32 precision settings as they stand."""
    mk = torch.backends.mkldnn
    return {
        "mkldnn.matmul.fp32_precision": _call(lambda: mk.matmul.fp32_precision),
        "mkldnn.conv.fp32_precision": _call(lambda: mk.conv.fp32_precision),
        "float32_matmul_precision": _call(torch.get_float32_matmul_precision),
    }


def takes_effect(torch) -> dict:
    """Whether a small product, convolution and transposed convolution come out rounded as
    bfloat16 products do (error against float64 over 1e-4 of the largest value; float32's is
    about 1e-6): the switch reached oneDNN on this CPU."""
    f = torch.nn.functional
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(16, 512, generator=g), torch.randn(512, 512, generator=g)
    a, k = torch.randn(1, 64, 960, generator=g), torch.randn(64, 64, 7, generator=g)
    cases = {"matmul": (f.linear, (x, w)), "conv": (f.conv1d, (a, k))}
    cases["conv_transpose"] = (f.conv_transpose1d, (a, k))
    out = {}
    for name, (op, args) in cases.items():
        exact = op(*(t.double() for t in args))
        err = (op(*args).double() - exact).abs().max() / exact.abs().max()
        out[name] = bool(err.item() > 1e-4)
    return out


def torch_switch(torch, mode: str) -> dict:
    """Sets torch's float32 products for `mode` (float32: torch's defaults, untouched; bf16:
    oneDNN's products in bfloat16) and says what it set, the settings after, the CPU's bfloat16
    support and, in bf16, whether the switch took effect."""
    if mode not in (TORCH_FLOAT32, TORCH_BF16):
        raise ValueError(f"torch mode {mode!r}: one of {TORCH_FLOAT32}, {TORCH_BF16}")
    out = {"mode": mode, "switch": None, "api": None}
    if mode == TORCH_BF16:
        mk = torch.backends.mkldnn
        if all(hasattr(getattr(mk, op, None), "fp32_precision") for op in ("matmul", "conv")):
            mk.matmul.fp32_precision = "bf16"
            mk.conv.fp32_precision = "bf16"
            out.update(switch=BF16_SWITCH, api="torch.backends.mkldnn fp32_precision")
        else:
            torch.set_float32_matmul_precision("medium")
            out.update(switch=BF16_FALLBACK, api="torch.set_float32_matmul_precision")
    out["settings"] = torch_settings(torch)
    out["cpu"] = torch_cpu_bf16(torch)
    if mode == TORCH_BF16:
        out["takes_effect"] = takes_effect(torch)
    return out
