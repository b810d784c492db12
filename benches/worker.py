"""One measurement in its own process (run by run.py; not meant to be called by hand).

    python benches/worker.py '<json spec>'

The thread count is fixed by the environment run.py sets before this process starts
(RAYON_NUM_THREADS, OMP_NUM_THREADS, ...), because candle's and rustymimi's thread pools read
it once. The result is printed as one line `@@RESULT {json}` on stdout.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402

import common  # noqa: E402
import efficiency  # noqa: E402
import precisions  # noqa: E402
import serving  # noqa: E402

RESULT_MARK = "@@RESULT "


class Timer:
    """Wall and process CPU time of a block (CPU / wall = cores actually busy)."""

    def __enter__(self):
        self.t0 = time.perf_counter()
        self.c0 = time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t0
        self.cpu = time.process_time() - self.c0


# ---------------------------------------------------------------------------------------------
# engines: a common face for every codec implementation


class Engine:
    name = "?"
    masks = False  # whether encode_step/decode_step take an active= row mask

    def version(self) -> str | None:
        return None

    def encode(self, pcm: np.ndarray) -> np.ndarray: ...
    def decode(self, codes: np.ndarray) -> np.ndarray: ...
    def encode_step(self, chunk: np.ndarray): ...
    def decode_step(self, codes: np.ndarray): ...
    def reset(self, batch: int = 1) -> None:
        """Fresh encoder and decoder streams (of `batch` rows where the engine needs it told)."""

    def sync(self) -> None:
        """Wait for the device (torch on CUDA); the numpy-returning engines are synchronous."""

    def describe(self) -> dict:
        """How this engine computes, for its results: mimi_py's precision, moshi's torch mode."""
        return {}


class MimiPyEngine(Engine):
    name = "mimi_py"

    def __init__(self, spec):
        import mimi_py

        self.m = mimi_py
        config = None
        if spec.get("hf_config"):
            config = mimi_py.CodecConfig.from_hf(json.loads(Path(spec["hf_config"]).read_text()))
        weights = spec.get("weights") if not spec.get("seeded") else None
        self.codec = mimi_py.MimiCodec(
            weights,
            config=config,
            num_codebooks=spec["num_codebooks"],
            device=spec.get("device", "cpu"),
            dtype=spec.get("dtype", "float32"),
            precision=spec.get("precision"),
            weights_dtype=spec.get("weights_dtype"),
        )

    def version(self):
        return f"{self.m.__version__} (candle {self.m.candle_version})"

    def describe(self):
        c = self.codec
        return {"precision": c.precision, "kernel_isa": getattr(c, "kernel_isa", None)}

    def encode(self, pcm):
        return self.codec.encode(pcm)

    def decode(self, codes):
        return self.codec.decode(codes)

    masks = True  # encode_step/decode_step take active= (per-row streams)

    def encode_step(self, chunk, active=None):
        return self.codec.encode_step(chunk, active=active)

    def decode_step(self, codes, active=None):
        return self.codec.decode_step(codes, active=active)

    def reset(self, batch=1):
        self.codec.reset_state()


class RustyMimiEngine(Engine):
    name = "rustymimi"

    def __init__(self, spec):
        if spec.get("hf_config"):
            raise RuntimeError("rustymimi only builds the real Mimi architecture")
        import rustymimi

        self.r = rustymimi
        self.tok = rustymimi.Tokenizer(spec["weights"], num_codebooks=spec["num_codebooks"])

    def version(self):
        try:
            from importlib.metadata import version

            return version("rustymimi")
        except Exception:
            return None

    def encode(self, pcm):
        return self.tok.encode(np.ascontiguousarray(pcm, dtype=np.float32))

    def decode(self, codes):
        return self.tok.decode(np.ascontiguousarray(codes, dtype=np.uint32))

    def encode_step(self, chunk):
        return self.tok.encode_step(np.ascontiguousarray(chunk, dtype=np.float32))

    def decode_step(self, codes):
        return self.tok.decode_step(np.ascontiguousarray(codes, dtype=np.uint32))

    def reset(self, batch=1):
        self.tok.reset()


class MoshiEngine(Engine):
    """moshi's PyTorch MimiModel, loaded from the same moshi-format file.

    Streaming: moshi keeps its streaming state in the modules, and only while the model is in
    streaming mode (`MimiModel.streaming(batch_size)`, an ExitStack). `reset` enters that mode
    (or resets the state if it is already in it); `encode`/`decode` outside streaming mode are
    the offline calls. spec may give "device" ("cpu", "cuda", ...) and "dtype" ("float32",
    "bfloat16", "float16"), for benches/gpu.py, and "torch_mode" ("float32": torch's defaults;
    "bf16": oneDNN's float32 products in bfloat16, set before the model loads, see
    benches/precisions.py)."""

    name = "moshi"

    def __init__(self, spec):
        if spec.get("hf_config"):
            raise RuntimeError("this bench builds moshi's Mimi only with the real architecture")
        import torch
        from moshi.models import loaders

        self.torch = torch
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        torch.set_grad_enabled(False)
        self.torch_precision = precisions.torch_switch(torch, spec.get("torch_mode", "float32"))
        self.device = torch.device(spec.get("device", "cpu"))
        self.dtype = getattr(torch, spec.get("dtype", "float32"))
        self.model = loaders.get_mimi(spec["weights"], device=self.device)
        self.model.set_num_codebooks(spec["num_codebooks"])
        self.model.eval()
        if self.dtype != torch.float32:
            self.model.to(dtype=self.dtype)
        self._stream = None  # the ExitStack of moshi's streaming mode, while in it
        self._stream_batch = 0

    def version(self):
        from importlib.metadata import version

        return f"moshi {version('moshi')}, torch {self.torch.__version__}"

    def describe(self):
        return {"torch_mode": self.torch_precision["mode"], "torch_precision": self.torch_precision}

    def _audio_in(self, pcm):
        return self.torch.from_numpy(np.ascontiguousarray(pcm, dtype=np.float32)).to(self.device, self.dtype)

    def _codes_in(self, codes):
        return self.torch.from_numpy(np.asarray(codes).astype(np.int64)).to(self.device)

    def sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def encode(self, pcm):
        self._offline()
        return self.model.encode(self._audio_in(pcm)).cpu().numpy()

    def decode(self, codes):
        self._offline()
        return self.model.decode(self._codes_in(codes)).float().cpu().numpy()

    def _offline(self):
        if self._stream is not None:
            self._stream.close()  # leaves streaming mode (moshi drops the state)
            self._stream = None

    def reset(self, batch=1):
        """Fresh streams for `batch` rows: enter streaming mode, or reset its state."""
        if self._stream is not None and self._stream_batch == batch:
            self.model.reset_streaming()
            return
        self._offline()
        self._stream = self.model.streaming(batch)
        self._stream_batch = batch

    def encode_step(self, chunk):
        if self._stream is None:
            self.reset(np.shape(chunk)[0])
        c = self.model.encode(self._audio_in(chunk))
        return c.cpu().numpy() if c.shape[-1] else None

    def decode_step(self, codes):
        if self._stream is None:
            self.reset(np.shape(codes)[0])
        return self.model.decode(self._codes_in(codes)).float().cpu().numpy()


class TransformersEngine(Engine):
    """transformers' MimiModel with its own random init of the real architecture (offline only)."""

    name = "transformers"

    def __init__(self, spec):
        if spec.get("hf_config"):
            raise RuntimeError("this bench builds transformers' Mimi only with the real architecture")
        import torch
        from transformers import MimiConfig, MimiModel

        self.torch = torch
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        torch.set_grad_enabled(False)
        torch.manual_seed(0)
        self.nq = spec["num_codebooks"]
        self.model = MimiModel(MimiConfig()).eval()

    def version(self):
        import transformers

        return f"transformers {transformers.__version__}, torch {self.torch.__version__}"

    def encode(self, pcm):
        out = self.model.encode(self.torch.from_numpy(np.ascontiguousarray(pcm)), num_quantizers=self.nq)
        return out.audio_codes.numpy()

    def decode(self, codes):
        return self.model.decode(self.torch.from_numpy(codes.astype(np.int64))).audio_values.numpy()

    def encode_step(self, chunk):
        raise NotImplementedError("streaming is not measured for transformers' MimiModel")

    decode_step = encode_step


