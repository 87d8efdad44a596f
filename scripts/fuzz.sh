#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 15; `scripts/fuzz.sh 600` for a
# real search), or only the TARGETs named: envelope, segment, replay
# (libs/eventlog/fuzz), quantity, cel, input (libs/dra/fuzz).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#   scripts/fuzz.sh --build-only     # install and build only (CI builds beside the tests)
#
# Installs cargo-fuzz (pinned, into ~/.cache/switchyard/cargo-fuzz) if missing and
# builds the targets on the nightly toolchain into ~/.cache/switchyard/fuzz-target,
# outside the clone. Corpora grow in ~/.cache/switchyard/fuzz/corpus/TARGET, seeded
# from the committed seeds (libs/*/fuzz/seeds/TARGET) and, for `input`, from
# deploy/examples. A crash, a timeout (10 s on one input) or running out of memory
# fails the script; the input that did it is kept under
# ~/.cache/switchyard/fuzz/artifacts/TARGET and its path printed with the command
# that replays it. No sanitizer: the code is safe Rust (bounds and overflow checks
# stay on), and without one the build is faster and each run searches more.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

seconds=15
build_only=
if [[ $# -gt 0 && $1 == --build-only ]]; then
    build_only=1
    shift
fi
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then
    seconds=$1
    shift
fi

cache="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
target_dir="$cache/fuzz-target"
cargo_fuzz_version=0.13.2
export PATH="$cache/cargo-fuzz/bin:$PATH"
export CARGO_TERM_COLOR=never
# Each clone builds at a new path: incremental caches would only pile up.
export CARGO_INCREMENTAL=0

# target -> its fuzz crate
declare -A crate=(
    [envelope]=libs/eventlog/fuzz
    [segment]=libs/eventlog/fuzz
    [replay]=libs/eventlog/fuzz
    [quantity]=libs/dra/fuzz
    [cel]=libs/dra/fuzz
    [input]=libs/dra/fuzz
)
all=(envelope segment replay quantity cel input)
targets=("${@:-${all[@]}}")
for t in "${targets[@]}"; do
    [[ -n ${crate[$t]:-} ]] || { echo "unknown fuzz target $t (known: ${all[*]})" >&2; exit 2; }
done

started=$(date +%s)
elapsed() { echo "$(( $(date +%s) - started ))s"; }

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "== install the nightly toolchain"
    rustup toolchain install nightly --profile minimal
fi
if [[ "$(cargo-fuzz --version 2>/dev/null)" != "cargo-fuzz $cargo_fuzz_version" ]]; then
    echo "== install cargo-fuzz $cargo_fuzz_version"
    cargo install cargo-fuzz --version "$cargo_fuzz_version" --locked --root "$cache/cargo-fuzz"
fi

host=$(rustc +nightly -vV | sed -n 's/^host: //p')
build=(-s none --target-dir "$target_dir")
declare -A built=()
for t in "${targets[@]}"; do
    dir=${crate[$t]}
    [[ -n ${built[$dir]:-} ]] && continue
    echo "== build $dir ($(elapsed))"
    cargo +nightly fuzz build "${build[@]}" --fuzz-dir "$dir"
    built[$dir]=1
done
if [[ -n $build_only ]]; then
    echo "== built ($(elapsed))"
    exit 0
fi

failed=()
for t in "${targets[@]}"; do
    dir=${crate[$t]}
    corpus="$cache/fuzz/corpus/$t"
    artifacts="$cache/fuzz/artifacts/$t"
    log="$cache/fuzz/logs/$t.log"
    mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
    seeds=("$root/$dir/seeds/$t")
    [[ $t == input ]] && seeds+=("$root/deploy/examples")
    args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048
        -artifact_prefix="$artifacts/" -print_final_stats=1)
    [[ -f $dir/$t.dict ]] && args+=(-dict="$root/$dir/$t.dict")
    # A selector may be 10 Ki characters long, and one more is refused.
    [[ $t == cel ]] && args+=(-max_len=12000)
    echo "== fuzz $t for ${seconds}s ($(elapsed))"
    if "$target_dir/$host/release/$t" "${args[@]}" "$corpus" "${seeds[@]}" >"$log" 2>&1; then
        grep -E '^stat::number_of_executed_units|^Done ' "$log" | tr '\n' ' ' || true
        echo "corpus: $(find "$corpus" -type f | wc -l) inputs"
    else
        failed+=("$t")
        tail -n 40 "$log"
        input=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
        echo "!! $t failed; log: $log"
        if [[ -n $input ]]; then
            echo "!! reproducer: $input"
            echo "!! replay: $target_dir/$host/release/$t $input"
            echo "!!     or: cargo +nightly fuzz run ${build[*]} --fuzz-dir $dir $t $input"
        else
            # A stack overflow kills the process before libFuzzer can save the input.
            echo "!! no reproducer saved (a stack overflow?); the newest corpus files:"
            ls -t "$corpus" | sed -n 1,5p | sed "s|^|!!   $corpus/|"
        fi
    fi
done

echo "== done ($(elapsed))"
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "fuzz targets failed: ${failed[*]}" >&2
    exit 1
fi
