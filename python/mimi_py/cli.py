"""Command line: ``mimi-py encode IN.wav OUT.npy`` / ``decode IN.npy OUT.wav``, and
``tokenize INPUT OUTPUT_DIR`` / ``detokenize OUTPUT_DIR WAV_DIR`` for a whole corpus on Ray
(:mod:`mimi_py.data`; ``pip install 'mimi_py[data]'``). ``python -m mimi_py`` is the same command.
Each subcommand's parser names its function (``set_defaults(func=...)``), which :func:`main` calls.

Audio is read and written with :mod:`mimi_py.audio` (``soundfile``); other sample rates are
resampled to the codec's rate with ``soxr`` (install both, and ``tqdm``, with
``pip install 'mimi_py[audio]'``).
Files are read, encoded, decoded and written block by block through the streaming calls
(``encode_step(..., last=True)`` ends a file, so its codes equal ``encode``'s exactly), so memory
stays bounded whatever the length, with a tqdm progress bar on stderr. ``--weights`` is a path or an
``hf:REPO_ID[@REVISION][:FILENAME]`` spec (``mimi_py.hub``). Errors are one line on stderr and a
non-zero exit code.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np

from . import MimiCodec, MimiError
from .audio import CHUNK_SECONDS, AudioReader, encode_blocks, open_writer, output_format
from .errors import InvalidInputError
from .hub import load_codec
from .options import add_precision


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 1."""


def _progress(total: int, desc: str, enabled: bool):
    """A tqdm progress bar over ``total`` code frames, on stderr."""
    try:
        from tqdm import tqdm
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise CliError("the progress bar needs tqdm: pip install 'mimi_py[audio]'") from e
    return tqdm(total=total, desc=desc, unit="frame", disable=not enabled, file=sys.stderr, leave=True)


def _codec(args) -> MimiCodec:
    if args.weights is None:
        print(
            "note: no --weights given: using seeded random weights (the output is noise); "
            "pass --weights hf:kyutai/mimi (or a path to kyutai/mimi's files) for real use",
            file=sys.stderr,
        )
    return load_codec(
        args.weights,
        num_codebooks=getattr(args, "num_codebooks", None),
        device=args.device,
        precision=args.precision,
        weights_dtype=args.weights_dtype,
    )


# Seconds of audio per streaming call: a call's activations (~4 KB per sample on the real
# model) are what memory holds beyond the weights. 2 s keeps an hour-long encode under 0.8 GB
# (1 s: 0.59 GB at RTF 9.6; 10 s: 1.44 GB at RTF 17).
_STEP_SECONDS = 2.0


def encode(args) -> None:
    """``encode IN OUT.npy``: audio file -> codes (1, num_codebooks, frames) uint32, read and
    encoded block by block."""
    path = Path(args.input)
    if not path.is_file():
        raise CliError(f"{path}: no such file")
    out_dir = Path(args.output).resolve().parent
    if not out_dir.is_dir():
        raise CliError(f"{args.output}: the folder {out_dir} does not exist")
    codec = _codec(args)
    try:
        with AudioReader(path, codec.sample_rate, block_seconds=CHUNK_SECONDS) as reader:
            if reader.info.channels > 1:
                print(f"note: downmixing {reader.info.channels} channels to mono", file=sys.stderr)
            total = math.ceil(reader.info.duration_s * codec.frame_rate)
            with _progress(total, "encode", args.progress) as bar:
                step = int(_STEP_SECONDS * codec.sample_rate)
                codes = encode_blocks(codec, reader, step, lambda c: bar.update(c.shape[-1]))
    except InvalidInputError as e:
        raise CliError(f"{path}: cannot read audio: {e}") from e
    np.save(args.output, codes)
    print(
        f"{args.output}: codes {codes.shape} uint32 ({codes.shape[-1] / codec.frame_rate:.2f} s)",
        file=sys.stderr,
    )


def _load_codes(path: str) -> np.ndarray:
    """Codes from a .npy file, as (1, num_codebooks, frames)."""
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError as e:
        raise CliError(f"{path}: cannot read codes: {e.strerror}") from e
    if magic != b"\x93NUMPY":
        raise CliError(f"{path}: not a .npy file of codes (write them with numpy.save, as `encode` does)")
    try:
        codes = np.load(path, allow_pickle=False, mmap_mode="r")
    except ValueError as e:
        raise CliError(f"{path}: not a .npy file of codes: it holds Python objects ({e})") from e
    if codes.dtype.kind not in "iu":
        raise CliError(f"{path}: codes must be integers, got dtype {codes.dtype}")
    if codes.ndim == 2:
        codes = codes[None]
    if codes.ndim != 3 or codes.shape[0] != 1:
        raise CliError(
            f"{path}: expected codes of shape (num_codebooks, frames) or (1, num_codebooks, frames), got {codes.shape}"
        )
    return codes


