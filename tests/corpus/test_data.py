"""Tokenize a corpus (mimi_py.data, python -m mimi_py tokenize/detokenize) on a local Ray instance.

One Ray instance (num_cpus=2) serves the whole test session; the corpus is generated here and
encoded with the fixtures' small codec. The reference for every file is written out plainly:
soundfile, the mean of the channels, soxr.resample, MimiCodec.encode.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import mimi_py
from support.extras import optional
from support.paths import CODEC_DIR, REPO
from support.reference import assert_close, assert_same

with optional("data"):
    import pyarrow as pa
    import ray
    import soundfile as sf
    import soxr

    import mimi_py.data as data
    from mimi_py.data.common import codes_column
    from mimi_py.data.model import make_model, resolve_weights, same_model
    from mimi_py.data.output import Output
    from mimi_py.data.runtime import ray_stage_args

pytestmark = [
    pytest.mark.extra("data"),
    # Ray 2.60's DataContext warns about its own defaults (use_push_based_shuffle) when created.
    pytest.mark.filterwarnings(r"ignore::DeprecationWarning:ray\."),
]

WEIGHTS = CODEC_DIR / "mimi_small.safetensors"
CONFIG = json.loads((CODEC_DIR / "mimi_small_candle_config.json").read_text())
Q = 4  # the small codec's codebooks

# name: (sample rate, channels, seconds, format)
GOOD = {
    "a/mono16k_short.wav": (16000, 1, 0.05, "PCM_16"),
    "a/stereo16k.wav": (16000, 2, 2.3, "PCM_16"),
    "b/mono24k.flac": (24000, 1, 1.0, "PCM_16"),
    "b/stereo24k.flac": (24000, 2, 4.04, "PCM_24"),
    "b/deep/stereo44k.flac": (44100, 2, 7.7, "PCM_16"),
    "long44k.wav": (44100, 1, 30.0, "FLOAT"),  # streamed from disk when max_inline_seconds < 30
}
# name: what its error says (a regular expression)
BAD = {
    "bad/truncated.wav": "truncated: the header declares",
    "bad/truncated.flac": "truncated|cannot decode",
    "bad/text.wav": "not a readable audio file",
    "bad/empty.wav": "not a readable audio file",
    "bad/zero_frames.wav": "no audio samples",
    "bad/nan.wav": "NaN or Inf samples",
}


def signal_of(seconds: float, sr: int, channels: int, seed: int) -> np.ndarray:
    """A speech-like test signal: low-passed noise plus a sine, RMS ~0.1, (samples, channels)."""
    rng = np.random.default_rng(seed)
    n = int(round(seconds * sr))
    t = np.arange(n) / sr
    out = []
    for c in range(channels):
        w = np.convolve(rng.standard_normal(n + 15), np.ones(16) / 4.0, mode="valid")[:n]
        out.append(0.1 * w + 0.2 * np.sin(2 * np.pi * (110 + 50 * c) * t))
    return np.stack(out, axis=1).astype(np.float32)


def make_corpus(root):
    for i, (name, (sr, ch, sec, subtype)) in enumerate(GOOD.items()):
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        sf.write(p, signal_of(sec, sr, ch, i), sr, subtype=subtype)
    (root / "bad").mkdir()
    for name in ("truncated.wav", "truncated.flac"):
        full = root / "bad" / ("full" + name[-5:] if name.endswith(".flac") else "full.wav")
        sf.write(full, signal_of(2.0, 16000, 2, 9), 16000, subtype="PCM_16")
        raw = full.read_bytes()
        (root / "bad" / name).write_bytes(raw[: len(raw) // 2])
        full.unlink()
    (root / "bad" / "text.wav").write_text("this is a text file, renamed .wav\n" * 20)
    (root / "bad" / "empty.wav").write_bytes(b"")
    sf.write(root / "bad" / "zero_frames.wav", np.zeros((0, 1), np.float32), 16000)
    x = signal_of(1.0, 24000, 1, 10)
    x[5000, 0] = np.nan
    sf.write(root / "bad" / "nan.wav", x, 24000, subtype="FLOAT")
    (root / "notes.txt").write_text("not an audio file name: the folder search skips it\n")
    return root


def reference_audio(path) -> np.ndarray:
    """The file's audio as the issue defines it: mono (mean of the channels), 24 kHz, float32."""
    x, sr = sf.read(str(path), dtype="float32", always_2d=True)
    mono = x[:, 0] if x.shape[1] == 1 else x.mean(axis=1).astype(np.float32)
    return mono if sr == 24000 else soxr.resample(mono, sr, 24000)


