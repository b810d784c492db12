#!/usr/bin/env bash
# The fuzz targets, run for a bounded time each (docs/correctness.md, Fuzzing): the four
# cargo-fuzz targets of fuzz/ (libFuzzer under AddressSanitizer, built by the nightly toolchain;
# the project itself builds on stable) and the server's doors (fuzz/serve_doors.py, atheris,
# with the mimi_py the current Python imports).
#
#   scripts/fuzz.sh ci         # each target 30 s on the committed corpus (.ci/run)
#   scripts/fuzz.sh campaign   # each target 600 s, the corpus kept in fuzz/target/campaign (make fuzz)
#   FUZZ_SECONDS=60 FUZZ_TARGETS="config streams" scripts/fuzz.sh ci
#
# It installs what it lacks: the nightly toolchain (rustup), cargo-fuzz (cargo install) and
# atheris (pip, into the current Python). New inputs go to a scratch folder (ci) or to
# fuzz/target/campaign (campaign), never into fuzz/corpus; a finding is written to
# fuzz/artifacts/<target>/ and fails the run. The last lines are one summary row per target:
# seconds, executions, edges (libFuzzer's cov), findings.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"
MODE="${1:-ci}"
PY="${PYTHON:-python}"
case "$MODE" in
    ci) SECONDS_EACH="${FUZZ_SECONDS:-30}"; WORK="$(mktemp -d "${TMPDIR:-/tmp}/mimi_py-fuzz.XXXXXX")" ;;
    campaign) SECONDS_EACH="${FUZZ_SECONDS:-600}"; WORK="$REPO/fuzz/target/campaign" ;;
    *) echo "usage: scripts/fuzz.sh [ci|campaign]" >&2; exit 2 ;;
esac
RUST_TARGETS=(checkpoint config host_calls streams)
ALL_TARGETS="${FUZZ_TARGETS:-${RUST_TARGETS[*]} serve}"
# libFuzzer's limits, declared once: a hang is an input over 10 s (a model call takes
# milliseconds), memory is bounded at 2 GiB, and each run is reproducible from its seed.
# LeakSanitizer's check after inputs that allocate more than they free is off: the targets keep
# their models and warm buffers in statics on purpose, the scan cost 45% of the time, and the
# RSS limit still bounds memory (ASan's memory errors are all still reported).
LIBFUZZER_ARGS=(-timeout=10 -rss_limit_mb=2048 -detect_leaks=0 -print_final_stats=1 -seed=1)
# One compute thread: the targets share the machine with whatever else runs, and every
# result they check is the same bits at any thread count.
export RAYON_NUM_THREADS="${FUZZ_THREADS:-1}"
mkdir -p "$WORK" "$REPO/fuzz/artifacts"

echo "== fuzz tools (nightly toolchain, cargo-fuzz)"
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
cargo +nightly fuzz --version

# One target's summary row from its libFuzzer log: executions, edges, findings.
summary() {
    local name="$1" log="$2" rc="$3"
    local execs edges
    execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)"
    edges="$(grep -o 'cov: [0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)"
    printf 'fuzz %-11s %5ss %12s execs %7s edges  findings: %s\n' "$name" "$SECONDS_EACH" \
        "${execs:-?}" "${edges:-?}" "$([ "$rc" = 0 ] && echo 0 || echo "1 (rc $rc, see $log)")" \
        | tee "$WORK/$name.summary"
}

run_rust() {
    local t="$1"
    mkdir -p "$WORK/corpus/$t" "$REPO/fuzz/artifacts/$t"
    local rc=0
    (cd fuzz && nice -n "${FUZZ_NICE:-0}" cargo +nightly fuzz run "$t" "$WORK/corpus/$t" "corpus/$t" -- \
        "${LIBFUZZER_ARGS[@]}" -max_total_time="$SECONDS_EACH" -artifact_prefix="$REPO/fuzz/artifacts/$t/") \
        >"$WORK/$t.log" 2>&1 || rc=$?
    tail -n 3 "$WORK/$t.log"
    summary "$t" "$WORK/$t.log" "$rc"
    return "$rc"
}

run_serve() {
    "$PY" -c 'import atheris' 2>/dev/null || "$PY" -m pip install --quiet atheris
    mkdir -p "$WORK/corpus/serve" "$REPO/fuzz/artifacts/serve"
    local rc=0
    MIMI_FUZZ_SERVE_STATS="$WORK/serve.json" nice -n "${FUZZ_NICE:-0}" "$PY" fuzz/serve_doors.py \
        "$WORK/corpus/serve" fuzz/corpus/serve "${LIBFUZZER_ARGS[@]}" -max_total_time="$SECONDS_EACH" \
        -artifact_prefix="$REPO/fuzz/artifacts/serve/" >"$WORK/serve.log" 2>&1 || rc=$?
    tail -n 3 "$WORK/serve.log"
    # The honest client must have finished a stream, every one exact.
    "$PY" - "$WORK/serve.json" <<'PY' || rc=1
import json, sys
s = json.load(open(sys.argv[1]))
print("serve:", s)
assert s["honest_exact"] >= 1 and s["honest_wrong"] == 0, "the honest client was not served exactly"
PY
    summary serve "$WORK/serve.log" "$rc"
    return "$rc"
}

if [[ " $ALL_TARGETS " == *" checkpoint "* || " $ALL_TARGETS " == *" config "* ||
      " $ALL_TARGETS " == *" host_calls "* || " $ALL_TARGETS " == *" streams "* ]]; then
    echo "== build (cargo +nightly fuzz build, AddressSanitizer)"
    (cd fuzz && time nice -n "${FUZZ_NICE:-0}" cargo +nightly fuzz build)
fi
failed=0
for t in $ALL_TARGETS; do
    echo "== fuzz $t (${SECONDS_EACH}s)"
    case "$t" in
        serve) run_serve || failed=1 ;;
        *) run_rust "$t" || failed=1 ;;
    esac
done
echo "== summary ($MODE; logs in $WORK)"
for t in $ALL_TARGETS; do cat "$WORK/$t.summary"; done
exit "$failed"
