#!/usr/bin/env bash
# The GPU check, as one prepared run on the GPU machine (repository root, results in $OUT):
#   1. the machine's python3 (PyTorch and NVIDIA's CUDA wheels come from it), with the carried
#      CUDA wheel of mimi_py, moshi, and those test/bench wheels the machine lacks, installed
#      into a folder on PYTHONPATH (no network there). Not a virtualenv: that python3 is itself
#      one, and a virtualenv made from it sees the base interpreter's packages, not its torch;
#   2. the device-independent test suites on MIMI_TEST_DEVICE (default cuda): fixture numerics,
#      state invariants, codec codes and audio, half precision, hostile inputs, weights, and the
#      batched rows (masked steps, row resets, forks: tests/streaming/test_batched.py, each row
#      against itself alone through support.ondevice.assert_row);
#   3. the real-size seeded codec's float32 codes on the device against the CPU's (>= 99%);
#   4. the GPU suites of the bench runner (python -m benches --suites gpu_rows,gpu_steady,
#      gpu_census): mimi_py against moshi's PyTorch Mimi on the same GPU, float32 and
#      bfloat16 (offline 10 s at B=1 and 16; streaming frames at B=1, 8 and 64, and mimi_py's
#      masked streaming (active=, 3 rows in 4) at the same sizes, and its transformer alone,
#      masked and unmasked; full rings at B=1, 8, 64, 256; streams held per GPU (frame p99
#      <= 80 ms); a kernel census through torch.profiler), within a 230 s budget;
#   5. cuDNN (MIMI_PY_CUDA_CUDNN=1): the real-size codes against the CPU's, and whether libcudnn
#      loaded and took every convolution; graph replays against eager steps, bit for bit (scripts/gpu_graph_check.py: the same
#      streamed frames with MIMI_PY_CUDA_GRAPHS=1 and =0, each in its own process, float32 and
#      bfloat16, unmasked, masked, with a row reset, and the transformer alone on full rings);
#   6. the switches table, before and after in one run, alternating (mimi_py only: offline at
#      B=16, streaming and full rings at B=1 and 64): the defaults, cuDNN on
#      (MIMI_PY_CUDA_CUDNN=1), graphs on (MIMI_PY_CUDA_GRAPHS=1) and both; each variant's codes
#      against the defaults'. Their results go to $OUT/switches.
# Per-row streaming (active=, reset_state(rows=), last=True) runs on CUDA too: test_half and
# test_codec check it there. TF32 stays off (MIMI_PY_CUDA_TF32 unset) so float32 codes can be
# compared with the CPU's (at least 99% equal, tests/support/ondevice.py).
# Sized for about 7.5 minutes (tests ~65 s of their 150, codes ~30 s of 60, cuDNN ~15 s of 40,
# graph check ~20 s of 40, bench 160 s of 180, switches ~115 s of 130; typically 7 minutes, the
# worst case is longer). Prepare .gpu/
# first (scripts/prepare_gpu_check.sh), then, with the device tool:
#   run(command="bash scripts/gpu_check.sh", carry=[".gpu"], timeout_s=540).
#
# Dry run on a CPU machine, with the mimi_py the current Python imports and a tiny bench:
#   MIMI_TEST_DEVICE=cpu bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
DEVICE="${MIMI_TEST_DEVICE:-cuda}"
OUT="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")}"
mkdir -p "$OUT"
echo "device=$DEVICE out=$OUT"
status=0
step() { echo "== $*"; }

if [ "$DEVICE" = cpu ]; then
    BENCH_SIZE=(--tiny --dtypes float32)
    GRAPH_SIZE=(--dtypes bfloat16 --frames 6 --tokens 24) # f32 on a CPU takes the planned step
    SWITCH_SIZE=(--tiny --dtypes float32 --codec small --size batches=2 --size stream_batches=1 --size steady_batches=1)
    PYTHON="${PYTHON:-python}"