def small_codec():
    return mimi_py.MimiCodec(WEIGHTS, config=CONFIG, num_codebooks=Q)


def rows_by_path(output_dir) -> dict:
    t = data.read_codes(output_dir)
    codes = data.codes_to_numpy(t.column("codes"))
    rows = {}
    for row, c in zip(t.to_pylist(), codes):
        assert row["path"] not in rows, f"two rows for {row['path']}"
        rows[row["path"]] = dict(row, codes=c)
    return rows


@pytest.fixture(scope="session")
def ray_address():
    """One local Ray instance for the whole test session; its address, for subprocess drivers."""
    if ray.is_initialized():  # pragma: no cover - someone else's instance
        yield ray.get_runtime_context().gcs_address
        return
    # On the loopback address: the test instance is reachable from this machine only.
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, _node_ip_address="127.0.0.1")
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def tokenized(ray_address, corpus, tmp_path_factory):
    """The corpus tokenized once with 2 workers; files over 20 s are streamed from disk."""
    out = tmp_path_factory.mktemp("codes")
    manifest = data.tokenize(
        corpus,
        out,
        weights=WEIGHTS,
        config=CONFIG,
        num_codebooks=Q,
        workers=2,
        max_inline_seconds=20.0,
        progress_every=None,
    )
    return out, manifest


# ---------------------------------------------------------------- the job


def test_every_good_file_gets_the_codes_of_encode_and_every_bad_file_an_error_row(corpus, tokenized):
    out, manifest = tokenized
    rows = rows_by_path(out)
    expected = {str(corpus / n) for n in list(GOOD) + list(BAD)}
    assert set(rows) == expected  # one row per input file, notes.txt not among them
    assert data.read_codes(out).schema == data.output_schema()
    codec = small_codec()
    for name, (sr, _, sec, _) in GOOD.items():
        row = rows[str(corpus / name)]
        assert row["error"] is None, (name, row["error"])
        ref = codec.encode(reference_audio(corpus / name))[0]
        assert row["codes"].dtype == np.uint16
        assert_same(row["codes"], ref, what=name)
        assert (row["num_frames"], row["num_codebooks"]) == (ref.shape[1], Q)
        assert row["sample_rate"] == sr and row["duration_s"] == pytest.approx(sec, abs=1e-4)
    for name, why in BAD.items():
        row = rows[str(corpus / name)]
        assert row["error"] is not None and re.search(why, row["error"]), (name, row["error"])
        assert row["error"].startswith("InvalidInputError: ")
        assert row["codes"] is None and row["num_frames"] is None and row["num_codebooks"] == Q

    c = manifest["counts"]
    assert (c["inputs"], c["rows"], c["ok"], c["errors"], c["missing"], c["duplicates"]) == (
        12,
        12,
        len(GOOD),
        len(BAD),
        0,
        0,
    )
    assert c["frames"] == sum(r["num_frames"] or 0 for r in rows.values())
    assert manifest["status"] == "complete"
    assert manifest == json.loads((out / data.MANIFEST_NAME).read_text())
    sha = hashlib.sha256(WEIGHTS.read_bytes()).hexdigest()
    assert manifest["weights"]["files"] == {WEIGHTS.name: sha}
    assert manifest["mimi_py"]["version"] == mimi_py.__version__
    assert manifest["config"]["num_codebooks"] == Q and manifest["config"]["workers"] == 2
    assert set(os.listdir(out)) == {data.MANIFEST_NAME} | {os.path.basename(p) for p in Output(out).parts()}


