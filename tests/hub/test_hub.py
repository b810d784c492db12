"""Weights from the Hugging Face Hub, offline: MimiCodec.from_pretrained against a cache folder
laid out as huggingface_hub lays it out, ``hf:`` weights specs, and bfloat16 checkpoints."""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest

import mimi_py
from mimi_py.hub import WeightsSpec, load_codec, parse_weights_spec
from safetensors_file import read_safetensors, write_zeros
from support.hub_cache import make_hf_cache
from support.paths import CODEC_DIR
from support.reference import assert_same

CODEC = CODEC_DIR
IO = dict(np.load(CODEC / "mimi_small_io.npz"))
HF_FILES = {
    "model.safetensors": CODEC / "mimi_small.safetensors",
    "config.json": CODEC / "mimi_small_hf_config.json",
}
# Snapshot B holds the same weights in the moshi layout, so the layout read tells the snapshots apart.
MOSHI_FILES = {
    "model.safetensors": CODEC / "mimi_small_moshi.safetensors",
    "config.json": CODEC / "mimi_small_hf_config.json",
}
COMMIT_A = "a" * 40
COMMIT_B = "0123456789abcdef0123456789abcdef01234567"
TOKENIZER = "tokenizer-e351c8d8-checkpoint125.safetensors"


def small_config():
    return mimi_py.CodecConfig(**json.loads((CODEC / "mimi_small_candle_config.json").read_text()))


def write_zero_checkpoint(path, manifest):
    """A real-size checkpoint of zeros with the names and shapes of a manifest (sparse on disk)."""
    tensors = json.loads((CODEC / manifest).read_text())["tensors"]
    write_zeros(path, {name: t["shape"] for name, t in tensors.items()})


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """kyutai/mimi (main -> A: HF layout; tag v1 -> B: moshi layout) and a moshi-format repo."""
    root = tmp_path_factory.mktemp("hf_cache")
    make_hf_cache(
        root, "kyutai/mimi", {COMMIT_A: HF_FILES, COMMIT_B: MOSHI_FILES}, {"main": COMMIT_A, "v1": COMMIT_B}
    )
    real = {TOKENIZER: lambda p: write_zero_checkpoint(p, "kyutai_moshi_mimi_manifest.json")}
    make_hf_cache(root, "kyutai/moshiko-pytorch-bf16", {COMMIT_B: real})
    return root


@pytest.fixture
def offline(monkeypatch):
    """HF_HUB_OFFLINE=1, also in huggingface_hub's constants (it reads the variable at import).
    The tests that use it are marked ``extra("hub")``."""
    import huggingface_hub as hf
    import huggingface_hub.constants
    import huggingface_hub.errors  # noqa: F401  (hf.errors below)

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf.constants, "HF_HUB_OFFLINE", True)
    return hf


# ---------------------------------------------------------------- from_pretrained


@pytest.mark.extra("hub")
def test_from_pretrained_gives_the_codes_of_the_same_files_loaded_directly(offline, cache, tmp_path):
    for name, src in HF_FILES.items():
        (tmp_path / name).write_bytes(src.read_bytes())
    direct = mimi_py.MimiCodec(tmp_path)
    codec = mimi_py.MimiCodec.from_pretrained("kyutai/mimi", cache_dir=cache)
    assert codec.checkpoint_layout == "hf" and codec.config == direct.config
    codes = codec.encode(IO["waveform"])
    assert_same(codes, direct.encode(IO["waveform"]))
    assert_same(codes, IO["codes"])
    assert_same(codec.decode(codes), direct.decode(codes))


@pytest.mark.extra("hub")
def test_from_pretrained_passes_num_codebooks_on(offline, cache):
    codec = mimi_py.MimiCodec.from_pretrained("kyutai/mimi", num_codebooks=2, cache_dir=cache)
    assert codec.num_codebooks == 2
    assert_same(codec.encode(IO["waveform"]), IO["codes"][:, :2])


@pytest.mark.extra("hub")
def test_from_pretrained_reads_huggingface_hubs_default_cache(offline, cache, monkeypatch):
    monkeypatch.setattr(offline.constants, "HF_HUB_CACHE", str(cache))
    codec = mimi_py.MimiCodec.from_pretrained()  # kyutai/mimi, cache_dir from huggingface_hub
    assert_same(codec.encode(IO["waveform"]), IO["codes"])


@pytest.mark.parametrize(
    "revision,layout",
    [(None, "hf"), ("main", "hf"), (COMMIT_A, "hf"), ("v1", "moshi"), (COMMIT_B, "moshi")],
)
@pytest.mark.extra("hub")
def test_revision_selects_a_snapshot(offline, cache, revision, layout):
    codec = mimi_py.MimiCodec.from_pretrained("kyutai/mimi", revision=revision, cache_dir=cache)
    assert codec.checkpoint_layout == layout
    assert_same(codec.encode(IO["waveform"]), IO["codes"])


