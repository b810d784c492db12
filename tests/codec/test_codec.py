"""The Mimi codec against the reference fixtures (tests/data/codec)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mimi_py
from safetensors_file import read_safetensors, write_safetensors
from support.models import small_codec_config
from support.ondevice import ON_CPU, assert_codes, make_codec, tolerance
from support.paths import CODEC_DIR, TESTS
from support.reference import assert_close, assert_same

CODEC = CODEC_DIR
META = json.loads((CODEC / "mimi_small.json").read_text())
TOL = META["tolerance"]
IO = dict(np.load(CODEC / "mimi_small_io.npz"))


@pytest.fixture(scope="module")
def codec():
    return make_codec(CODEC / "mimi_small.safetensors", config=small_codec_config())


# ---------------------------------------------------------------- config


def test_config_accepts_the_candle_json_and_round_trips():
    d = json.loads((CODEC / "mimi_small_candle_config.json").read_text())
    c = mimi_py.CodecConfig(**d)
    assert c.to_dict() == d
    assert mimi_py.CodecConfig(**c.to_dict()) == c
    assert c.frame_size == 1920 and c.quantizer_n_q == 4
    assert isinstance(c.transformer, mimi_py.TransformerConfig)


def test_mimi_preset():
    c = mimi_py.CodecConfig.mimi(num_codebooks=16)
    assert (c.sample_rate, c.frame_rate, c.frame_size, c.quantizer_n_q) == (24000.0, 12.5, 1920, 16)
    assert (c.quantizer_bins, c.quantizer_dim, c.seanet["dimension"], c.seanet["ratios"]) == (
        2048,
        256,
        512,
        [8, 6, 5, 4],
    )
    assert c.transformer.d_model == 512 and c.transformer.context == 250
    assert mimi_py.CodecConfig() == mimi_py.CodecConfig.mimi()
    assert mimi_py.CodecConfig(**c.to_dict()) == c
    with pytest.raises(mimi_py.ConfigError, match="num_codebooks"):
        mimi_py.CodecConfig.mimi(num_codebooks=33)


@pytest.mark.parametrize(
    "kw,field",
    [
        ({"quantizer_n_q": 0}, "quantizer_n_q"),
        ({"channels": 2}, "channels"),
        ({"frame_rate": 13.0}, "frame_rate"),
        ({"seanet": {"ratios": [8, 0]}}, "seanet.ratios"),
        ({"seanet": {"lstm": 2}}, "seanet.lstm"),
        ({"seanet": {"bogus": 1}}, "seanet.bogus"),
        ({"transformer": {"d_model": 256, "num_heads": 8}}, "transformer.d_model"),
        ({"transformer": {"context": 0}}, "transformer.context"),
        ({"codebooks": 8}, "codebooks"),
    ],
)
def test_config_validation_names_the_field(kw, field):
    with pytest.raises(mimi_py.ConfigError, match=f"`{field}`"):
        mimi_py.CodecConfig(**kw)


def test_config_from_hf_config_json():
    hf = json.loads((CODEC / "mimi_small_hf_config.json").read_text())
    c = mimi_py.CodecConfig.from_hf(hf)
    ref = small_codec_config()
    assert c.seanet == ref.seanet
    for f in ("channels", "sample_rate", "frame_rate", "quantizer_n_q", "quantizer_bins", "quantizer_dim"):
        assert getattr(c, f) == getattr(ref, f), f
    t, r = c.transformer, ref.transformer
    for f in (
        "d_model",
        "num_heads",
        "num_layers",
        "dim_feedforward",
        "context",
        "max_period",
        "layer_scale",
    ):
        assert getattr(t, f) == getattr(r, f), f


# ---------------------------------------------------------------- offline parity


@pytest.mark.parametrize("weights", ["mimi_small.safetensors", "mimi_small_moshi.safetensors"])
def test_codes_audio_latents_match_reference(weights):
    c = make_codec(CODEC / weights, config=small_codec_config())
    assert c.checkpoint_layout == ("moshi" if "moshi" in weights else "hf")
    codes = c.encode(IO["waveform"])
    assert codes.dtype == np.uint32 and codes.shape == IO["codes"].shape
    assert_codes(codes, IO["codes"])
    assert (codes != IO["codes_interleaved_rope_on_hf_layout"]).sum() > 0
    lat = TOL["latents"]
    assert_close(c.encode_latents(IO["waveform"]), IO["latents"], *tolerance(lat), "latents")
    q = TOL["quantized"]
    assert_close(c.decode_latents(IO["codes"]), IO["quantized"], *tolerance(q), "quantized")
    a = TOL["audio"]
    audio = c.decode(IO["codes"])
    assert audio.dtype == np.float32
    assert_close(audio, IO["audio"], *tolerance(a), "audio")


# Run in a fresh process (MIMI_PY_ISA is read once): the fixture's codes and audio, offline
# and streamed, with the kernels capped at `isa`; prints what the process ran.
ISA_RUN = """
import json, sys
import numpy as np
import mimi_py
from support.models import small_codec_config
from support.paths import CODEC_DIR, TESTS
io = dict(np.load(CODEC_DIR / "mimi_small_io.npz"))
c = mimi_py.MimiCodec(CODEC_DIR / "mimi_small.safetensors", config=small_codec_config())
x = io["waveform"]
steps = [c.encode_step(x[..., i : i + 1920]) for i in range(0, x.shape[-1] - 1919, 1920)]
audio = c.decode(io["codes"])
np.savez(sys.argv[1], codes=c.encode(x), stream=np.concatenate(steps, -1), audio=audio)
print(json.dumps(mimi_py.settings()))
"""


@pytest.mark.skipif(not ON_CPU, reason="MIMI_PY_ISA caps the CPU kernels; this run is on another device")
@pytest.mark.parametrize("isa", ["portable", "avx2"])
def test_capped_kernels_give_the_reference_codes_and_audio(tmp_path, isa):
    """MIMI_PY_ISA runs the plain-Rust (or AVX2) kernels on any machine: the codes still equal
    PyTorch's exactly, offline and streamed, and the audio stays within the fixture's bounds."""
    env = dict(os.environ, MIMI_PY_ISA=isa)
    out = tmp_path / "run.npz"
    run = subprocess.run(
        [sys.executable, "-c", ISA_RUN, str(out)], env=env, capture_output=True, text=True, cwd=TESTS
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["MIMI_PY_ISA"] == isa
    got = dict(np.load(out))
    assert_same(got["codes"], IO["codes"], what=f"codes ({isa})")
    n = got["stream"].shape[-1]
    assert_same(got["stream"], IO["codes"][..., :n], what=f"streamed codes ({isa})")
    assert_close(got["audio"], IO["audio"], *tolerance(TOL["audio"]), f"audio ({isa})")


def test_hf_directory_with_config_json(tmp_path):
    shutil.copy(CODEC / "mimi_small.safetensors", tmp_path / "model.safetensors")
    shutil.copy(CODEC / "mimi_small_hf_config.json", tmp_path / "config.json")
    c = make_codec(tmp_path)
    assert c.num_codebooks == 4 and c.frame_size == 1920
    assert_codes(c.encode(IO["waveform"]), IO["codes"])


def test_weights_from_a_mapping(codec):
    tensors = read_safetensors(CODEC / "mimi_small_moshi.safetensors")
    c = make_codec(tensors, config=small_codec_config())
    assert c.checkpoint_layout == "moshi"
    assert_codes(c.encode(IO["waveform"]), IO["codes"])


def test_fewer_codebooks_are_the_first_ones():
    c2 = make_codec(CODEC / "mimi_small.safetensors", config=small_codec_config(), num_codebooks=2)
    assert c2.num_codebooks == 2
    assert_codes(c2.encode(IO["waveform"]), IO["codes"][:, :2])
    with pytest.raises(mimi_py.WeightsError, match="has 4"):
        make_codec(CODEC / "mimi_small.safetensors", config=small_codec_config(), num_codebooks=5)


def test_input_forms_and_dtypes(codec):
    w = IO["waveform"]
    ref = IO["codes"]
    assert_same(codec.encode(w[0, 0]), ref)  # (samples,)
    assert_same(codec.encode(w.astype(np.float64)), ref)
    strided = np.repeat(w, 2, axis=-1)[..., ::2]  # non-contiguous view of the same values
    assert_same(codec.encode(strided), ref)
    assert codec.encode(np.zeros((2, 1, 0), np.float32)).shape == (2, 4, 0)
    assert_same(codec.decode(ref.astype(np.int32)), codec.decode(ref.astype(np.uint32)))


def test_batches(codec):
    w = IO["waveform"]
    w2 = np.concatenate([w, w[..., ::-1] * 0.5], axis=0)
    codes = codec.encode(w2)
    assert codes.shape == (2, 4, 19)
    assert_codes(codes[:1], IO["codes"])
    assert_same(codes[1:], codec.encode(w2[1:]))
    audio = codec.decode(codes)
    assert audio.shape == (2, 1, 36480)
    assert_close(audio[1:], codec.decode(codes[1:]), atol=1e-5, rtol=0)


# ---------------------------------------------------------------- streaming


def stream_encode(c, w, sizes):
    out, s = [], 0
    for n in sizes:
        r = c.encode_step(w[..., s : s + n])
        s += n
        if r is not None:
            out.append(r)
    return np.concatenate(out, axis=-1) if out else np.zeros((w.shape[0], c.num_codebooks, 0), np.uint32)


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(cuts=st.lists(st.integers(1, 35999), max_size=25))
def test_streaming_encode_any_chunking_gives_offline_codes(codec, cuts):
    sizes = np.diff(sorted({0, 36000, *cuts})).tolist()
    codec.reset_state()
    codes = stream_encode(codec, IO["waveform"], sizes)
    # frames are emitted when complete: floor(36000 / 1920) = 18 of the 19 offline frames
    assert codes.shape == (1, 4, 18)
    assert_codes(codes, IO["codes"][..., :18])


def test_streaming_decode_gives_offline_audio(codec):
    codec.reset_state()
    a = TOL["audio"]
    for sizes in ([1] * 19, [3, 7, 9], [19]):
        codec.reset_state()
        out, s = [], 0
        for n in sizes:
            r = codec.decode_step(IO["codes"][..., s : s + n])
            s += n
            assert r is not None and r.shape == (1, 1, n * 1920)
            out.append(r)
        assert_close(np.concatenate(out, -1), IO["audio"], *tolerance(a), f"stream decode {sizes}")
    assert codec.decode_step(None) is None


def test_long_offline_calls_match_the_stream(codec):
    """Offline calls on the CPU run as streams over 2 s chunks, flushed at the end: an input
    several chunks long gives the streaming codes for its whole frames, the same audio as a
    streaming decode, and its own first frames do not depend on what follows."""
    w = IO["waveform"]
    long = np.concatenate([w, w[..., ::-1] * 0.7, w * 0.5, w[..., :5000]], axis=-1)  # 113000 samples
    codes = codec.encode(long)
    assert codes.shape == (1, 4, -(-113000 // 1920))
    codec.reset_state()
    streamed = stream_encode(codec, long, [7000] * 16 + [1000])
    assert streamed.shape == (1, 4, 113000 // 1920)
    assert_same(codes[..., : streamed.shape[-1]], streamed)
    assert_codes(codes[..., :18], IO["codes"][..., :18])
    audio = codec.decode(codes)
    codec.reset_state()
    parts = [codec.decode_step(codes[..., s : s + 7]) for s in range(0, codes.shape[-1], 7)]
    a = TOL["audio"]
    assert_close(np.concatenate(parts, -1), audio, *tolerance(a), "long stream decode")
    assert_close(audio[..., :36480], codec.decode(codes[..., :19]), *tolerance(a), "prefix")


def test_offline_calls_do_not_disturb_the_stream(codec):
    codec.reset_state()
    w = IO["waveform"]
    out = []
    for s in range(0, 36000, 1000):
        r = codec.encode_step(w[..., s : s + 1000])
        codec.encode(w[..., :5000] * 0.3)  # offline call in the middle of the stream
        codec.decode(IO["codes"][..., :3])
        if r is not None:
            out.append(r)
    assert_codes(np.concatenate(out, -1), IO["codes"][..., :18])


def test_reset_state_restarts_both_streams(codec):
    codec.reset_state()
    stream_encode(codec, IO["waveform"][..., :20000] * 0.7, [20000])
    codec.decode_step(IO["codes"][..., 5:9])
    codec.reset_state()
    assert_codes(stream_encode(codec, IO["waveform"], [36000]), IO["codes"][..., :18])
    a = TOL["audio"]
    assert_close(codec.decode_step(IO["codes"]), IO["audio"], *tolerance(a), "decode after reset")


def test_stream_batch_size_is_fixed_until_reset(codec):
    codec.reset_state()
    codec.encode_step(IO["waveform"][..., :3000])
    with pytest.raises(mimi_py.ShapeError, match="reset_state"):
        codec.encode_step(np.zeros((2, 1, 3000), np.float32))
    codec.reset_state()
    assert codec.encode_step(np.zeros((2, 1, 3840), np.float32)).shape == (2, 4, 2)


def test_a_rejected_row_reset_changes_neither_stream(codec):
    """The encoder streams 4 rows and the decoder 2: row 3 is refused (for the decoder)
    before either stream changes, so both continue as if the call had not been made."""
    codec.reset_state()
    rng = np.random.default_rng(5)
    pcm = (rng.standard_normal((4, 1, 2 * 1920)) * 0.1).astype(np.float32)
    codec.encode_step(pcm)
    codec.decode_step(IO["codes"][..., :2].repeat(2, 0))
    twin = codec.clone()
    with pytest.raises(mimi_py.ShapeError):
        codec.reset_state(rows=[3])
    assert_same(codec.positions, twin.positions)
    assert_same(codec.encode_step(pcm), twin.encode_step(pcm))
    assert_same(
        codec.decode_step(IO["codes"][..., 2:4].repeat(2, 0)),
        twin.decode_step(IO["codes"][..., 2:4].repeat(2, 0)),
    )
    codec.reset_state()


def test_many_clips_on_one_instance_and_a_stream_past_8192_transformer_steps():
    c = make_codec(CODEC / "mimi_small.safetensors", config=small_codec_config())
    rng = np.random.default_rng(0)
    clip = (rng.standard_normal((1, 1, 24000 * 30)) * 0.1).astype(np.float32)
    first = c.encode(clip)
    for i in range(20):  # 20 x 30 s = 10 minutes through one instance
        c.encode(clip * (0.5 + 0.02 * i))
    assert_same(c.encode(clip), first)
    fresh = make_codec(CODEC / "mimi_small.safetensors", config=small_codec_config())
    assert_same(fresh.encode(clip), first)
    # one stream of 340 s: 8500 steps of the encoder transformer (25 Hz), past max_seq_len=8192
    n = 0
    for _ in range(34):
        chunk = (rng.standard_normal((1, 1, 240000)) * 0.1).astype(np.float32)
        n += c.encode_step(chunk).shape[-1]
    assert n == 34 * 240000 // 1920
    last = c.encode_step(IO["waveform"][..., :19200])
    assert last.shape == (1, 4, 10)


def test_concurrent_offline_encodes_equal_serial(codec):
    rng = np.random.default_rng(1)
    clips = [(rng.standard_normal((1, 1, 48000)) * 0.1).astype(np.float32) for _ in range(4)]
    serial = [codec.encode(x) for x in clips]
    results = [None] * 4

    def work(i):
        results[i] = codec.encode(clips[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for r, s in zip(results, serial):
        assert_same(r, s)


# ---------------------------------------------------------------- errors


def test_bad_inputs(codec):
    with pytest.raises(mimi_py.ShapeError, match="channels=1"):
        codec.encode(np.zeros((1, 2, 100), np.float32))
    with pytest.raises(mimi_py.ShapeError, match=r"pcm\[:, None, :\]"):
        codec.encode(np.zeros((1, 100), np.float32))
    with pytest.raises(mimi_py.DTypeError, match="16-bit PCM"):
        codec.encode(np.zeros(100, np.int8))
    with pytest.raises(mimi_py.InvalidInputError, match="NaN"):
        codec.encode(np.full(100, np.nan, np.float32))
    with pytest.raises(mimi_py.ShapeError, match="num_codebooks=4"):
        codec.decode(np.zeros((1, 3, 2), np.uint32))
    with pytest.raises(mimi_py.InvalidInputError, match=r"\[0, 64\)"):
        codec.decode(np.full((1, 4, 2), 64, np.int64))
    with pytest.raises(mimi_py.InvalidInputError):
        codec.decode(np.full((1, 4, 2), -1, np.int64))
    with pytest.raises(mimi_py.DTypeError, match="integer"):
        codec.decode(np.zeros((1, 4, 2), np.float32))
    assert codec.decode(np.zeros((1, 4, 0), np.uint32)).shape == (1, 1, 0)


def test_missing_and_misshaped_tensors_are_named(tmp_path):
    t = read_safetensors(CODEC / "mimi_small.safetensors")
    del t["encoder.layers.3.conv.weight"]
    del t["quantizer.acoustic_residual_vector_quantizer.layers.1.codebook.embed_sum"]
    t["decoder_transformer.layers.1.mlp.fc1.weight"] = np.zeros((3, 64), np.float32)
    for src in (t, tmp_path / "bad.safetensors"):
        if not isinstance(src, dict):
            write_safetensors(src, t)
        with pytest.raises(mimi_py.WeightsError) as ei:
            make_codec(src, config=small_codec_config(), num_codebooks=2)
        msg = str(ei.value)
        assert "encoder.layers.3.conv.weight" in msg and "[16, 8, 8]" in msg
        assert "decoder_transformer.layers.1.mlp.fc1.weight" in msg and "[3, 64]" in msg
    with pytest.raises(mimi_py.WeightsError, match="has 2"):
        make_codec(t, config=small_codec_config(), num_codebooks=4)


def test_not_a_mimi_checkpoint(tmp_path):
    with pytest.raises(mimi_py.WeightsError, match="not a Mimi checkpoint"):
        make_codec({"foo.weight": np.zeros(3, np.float32)})
    with pytest.raises(mimi_py.WeightsError, match="no model.safetensors"):
        make_codec(tmp_path)


# ---------------------------------------------------------------- the real architecture


def manifest_file(tmp_path_factory, name):
    m = json.loads((CODEC / name).read_text())
    tensors = {t: np.zeros(v["shape"] if isinstance(v, dict) else v, np.float32) for t, v in iter_manifest(m)}
    path = tmp_path_factory.mktemp("real") / "model.safetensors"
    write_safetensors(path, tensors)
    return path, len(tensors)


def iter_manifest(m):
    t = m["tensors"]
    if isinstance(t, dict):
        for k, v in t.items():
            yield k, (v["shape"] if isinstance(v, dict) else v)
    else:
        for e in t:
            yield e["name"], e["shape"]


@pytest.mark.parametrize("manifest", ["kyutai_mimi_manifest.json", "kyutai_moshi_mimi_manifest.json"])
def test_real_checkpoint_layouts_load_with_8_16_32_codebooks(tmp_path_factory, manifest):
    path, n = manifest_file(tmp_path_factory, manifest)
    assert n in (350, 318)
    for k in (8, 16, 32):
        c = make_codec(path, num_codebooks=k)
        assert c.checkpoint_layout == ("moshi" if "moshi" in manifest else "hf")
        assert c.num_codebooks == k and c.cardinality == 2048 and c.sample_rate == 24000
        assert c.encode(np.zeros(1920, np.float32)).shape == (1, k, 1)


def test_seeded_real_architecture():
    c = make_codec(seed=0)
    assert c.config == mimi_py.CodecConfig.mimi(num_codebooks=8)
    assert (c.frame_size, c.frame_rate, c.num_codebooks, c.checkpoint_layout) == (1920, 12.5, 8, None)
    x = (np.random.default_rng(0).standard_normal(3840) * 0.1).astype(np.float32)
    codes = c.encode(x)
    assert codes.shape == (1, 8, 2) and codes.max() < 2048
    assert_same(make_codec(seed=0).encode(x), codes)
    assert c.decode(codes).shape == (1, 1, 3840)


def test_streaming_decode_with_a_batch(codec):
    rng = np.random.default_rng(5)
    codes = np.concatenate([IO["codes"], rng.integers(0, 64, IO["codes"].shape)], axis=0).astype(np.uint32)
    offline = codec.decode(codes)
    codec.reset_state()
    out = [codec.decode_step(codes[..., s : s + 4]) for s in range(0, 19, 4)]
    stream = np.concatenate(out, axis=-1)
    assert stream.shape == offline.shape == (2, 1, 19 * 1920)
    assert_close(stream, offline, atol=1e-4, rtol=1e-3)
    assert_close(offline[1:], codec.decode(codes[1:]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("last_chunk", [0, 1, 777, 1920, 2500])
def test_a_stream_ended_with_last_true_gives_exactly_the_offline_codes(codec, last_chunk):
    rng = np.random.default_rng(12)
    pcm = (rng.standard_normal((2, 1, 3 * 1920 + 1234 + last_chunk)) * 0.1).astype(np.float32)
    codec.reset_state()
    cut = pcm.shape[-1] - last_chunk
    parts = [codec.encode_step(pcm[:, :, a : min(a + 1111, cut)]) for a in range(0, cut, 1111)]
    parts.append(codec.encode_step(pcm[:, :, cut:], last=True))
    streamed = np.concatenate([p for p in parts if p is not None], axis=-1)
    assert_codes(streamed, codec.encode(pcm), "last=True stream vs offline encode")
    # the stream is spent: the next call starts a fresh one, of any batch size
    assert codec.positions.size == 0
    assert codec.encode_step(pcm[:1, :, :1920]).shape == (1, codec.num_codebooks, 1)
    codec.reset_state()


def test_last_true_cannot_be_masked(codec):
    with pytest.raises(mimi_py.InvalidInputError, match="active"):
        codec.encode_step(np.zeros((1, 1, 1920), np.float32), active=np.array([True]), last=True)
