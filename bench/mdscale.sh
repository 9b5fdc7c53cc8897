#!/usr/bin/env bash
# Metadata at scale (issue 19, point 7): one local engine on a sparse device
# file, peregrine-mdscale creating --files files of --size bytes in a tree
# (--per-dir per directory) through the POSIX layer (no FUSE), with the create
# and stat rates per decade (10^4, 10^5, 10^6) and the engine's RSS per file;
# then the engine is SIGKILLed and restarted on the same device, and the time
# until the tree serves again (a stat of the last file) is printed. Last, the
# same tree in a local directory on the same disk (the peer), and the ratios.
#
#   bench/mdscale.sh [--files 1000000] [--size 3901] [--per-dir 1000] [--threads 4]
#                    [--stats 20000] [--targets N] [--scm-value-max 4KiB] [--dir /var/tmp]
#                    [--no-build] [--keep]
#
# --targets defaults to what the run's metadata needs: a target keeps at most
# 512 MiB of metadata and small values (its checkpoint slot holds 1 GiB), and
# values below --scm-value-max (the engine's scm_value_max, 4 KiB unless
# given: a 3901-byte file's data) live in the engine's RAM. Each target
# gets an 8 GiB slice of the sparse device (only what is written takes disk:
# up to ~1.5 GiB per target for the WAL and the two checkpoint slots).
set -euo pipefail

BENCH_NAME=mdscale
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
MDSCALE="$BIN/peregrine-mdscale"

FILES=1000000
SIZE=3901
PER_DIR=1000
THREADS=4
STATS=20000
TARGETS=
SCM_VALUE_MAX=4096

while (($#)); do
  case $1 in
    --files) FILES=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --per-dir) PER_DIR=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --stats) STATS=$2; shift 2 ;;
    --targets) TARGETS=$2; shift 2 ;;
    --scm-value-max) SCM_VALUE_MAX=$2; shift 2 ;;
    --dir) PARENT=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --keep) KEEP=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown option $1" ;;
  esac
done
for v in FILES SIZE PER_DIR THREADS STATS; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "--${v,,} wants a number, got ${!v}"
done

# Metadata and small values per file as the pool accounts them: the entry
# (~200 bytes), the parent directory's entry rewritten per create (kept until
# aggregation, ~200), the file's data when below 4 KiB (size + ~80).
PER_FILE=400
SCM_VALUE_MAX_BYTES=$(bytes_of "$SCM_VALUE_MAX")
((SIZE < SCM_VALUE_MAX_BYTES)) && PER_FILE=$((PER_FILE + SIZE + 80))
SCM_NEED=$((FILES * PER_FILE + (256 << 20)))
BUDGET=$((512 << 20)) # per target
if [[ -z $TARGETS ]]; then
  TARGETS=$(((SCM_NEED + BUDGET - 1) / BUDGET))
  ((TARGETS < 2)) && TARGETS=2
fi
[[ $TARGETS =~ ^[1-9][0-9]*$ ]] || die "--targets wants a positive number, got $TARGETS"
DEVICE_BYTES=$((TARGETS * (8 << 30) + (64 << 20)))
SCM=$((TARGETS * BUDGET))
NVME=$((TARGETS * (4 << 30)))

bench_build peregrine-engine peregrine-cli peregrine-bench -- "$PEREGRINE" "$ENGINE" "$MDSCALE"
engines_check_ports_free || die "refusing to start"
bench_workdir peregrine-mdscale

echo "==> 1 engine, $TARGETS targets, $((DEVICE_BYTES >> 30)) GiB sparse device, in $WORK"
ENGINES_EXTRA="scm_value_max: $SCM_VALUE_MAX_BYTES" engines_start 1 "$DEVICE_BYTES" "$TARGETS" "$SCM"
engines_up 1 || die "engine did not come up"
"$PEREGRINE" pool create mdscale --scm-size "$SCM" --nvme-size "$NVME" >/dev/null
"$PEREGRINE" cont create mdscale fs --oclass S1 --dir-oclass S1 >/dev/null
echo "==> pool mdscale, POSIX container fs (oclass S1)"

CMD=("$MDSCALE" --pool mdscale --cont fs --files "$FILES" --size "$SIZE" --per-dir "$PER_DIR" --threads "$THREADS" --stats "$STATS")
echo "==> ${CMD[*]##*/} --engine-pid ${ENGINE_PIDS[0]}"
"${CMD[@]}" --engine-pid "${ENGINE_PIDS[0]}" | tee "$WORK/store.txt"
echo "==> engine device: $(du -sh --apparent-size "$WORK/nvme0.img" | cut -f1) apparent, $(du -sh "$WORK/nvme0.img" | cut -f1) written"

# kill -9, then the same engine on the same device; time until it serves the tree.
echo "==> kill -9 the engine, restart it"
kill -KILL "${ENGINE_PIDS[0]}"
wait "${ENGINE_PIDS[0]}" 2>/dev/null || true
ENGINE_PIDS=()
"$ENGINE" --config "$WORK/engine0.yaml" >>"$WORK/engine0.out" 2>&1 &
ENGINE_PIDS+=($!)
RESTART=$(date +%s.%N)
"${CMD[@]}" --wait-serving 600
# Where the restart went: when the process started, each target's replay
# (checkpoint, then WAL records) and the storage open, from the engine's log.
echo "==> engine log of the restart (process started at $(date -u -d "@$RESTART" +%T.%3N) UTC)"
grep -E '"replayed"|replayed|storage open|ready|serving' "$WORK/engine0.log" | tail -n "$((TARGETS + 4))" | cut -c1-220
echo "==> engine RSS after the restart: $(awk '/VmRSS/ {printf "%.0f MiB", $2 / 1024}' "/proc/${ENGINE_PIDS[0]}/status")"

# The peer: the same tree built and stat'ed in a local directory on the same
# disk, through the kernel (its stats come from the dentry and inode caches),
# with the engine stopped (unless --keep) so that it takes no CPU from it.
((KEEP)) || engines_stop
LOCAL_FS=$(df -T "$WORK" | awk 'NR == 2 {print $2}')
echo "==> the same tree in a local directory ($LOCAL_FS, same disk)"
"$MDSCALE" --local "$WORK/local" --files "$FILES" --size "$SIZE" --per-dir "$PER_DIR" \
  --threads "$THREADS" --stats "$STATS" | tee "$WORK/local.txt"
echo "==> store / $LOCAL_FS, per decade"
awk 'NR == FNR && FNR > 1 {c[$1] = $2; s[$1] = $3; next}
     FNR == 1 {if (NR != FNR) printf "%9s %10s %10s\n", "files", "create", "stat"; next}
     ($1 in c) {printf "%9s %10.2f %10.2f\n", $1, c[$1] / $2, s[$1] / $3}' \
  "$WORK/store.txt" "$WORK/local.txt"
