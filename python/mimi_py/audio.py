"""Sound files in and out, shared by the command line, :mod:`mimi_py.data` and :mod:`mimi_py.serve`.

A file is read block by block as mono float32 (the mean of its channels) and resampled with
soxr's streaming resampler to the rate the caller passes, which is the codec's
``sample_rate``; a file is written with soundfile, whole or block by block. Needs soundfile and
soxr (the ``audio`` or ``data`` extra), imported when first used so that ``import mimi_py``
stays numpy-only.

The defaults that do not come from a codec are declared here once: :data:`MIMI_SAMPLE_RATE`
(where no codec is at hand) and :data:`CHUNK_SECONDS` (read blocks and codec calls).
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from .errors import InvalidInputError

__all__ = [
    "AudioInfo",
    "AudioReader",
    "CHUNK_SECONDS",
    "MIMI_SAMPLE_RATE",
    "encode_blocks",
    "open_writer",
    "output_format",
    "read_audio",
    "write_audio",
]

MIMI_SAMPLE_RATE = 24000
"""The real Mimi codec's sample rate: the default target rate where no codec is passed in."""
CHUNK_SECONDS = 10.0
"""Default seconds of audio per read block and per streaming codec call."""

_INSTALL = "pip install 'mimi_py[audio]'"
# libsndfile's log line for a data chunk shorter than its header says: "data : 192000 (should be 95978)".
_SHORT_CHUNK = re.compile(r"^data\s*:\s*(\d+)\s*\(should be (\d+)\)", re.MULTILINE)
# Data sizes that streaming writers put in a header when they do not know the length.
_UNKNOWN_SIZES = {0, 0xFFFFFFFF, 0x7FFFFFFF, 0xFFFFFFFE}


def _module(name: str, what: str) -> Any:
    """Import soundfile or soxr, or say how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ImportError(f"{what} needs {name}: {_INSTALL}") from e


class AudioInfo(NamedTuple):
    """What a sound file's header says: its own sample rate, channel and frame counts."""

    sample_rate: int
    channels: int
    frames: int

    @property
    def duration_s(self) -> float:
        """The source duration in seconds."""
        return self.frames / self.sample_rate


class AudioReader:
    """A sound file read block by block as mono float32 at ``sample_rate`` (bounded memory).

    ``sample_rate`` is the target rate: pass the codec's ``sample_rate``. Channels are averaged
    (downmix to mono) and other rates are resampled with soxr's streaming resampler, whose output
    equals ``soxr.resample`` of the whole file exactly. Raises
    :class:`~mimi_py.InvalidInputError` for a file that is not audio, has no samples, is
    truncated (its header promises more data than the file holds, or fewer frames can be read
    than it declares) or holds NaN/Inf samples (while iterating), and :class:`FileNotFoundError`
    for a missing file. Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        sample_rate: int = MIMI_SAMPLE_RATE,
        *,
        block_seconds: float = CHUNK_SECONDS,
    ) -> None:
        sf = _module("soundfile", "reading audio")
        self.path = os.fspath(path)
        self.sample_rate = int(sample_rate)
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"{self.path}: no such file")
        try:
            self._file = sf.SoundFile(self.path)
        except Exception as e:  # soundfile's own error types (LibsndfileError, TypeError...)
            raise InvalidInputError(f"not a readable audio file: {e}") from e
        f = self._file
        self.info = AudioInfo(int(f.samplerate), int(f.channels), int(f.frames))
        try:
            self._check_header(f.extra_info or "")
        except BaseException:
            f.close()
            raise
        self._block = max(1, int(block_seconds * self.info.sample_rate))

    def _check_header(self, extra_info: str) -> None:
        """Raises for a truncated data chunk or no frames at all."""
        for declared, actual in _SHORT_CHUNK.findall(extra_info):
            if int(declared) > int(actual) and int(declared) not in _UNKNOWN_SIZES:
                raise InvalidInputError(
                    f"truncated: the header declares {int(declared)} bytes of audio, "
                    f"the file holds {int(actual)}"
                )
        if self.info.frames <= 0:
            raise InvalidInputError("no audio samples")

    def _mono_blocks(self) -> Iterator[np.ndarray]:
        """The file's blocks downmixed to mono float32 at its own rate, checked for NaN/Inf."""
        info, f = self.info, self._file
        f.seek(0)
        read = 0
        blocks = f.blocks(blocksize=self._block, dtype="float32", always_2d=True)
        while True:
            try:
                block = next(blocks)
            except StopIteration:
                break
            except Exception as e:  # soundfile's own error types
                at = read / info.sample_rate
                raise InvalidInputError(f"cannot decode the audio after {at:.3f} s: {e}") from e
            mono = block[:, 0] if info.channels == 1 else block.mean(axis=1, dtype=np.float32)
            mono = np.ascontiguousarray(mono, dtype=np.float32)
            if not np.isfinite(mono).all():
                at = read + int(np.argmin(np.isfinite(mono)))
                raise InvalidInputError(f"NaN or Inf samples (first at {at / info.sample_rate:.3f} s)")
            read += len(mono)
            yield mono
        if read < info.frames:
            raise InvalidInputError(f"truncated: read {read} of the {info.frames} frames the header declares")

    def __iter__(self) -> Iterator[np.ndarray]:
        """Blocks of mono float32 samples at ``sample_rate``, from the start of the file."""
        if self.info.sample_rate == self.sample_rate:
            yield from self._mono_blocks()
            return
        soxr = _module("soxr", "resampling audio")
        stream = soxr.ResampleStream(self.info.sample_rate, self.sample_rate, 1, dtype="float32")
        for mono in self._mono_blocks():
            yield stream.resample_chunk(mono)
        tail = stream.resample_chunk(np.zeros(0, np.float32), last=True)
        if len(tail):
            yield tail

    def read(self) -> np.ndarray:
        """The whole file: mono float32 samples at ``sample_rate``."""
        blocks = list(self)
        return np.concatenate(blocks) if blocks else np.zeros(0, np.float32)

    def close(self) -> None:
        """Close the file."""
        self._file.close()

    def __enter__(self) -> AudioReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def encode_blocks(codec: Any, blocks: Any, step: int, on_codes: Any = None) -> np.ndarray:
    """The codes ``(1, num_codebooks, frames)`` of consecutive mono blocks at the codec's rate
    (an :class:`AudioReader`, say), streamed through ``codec.encode_step`` in calls of ``step``
    samples from a fresh state and ended with ``last=True``, which pads the last partial frame
    as ``encode`` does: ``encode``'s codes of the whole audio, with memory bounded by a call.
    ``on_codes(codes)`` sees each call's codes (a progress bar). Leaves the codec's streams fresh."""
    out, fed = [], 0

    def keep(codes: np.ndarray | None) -> None:
        if codes is not None:
            out.append(codes)
            if on_codes is not None:
                on_codes(codes)

    codec.reset_state()
    try:
        for block in blocks:
            for s in range(0, len(block), step):
                fed += len(block[s : s + step])
                keep(codec.encode_step(block[None, None, s : s + step]))
        if fed:  # no audio, no frames: nothing to end
            keep(codec.encode_step(np.zeros((1, 1, 0), np.float32), last=True))
    finally:
        codec.reset_state()
    return np.concatenate(out, axis=-1) if out else np.zeros((1, codec.num_codebooks, 0), np.uint32)