@pytest.mark.extra("hub")
def test_filename_reads_one_moshi_checkpoint_with_the_real_mimi_config(offline, cache):
    path = cache / "models--kyutai--moshiko-pytorch-bf16" / "snapshots" / COMMIT_B / TOKENIZER
    codec = mimi_py.MimiCodec.from_pretrained(
        "kyutai/moshiko-pytorch-bf16", filename=TOKENIZER, num_codebooks=16, cache_dir=cache
    )
    assert codec.checkpoint_layout == "moshi"
    assert codec.config == mimi_py.CodecConfig.mimi(num_codebooks=16) and codec.num_codebooks == 16
    x = np.sin(np.arange(3840, dtype=np.float32) / 7.0)
    codes = codec.encode(x)
    assert codes.shape == (1, 16, 2)
    assert_same(codes, mimi_py.MimiCodec(path, num_codebooks=16).encode(x))


# ---------------------------------------------------------------- errors


@pytest.mark.extra("hub")
def test_a_repo_missing_from_the_cache_says_what_to_download(offline, cache):
    with pytest.raises(mimi_py.WeightsError) as ei:
        mimi_py.MimiCodec.from_pretrained("kyutai/absent", cache_dir=cache)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("kyutai/absent: cannot get model.safetensors")
    assert "HF_HUB_OFFLINE" in msg and str(cache) in msg
    assert "`hf download kyutai/absent config.json model.safetensors" in msg
    assert "`huggingface-cli download kyutai/absent config.json model.safetensors" in msg
    assert isinstance(ei.value.__cause__, offline.errors.LocalEntryNotFoundError)


@pytest.mark.extra("hub")
def test_a_file_or_revision_missing_from_the_cache_is_named(offline, cache):
    with pytest.raises(
        mimi_py.WeightsError, match=r"cannot get other\.safetensors.*hf download kyutai/mimi other"
    ):
        mimi_py.MimiCodec.from_pretrained("kyutai/mimi", filename="other.safetensors", cache_dir=cache)
    with pytest.raises(mimi_py.WeightsError, match=r"^kyutai/mimi@v2: .*--revision v2"):
        mimi_py.MimiCodec.from_pretrained("kyutai/mimi", revision="v2", cache_dir=cache)


def test_without_huggingface_hub_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `import huggingface_hub` fails
    with pytest.raises(mimi_py.WeightsError) as ei:
        mimi_py.MimiCodec.from_pretrained("kyutai/mimi")
    msg = str(ei.value)
    assert "\n" not in msg and "'kyutai/mimi'" in msg and "pip install 'mimi_py[hub]'" in msg
    assert isinstance(ei.value.__cause__, ImportError)


