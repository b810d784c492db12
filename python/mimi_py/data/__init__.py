"""Tokenize a corpus: a folder of audio to Mimi codes in Parquet, on one machine or a Ray cluster.

Needs the ``data`` extra (``pip install 'mimi_py[data]'``: ``ray[data]``, ``pyarrow``,
``soundfile``, ``soxr``); they are imported when first used, so ``import mimi_py`` stays
numpy-only. The pipeline runs on Ray Data, the same code on a laptop (a local Ray instance) and
on a cluster (``address=`` or ``RAY_ADDRESS``):

1. :func:`read_audio_batch`, a task stage: each file is decoded with soundfile, downmixed to mono
   (the mean of the channels) and resampled to the codec's sample rate with soxr, block by block
   (:class:`mimi_py.audio.AudioReader`). Files longer than ``max_inline_seconds`` (default one
   hour) are not decoded here: the encoder streams them from disk itself, so no row holds more
   than that much audio.
2. :class:`MimiEncoder`, an actor stage: one :class:`~mimi_py.MimiCodec` per actor, loaded once,
   with ``RAYON_NUM_THREADS`` set to ``threads_per_worker`` in the actor's environment. Each file
   is encoded with ``MimiCodec.encode`` (streams over short chunks inside the codec, so its
   working memory does not grow with the file), so its codes equal ``MimiCodec.encode`` of the
   file's (resampled, mono) audio exactly. Longer files stream through ``encode_step`` in chunks
   of ``batch_seconds``, ended with ``last=True``, which pads the last partial frame as
   ``encode`` does: exact too (:meth:`MimiEncoder.encode_blocks`).
3. The driver (:func:`tokenize`) writes the rows to Parquet part files in ``OUTPUT_DIR``, each
   under a temporary name and then renamed, and keeps ``.MANIFEST.json`` up to date.

Output: one row per input file (:func:`output_schema`): ``path``, ``sample_rate``,
``duration_s``, ``num_frames``, ``num_codebooks``, ``codes`` (list<list<uint16>>, shape
(num_codebooks, num_frames)) and ``error``. A file that cannot be decoded (truncated, not
audio, no samples, NaN samples) gets a row with ``error`` set and ``codes`` null; it never stops
the job. ``resume=True`` skips the paths that already have a row.

The modules, by concern: ``read`` (find and read the input audio), ``encode`` (the codec stage),
``output`` (part files and ``.MANIFEST.json``), ``tokenize`` (the job), ``detokenize`` (the
reverse), ``model`` (the weights and their identity), ``runtime`` (Ray and thread counts) and
``common`` (what they all share). Everything public is imported here and listed in ``__all__``,
as each module lists its own; the other plain names (``common.need``, ``model.Model``) are
shared between the modules only, and a name with a leading ``_`` stays in its module.
"""

from ..audio import AudioInfo, AudioReader
from .common import MANIFEST_NAME, Progress, codes_to_numpy, output_schema
from .detokenize import MimiDecoder, detokenize, wav_name, wav_names
from .encode import MimiEncoder, encode_batches
from .output import read_codes
from .read import AUDIO_EXTENSIONS, find_audio, read_audio_batch
from .tokenize import tokenize

__all__ = [
    "AUDIO_EXTENSIONS",
    "AudioInfo",
    "AudioReader",
    "MANIFEST_NAME",
    "MimiDecoder",
    "MimiEncoder",
    "Progress",
    "codes_to_numpy",
    "detokenize",
    "encode_batches",
    "find_audio",
    "output_schema",
    "read_audio_batch",
    "read_codes",
    "tokenize",
    "wav_name",
    "wav_names",
]