def read_audio(
    path: str | os.PathLike[str], sample_rate: int, *, block_seconds: float = CHUNK_SECONDS
) -> tuple[np.ndarray, AudioInfo]:
    """A whole sound file as mono float32 at ``sample_rate`` (the codec's), and its header info.
    Raises as :class:`AudioReader` does."""
    with AudioReader(path, sample_rate, block_seconds=block_seconds) as r:
        return r.read(), r.info


def output_format(path: str | os.PathLike[str], subtype: str | None = None) -> tuple[str, str]:
    """The ``(format, subtype)`` a sound file ``path`` is written with, checked before any work
    is done: the format its extension names, and ``subtype`` or the format's default (FLOAT for
    WAV-like formats, which hold float samples; soundfile's default elsewhere: PCM_16 for FLAC,
    VORBIS for Ogg, MPEG_LAYER_III for MP3). Raises ``InvalidInputError`` naming the choices for
    an unknown extension, a subtype the format cannot hold, or a folder that does not exist."""
    sf = _module("soundfile", "writing audio")
    parent = os.path.dirname(os.path.abspath(os.fspath(path)))
    if not os.path.isdir(parent):
        raise InvalidInputError(f"{path}: the folder {parent} does not exist")
    ext = os.path.splitext(os.fspath(path))[1].lstrip(".").upper()
    formats = sf.available_formats()
    if ext not in formats:
        known = ", ".join("." + f.lower() for f in ("WAV", "FLAC", "OGG", "MP3", "AIFF") if f in formats)
        raise InvalidInputError(
            f"{path}: unknown audio format {('.' + ext.lower()) or '(none)'}; use {known}"
        )
    if subtype is None:
        subtype = "FLOAT" if sf.check_format(ext, "FLOAT") else sf.default_subtype(ext)
    subtype = subtype.upper()
    if not sf.check_format(ext, subtype):
        valid = ", ".join(sorted(sf.available_subtypes(ext)))
        raise InvalidInputError(f"{path}: {ext} files cannot hold subtype {subtype}; choose one of {valid}")
    return ext, subtype


def open_writer(
    path: str | os.PathLike[str], sample_rate: int, *, subtype: str = "FLOAT", format: str | None = None
) -> Any:
    """A mono sound file open for writing block by block (a ``soundfile.SoundFile``; use it as a
    context manager). ``format`` defaults to the one the file name's extension names."""
    sf = _module("soundfile", "writing audio")
    return sf.SoundFile(
        os.fspath(path), "w", samplerate=int(sample_rate), channels=1, subtype=subtype, format=format
    )


def write_audio(
    path: str | os.PathLike[str], pcm: np.ndarray, sample_rate: int, *, subtype: str | None = None
) -> None:
    """Write mono samples ``pcm`` at ``sample_rate`` (the codec's) to the sound file ``path``
    (format and subtype as :func:`output_format` picks and checks them)."""
    fmt, subtype = output_format(path, subtype)
    with open_writer(path, sample_rate, subtype=subtype, format=fmt) as f:
        f.write(pcm)
