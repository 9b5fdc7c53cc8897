#!/usr/bin/env bash
# What a short process pays for the interception library: each command below runs --runs
# times through a peregrine-fuse mount on the kernel path, then as many times with
# LD_PRELOAD of the library, in alternation (--rounds), and the table gives microseconds per
# run of each and their ratio. A shell script, a build or a package install starts
# thousands of such processes; each one under the library learns the mount's container
# from the daemon and connects to the engines it touches before its first call is served.
#
# Starts one engine (2 targets, a sparse device file), pool `start` and a POSIX container
# `fs` (object class SX), and mounts it. Commands, in a fresh directory of the mount:
#   true        no Peregrine file touched: loading the library
#   cat         read a 4-byte file
#   redirect    sh -c 'echo x > f' (a create; dash converts its redirection)
#   mkdir-p     sh -c 'mkdir -p d/e && rmdir d/e d' (three processes)
#
#   bench/il-start.sh [--runs 100] [--rounds 3] [--dir /var/tmp] [--no-build]
set -euo pipefail

BENCH_NAME=il-start
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
IL="$BIN/libperegrine_il.so"
RUNS=100
ROUNDS=3

while (($#)); do
  case $1 in
    --runs) RUNS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --dir) PARENT=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown option $1" ;;
  esac
done
want_positive --runs "$RUNS"
want_positive --rounds "$ROUNDS"

bench_build peregrine-engine peregrine-cli peregrine-fuse peregrine-il -- "$ENGINE" "$PEREGRINE" "$FUSE" "$IL"
bench_workdir peregrine-il-start
bench_before_stop() { bench_unmount; }

engines_start 1 4GiB 2 1GiB
engines_up 1 || die "engine did not come up"
"$PEREGRINE" pool create start --scm-size $((128 * 1024 * 1024)) --nvme-size $((1024 * 1024 * 1024)) >/dev/null
"$PEREGRINE" cont create start fs --type POSIX --oclass SX >/dev/null
bench_mount start fs
echo "==> pool start, container fs mounted on $MNT; $RUNS runs per command and path, $ROUNDS rounds"

declare -A CMDS=(
  [true]="/bin/true"
  [cat]="cat f4"
  [redirect]="sh -c 'echo x > r'"
  [mkdir-p]="sh -c 'mkdir -p d/e && rmdir d/e d'"
)
ORDER=(true cat redirect mkdir-p)

# per_run DIR PRELOAD CMD: microseconds per run of CMD in DIR (PRELOAD: the library or "").
per_run() {
  local dir=$1 preload=$2 cmd=$3 start i
  start=$(date +%s%N)
  for ((i = 0; i < RUNS; i++)); do
    (
      cd "$dir"
      [[ -z $preload ]] || export LD_PRELOAD=$preload
      eval "$cmd"
    ) >/dev/null
  done
  echo $((($(date +%s%N) - start) / (RUNS * 1000)))
}

OUT="$WORK/runs"
: >"$OUT"
for ((r = 1; r <= ROUNDS; r++)); do
  for name in "${ORDER[@]}"; do
    for path in kernel library; do
      dir="$MNT/r$r-$name-$path"
      mkdir -p "$dir"
      printf 'data' >"$dir/f4"
      preload=""
      [[ $path == library ]] && preload=$IL
      echo "$name $path $(per_run "$dir" "$preload" "${CMDS[$name]}")" >>"$OUT"
    done
  done
done

python3 - "$OUT" "${ORDER[@]}" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
print(f"\n{'command':<10} {'kernel us/run':>14} {'library us/run':>15} {'library/kernel':>15}")
for name in sys.argv[2:]:
    k = [int(v) for n, p, v in rows if n == name and p == "kernel"]
    lib = [int(v) for n, p, v in rows if n == name and p == "library"]
    mk, ml = statistics.median(k), statistics.median(lib)
    print(f"{name:<10} {mk:>14.0f} {ml:>15.0f} {ml / mk:>15.2f}   (rounds: {k} / {lib})")
PY