ENGINES = {
    "mimi_py": MimiPyEngine,
    "rustymimi": RustyMimiEngine,
    "moshi": MoshiEngine,
    "transformers": TransformersEngine,
}


def make_engine(spec):
    base = spec["engine"].split("+")[0]
    with Timer() as t:
        eng = ENGINES[base](spec)
    return eng, t.wall


def mem_info():
    return {
        "rss_now_bytes": common.rss_now_bytes(),
        "rss_peak_bytes": common.rss_peak_bytes(),
        "minor_faults": common.minor_faults(),
    }


# ---------------------------------------------------------------------------------------------
# tasks


def task_transformer(spec):
    import mimi_py

    if spec["tiny"]:
        cfg = mimi_py.TransformerConfig(d_model=64, num_heads=4, num_layers=2, context=16)
    else:
        cfg = mimi_py.TransformerConfig.mimi()
    t = mimi_py.StreamingTransformer(cfg, seed=0)
    steps, warm, chunk_len = spec["steps"], spec["warmup"], spec["chunk"]
    rng = np.random.default_rng(1)
    xs = rng.uniform(-1, 1, size=(1, steps + warm, cfg.d_model)).astype(np.float32)
    times = []
    with Timer() as tt:
        for i in range(steps + warm):
            x = xs[:, i : i + 1]
            t0 = time.perf_counter()
            t.step(x)
            dt = time.perf_counter() - t0
            if i >= warm:
                times.append(dt)
    chunk = rng.uniform(-1, 1, size=(1, chunk_len, cfg.d_model)).astype(np.float32)
    chunk_times = []
    for _ in range(spec["chunk_repeats"]):
        t.reset_state()
        t0 = time.perf_counter()
        t.forward(chunk)
        chunk_times.append(time.perf_counter() - t0)
    s = common.summary_us(times)
    return {
        "engine": "mimi_py",
        "config": cfg.to_dict(),
        "batch": 1,
        "steps": steps,
        "warmup": warm,
        "step_median_us": s["median_us"],
        "step_p99_us": s["p99_us"],
        "step_stats": s,
        "chunk_len": chunk_len,
        "chunk_us": round(common.median(chunk_times) * 1e6, 1),
        "chunk_first_us": round(chunk_times[0] * 1e6, 1),
        "chunk_all_us": [round(c * 1e6, 1) for c in chunk_times],
        "steps_cpu_per_wall": round(tt.cpu / tt.wall, 2),
        **mem_info(),
    }


