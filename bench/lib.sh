# What the benchmark scripts share; sourced by each, after it sets BENCH_NAME (the prefix of
# its messages). It gives the release binaries' paths, option checks, sizes, the release build,
# a work directory, local engines (hack/engines.sh, on 127.0.0.1:10001) and the clean-up on any
# exit. A script then sets its own defaults and parses its options.
# shellcheck shell=bash

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="${CARGO_TARGET_DIR:-$ROOT/engine/target}/release"
PEREGRINE="$BIN/peregrine"
ENGINE="$BIN/peregrine-engine"
# shellcheck disable=SC2034 # the scripts write their results there
RESULTS="$ROOT/bench/results"
PARENT=${TMPDIR:-/var/tmp}
BUILD=1
KEEP=0
WORK=

# usage: the script's opening comment, its help.
usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

die() {
  echo "$BENCH_NAME: $*" >&2
  exit 1
}

# want_percent OPTION VALUE: VALUE is a percentage (digits, an optional fraction).
want_percent() {
  [[ $2 =~ ^[0-9]+([.][0-9]+)?$ ]] || die "$1 wants a percentage, got $2"
}

# use_transport VALUE: auto, tcp or shm, exported as PEREGRINE_TRANSPORT (peregrine-bench reads it).
use_transport() {
  case $1 in
    auto | tcp | shm) export PEREGRINE_TRANSPORT=$1 ;;
    *) die "--transport wants auto, tcp or shm, got $1" ;;
  esac
}

# want_positive OPTION VALUE: VALUE is a whole number above zero.
want_positive() {
  [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 wants a positive number, got $2"
}

# Bytes from a size string in the CLI's binary units: 1GiB, 512MiB, 4G, 4096.
bytes_of() {
  local s=${1%B}
  numfmt --from=iec "${s%i}"
}

# bench_build PACKAGE... -- BINARY...: cargo's release build of the packages (unless the script
# was given --no-build: BUILD=0), then each binary must be there.
bench_build() {
  local packages=()
  while (($#)) && [[ $1 != -- ]]; do
    packages+=(-p "$1")
    shift
  done
  (($#)) && shift
  if ((BUILD)); then
    echo "==> cargo build --release"
    (cd "$ROOT/engine" && cargo build --release "${packages[@]}") || die "build failed"
  fi
  local b
  for b in "$@"; do
    [[ -x $b ]] || die "$b is missing (run without --no-build)"
  done
}

# bench_workdir PREFIX: a fresh directory under --dir, in WORK (and BENCH_TOP, what the clean-up
# removes), with a warning on tmpfs, which has no O_DIRECT; from here on, bench_cleanup runs at
# any exit.
bench_workdir() {
  WORK=$(mktemp -d "$PARENT/$1.XXXXXX")
  BENCH_TOP=$WORK
  trap bench_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  if [[ $(stat -f -c %T "$WORK") == tmpfs ]]; then
    echo "$BENCH_NAME: warning: $WORK is on tmpfs (no O_DIRECT): device figures mean nothing; use --dir" >&2
  fi
}

# On any exit: engine logs on a failure, the script's bench_before_stop (if it defines one:
# a mount to remove), then the engines stopped and BENCH_TOP removed; with --keep (KEEP=1) both
# are left.
bench_cleanup() {
  local rc=$?
  trap - EXIT
  if ((rc != 0)); then
    echo "$BENCH_NAME: FAILED (exit $rc); engine logs follow" >&2
    engines_dump_logs
  fi
  if declare -F bench_before_stop >/dev/null; then
    bench_before_stop "$rc"
  fi
  if ((KEEP)); then
    echo "$BENCH_NAME: --keep: engines still running; stop with: kill ${ENGINE_PIDS[*]}; rm -rf $BENCH_TOP"
    exit "$rc"
  fi
  engines_stop
  engines_commit_stats
  rm -rf "$BENCH_TOP"
  exit "$rc"
}

FUSE="$BIN/peregrine-fuse"
MNT=
FUSE_PID=""
MOUNTS=()
FUSE_PIDS=()
# How the daemons take the kernel's requests (`peregrine-fuse --io-uring`): FUSE over io_uring
# where this kernel has it (the daemon turns its parameter on), else /dev/fuse; a script's
# --io-uring option overrides it.
if [[ -e /sys/module/fuse/parameters/enable_uring ]]; then IO_URING=on; else IO_URING=off; fi

# want_io_uring VALUE: on, off or auto, for IO_URING.
want_io_uring() {
  case $1 in
    on | off | auto) IO_URING=$1 ;;
    *) die "--io-uring wants on, off or auto, got $1" ;;
  esac
}

# bench_fuse POOL CONT DIR [FLAG...]: a peregrine-fuse daemon mounts the container on DIR, its log
# in DIR.log, with --io-uring $IO_URING unless the flags say otherwise; its pid in BENCH_FUSE_PID.
# bench_unmount stops every daemon started so.
bench_fuse() {
  local pool=$1 cont=$2 dir=$3
  shift 3
  mkdir -p "$dir"
  local io=(--io-uring "$IO_URING")
  [[ " $* " == *" --io-uring "* ]] && io=()
  "$FUSE" --pool "$pool" --cont "$cont" --mountpoint "$dir" --foreground "${io[@]}" "$@" \
    >"$dir.log" 2>&1 &
  BENCH_FUSE_PID=$!
  FUSE_PIDS+=("$BENCH_FUSE_PID")
  MOUNTS+=("$dir")
  wait_until 30 "the peregrine-fuse mount on $dir" bench_mounted "$dir" ||
    die "mount failed: $(cat "$dir.log")"
}

# bench_mount POOL CONT [FLAG...]: bench_fuse on $WORK/mnt (MNT, FUSE_PID; its log
# $WORK/mnt.log); bench_unmount stops it (a script's bench_before_stop calls it, so that the
# mount goes before the engines stop).
bench_mount() {
  MNT="$WORK/mnt"
  bench_fuse "$1" "$2" "$MNT" "${@:3}"
  FUSE_PID=$BENCH_FUSE_PID
}

bench_mounted() { grep -q " ${1:-$MNT} fuse.peregrine " /proc/mounts; }

bench_unmount() {
  local pid dir
  for pid in "${FUSE_PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${FUSE_PIDS[@]}"; do
    for _ in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  FUSE_PIDS=()
  FUSE_PID=""
  for dir in "${MOUNTS[@]}"; do
    if bench_mounted "$dir"; then
      umount -l "$dir" 2>/dev/null || fusermount3 -uz "$dir" 2>/dev/null || true
    fi
  done
  MOUNTS=()
}

export PEREGRINE_MGMT=127.0.0.1:10001
# shellcheck source=hack/engines.sh
source "$ROOT/hack/engines.sh"