else
    # Four (engine, dtype) workers of at most 45 s each fit inside the bench's 190 s, so a
    # slow worker loses its own rows, not the whole table.
    BENCH_SIZE=(--budget 160 --timeout 75 --size held_budget=15)
    GRAPH_SIZE=()
    SWITCH_SIZE=(--budget 120 --timeout 25 --size batches=16 --size stream_batches=1,64 --size steady_batches=1,64)
    step "environment"
    (nvidia-smi || true) >"$OUT/nvidia-smi.txt" 2>&1
    head -15 "$OUT/nvidia-smi.txt"
    PYTHON="${PYTHON:-python3}"
    SITE=/tmp/gpu-site
    missing=()
    for pkg in pytest hypothesis einops sentencepiece safetensors; do
        "$PYTHON" -c "import $pkg" 2>/dev/null || missing+=("$pkg")
    done
    echo "python: $(command -v "$PYTHON"), torch $("$PYTHON" -c 'import torch; print(torch.__version__)' 2>&1 | tail -1); carried for lack of them: ${missing[*]:-none}"
    for pkg in "${missing[@]}"; do # one at a time: one that fails leaves the others
        "$PYTHON" -m pip install --quiet --no-index --find-links .gpu/wheels --target "$SITE" \
            "$pkg" || status=1
    done
    "$PYTHON" -m pip install --quiet --no-index --no-deps --target "$SITE" \
        .gpu/wheels/moshi-*.whl .gpu/mimi_py-*.whl || status=1
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    # Only the plugins the suites need: the machine's own (benchmark, cov, xdist, ...) could
    # warn, and the suites turn warnings into errors.
    export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
fi
export MIMI_TEST_DEVICE="$DEVICE"

step "import and open the device"
"$PYTHON" - <<PY 2>&1 | tee "$OUT/device.txt" || status=1
import mimi_py, numpy as np
print("mimi_py", mimi_py.__version__, "features", mimi_py.features, "from", mimi_py.__file__)
c = mimi_py.MimiCodec(seed=0, device="$DEVICE")
print(c, "->", c.encode(np.zeros((1, 1, 1920), np.float32)).shape)
PY

step "tests on $DEVICE"
timeout 150 "$PYTHON" -m pytest -q -p no:cacheprovider -rfEs --junitxml="$OUT/junit.xml" \
    tests/transformer/test_fixtures.py tests/transformer/test_state.py tests/codec/test_codec.py \
    tests/codec/test_half.py tests/inputs/test_input_arrays.py tests/transformer/test_transformer_inputs.py \
    tests/codec/test_codec_inputs.py tests/transformer/test_config.py tests/weights/test_weights.py \
    tests/errors/test_errors.py tests/inputs/test_memory_limits.py tests/streaming/test_batched.py \
    tests/codec/test_real_size.py \
    2>&1 | tee "$OUT/tests.log" | tail -40
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

step "real-size codes on $DEVICE against the CPU's"
# The tests use the small codec; here the real-size seeded one: float32 codes on the device
# must equal the CPU's (>= 99%), offline and streaming (the streamed frames equal offline's),
# each streaming step called from a new thread (a GPU's work is queued per thread).
timeout 60 "$PYTHON" - "$DEVICE" <<'PY' 2>&1 | tee "$OUT/agreement.txt"
import sys
import threading
import numpy as np
import mimi_py
dev = sys.argv[1]
pcm = (np.random.default_rng(0).standard_normal((2, 1, 4 * 24000)) * 0.1).astype(np.float32)
cpu = mimi_py.MimiCodec(seed=0, num_codebooks=8)
ref = cpu.encode(pcm)
audio_ref = cpu.decode(ref)
print("cpu codes", ref.shape, "distinct values", len(np.unique(ref)))
worst = 1.0
def on_threads(calls):
    # Each call on a thread of its own, one after the other: a device queues work per thread.
    out = []
    for call in calls:
        t = threading.Thread(target=lambda c=call: out.append(c()))
        t.start()
        t.join()
    return out