def saved_stem(spec) -> str:
    """The file name stem of an offline run's saved codes and audio: its label and threads."""
    import re

    return re.sub(r"[^\w+.-]+", "_", spec.get("label") or spec["engine"]) + f"-t{spec['threads']}"


def task_codec_offline(spec):
    eng, load_s = make_engine(spec)
    sr = common.SAMPLE_RATE
    n = int(round(spec["seconds"] * sr))
    pcm = common.smooth_noise(n, seed=0)[None, None]
    warm = common.smooth_noise(int(round(spec["warmup_seconds"] * sr)), seed=1)[None, None]
    eng.decode(eng.encode(warm))  # warm-up: thread pools, allocator, lazy init
    enc, dec, enc_cpu, dec_cpu = [], [], [], []
    codes = audio = None
    for _ in range(spec["repeats"]):
        with Timer() as te:
            codes = eng.encode(pcm)
        with Timer() as td:
            audio = eng.decode(codes)
        enc.append(te.wall)
        dec.append(td.wall)
        enc_cpu.append(te.cpu)
        dec_cpu.append(td.cpu)
    audio_s = n / sr
    enc_m, dec_m = common.median(enc), common.median(dec)
    if spec.get("save_dir"):
        stem = Path(spec["save_dir"]) / saved_stem(spec)
        np.save(f"{stem}-codes.npy", np.asarray(codes))
        np.save(f"{stem}-audio.npy", np.asarray(audio))
    return {
        "engine": spec["engine"],
        "version": eng.version(),
        **eng.describe(),
        "audio_seconds": audio_s,
        "load_s": round(load_s, 3),
        "repeats": spec["repeats"],
        "encode_s": round(enc_m, 4),
        "decode_s": round(dec_m, 4),
        "encode_all_s": [round(x, 4) for x in enc],
        "decode_all_s": [round(x, 4) for x in dec],
        "encode_rtf": round(audio_s / enc_m, 3),
        "decode_rtf": round(audio_s / dec_m, 3),
        "encode_cpu_per_wall": round(sum(enc_cpu) / sum(enc), 2),
        "decode_cpu_per_wall": round(sum(dec_cpu) / sum(dec), 2),
        "codes_shape": list(np.shape(codes)),
        "audio_shape": list(np.shape(audio)),
        **mem_info(),
    }


