"""mimi_py.audio: files read block by block as mono at the rate the caller asks for, and written."""

from __future__ import annotations

import numpy as np
import pytest

import mimi_py
from mimi_py import audio
from support.extras import optional
from support.reference import assert_same

pytestmark = pytest.mark.extra("audio")
with optional("audio"):
    import soundfile as sf
    import soxr


def stereo(seconds: float, sr: int) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    return (0.3 * np.stack([np.sin(2 * np.pi * 220 * t), np.cos(2 * np.pi * 330 * t)], axis=1)).astype(
        np.float32
    )


@pytest.mark.parametrize("target", [24000, 16000, 44100])
def test_reads_resample_to_the_rate_the_caller_passes(tmp_path, target):
    path = tmp_path / "in.wav"
    x = stereo(1.3, 44100)
    sf.write(path, x, 44100, subtype="FLOAT")
    pcm, info = audio.read_audio(path, target, block_seconds=0.25)
    assert (info.sample_rate, info.channels, info.frames) == (44100, 2, len(x))
    mono = x.mean(axis=1, dtype=np.float32)
    expected = mono if target == 44100 else soxr.resample(mono, 44100, target)
    assert_same(pcm, expected)


def test_the_defaults_are_declared_once():
    assert audio.AudioReader.__init__.__defaults__ == (audio.MIMI_SAMPLE_RATE,)
    assert audio.MIMI_SAMPLE_RATE == mimi_py.CodecConfig.mimi().sample_rate
    assert audio.CHUNK_SECONDS == 10.0


def test_written_files_read_back_exactly(tmp_path):
    pcm = stereo(0.5, 24000)[:, 0]
    audio.write_audio(tmp_path / "out.wav", pcm, 24000)
    back, sr = sf.read(tmp_path / "out.wav", dtype="float32")
    assert sr == 24000
    assert_same(back, pcm)
    with audio.open_writer(tmp_path / "blocks.tmp", 24000, format="WAV") as f:
        f.write(pcm[:100])
        f.write(pcm[100:])
    assert_same(sf.read(tmp_path / "blocks.tmp", dtype="float32")[0], pcm)
