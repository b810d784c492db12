"""The agreement of each precision with "highest", per layer group (docs/precision.md): for the
fixture codec and the real-size seeded one (32 codebooks), on a speech-like input and on white
noise, the fraction of codebook 0's codes and of all codes equal to highest's, and the SNR of
the decoded audio against highest's decoding of the same codes. "medium" is measured with its
default groups, every group, and one group at a time (`MIMI_PY_MEDIUM_LAYERS`, read once per
process: each configuration is a job of its own). Imports nothing of the bench at the top:
tests/precision loads `inputs` from this file by path."""

from __future__ import annotations

import json

import numpy as np

PEERS = ()
DEFAULT_LAYERS = "frame_rate,transformers,decoder_convs"  # MIMI_PY_MEDIUM_LAYERS' default
GROUPS = ["all", DEFAULT_LAYERS, "encoder_convs", "frame_rate", "transformers", "decoder_convs"]
SIZES = {
    "tiny": {"seconds": 0.5, "real_size": False, "groups": 2},
    "full": {"seconds": 20.0, "real_size": True, "groups": 7},
}
COLUMNS = (
    "precision | layers in bf16=layers | codec | codebook 0 equal=codebook0_equal | "
    "all codes equal=all_equal | decoded SNR dB=decoded_snr_db"
)


def jobs(ctx, sizes):
    configs = [("high", "all")] + [("medium", g) for g in GROUPS[1:] + GROUPS[:1]]
    out = []
    for p, g in configs[: sizes["groups"]]:
        task = dict(sizes, kind="agreement", precision=p, layers=g)
        out.append(
            {
                "engine": "mimi_py",
                "label": f"{p} ({g})",
                "once": True,
                "env": {"MIMI_PY_MEDIUM_LAYERS": g},
                "tasks": [task],
            }
        )
    return out, {}


def inputs(seconds: float, sr: int = 24000) -> dict:
    """(1, 1, samples) each: a gliding, pulsing tone with a little noise, and white noise."""
    t = np.arange(int(seconds * sr)) / sr
    rng = np.random.default_rng(1)
    tone = np.sin(2 * np.pi * (200 + 150 * np.sin(2 * np.pi * 0.3 * t)) * t) * (
        0.5 + 0.5 * np.sin(4 * np.pi * t)
    )
    speech = (0.3 * tone + 0.05 * rng.standard_normal(t.size)).astype(np.float32)[None, None]
    return {
        "speech-like": speech,
        "noise": (0.1 * rng.standard_normal(t.size)).astype(np.float32)[None, None],
    }


def snr_db(ref, x) -> float:
    err = float(((ref.astype(np.float64) - x) ** 2).sum())
    return (
        float("inf")
        if err == 0
        else round(float(10 * np.log10(float((ref.astype(np.float64) ** 2).sum()) / err)), 2)
    )


def codecs(precision: str, real_size: bool):
    """(name, highest's codec, the codec at `precision`) for the fixture and real-size codecs."""
    import mimi_py
    from common import CODEC_FIXTURES

    cfg = mimi_py.CodecConfig(**json.loads((CODEC_FIXTURES / "mimi_small_candle_config.json").read_text()))
    f = CODEC_FIXTURES / "mimi_small.safetensors"
    yield "fixture codec", *(mimi_py.MimiCodec(f, config=cfg, precision=p) for p in ("highest", precision))
    if real_size:
        both = (mimi_py.MimiCodec(seed=0, num_codebooks=32, precision=p) for p in ("highest", precision))
        yield "real-size, seeded, 32 codebooks", *both


def measure(w, task) -> dict:
    """One sub-row per codec, each figure per input."""
    rows = []
    for name, ref, ours in codecs(task["precision"], task["real_size"]):
        row = {"codec": name, "codebook0_equal": {}, "all_equal": {}, "decoded_snr_db": {}, "finite": True}
        for what, pcm in inputs(task["seconds"]).items():
            codes, mine = ref.encode(pcm), ours.encode(pcm)
            audio, decoded = ref.decode(codes), ours.decode(codes)
            row["codebook0_equal"][what] = round(float((codes == mine)[:, 0].mean()), 4)
            row["all_equal"][what] = round(float((codes == mine).mean()), 4)
            row["decoded_snr_db"][what] = snr_db(audio, decoded)
            row["finite"] &= bool(np.isfinite(mine).all() and np.isfinite(decoded).all())
        rows.append(dict(row, kernel_isa=ours.kernel_isa))
    return {"rows": rows}
