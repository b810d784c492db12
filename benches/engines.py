"""The engines a suite measures, behind one face (encode, decode, encode_step, decode_step,
reset, sync, describe): mimi_py and its peers, rustymimi (Kyutai's candle Mimi), moshi's
PyTorch Mimi and transformers' MimiModel. Loaded only in a worker process (benches/worker.py),
after the runner has set its thread counts, because candle's and torch's pools read them once.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np


def torch_switch(torch, mode: str) -> dict:
    """Sets torch's float32 products for `mode` in this process, before the model loads:
    "float32" (torch's defaults) or "bf16", torch's own bf16 mode, which computes as "medium"
    does (oneDNN's products in bfloat16: torch >= 2.9's per-backend switch, else the matmul
    one); returns what it set and the CPU's capability as torch sees it."""
    done = "defaults"
    if mode == "bf16":
        mk = torch.backends.mkldnn
        if hasattr(getattr(mk, "matmul", None), "fp32_precision"):
            mk.matmul.fp32_precision = mk.conv.fp32_precision = "bf16"
            done = "torch.backends.mkldnn.{matmul,conv}.fp32_precision = 'bf16'"
        else:
            torch.set_float32_matmul_precision("medium")
            done = "torch.set_float32_matmul_precision('medium')"
    cpu = getattr(torch.backends, "cpu", None)
    isa = cpu.get_cpu_capability() if cpu and hasattr(cpu, "get_cpu_capability") else None
    return {"mode": mode, "set": done, "cpu_capability": isa}


def version_of(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


class Engine:
    """The common face; `masks`: whether the steps take an `active=` row mask."""

    name, masks = "?", False

    def version(self) -> str | None:
        return version_of(self.name)

    def reset(self, batch: int = 1) -> None:
        """Fresh encoder and decoder streams (of `batch` rows where the engine must be told)."""

    def sync(self) -> None:
        """Waits for the device (torch on CUDA); the numpy-returning engines are synchronous."""

    def describe(self) -> dict:
        """How it computes, for its rows: mimi_py's precision, moshi's torch mode."""
        return {}

    def free(self) -> None:
        """After a failure or before a larger batch: moshi leaves its streaming mode (dropping
        its state and CUDA graphs), torch gives its cached device memory back."""
        getattr(self, "_offline", lambda: None)()
        torch = getattr(self, "torch", None)
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()


def _torch(spec: dict, what: str):
    """torch, set up for a peer: its threads from the environment, no autograd."""
    if spec.get("hf_config"):
        raise RuntimeError(f"this bench builds {what} only with the real architecture")
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.set_grad_enabled(False)
    return torch


class MimiPyEngine(Engine):
    name, masks = "mimi_py", True

    def __init__(self, spec):
        import mimi_py

        self.m, hf = mimi_py, spec.get("hf_config")
        config = mimi_py.CodecConfig.from_hf(json.loads(Path(hf).read_text())) if hf else None
        self.codec = mimi_py.MimiCodec(
            None if spec.get("seeded") else spec.get("weights"),
            config=config,
            num_codebooks=spec["num_codebooks"],
            device=spec.get("device", "cpu"),
            dtype=spec.get("dtype", "float32"),
            precision=spec.get("precision"),
        )
        self.encode, self.decode, self.encode_step, self.decode_step = (
            self.codec.encode,
            self.codec.decode,
            self.codec.encode_step,
            self.codec.decode_step,
        )

    def version(self):
        return f"{self.m.__version__} (candle {self.m.candle_version})"

    def describe(self):
        return {"precision": self.codec.precision, "kernel_isa": self.codec.kernel_isa}

    def reset(self, batch=1):
        self.codec.reset_state()


class RustyMimiEngine(Engine):
    name = "rustymimi"

    def __init__(self, spec):
        if spec.get("hf_config"):
            raise RuntimeError("rustymimi only builds the real Mimi architecture")
        import rustymimi

        self.tok = rustymimi.Tokenizer(spec["weights"], num_codebooks=spec["num_codebooks"])
        self.encode = lambda pcm: self.tok.encode(np.ascontiguousarray(pcm, np.float32))
        self.decode = lambda codes: self.tok.decode(np.ascontiguousarray(codes, np.uint32))
        self.encode_step = lambda pcm: self.tok.encode_step(np.ascontiguousarray(pcm, np.float32))
        self.decode_step = lambda codes: self.tok.decode_step(np.ascontiguousarray(codes, np.uint32))

    def reset(self, batch=1):
        self.tok.reset()


class MoshiEngine(Engine):
    """moshi's PyTorch MimiModel, from the same moshi-format file, on a `device` in a `dtype`,
    in a `torch_mode` (torch_switch). moshi keeps its streaming state in its modules while in
    streaming mode (`MimiModel.streaming(batch)`, an ExitStack): `reset` enters it (or resets
    its state); `encode`/`decode` leave it, for the offline calls."""

    name = "moshi"

    def __init__(self, spec):
        self.torch = torch = _torch(spec, "moshi's Mimi")
        from moshi.models import loaders

        self.torch_precision = torch_switch(torch, spec.get("torch_mode", "float32"))
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
        return f"moshi {version_of('moshi')}, torch {self.torch.__version__}"

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
        self.torch = torch = _torch(spec, "transformers' Mimi")
        from transformers import MimiConfig, MimiModel

        torch.manual_seed(0)
        self.nq = spec["num_codebooks"]
        self.model = MimiModel(MimiConfig()).eval()

    def version(self):
        return f"transformers {version_of('transformers')}, torch {self.torch.__version__}"

    def encode(self, pcm):
        out = self.model.encode(self.torch.from_numpy(np.ascontiguousarray(pcm)), num_quantizers=self.nq)
        return out.audio_codes.numpy()

    def decode(self, codes):
        return self.model.decode(self.torch.from_numpy(codes.astype(np.int64))).audio_values.numpy()


ENGINES = {"mimi_py": MimiPyEngine, "rustymimi": RustyMimiEngine, "moshi": MoshiEngine}
ENGINES["transformers"] = TransformersEngine
# What each engine imports: a peer that lacks one is recorded as not installed.
NEEDS = {"mimi_py": ["mimi_py"], "rustymimi": ["rustymimi"], "moshi": ["torch", "moshi"]}
NEEDS["transformers"] = ["torch", "transformers"]


def make_engine(spec: dict):
    """(the engine of spec["engine"], its load time in seconds)."""
    t0 = time.perf_counter()
    eng = ENGINES[spec["engine"]](spec)
    return eng, time.perf_counter() - t0