def decode(args) -> None:
    """``decode IN.npy OUT``: codes -> audio file at the codec's sample rate, decoded and
    written block by block."""
    try:
        fmt, subtype = output_format(args.output, args.subtype)
    except InvalidInputError as e:
        raise CliError(str(e)) from e
    codes = _load_codes(args.input)
    args.num_codebooks = codes.shape[1]
    codec = _codec(args)
    step = max(1, int(_STEP_SECONDS * codec.frame_rate))
    samples = 0
    codec.reset_state()
    tmp = Path(args.output).with_name(f".{Path(args.output).name}.{os.getpid()}.tmp")
    try:  # written under a temporary name: a failed decode leaves no partial file
        with open_writer(tmp, codec.sample_rate, subtype=subtype, format=fmt) as f:
            with _progress(codes.shape[-1], "decode", args.progress) as bar:
                for s in range(0, codes.shape[-1], step):
                    pcm = codec.decode_step(np.asarray(codes[..., s : s + step]))
                    if pcm is not None:
                        f.write(pcm[0, 0])
                        samples += pcm.shape[-1]
                    bar.update(min(step, codes.shape[-1] - s))
        os.replace(tmp, args.output)
    finally:
        tmp.unlink(missing_ok=True)
    print(f"{args.output}: {samples / codec.sample_rate:.2f} s at {codec.sample_rate} Hz", file=sys.stderr)


def tokenize(args) -> None:
    """``tokenize INPUT OUTPUT_DIR``: :func:`mimi_py.data.tokenize`, then a one-line summary."""
    from . import data

    if args.weights is None:
        print(
            "note: no --weights given: using seeded random weights (the codes are meaningless); "
            "pass --weights hf:kyutai/mimi (or a path to kyutai/mimi's files) for real use",
            file=sys.stderr,
        )
    try:
        m = data.tokenize(
            args.input,
            args.output_dir,
            weights=args.weights,
            num_codebooks=args.num_codebooks,
            workers=args.workers,
            threads_per_worker=args.threads_per_worker,
            batch_seconds=args.batch_seconds,
            address=args.address,
            resume=args.resume,
            progress_every=args.progress_every,
            precision=args.precision,
            weights_dtype=args.weights_dtype,
        )
    except KeyboardInterrupt:
        print(
            f"interrupted: the rows written so far are kept; run the same command with --resume "
            f"to finish ({args.output_dir}/{data.MANIFEST_NAME})",
            file=sys.stderr,
        )
        raise SystemExit(130) from None
    c = m["counts"]
    print(
        f"{args.output_dir}: {c['rows']} rows for {c['inputs']} inputs ({c['errors']} errors, "
        f"{c['missing']} missing), {c['audio_hours']:.3f} h of audio; {data.MANIFEST_NAME}: {m['status']}",
        file=sys.stderr,
    )


def detokenize(args) -> None:
    """``detokenize OUTPUT_DIR WAV_DIR``: :func:`mimi_py.data.detokenize`; exit 1 if a row failed."""
    from . import data

    c = data.detokenize(
        args.output_dir,
        args.wav_dir,
        weights=args.weights,
        workers=args.workers,
        threads_per_worker=args.threads_per_worker,
        address=args.address,
        limit=args.limit,
        progress_every=args.progress_every,
    )
    if c["failed"]:
        raise CliError(f"{c['failed']} row(s) could not be decoded (see the lines above)")


def _add_codec_parsers(sub) -> None:
    """The encode / decode subcommands (one file, streamed through the codec)."""
    e = sub.add_parser("encode", help="audio file -> codes (.npy, uint32, (1, num_codebooks, frames))")
    e.add_argument("input")
    e.add_argument("output")
    e.add_argument(
        "--num-codebooks", type=int, default=None, help="default: the checkpoint's (or config's) own number"
    )
    e.set_defaults(func=encode)
    d = sub.add_parser("decode", help="codes (.npy) -> audio file")
    d.add_argument("input")
    d.add_argument("output")
    d.add_argument(
        "--subtype",
        default=None,
        help="soundfile subtype of the output (default: FLOAT where the format holds it, else the "
        "format's own: PCM_16 for FLAC, VORBIS for Ogg, MPEG_LAYER_III for MP3)",
    )
    d.set_defaults(func=decode)
    for q in (e, d):
        q.add_argument(
            "--weights",
            default=None,
            help="hf:REPO_ID[@REVISION][:FILENAME] (e.g. hf:kyutai/mimi, from the Hugging Face Hub or its "
            "cache; needs mimi_py[hub]), or a path: kyutai/mimi's model.safetensors, its directory, or a "
            "moshi checkpoint (default: seeded random weights)",
        )
        q.add_argument("--device", default="cpu")
        q.add_argument("--progress", action=argparse.BooleanOptionalAction, default=sys.stderr.isatty())
        add_precision(q)


