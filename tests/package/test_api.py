"""Package surface: stubs match the module, metadata, threads."""

from __future__ import annotations

import ast
import importlib
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import mimi_py
from mimi_py import _core

PKG = Path(mimi_py.__file__).parent


def stub_names():
    tree = ast.parse((PKG / "_core.pyi").read_text())
    names = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = [
                n.name for n in node.body if isinstance(n, ast.FunctionDef) and n.name != "__init__"
            ]
        elif isinstance(node, ast.FunctionDef):
            names[node.name] = []
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = []
    return names


def test_every_stubbed_name_exists():
    aliases = {"PositionalEmbedding", "NormName", "Gating"}
    for name, members in stub_names().items():
        if name in aliases:
            continue
        assert hasattr(_core, name), name
        obj = getattr(_core, name)
        for m in members:
            assert hasattr(obj, m), f"{name}.{m}"


def test_every_public_class_is_stubbed():
    stubbed = stub_names()
    for name in dir(_core):
        if name.startswith("__") or name in ("_core",):
            continue
        assert name in stubbed, f"{name} is missing from _core.pyi"
    for name in mimi_py.__all__:
        assert hasattr(mimi_py, name)


@pytest.mark.parametrize(
    "module", ["mimi_py", "mimi_py.audio", "mimi_py.hub", "mimi_py.data", "mimi_py.serve"]
)
def test_every_module_lists_its_public_names_sorted_and_they_import(module):
    m = importlib.import_module(module)
    assert m.__all__ == sorted(m.__all__)
    assert [n for n in m.__all__ if not hasattr(m, n)] == []


def test_metadata():
    assert (PKG / "py.typed").exists()
    assert isinstance(mimi_py.__version__, str) and mimi_py.__version__
    assert isinstance(mimi_py.features, frozenset)
    assert mimi_py.features <= {"cuda", "metal", "mkl", "accelerate"}


def small(seed=0):
    cfg = mimi_py.TransformerConfig(d_model=64, num_heads=4, num_layers=4, dim_feedforward=256, context=32)
    return mimi_py.StreamingTransformer(cfg, seed=seed)


def test_two_threads_run_two_transformers_at_once():
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((2, 200, 64)).astype(np.float32) for _ in range(2)]
    serial = [small(i).forward(xs[i]) for i in range(2)]
    results = [None, None]
    errors = []

    def work(i):
        try:
            t = small(i)
            results[i] = np.concatenate([t.step(xs[i][:, j : j + 1]) for j in range(200)], axis=1)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not errors and all(not th.is_alive() for th in threads)
    for i in range(2):
        np.testing.assert_allclose(results[i], serial[i], atol=1e-5, rtol=1e-5)


def test_one_object_shared_by_threads_serializes_calls():
    t = small()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 1, 64)).astype(np.float32)
    errors = []

    def work():
        try:
            for _ in range(50):
                t.step(x)
                _ = t.position
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not errors, errors
    assert t.position == 200


def forward_lets_another_thread_run(t, x) -> bool:
    """Whether the main thread ran while a worker thread was inside ``t.forward(x)``: the
    worker sets `entered`, calls forward, then sets `returned`; the main thread, waiting on
    `entered`, looks at `returned` as soon as it runs again."""
    entered, returned = threading.Event(), threading.Event()

    def work():
        entered.set()
        t.forward(x)
        returned.set()

    th = threading.Thread(target=work)
    th.start()
    entered.wait()
    ran_inside = not returned.is_set()
    th.join(timeout=120)
    assert not th.is_alive()
    return ran_inside


def test_gil_is_released_during_compute():
    """Another Python thread runs while one thread is inside `forward`; no clock is read.

    The switch interval is raised far beyond the test's length, so the interpreter never takes
    the GIL from a running thread: a thread waiting for it runs only once the holder releases
    it. The main thread waits for the worker's `entered`, which the worker sets just before it
    calls `forward`; so the main thread runs again only when the worker releases the GIL. A
    forward that holds the GIL throughout sets `returned` before that, and the main thread
    always finds it set: the test fails every time. A forward that detaches lets the main
    thread run inside it, and it finds `returned` clear, unless the OS does not schedule it
    before the forward ends (hundreds of milliseconds) and the worker takes the GIL back first:
    that one way to miss a release is why three tries are allowed."""
    t = mimi_py.StreamingTransformer(mimi_py.TransformerConfig(num_layers=4), seed=0)
    x = np.random.default_rng(2).standard_normal((1, 600, 512)).astype(np.float32)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        tries = []
        while len(tries) < 3 and not any(tries):
            t.reset_state()
            tries.append(forward_lets_another_thread_run(t, x))
    finally:
        sys.setswitchinterval(interval)
    assert any(tries), "the main thread never ran while forward computed: the GIL was held"


def test_from_pretrained_is_declared_once_in_the_hub_and_the_stub_matches_it():
    """`MimiCodec.from_pretrained` passes its arguments to `mimi_py.hub.from_pretrained` as
    given; the stub declares the hub's parameters, names, kinds, defaults and annotations."""
    import inspect

    import mimi_py.hub

    hub = inspect.signature(mimi_py.hub.from_pretrained)
    stub_file = Path(_core.__file__).with_name("_core.pyi")
    tree = ast.parse(stub_file.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MimiCodec")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "from_pretrained")
    a = fn.args
    stub = [(p.arg, "positional") for p in a.args[1:]] + [(p.arg, "keyword") for p in a.kwonlyargs]
    defaults = [ast.literal_eval(d) for d in a.defaults] + [ast.literal_eval(d) for d in a.kw_defaults]
    annotations = [ast.unparse(p.annotation) for p in a.args[1:] + a.kwonlyargs]
    kind = {inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional", inspect.Parameter.KEYWORD_ONLY: "keyword"}
    assert stub == [(p.name, kind[p.kind]) for p in hub.parameters.values()]
    assert defaults == [p.default for p in hub.parameters.values()]
    assert annotations == [str(p.annotation) for p in hub.parameters.values()]