def task_codec_aggregate(spec):
    """One of the aggregate suite's processes: load, warm up, wait at the barrier, then encode
    spec["clips"] clips of spec["seconds"] back to back. The start and end times are
    time.monotonic() (one clock for every process of the machine), so run.py can take the span
    from the first start to the last end."""
    eng, load_s = make_engine(spec)
    sr = common.SAMPLE_RATE
    n = int(round(spec["seconds"] * sr))
    pcm = common.smooth_noise(n, seed=0)[None, None]
    warm = common.smooth_noise(int(round(spec["warmup_seconds"] * sr)), seed=1)[None, None]
    eng.encode(warm)  # warm-up: thread pools, allocator, lazy init
    barrier = Path(spec["barrier_dir"])
    (barrier / f"ready-{spec['index']}").touch()
    deadline = time.monotonic() + spec.get("barrier_timeout", 600.0)
    while not (barrier / "go").exists():  # run.py creates it once every process is ready
        if time.monotonic() > deadline:
            raise TimeoutError("the other processes never got ready")
        time.sleep(0.002)
    times, codes = [], None
    with Timer() as tt:
        start = time.monotonic()
        for _ in range(spec["clips"]):
            t0 = time.perf_counter()
            codes = eng.encode(pcm)
            times.append(time.perf_counter() - t0)
        end = time.monotonic()
    audio_s = spec["clips"] * n / sr
    return {
        "engine": spec["engine"],
        "version": eng.version(),
        "index": spec["index"],
        "load_s": round(load_s, 3),
        "clips": spec["clips"],
        "clip_seconds": n / sr,
        "audio_s": audio_s,
        "start_monotonic": start,
        "end_monotonic": end,
        "wall_s": round(tt.wall, 4),
        "clip_all_s": [round(x, 4) for x in times],
        "rtf": round(audio_s / tt.wall, 3),
        "cpu_per_wall": round(tt.cpu / tt.wall, 2),
        "codes_shape": list(np.shape(codes)),
        **mem_info(),
    }


def task_codec_streaming(spec):
    eng, load_s = make_engine(spec)
    fs = common.FRAME_SIZE
    warm, frames = spec["warmup"], spec["frames"]
    pcm = common.smooth_noise((warm + frames) * fs, seed=2)[None, None]
    eng.reset()
    enc, dec, tot = [], [], []
    missing = 0
    switches0 = None
    with Timer() as tt:
        for i in range(warm + frames):
            if i == warm:
                switches0 = common.context_switches()
            chunk = pcm[:, :, i * fs : (i + 1) * fs]
            t0 = time.perf_counter()
            codes = eng.encode_step(chunk)
            t1 = time.perf_counter()
            if codes is not None and np.shape(codes)[-1] > 0:
                eng.decode_step(codes)
            else:
                missing += 1
            t2 = time.perf_counter()
            if i >= warm:
                enc.append(t1 - t0)
                dec.append(t2 - t1)
                tot.append(t2 - t0)
    switches1 = common.context_switches()
    per_frame = None
    if switches0 is not None and switches1 is not None:
        per_frame = {k: round((switches1[k] - switches0[k]) / frames, 1) for k in switches0}
    return {
        "engine": spec["engine"],
        "version": eng.version(),
        **eng.describe(),
        "frame_size": fs,
        "frames": frames,
        "warmup": warm,
        "load_s": round(load_s, 3),
        "frames_without_codes": missing,
        "encode_step": common.summary_us(enc),
        "decode_step": common.summary_us(dec),
        "frame_total": common.summary_us(tot),
        "context_switches_per_frame": per_frame,
        "cpu_per_wall": round(tt.cpu / tt.wall, 2),
        **mem_info(),
    }


def task_codec_rss(spec):
    base = mem_info()
    eng, load_s = make_engine(spec)
    after_load = mem_info()
    n = int(round(spec["seconds"] * common.SAMPLE_RATE))
    pcm = common.smooth_noise(n, seed=0)[None, None]
    codes = eng.encode(pcm)
    eng.decode(codes)
    peak = mem_info()
    ru = None
    try:
        import resource

        ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except Exception:
        pass
    return {
        "engine": spec["engine"],
        "version": eng.version(),
        "audio_seconds": n / common.SAMPLE_RATE,
        "weights": "seeded (no file)" if spec.get("seeded") else spec.get("weights"),
        "load_s": round(load_s, 3),
        "rss_after_import_bytes": base["rss_now_bytes"],
        "rss_after_load_bytes": after_load["rss_now_bytes"],
        "peak_rss_bytes": peak["rss_peak_bytes"],
        "ru_maxrss_bytes": ru,
        "minor_faults": peak["minor_faults"],
    }