def _add_tokenize_parser(sub):
    """The tokenize subcommand (mimi_py.data, on Ray)."""
    t = sub.add_parser(
        "tokenize",
        help="a corpus (folder, glob, .jsonl/.txt manifest) -> Mimi codes in Parquet, on Ray",
        description="Tokenize every audio file of INPUT into Parquet rows in OUTPUT_DIR (one row per "
        "file: path, sample_rate, duration_s, num_frames, num_codebooks, codes, error) plus "
        ".MANIFEST.json. Runs on a local Ray instance, or the cluster at --address / RAY_ADDRESS. "
        "Needs mimi_py[data].",
    )
    t.add_argument(
        "input", help="a folder (searched recursively), a glob, or a .jsonl/.txt manifest of paths"
    )
    t.add_argument("output_dir", help="a folder, or a pyarrow filesystem URI such as s3://bucket/codes")
    t.add_argument(
        "--num-codebooks", type=int, default=None, help="default: the checkpoint's (or config's) own number"
    )
    t.add_argument(
        "--batch-seconds",
        type=float,
        default=CHUNK_SECONDS,
        help="seconds of audio per read block, and per codec call for files streamed from disk "
        f"(default {CHUNK_SECONDS:g})",
    )
    t.add_argument(
        "--resume", action="store_true", help="skip the paths that already have a row in OUTPUT_DIR"
    )
    add_precision(t)
    t.set_defaults(func=tokenize)
    return t


def _add_corpus_parsers(sub) -> None:
    """The tokenize / detokenize subcommands (mimi_py.data, on Ray)."""
    t = _add_tokenize_parser(sub)
    d = sub.add_parser(
        "detokenize",
        help="the codes in a tokenize OUTPUT_DIR -> wav files, for listening checks",
        description="Decode the rows of a tokenize OUTPUT_DIR to float32 wav files at the codec's sample "
        "rate in WAV_DIR (error rows are skipped). --weights defaults to the ones recorded in .MANIFEST.json.",
    )
    d.add_argument("output_dir")
    d.add_argument("wav_dir")
    d.add_argument("--limit", type=int, default=None, help="decode only the first N rows")
    d.set_defaults(func=detokenize)
    for q in (t, d):
        q.add_argument(
            "--weights",
            default=None,
            help="hf:REPO_ID[@REVISION][:FILENAME] or a path, as for encode (tokenize default: seeded "
            "random weights; detokenize default: the weights in .MANIFEST.json). On a cluster, hf: "
            "weights are fetched by every node, pinned to the commit the driver resolved",
        )
        q.add_argument(
            "--workers", type=int, default=None, help="codec actors (default: the cluster's CPUs / threads)"
        )
        q.add_argument("--threads-per-worker", type=int, default=1, help="threads (and CPUs) per actor")
        q.add_argument(
            "--address", default=None, help="Ray cluster address (default: RAY_ADDRESS, else local)"
        )
        q.add_argument(
            "--progress-every",
            type=float,
            default=5.0,
            help="seconds between summary lines on stderr (default 5)",
        )


def _add_serve_parser(sub) -> None:
    """The serve subcommand (mimi_py.serve: the WebSocket server and its page)."""
    from . import serve

    s = sub.add_parser(
        "serve",
        help="a real-time WebSocket server: /encode, /decode, /health and a page at / (needs mimi_py[serve])",
        description="Serve Mimi over WebSockets (docs/protocol.md). The first line on stdout is "
        "'listening on ws://HOST:PORT'; SIGINT/SIGTERM shut it down gracefully.",
    )
    serve.add_arguments(s)


def parser(prog: str = "mimi-py") -> argparse.ArgumentParser:
    """The argument parser: one subcommand per job, each naming its function (``func``)."""
    p = argparse.ArgumentParser(prog=prog, description="Mimi codec: audio <-> tokens")
    sub = p.add_subparsers(dest="command", required=True)
    _add_codec_parsers(sub)
    _add_corpus_parsers(sub)
    _add_serve_parser(sub)
    return p


def main(argv: list[str] | None = None, prog: str = "mimi-py") -> int:
    """The ``mimi-py`` (and ``python -m mimi_py``) command; returns the exit code."""
    args = parser(prog).parse_args(argv)
    try:
        args.func(args)
    except (CliError, MimiError, OSError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
