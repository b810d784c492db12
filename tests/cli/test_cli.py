"""The command line: python -m mimi_py encode/decode."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from support.extras import optional
from support.hub_cache import make_hf_cache
from support.paths import CODEC_DIR
from support.reference import assert_close, assert_same

pytestmark = pytest.mark.extra("audio")
with optional("audio"):
    import soundfile as sf

CODEC = CODEC_DIR
IO = dict(np.load(CODEC / "mimi_small_io.npz"))


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("mimi_small")
    shutil.copy(CODEC / "mimi_small.safetensors", d / "model.safetensors")
    shutil.copy(CODEC / "mimi_small_hf_config.json", d / "config.json")
    return d


def run(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "mimi_py", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=None if env is None else {**os.environ, **env},
    )


def test_each_subcommand_names_its_function_and_codebooks_default_to_the_checkpoints():
    from mimi_py import cli

    for argv in (["encode", "a.wav", "c.npy"], ["tokenize", "corpus", "codes"]):
        args = cli.parser().parse_args(argv)
        assert args.num_codebooks is None and args.func is getattr(cli, argv[0])
    assert cli.parser().parse_args(["detokenize", "codes", "wav"]).func is cli.detokenize


def test_encode_decode_round_trip(tmp_path, small_dir):
    wav = tmp_path / "in.wav"
    sf.write(wav, IO["waveform"][0, 0], 24000, subtype="FLOAT")
    r = run("encode", wav, tmp_path / "codes.npy", "--weights", small_dir, "--progress")
    assert r.returncode == 0, r.stderr
    assert "encode: 100%" in r.stderr and "frame" in r.stderr  # tqdm's progress bar
    codes = np.load(tmp_path / "codes.npy")
    assert codes.dtype == np.uint32
    assert_same(codes, IO["codes"])  # whole-frame padding keeps the codes
    r = run("decode", tmp_path / "codes.npy", tmp_path / "out.wav", "--weights", small_dir)
    assert r.returncode == 0, r.stderr
    audio, sr = sf.read(tmp_path / "out.wav", dtype="float32")
    assert sr == 24000
    assert_close(audio[None, None], IO["audio"], 1e-4, 1e-3, "decoded wav")


def test_resamples_and_downmixes(tmp_path, small_dir):
    wav = tmp_path / "stereo48k.wav"
    x = np.stack([np.sin(np.arange(48000) / 20.0), np.cos(np.arange(48000) / 30.0)], axis=1) * 0.3
    sf.write(wav, x, 48000)
    r = run("encode", wav, tmp_path / "c.npy", "--weights", small_dir, "--num-codebooks", "2")
    assert r.returncode == 0, r.stderr
    assert "downmixing 2 channels" in r.stderr
    assert np.load(tmp_path / "c.npy").shape == (1, 2, 13)  # 1 s at 24 kHz = 12.5 frames -> 13


def test_errors_are_one_line_and_nonzero(tmp_path, small_dir):
    r = run("encode", tmp_path / "missing.wav", tmp_path / "c.npy", "--weights", small_dir)
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "no such file" in r.stderr
    bad = tmp_path / "bad.npy"
    np.save(bad, np.full((4, 3), 999, np.int64))
    r = run("decode", bad, tmp_path / "o.wav", "--weights", small_dir)
    assert r.returncode == 1 and r.stderr.startswith("error:") and "[0, 64)" in r.stderr
    notwav = tmp_path / "x.wav"
    notwav.write_text("not audio")
    r = run("encode", notwav, tmp_path / "c.npy", "--weights", small_dir)
    assert r.returncode == 1 and "cannot read audio" in r.stderr


def one_line_error(r, *needles):
    """The run failed with exit code 1 and one line on stderr that holds every needle."""
    assert r.returncode == 1, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if not ln.startswith("note:")]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert all(n in lines[0] for n in needles), r.stderr


def test_usage_mistakes_are_one_line_found_before_any_work(tmp_path, small_dir):
    codes = tmp_path / "c.npy"
    np.save(codes, IO["codes"][:1])
    w = ("--weights", small_dir)
    one_line_error(run("decode", codes, tmp_path / "o.xyz", *w), "unknown audio format .xyz", ".flac")
    one_line_error(
        run("decode", codes, tmp_path / "o.wav", "--subtype", "BOGUS", *w), "cannot hold subtype BOGUS"
    )
    one_line_error(run("decode", codes, tmp_path / "no" / "o.wav", *w), "does not exist")
    src = tmp_path / "in.wav"
    sf.write(src, np.zeros(2000, np.float32), 24000)
    one_line_error(run("encode", src, tmp_path / "no" / "c.npy", *w), "does not exist")
    wav = tmp_path / "hello.wav"
    sf.write(wav, np.zeros(1000, np.float32), 24000)
    one_line_error(run("decode", wav, tmp_path / "o.wav", *w), "not a .npy file of codes")
    pickled = tmp_path / "p.npy"
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    one_line_error(run("decode", pickled, tmp_path / "o.wav", *w), "holds Python objects")
    floats = tmp_path / "f.npy"
    np.save(floats, IO["codes"][:1].astype(np.float32))
    one_line_error(run("decode", floats, tmp_path / "o.wav", *w), "must be integers")


@pytest.mark.parametrize("ext", ["flac", "ogg", "mp3"])
def test_decode_writes_compressed_formats_with_a_subtype_they_hold(tmp_path, small_dir, ext):
    codes = tmp_path / "c.npy"
    np.save(codes, IO["codes"][:1])
    out = tmp_path / f"o.{ext}"
    r = run("decode", codes, out, "--weights", small_dir)
    if r.returncode != 0 and "unknown audio format" in r.stderr:  # pragma: no cover - libsndfile build
        pytest.skip(f"this libsndfile cannot write .{ext}")
    assert r.returncode == 0, r.stderr
    audio, sr = sf.read(out, dtype="float32")
    assert sr == 24000 and abs(len(audio) - IO["codes"].shape[-1] * 1920) <= 2000


@pytest.mark.extra("hub")
def test_weights_from_the_hugging_face_cache_offline(tmp_path):
    files = {
        "model.safetensors": CODEC / "mimi_small.safetensors",
        "config.json": CODEC / "mimi_small_hf_config.json",
    }
    make_hf_cache(tmp_path / "hub", "kyutai/mimi", {"c" * 40: files})
    env = {"HF_HOME": str(tmp_path / "home"), "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    wav = tmp_path / "in.wav"
    sf.write(wav, IO["waveform"][0, 0], 24000, subtype="FLOAT")
    r = run("encode", wav, tmp_path / "codes.npy", "--weights", "hf:kyutai/mimi@main", env=env)
    assert r.returncode == 0, r.stderr
    assert_same(np.load(tmp_path / "codes.npy"), IO["codes"])
    r = run("encode", wav, tmp_path / "c.npy", "--weights", "hf:kyutai/absent", env=env)
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0
    assert r.stderr.startswith("error: kyutai/absent: cannot get") and "hf download kyutai/absent" in r.stderr
    r = run("encode", wav, tmp_path / "c.npy", "--weights", "hf:kyutai/mimi@", env=env)
    assert r.returncode == 1 and "malformed weights spec" in r.stderr


def test_weights_dtype_reaches_the_codec_of_decode_and_encode(tmp_path, small_dir):
    import mimi_py

    codes = tmp_path / "c.npy"
    np.save(codes, IO["codes"])
    r = run("decode", codes, tmp_path / "bf16.wav", "--weights", small_dir, "--weights-dtype", "bfloat16")
    assert r.returncode == 0, r.stderr
    audio, _ = sf.read(tmp_path / "bf16.wav", dtype="float32")
    bf16 = mimi_py.MimiCodec(small_dir, weights_dtype="bfloat16").decode(IO["codes"])[0, 0]
    f32 = mimi_py.MimiCodec(small_dir).decode(IO["codes"])[0, 0]
    assert np.abs(bf16 - f32).max() > 1e-3  # so the comparison below tells them apart
    assert_close(audio, bf16, atol=1e-4, rtol=0)
    wav = tmp_path / "in.wav"
    sf.write(wav, IO["waveform"][0, 0], 24000, subtype="FLOAT")
    r = run("encode", wav, tmp_path / "c2.npy", "--weights", small_dir, "--weights-dtype", "bfloat16")
    assert r.returncode == 0, r.stderr
    expect = mimi_py.MimiCodec(small_dir, weights_dtype="bfloat16").encode(IO["waveform"])
    assert_same(np.load(tmp_path / "c2.npy"), expect)
    r = run("encode", wav, tmp_path / "c3.npy", "--weights-dtype", "float16")
    assert r.returncode == 2 and "invalid choice: 'float16'" in r.stderr
    r = run("encode", wav, tmp_path / "c4.npy", "--weights", small_dir, "--precision", "medium")
    assert r.returncode == 0, r.stderr
    expect = mimi_py.MimiCodec(small_dir, precision="medium").encode(IO["waveform"])
    assert_same(np.load(tmp_path / "c4.npy"), expect)
    args = ("--weights", small_dir, "--precision", "medium", "--weights-dtype", "float32")
    r = run("encode", wav, tmp_path / "c5.npy", *args)
    assert r.returncode == 1 and 'contradicts precision="medium"' in r.stderr


def test_precision_is_one_option_shared_by_encode_decode_tokenize_and_serve(monkeypatch):
    from mimi_py import cli, data

    p = cli.parser()
    for argv in (
        ["encode", "a.wav", "c.npy"],
        ["decode", "c.npy", "a.wav"],
        ["tokenize", "in", "out"],
        ["serve"],
    ):
        assert (p.parse_args(argv).precision, p.parse_args(argv).weights_dtype) == (None, None), argv
        assert p.parse_args([*argv, "--weights-dtype", "bfloat16"]).weights_dtype == "bfloat16", argv
        assert p.parse_args([*argv, "--precision", "medium"]).precision == "medium", argv
    seen = {}

    def fake_tokenize(*args, **kwargs):
        seen.update(kwargs)
        raise KeyboardInterrupt  # stops before the summary (the CLI's own path for Ctrl-C)

    monkeypatch.setattr(data, "tokenize", fake_tokenize)
    with pytest.raises(SystemExit):
        cli.tokenize(
            p.parse_args(["tokenize", "in", "out", "--weights-dtype", "bfloat16", "--precision", "high"])
        )
    assert (seen["weights_dtype"], seen["precision"]) == ("bfloat16", "high")