def _corpus_config(spec):
    import mimi_py

    if spec.get("hf_config"):
        return mimi_py.CodecConfig.from_hf(json.loads(Path(spec["hf_config"]).read_text()))
    return None


def task_corpus_loop(spec):
    """The baseline: one process, a plain loop (soundfile, mean of the channels, soxr,
    MimiCodec.encode) over the corpus files; the codes go to spec["codes_out"] (npz)."""
    import soundfile as sf
    import soxr

    import mimi_py

    with Timer() as tl:
        codec = mimi_py.MimiCodec(
            spec["weights"], config=_corpus_config(spec), num_codebooks=spec["num_codebooks"]
        )
    codes, audio_s = {}, 0.0
    with Timer() as tw:
        for i, path in enumerate(spec["files"]):
            x, sr = sf.read(path, dtype="float32", always_2d=True)
            audio_s += len(x) / sr
            mono = x[:, 0] if x.shape[1] == 1 else x.mean(axis=1).astype(np.float32)
            if sr != codec.sample_rate:
                mono = soxr.resample(mono, sr, codec.sample_rate)
            codes[str(i)] = codec.encode(mono)[0].astype(np.uint16)
    np.savez(spec["codes_out"], **codes)
    return {
        "engine": "loop",
        "workers": 1,
        "files": len(spec["files"]),
        "audio_s": round(audio_s, 3),
        "load_s": round(tl.wall, 3),
        "work_s": round(tw.wall, 3),
        "wall_s": round(tl.wall + tw.wall, 3),
        "cpu_per_wall": round(tw.cpu / tw.wall, 2),
        **mem_info(),
    }


def task_corpus_tokenize(spec):
    """mimi_py.data.tokenize on a fresh local Ray instance (spec["ray_cpus"] CPUs) with
    spec["workers"] actors of one thread; one row per part file, to time the first row."""
    import logging

    import ray

    from mimi_py import data

    with Timer() as ti:
        ray.init(num_cpus=spec["ray_cpus"], include_dashboard=False, logging_level=logging.WARNING)
    ray.data.DataContext.get_current().enable_progress_bars = False
    parts = []
    try:
        with Timer() as tw:
            m = data.tokenize(
                spec["corpus"],
                spec["out"],
                weights=spec["weights"],
                config=_corpus_config(spec),
                num_codebooks=spec["num_codebooks"],
                workers=spec["workers"],
                threads_per_worker=1,
                rows_per_file=1,
                progress_every=None,
                on_part=lambda p: parts.append(p.wall_seconds),
            )
    finally:
        ray.shutdown()
    c = m["counts"]
    return {
        "engine": "tokenize",
        "workers": spec["workers"],
        "files": c["rows"],
        "errors": c["errors"],
        "audio_s": round(c["audio_hours"] * 3600, 3),
        "ray_init_s": round(ti.wall, 3),
        "wall_s": round(tw.wall, 3),
        "first_row_s": round(parts[0], 3) if parts else None,
        "driver_cpu_s": round(tw.cpu, 3),
    }


TASKS = {
    "transformer": task_transformer,
    "codec_offline": task_codec_offline,
    "codec_streaming": task_codec_streaming,
    "codec_aggregate": task_codec_aggregate,
    "codec_rss": task_codec_rss,
    "corpus_loop": task_corpus_loop,
    "corpus_tokenize": task_corpus_tokenize,
    "serving": lambda spec: serving.task_serving(spec, make_engine),
    "efficiency": lambda spec: efficiency.task_efficiency(spec, make_engine),
}


def main(argv):
    spec = json.loads(argv[1])
    try:
        out = TASKS[spec["task"]](spec)
        out["ok"] = True
    except ImportError as e:
        out = {"ok": False, "not_installed": True, "error": f"{type(e).__name__}: {e}"}
    except Exception as e:
        out = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    out["threads_env"] = {k: os.environ.get(k) for k in ("RAYON_NUM_THREADS", "OMP_NUM_THREADS")}
    out["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    core = sys.modules.get("mimi_py._core")
    if core is not None and getattr(core, "__file__", None):
        # which build of the extension this process ran (it may be rebuilt during a long run)
        out["mimi_py_core_mtime"] = time.strftime(
            "%Y-%m-%dT%H:%M:%S", time.localtime(os.path.getmtime(core.__file__))
        )
    sys.stdout.write(RESULT_MARK + json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