@pytest.mark.extra("hub")
def test_a_cached_file_that_is_not_a_mimi_checkpoint_is_a_weights_error(offline, tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not safetensors")
    make_hf_cache(tmp_path / "cache", "org/bad", {COMMIT_A: {"ckpt.safetensors": bad}})
    with pytest.raises(mimi_py.WeightsError):
        mimi_py.MimiCodec.from_pretrained(
            "org/bad", filename="ckpt.safetensors", cache_dir=tmp_path / "cache"
        )


# ---------------------------------------------------------------- hf: specs and load_codec


@pytest.mark.parametrize(
    "spec,parts",
    [
        ("hf:kyutai/mimi", ("kyutai/mimi", None, None)),
        ("hf:gpt2", ("gpt2", None, None)),
        ("hf:kyutai/mimi@main", ("kyutai/mimi", "main", None)),
        ("hf:kyutai/mimi@refs/pr/1", ("kyutai/mimi", "refs/pr/1", None)),
        (f"hf:kyutai/mimi@{COMMIT_B}:model.safetensors", ("kyutai/mimi", COMMIT_B, "model.safetensors")),
        (f"hf:kyutai/moshiko-pytorch-bf16:{TOKENIZER}", ("kyutai/moshiko-pytorch-bf16", None, TOKENIZER)),
        ("hf:Org_1/my.model-2:sub/dir/w.safetensors", ("Org_1/my.model-2", None, "sub/dir/w.safetensors")),
    ],
)
def test_weights_spec_accepts_the_documented_forms(spec, parts):
    assert parse_weights_spec(spec) == WeightsSpec(*parts)


@pytest.mark.parametrize(
    "spec",
    [
        "hf:",
        "kyutai/mimi",
        "hf:/mimi",
        "hf:kyutai/",
        "hf:a/b/c",
        "hf:kyutai mimi",
        "hf:kyutai/mimi@",
        "hf:kyutai/mimi:",
        "hf:kyutai/mimi@main:",
        "hf:kyutai/mimi@a@b",
        "hf:kyutai/mimi:a:b",
        "hf:kyutai/mimi:/abs.safetensors",
        "hf:kyutai/mimi:../up.safetensors",
    ],
)
def test_weights_spec_rejects_malformed_forms(spec):
    with pytest.raises(
        mimi_py.WeightsError, match=r"malformed weights spec .*hf:REPO_ID\[@REVISION\]\[:FILENAME\]"
    ):
        parse_weights_spec(spec)


@pytest.mark.extra("hub")
def test_load_codec_takes_an_hf_spec_or_a_path(offline, cache, monkeypatch):
    monkeypatch.setattr(offline.constants, "HF_HUB_CACHE", str(cache))
    from_hub = load_codec("hf:kyutai/mimi@v1", num_codebooks=3)
    assert from_hub.checkpoint_layout == "moshi" and from_hub.num_codebooks == 3
    snapshots = cache / "models--kyutai--mimi" / "snapshots"
    from_path = load_codec(snapshots / COMMIT_B, num_codebooks=3)
    assert from_path.checkpoint_layout == "moshi" and from_path.num_codebooks == 3
    assert_same(from_hub.encode(IO["waveform"]), from_path.encode(IO["waveform"]))
    assert load_codec(str(snapshots / COMMIT_A)).checkpoint_layout == "hf"
    with pytest.raises(mimi_py.WeightsError, match="malformed"):
        load_codec("hf:kyutai/mimi@")


# ---------------------------------------------------------------- bfloat16 checkpoints

BF16 = CODEC / "mimi_small_moshi_bf16.safetensors"  # tests/data/make_bf16.py


def test_the_bfloat16_fixture_is_what_its_generator_writes(tmp_path):
    spec = importlib.util.spec_from_file_location("make_bf16", CODEC.parent / "make_bf16.py")
    assert spec is not None and spec.loader is not None
    make_bf16 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_bf16)
    assert make_bf16.convert(CODEC / "mimi_small_moshi.safetensors", tmp_path / "bf16.safetensors") == 114
    assert (tmp_path / "bf16.safetensors").read_bytes() == BF16.read_bytes()


def test_the_bfloat16_fixture_is_the_float32_one_rounded():
    f32, bf16 = read_safetensors(CODEC / "mimi_small_moshi.safetensors"), read_safetensors(BF16)
    assert set(f32) == set(bf16)
    for name, x in f32.items():
        y = bf16[name]
        # rounded to nearest: within half a step of bf16's 8 significant bits, <= 2^-8 |x|
        assert np.all(np.abs(y - x) <= np.abs(x) * 2.0**-8), name
    assert any(not np.array_equal(f32[k], bf16[k]) for k in f32)


def test_a_bfloat16_checkpoint_loads_as_the_float32_upcast_of_its_values():
    codec = mimi_py.MimiCodec(BF16, config=small_config())
    assert codec.checkpoint_layout == "moshi" and codec.dtype == "float32"
    upcast = mimi_py.MimiCodec(read_safetensors(BF16), config=small_config())
    assert_same(codec.encode(IO["waveform"]), upcast.encode(IO["waveform"]))
    assert_same(codec.decode(IO["codes"]), upcast.decode(IO["codes"]))


def test_bfloat16_codes_match_float32_as_far_as_rounding_allows():
    """4 s of seeded noise and 4 s of a 100 Hz -> 4 kHz sine sweep (4 codebooks x 50 frames each).

    Measured: 98.0% (noise) and 98.5% (sweep) of the codes are equal; decoding the same codes,
    the bf16 and f32 audio differ by at most 0.0147 (peak |audio| 1.87, so 0.8%).
    """
    f32 = mimi_py.MimiCodec(CODEC / "mimi_small_moshi.safetensors", config=small_config())
    bf16 = mimi_py.MimiCodec(BF16, config=small_config())
    sr = 24000
    t = np.arange(4 * sr) / sr
    noise = 0.1 * np.random.default_rng(0).standard_normal(t.size)
    sweep = 0.3 * np.sin(2 * np.pi * (100 * t + (4000 - 100) / 8 * t**2))
    for x in (noise.astype(np.float32), sweep.astype(np.float32)):
        codes = f32.encode(x)
        assert (codes == bf16.encode(x)).mean() >= 0.95
        audio = f32.decode(codes)
        diff = np.abs(bf16.decode(codes) - audio).max()
        assert 0 < diff <= 0.025 and np.abs(audio).max() > 1.0  # a small, real difference