for dtype in ("float32", "bfloat16"):
    gpu = mimi_py.MimiCodec(seed=0, num_codebooks=8, device=dev, dtype=dtype)
    off = float((gpu.encode(pcm) == ref).mean())
    frame = [lambda i=i: gpu.encode_step(pcm[..., i * 1920 : (i + 1) * 1920]) for i in range(25)]
    steps = on_threads(frame)
    stream = float((np.concatenate(steps, -1) == ref[..., :25]).mean())
    audio = gpu.decode(ref)
    rel = float(np.abs(audio - audio_ref).max() / np.abs(audio_ref).max())
    print(f"{dtype}: codes equal offline {off:.1%}, streaming {stream:.1%} (each step on a new")
    print(f"  thread); decode max err {rel:.2e} of peak")
    if dtype == "float32":
        worst = min(off, stream)
if worst < 0.99:
    sys.exit(f"float32 codes on {dev} differ from the CPU's: {worst:.1%} equal (expected >= 99%)")
PY
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

step "cuDNN convolutions on $DEVICE against candle's"
# MIMI_PY_CUDA_CUDNN=1 in its own process (the switch is read once): the real-size codec's codes
# against the CPU's, float32 and bfloat16, and whether cuDNN was used (libcudnn loaded, no call
# refused: mimi_py._core._cudnn_unavailable()).
MIMI_PY_CUDA_CUDNN=1 timeout 40 "$PYTHON" - "$DEVICE" <<'PY' 2>&1 | tee "$OUT/cudnn.txt"
import sys
import numpy as np
import mimi_py
dev = sys.argv[1]
pcm = (np.random.default_rng(1).standard_normal((2, 1, 2 * 24000)) * 0.1).astype(np.float32)
ref = mimi_py.MimiCodec(seed=0, num_codebooks=8).encode(pcm)
for dtype in ("float32", "bfloat16"):
    codes = mimi_py.MimiCodec(seed=0, num_codebooks=8, device=dev, dtype=dtype).encode(pcm)
    print(f"{dtype}: codes equal to the CPU's {float((codes == ref).mean()):.1%}")
why = mimi_py._core._cudnn_unavailable()
print("cuDNN used:", why is None, why or "")
sys.exit(1 if why and dev != "cpu" else 0)
PY
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

step "bench on $DEVICE"
# The wheel's commit (scripts/prepare_gpu_check.sh writes it; the copy here has no .git).
[ -f .gpu/commit ] && export MIMI_BENCH_COMMIT="$(cat .gpu/commit)"
# One results file for the machine ($OUT/<gpu>.json), and its tables in $OUT/gpu_results.md.
timeout 180 "$PYTHON" -m benches --suites gpu_rows,gpu_steady,gpu_census --device "$DEVICE" \
    --out "$OUT" "${BENCH_SIZE[@]}" 2>&1 | tee "$OUT/bench.log" | tail -40
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
"$PYTHON" -m benches report "$OUT"/*.json --readme "$OUT/gpu_results.md" --charts "$OUT" || status=1
[ -f "$OUT/gpu_results.md" ] && cat "$OUT/gpu_results.md"

step "graph replays against eager steps on $DEVICE"
timeout 40 "$PYTHON" scripts/gpu_graph_check.py --device "$DEVICE" --out "$OUT/graphs.json" \
    "${GRAPH_SIZE[@]}" 2>&1 \
    | tee "$OUT/graphs.log" | tail -20
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

step "switches on $DEVICE, alternating"
mkdir -p "$OUT/switches"
timeout 130 "$PYTHON" -m benches --device "$DEVICE" --out "$OUT/switches" --engines mimi_py \
    --sections offline,streaming,steady \
    --variant defaults: --variant cudnn:MIMI_PY_CUDA_CUDNN=1 --variant graphs:MIMI_PY_CUDA_GRAPHS=1 \
    --variant both:MIMI_PY_CUDA_CUDNN=1,MIMI_PY_CUDA_GRAPHS=1 \
    --rounds 2 "${SWITCH_SIZE[@]}" 2>&1 | tee "$OUT/switches/bench.log" | tail -30
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
"$PYTHON" -m benches report "$OUT"/switches/*.json --readme "$OUT/switches/gpu_results.md" \
    --charts "$OUT/switches" >/dev/null || status=1
echo "gpu_check status=$status (results in $OUT)"
exit "$status"
