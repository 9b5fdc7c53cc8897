#!/usr/bin/env bash
# Peregrine in one minute on one machine: three engines on sparse files, a pool,
# a container, 100 MiB written and read back byte for byte, then everything torn down.
#
#   hack/quickstart.sh            (or: make quickstart)
#
# Environment: QUICKSTART_KEEP=1 leaves the engines running and the temp dir in
# place (it prints how to stop them); PEREGRINE_TMP picks the temp dir's parent.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="$ROOT/engine/target/release"
COUNT=3
DATA_MIB=100
KEEP=${QUICKSTART_KEEP:-0}
PEREGRINE="$BIN/peregrine"
ENGINE="$BIN/peregrine-engine"
export PEREGRINE_MGMT=127.0.0.1:10001
# shellcheck source=hack/engines.sh
source "$ROOT/hack/engines.sh"

say() { printf '==> %s\n' "$*"; }
die() {
  printf 'quickstart: %s\n' "$*" >&2
  exit 1
}

# ---- binaries ----
if [[ ! -x "$PEREGRINE" || ! -x "$ENGINE" ]]; then
  say "building release binaries"
  command -v cargo >/dev/null || die "cargo not found: run hack/install-deps.sh and install Rust"
  (cd "$ROOT/engine" && cargo build --release -p peregrine-engine -p peregrine-cli) || die "build failed"
fi
engines_check_ports_free || die "refusing to start"

# ---- temp dir and cleanup ----
WORK=$(mktemp -d "${PEREGRINE_TMP:-${TMPDIR:-/tmp}}/peregrine-quickstart.XXXXXX")
cleanup() {
  local rc=$?
  trap - EXIT
  if ((rc != 0)); then
    echo "quickstart: FAILED (exit $rc); engine logs follow" >&2
    engines_dump_logs
  fi
  if [[ "$KEEP" == 1 && $rc == 0 ]]; then
    echo "QUICKSTART_KEEP=1: engines still running; talk to them with:"
    echo "  export PEREGRINE_TLS_DIR=$WORK/certs/admin   # (peregrine certs made it)"
    echo "stop them with:"
    echo "  kill ${ENGINE_PIDS[*]}; rm -rf $WORK"
    exit 0
  fi
  engines_stop
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- engines ----
say "starting $COUNT engines in $WORK (2 GiB sparse device each, 2 targets)"
engines_start "$COUNT" 2GiB 2 512MiB
say "waiting for them to join, formatting, waiting until ready"
engines_up "$COUNT" || die "engines did not come up"
"$PEREGRINE" system query

# ---- pool, container ----
say "creating pool tank (2 GiB) and container demo (oclass SX)"
"$PEREGRINE" pool create tank --size 2GiB >/dev/null || die "pool create failed"
"$PEREGRINE" cont create tank demo --oclass SX >/dev/null || die "cont create failed"

# ---- data ----
say "writing ${DATA_MIB} MiB and reading it back"
head -c $((DATA_MIB << 20)) /dev/urandom >"$WORK/in.bin"
bandwidth() { # bytes start_ns end_ns
  awk -v b="$1" -v s="$2" -v e="$3" \
    'BEGIN { d = (e - s) / 1e9; if (d <= 0) d = 1e-9; printf "%.1f MB/s (%.2f s)", b / 1e6 / d, d }'
}
OID=SX:0.1
t0=$(date +%s%N)
"$PEREGRINE" obj put tank demo "$OID" data blob --array --file "$WORK/in.bin" || die "obj put failed"
t1=$(date +%s%N)
"$PEREGRINE" obj get tank demo "$OID" data blob --array --out "$WORK/out.bin" || die "obj get failed"
t2=$(date +%s%N)
cmp "$WORK/in.bin" "$WORK/out.bin" || die "the data read back differs from the data written"
bytes=$((DATA_MIB << 20))
echo "write:  $(bandwidth "$bytes" "$t0" "$t1")"
echo "read:   $(bandwidth "$bytes" "$t1" "$t2")"
echo "verify: ${DATA_MIB} MiB read back identical"

say "pool query tank"
"$PEREGRINE" pool query tank

if [[ "$KEEP" != 1 ]]; then
  say "stopping engines"
  engines_stop
fi
say "quickstart OK"