def test_resume_after_a_kill_ends_with_exactly_one_row_per_path(ray_address, corpus, tokenized, tmp_path):
    out = tmp_path / "codes"
    # A driver on the shared Ray instance, killed by SIGKILL right after its second part file.
    script = textwrap.dedent(
        f"""
        import os, signal, ray
        from mimi_py import data
        ray.init(address={ray_address!r})
        def kill(p):
            if p.parts == 2:
                os.kill(os.getpid(), signal.SIGKILL)
        data.tokenize({str(corpus)!r}, {str(out)!r}, weights={str(WEIGHTS)!r}, config={CONFIG!r},
                      num_codebooks={Q}, workers=2, rows_per_file=1, progress_every=None, on_part=kill)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    before = rows_by_path(out)
    assert 2 <= len(before) < 12
    (out / ".part-killed-mid-write.parquet.1234.tmp").write_bytes(b"PAR1 half a file")

    with pytest.raises(FileExistsError, match="resume"):
        data.tokenize(corpus, out, weights=WEIGHTS, config=CONFIG, num_codebooks=Q, progress_every=None)
    manifest = data.tokenize(
        corpus,
        out,
        weights=WEIGHTS,
        config=CONFIG,
        num_codebooks=Q,
        workers=2,
        resume=True,
        progress_every=None,
    )
    after = rows_by_path(out)  # raises on a duplicate path
    assert set(after) == set(rows_by_path(tokenized[0]))
    for path, row in after.items():
        ref = rows_by_path(tokenized[0])[path] if path not in before else before[path]
        assert row["error"] == ref["error"]
        if ref["codes"] is not None:
            assert_same(row["codes"], ref["codes"])
    assert manifest["counts"]["rows"] == 12 and manifest["status"] == "complete"
    first, second = manifest["runs"]
    assert "finished" not in first and second["resumed"] and second["skipped"] == len(before)
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]


def test_resume_refuses_a_different_model(corpus, tokenized):
    out, _ = tokenized
    with pytest.raises(mimi_py.ConfigError, match="another model.*num_codebooks"):
        data.tokenize(
            corpus, out, weights=WEIGHTS, config=CONFIG, num_codebooks=2, resume=True, progress_every=None
        )


def test_detokenize_writes_the_audio_of_decode(corpus, tokenized, tmp_path):
    out, _ = tokenized
    wav_dir = tmp_path / "wav"
    # Weights, config and codebooks come from .MANIFEST.json. Files over 10 s stream through
    # decode_step (float rounding of decode's samples); shorter ones are decode's samples exactly.
    counts = data.detokenize(out, wav_dir, max_inline_seconds=10.0, progress_every=None)
    assert (counts["files"], counts["skipped"], counts["failed"]) == (len(GOOD), len(BAD), 0)
    codec = small_codec()
    rows = rows_by_path(out)
    names = data.wav_names(list(rows))
    assert names[str(corpus / "b/mono24k.flac")] == os.path.join(
        *str(corpus / "b/mono24k.wav").split(os.sep)[1:]
    )
    for path, row in rows.items():
        wav = wav_dir / names[path]
        if row["error"] is not None:
            assert not wav.exists()
            continue
        audio, sr = sf.read(wav, dtype="float32")
        # Trimmed to the source's duration (the last frame's codes cover padding).
        samples = round(row["duration_s"] * 24000)
        expected = codec.decode(row["codes"][None])[0, 0, :samples]
        assert sr == 24000 and audio.shape == expected.shape == (samples,)
        if row["num_frames"] <= 10 * 12.5:
            assert_same(audio, expected, what=path)
        else:
            assert_close(audio, expected, 1e-5, 1e-4, path)
    assert not [p for p in wav_dir.rglob("*") if p.name.endswith(".tmp")]


def test_tokenize_defaults_to_the_checkpoints_own_number_of_codebooks(ray_address, corpus, tmp_path):
    files = [str(corpus / "b/mono24k.flac"), str(corpus / "a/mono16k_short.wav")]
    out = tmp_path / "codes"
    manifest = data.tokenize(files, out, weights=WEIGHTS, config=CONFIG, workers=1, progress_every=None)
    assert manifest["config"]["num_codebooks"] == Q and manifest["status"] == "complete"
    rows = rows_by_path(out)
    codec = small_codec()
    for f in files:
        assert rows[f]["error"] is None and rows[f]["num_codebooks"] == Q
        assert_same(rows[f]["codes"], codec.encode(reference_audio(f))[0])


def test_encoder_actors_get_rayon_num_threads_from_threads_per_worker(ray_address):
    class Probe:
        def __call__(self, batch):
            return {"threads": np.array([os.environ.get("RAYON_NUM_THREADS", "unset")] * len(batch["x"]))}

    ds = ray.data.from_items([{"x": 1}]).map_batches(Probe, **ray_stage_args(1, 2, 2.0))
    assert [r["threads"] for r in ds.take_all()] == ["2"]


# ---------------------------------------------------------------- the command line


def test_command_line_tokenizes_a_manifest_and_decodes_it_back(ray_address, corpus, tmp_path):
    small = tmp_path / "mimi_small"
    small.mkdir()
    shutil.copy(WEIGHTS, small / "model.safetensors")
    shutil.copy(CODEC_DIR / "mimi_small_hf_config.json", small / "config.json")
    manifest = tmp_path / "list.jsonl"
    names = ["a/stereo16k.wav", "b/mono24k.flac", "bad/text.wav", "a/stereo16k.wav"]  # one twice
    lines = [json.dumps({"path": str(corpus / n), "text": "ignored"}) for n in names]
    manifest.write_text("\n".join(lines[:2] + ["", json.dumps(str(corpus / names[2])), lines[3]]) + "\n")

    def run(*args):
        cmd = [sys.executable, "-m", "mimi_py", *map(str, args), "--address", ray_address, "--workers", "1"]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    out = tmp_path / "codes"
    r = run("tokenize", manifest, out, "--weights", small, "--num-codebooks", Q)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "tokenize: 3/3 files (1 errors)" in r.stderr and "3 rows for 3 inputs" in r.stderr
    # A successful run says only its own lines: none of Ray's warnings or error-level notes.
    foreign = [ln for ln in r.stderr.splitlines() if not ln.startswith(("tokenize:", "note:", str(out)))]
    assert not [ln for ln in foreign if re.search(r"WARNING| E |ERROR|Warning", ln)], r.stderr[-3000:]
    rows = rows_by_path(out)
    assert set(rows) == {str(corpus / n) for n in names}
    ref = small_codec().encode(reference_audio(corpus / names[0]))[0]
    assert_same(rows[str(corpus / names[0])]["codes"], ref)

    r = run("tokenize", manifest, out, "--weights", small, "--num-codebooks", Q)
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "--resume" in r.stderr

    r = run("detokenize", out, tmp_path / "wav", "--limit", 2)
    assert r.returncode == 0, r.stderr[-3000:]
    m = re.search(r"detokenize: (\d+) files \((\d+) error rows skipped\)", r.stderr)
    assert m and int(m[1]) + int(m[2]) == 2, r.stderr[-3000:]
    assert len(list((tmp_path / "wav").rglob("*.wav"))) == int(m[1])


# ---------------------------------------------------------------- the pieces, without Ray


def test_find_audio_reads_folders_globs_and_manifests(corpus, tmp_path):
    in_folder = data.find_audio(corpus)
    assert [p for p, _ in in_folder] == sorted(str(corpus / n) for n in list(GOOD) + list(BAD))
    flacs = data.find_audio(str(corpus / "**" / "*.flac"))
    assert {os.path.basename(p) for p, _ in flacs} == {
        "mono24k.flac",
        "stereo24k.flac",
        "stereo44k.flac",
        "truncated.flac",
    }
    txt = corpus / "list.txt"
    txt.write_text("# relative to the manifest's folder\nb/mono24k.flac\n\nlong44k.wav\nb/mono24k.flac\n")
    assert data.find_audio(txt) == [
        ("b/mono24k.flac", str(corpus / "b/mono24k.flac")),
        ("long44k.wav", str(corpus / "long44k.wav")),
    ]
    txt.unlink()
    with pytest.raises(FileNotFoundError, match="no such folder"):
        data.find_audio(tmp_path / "missing")
    (tmp_path / "bad.jsonl").write_text('{"file": "x.wav"}\n')
    with pytest.raises(mimi_py.InvalidInputError, match="bad.jsonl:1"):
        data.find_audio(tmp_path / "bad.jsonl")


def test_audio_reader_streams_the_resampled_audio_and_names_what_is_wrong(corpus):
    for name in GOOD:
        with data.AudioReader(corpus / name, block_seconds=0.7) as r:
            blocks = list(r)
        assert len(blocks) > 1 or GOOD[name][2] < 0.7
        assert_same(np.concatenate(blocks), reference_audio(corpus / name), what=name)
    for name, why in BAD.items():
        with pytest.raises(mimi_py.InvalidInputError, match=why):
            with data.AudioReader(corpus / name) as r:
                r.read()
    with pytest.raises(FileNotFoundError):
        data.AudioReader(corpus / "missing.wav")


def test_the_encoder_alone_reads_files_and_streams_them_exactly(corpus):
    enc = data.MimiEncoder(WEIGHTS, config=CONFIG, num_codebooks=Q, batch_seconds=3.0)
    codec = small_codec()
    # Without the decoding stage (no audio column) it reads each file itself, streaming.
    names = ["b/stereo24k.flac", "bad/nan.wav", "long44k.wav"]
    out = enc(pa.table({"path": [str(corpus / n) for n in names]}))
    codes = data.codes_to_numpy(out.column("codes"))
    assert out.column("error").to_pylist()[0] is None and "NaN" in out.column("error").to_pylist()[1]
    assert_same(codes[2], codec.encode(reference_audio(corpus / "long44k.wav"))[0])
    # Streaming ends with encode_step(last=True): even a partial last frame is encode's.
    x = reference_audio(corpus / "b/stereo24k.flac")
    assert len(x) % 1920
    streamed = enc.encode_blocks([x[:50000], x[50000:]])
    offline = codec.encode(x)[0]
    assert streamed.shape == offline.shape == (Q, -(-len(x) // 1920))
    assert_same(streamed, offline)
    assert_same(codes[0], offline)


def test_codes_round_trip_through_arrow():
    arrays = [np.arange(12, dtype=np.uint16).reshape(4, 3), None, np.full((4, 1), 2047, np.uint16)]
    col = codes_column(arrays)
    assert col.type == data.output_schema().field("codes").type and col.null_count == 1
    back = data.codes_to_numpy(col)
    assert_same(back[0], arrays[0])
    assert back[1] is None
    assert_same(back[2], arrays[2])
    assert data.wav_name("/data/x/a.flac") == os.path.join("data", "x", "a.wav")
    assert data.wav_name("/data/x/a.flac", keep_extension=True) == os.path.join("data", "x", "a.flac.wav")
    assert data.wav_name("../up/b.wav") == os.path.join("__", "up", "b.wav")
    names = data.wav_names(["/d/a.wav", "/d/a.flac", "/d/b.flac", "/e/a.flac"])
    assert names == {
        "/d/a.wav": os.path.join("d", "a.wav"),
        "/d/a.flac": os.path.join("d", "a.flac.wav"),
        "/d/b.flac": os.path.join("d", "b.wav"),
        "/e/a.flac": os.path.join("e", "a.wav"),
    }


@pytest.mark.extra("hub")
def test_hf_weights_are_pinned_to_the_commit_and_identified_by_sha256(tmp_path, monkeypatch):
    import huggingface_hub as hf
    import huggingface_hub.constants  # noqa: F401  (hf.constants below)

    from support.hub_cache import make_hf_cache

    commit = "c" * 40
    files = {"model.safetensors": WEIGHTS, "config.json": CODEC_DIR / "mimi_small_hf_config.json"}
    make_hf_cache(tmp_path, "kyutai/mimi", {commit: files})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hf.constants, "HF_HUB_CACHE", str(tmp_path))
    model, ident = resolve_weights(make_model("hf:kyutai/mimi", None, Q, 0))
    assert model.weights == ident["spec"] == f"hf:kyutai/mimi@{commit}"
    assert (ident["repo_id"], ident["revision"], ident["commit"]) == ("kyutai/mimi", None, commit)
    assert ident["files"] == {n: hashlib.sha256(p.read_bytes()).hexdigest() for n, p in files.items()}
    assert model.load().num_codebooks == Q  # every actor loads the pinned spec
    # Local files with the same bytes are the same model; a seed is not.
    local = resolve_weights(make_model(WEIGHTS, CONFIG, Q, 0))[1]
    config = {"num_codebooks": Q, "codec": small_codec().config.to_dict()}
    assert same_model({"weights": ident, "config": config}, {"weights": local, "config": config}) is None
    seeded = resolve_weights(make_model(None, None, Q, 0))[1]
    assert "seeded" in same_model({"weights": ident, "config": config}, {"weights": seeded, "config": config})
    # The precision is part of the model (a manifest without it: its weights_dtype's, bfloat16
    # being "high"; without either, "highest").
    bf16 = dict(config, weights_dtype="bfloat16")
    medium = dict(config, weights_dtype="bfloat16", precision="medium")
    old, new = {"weights": ident, "config": config}, {"weights": local, "config": medium}
    assert same_model(old, new) == "precision 'highest' then 'medium'"
    old = {"weights": ident, "config": bf16}
    assert same_model(old, new) == "precision 'high' then 'medium'"
    assert same_model(old, dict(new, config=dict(bf16, precision="high"))) is None
    assert make_model(WEIGHTS, CONFIG, Q, 0, "bfloat16").load().weights_dtype == "bfloat16"
    assert make_model(WEIGHTS, CONFIG, Q, 0, precision="medium").load().precision == "medium"
    # neither given: the driver's default, pinned for the actors
    try:
        mimi_py.set_float32_matmul_precision("medium")
        assert make_model(WEIGHTS, CONFIG, Q, 0).precision == "medium"
    finally:
        mimi_py.set_float32_matmul_precision("highest")


# ---------------------------------------------------------------- the output in every reader


def _reference_rows(out) -> dict:
    """path -> (num_frames, codes as nested lists), read through mimi_py."""
    rows = rows_by_path(out)
    return {
        p: (r["num_frames"], None if r["codes"] is None else r["codes"].tolist()) for p, r in rows.items()
    }


def _as_nested(codes) -> list | None:
    if codes is None:
        return None
    return [[int(v) for v in row] for row in codes]


def _check_rows(paths, frames, codes, reference) -> None:
    got = {
        p: (None if f is None or f != f else int(f), _as_nested(c)) for p, f, c in zip(paths, frames, codes)
    }
    assert got == reference


@pytest.mark.extra("test", modules=["pandas"])
def test_pandas_reads_the_output_folder(tokenized):
    import pandas as pd

    out, _ = tokenized
    df = pd.read_parquet(out)
    assert list(df.columns) == [f.name for f in data.output_schema()]
    frames = [None if pd.isna(f) else f for f in df["num_frames"]]
    _check_rows(df["path"], frames, df["codes"], _reference_rows(out))


def test_pyarrow_reads_the_output_folder_as_a_table_and_as_a_dataset(tokenized):
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    out, _ = tokenized
    reference = _reference_rows(out)
    for table in (pq.read_table(out), ds.dataset(out, format="parquet").to_table()):
        assert table.schema.equals(data.output_schema(), check_metadata=False)
        cols = table.to_pydict()
        _check_rows(cols["path"], cols["num_frames"], cols["codes"], reference)


@pytest.mark.extra("test", modules=["polars"])
def test_polars_reads_the_part_files_by_their_glob(tokenized):
    import polars as pl

    out, _ = tokenized
    df = pl.read_parquet(f"{out}/*.parquet")
    _check_rows(df["path"].to_list(), df["num_frames"].to_list(), df["codes"].to_list(), _reference_rows(out))


@pytest.mark.extra("test", modules=["duckdb"])
def test_duckdb_queries_the_part_files(tokenized):
    import duckdb

    out, _ = tokenized
    rows = duckdb.sql(f"SELECT path, num_frames, codes FROM read_parquet('{out}/*.parquet')").fetchall()
    paths, frames, codes = zip(*rows)
    _check_rows(paths, frames, codes, _reference_rows(out))
    [(n_ok,)] = duckdb.sql(
        f"SELECT count(*) FROM read_parquet('{out}/*.parquet') WHERE error IS NULL"
    ).fetchall()
    assert n_ok == len(GOOD)


@pytest.mark.extra("test", modules=["datasets"])
def test_hf_datasets_loads_the_output_folder_offline(tokenized, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import datasets

    out, _ = tokenized
    ds = datasets.load_dataset("parquet", data_dir=str(out), split="train", cache_dir=str(tmp_path / "cache"))
    assert ds.column_names == [f.name for f in data.output_schema()]
    _check_rows(ds["path"], ds["num_frames"], ds["codes"], _reference_rows(out))


def test_an_old_manifest_name_is_read_to_resume_and_replaced(ray_address, corpus, tmp_path):
    files = [str(corpus / n) for n in list(GOOD)[:4]]
    out = tmp_path / "codes"
    kw = dict(weights=WEIGHTS, config=CONFIG, num_codebooks=Q, workers=1, progress_every=None)
    data.tokenize(files[:2], out, **kw)
    (out / data.MANIFEST_NAME).rename(out / "MANIFEST.json")
    manifest = data.tokenize(files, out, resume=True, **kw)
    assert len(manifest["runs"]) == 2 and manifest["counts"]["rows"] == 4
    assert not (out / "MANIFEST.json").exists() and (out / data.MANIFEST_NAME).exists()


def test_short_clips_are_batched_and_each_gets_its_codes_alone():
    enc = data.MimiEncoder(WEIGHTS, config=CONFIG, num_codebooks=Q, batch_seconds=1.0)
    rng = np.random.default_rng(5)
    clips = [signal_of(s, 24000, 1, i)[:, 0] for i, s in enumerate(rng.uniform(0.01, 0.6, 9))]
    clips.append(signal_of(1.7, 24000, 1, 99)[:, 0])  # longer than a batch: a group of its own
    codec = small_codec()
    for clip, codes in zip(clips, enc.encode_many(clips)):
        assert_same(codes, codec.encode(clip)[0])
        assert codes.dtype == np.uint16


@pytest.mark.extra("test", modules=["datasets"])
def test_the_corpus_page_recipe_adds_a_codes_column_to_an_hf_audio_dataset(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    import datasets

    page = (REPO / "docs" / "corpus.md").read_text()
    start = page.index("**A Hugging Face `datasets` audio dataset into a codes column.**")
    block = page[page.index("```python\n", start) + len("```python\n") : page.index("```\n", start + 1)]
    # The recipe's model: the fixtures' small codec instead of the hub's (no network).
    block = block.replace(
        'mimi_py.MimiCodec.from_pretrained("kyutai/mimi", num_codebooks=8)', "small_codec()"
    )
    names = ["a/stereo16k.wav", "b/mono24k.flac", "b/deep/stereo44k.flac"]
    ds = datasets.Dataset.from_dict({"audio": [str(corpus / n) for n in names]})
    ds = ds.cast_column("audio", datasets.Audio(decode=False))
    scope = {"mimi_py": mimi_py, "ds": ds, "small_codec": small_codec}
    exec(compile(block, "docs/corpus.md", "exec"), scope)
    out = scope["ds"]
    codec = small_codec()
    for name, codes in zip(names, out["codes"]):
        assert_same(np.array(codes), codec.encode(reference_audio(corpus / name))[0])
