#!/usr/bin/env bash
# Peregrine against the raw device, in one run on this machine.
#
# Starts local engines on sparse device files, runs peregrine-bench against a
# pool and container (object class S1: one target, the fair match for one fio
# file), then runs fio with the same patterns on a device file of the same kind
# in the same directory, and prints one table: test, peregrine, raw fio, ratio.
# Results: bench/results/latest.json. Engines are stopped on any exit.
#
#   bench/run.sh [--engines 1|3] [--size 1GiB] [--secs 10] [--device-size 8GiB]
#                [--dir /var/tmp] [--oclass S1] [--no-build] [--no-fio] [--keep]
#
# Needs fio (hack/install-deps.sh installs it) and a filesystem that supports
# O_DIRECT for --dir (not tmpfs).
set -euo pipefail

BENCH_NAME=bench
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BENCH="$BIN/peregrine-bench"

COUNT=1
SIZE=1GiB
SECS=10
DEVICE_SIZE=8GiB
TARGETS=2
OCLASS=S1
FIO=1

while (($#)); do
  case $1 in
    --engines) COUNT=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --secs) SECS=$2; shift 2 ;;
    --device-size) DEVICE_SIZE=$2; shift 2 ;;
    --dir) PARENT=$2; shift 2 ;;
    --oclass) OCLASS=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --no-fio) FIO=0; shift ;;
    --keep) KEEP=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown option $1" ;;
  esac
done
want_positive --engines "$COUNT"
[[ $SECS =~ ^[0-9]+$ ]] || die "--secs wants whole seconds, got $SECS"

bench_build peregrine-engine peregrine-cli peregrine-bench -- "$PEREGRINE" "$ENGINE" "$BENCH"
if ((FIO)); then
  command -v fio >/dev/null || die "fio not found: run hack/install-deps.sh (or pass --no-fio)"
fi
engines_check_ports_free || die "refusing to start"
SIZE_BYTES=$(bytes_of "$SIZE") || die "--size: cannot parse $SIZE"
DEVICE_BYTES=$(bytes_of "$DEVICE_SIZE") || die "--device-size: cannot parse $DEVICE_SIZE"
bench_workdir peregrine-bench

# ---- engines, pool, container ----
echo "==> $COUNT engine(s), $DEVICE_SIZE sparse device each, $TARGETS targets, in $WORK"
engines_start "$COUNT" "$DEVICE_SIZE" "$TARGETS" 1GiB
engines_up "$COUNT" || die "engines did not come up"
# Half of the devices for the pool's bulk tier (the rest holds the WAL, checkpoints and
# headroom); metadata in RAM.
NVME=$((DEVICE_BYTES * COUNT / 2))
SCM=$((256 * 1024 * 1024 * COUNT))
"$PEREGRINE" pool create bench --scm-size "$SCM" --nvme-size "$NVME" >/dev/null
"$PEREGRINE" cont create bench raw --oclass "$OCLASS" --checksum off >/dev/null
echo "==> pool bench, container raw (oclass $OCLASS, checksums off, as fio has none)"

# ---- peregrine ----
echo "==> peregrine-bench ($SIZE data set, ${SECS}s random tests)"
"$BENCH" --pool bench --cont raw --seq-bytes "$SIZE_BYTES" --rand-secs "$SECS" --lat-secs "$SECS" \
  --json-out "$WORK/peregrine.json"

# The engines are done; stop them before fio so they do not compete for the disk.
if ((!KEEP)); then
  engines_stop
fi

mkdir -p "$RESULTS"
if ((!FIO)); then
  cp "$WORK/peregrine.json" "$RESULTS/latest.json"
  echo "==> --no-fio: peregrine numbers only, in $RESULTS/latest.json"
  exit 0
fi

# ---- raw device with fio ----
# Same kind of device as the engine's: a sparse file of the same size, same directory.
FIOFILE="$WORK/raw.img"
truncate -s "$DEVICE_SIZE" "$FIOFILE"
QUARTER=$((SIZE_BYTES / 4))
cat >"$WORK/raw.fio" <<EOF
[global]
filename=$FIOFILE
direct=1
group_reporting=1
# Each job starts once the previous finished (and reports as its own group).
stonewall

[seq_write]
rw=write
bs=1M
ioengine=psync
numjobs=4
size=$QUARTER
offset_increment=$QUARTER

[seq_read]
rw=read
bs=1M
ioengine=psync
numjobs=4
size=$QUARTER
offset_increment=$QUARTER

[rand_read_qd32]
rw=randread
bs=4k
ioengine=io_uring
iodepth=32
size=$SIZE_BYTES
time_based=1
runtime=$SECS

[lat_qd1]
rw=randread
bs=4k
ioengine=psync
iodepth=1
size=$SIZE_BYTES
time_based=1
runtime=$SECS
percentile_list=50:99
EOF
echo "==> fio on $FIOFILE"
if ! fio --output-format=json --output="$WORK/fio.json" "$WORK/raw.fio" 2>"$WORK/fio.err"; then
  cat "$WORK/fio.err" >&2
  die "fio failed (see above)"
fi

# ---- the table ----
echo
echo "Peregrine vs raw device ($COUNT engine(s), oclass $OCLASS, $SIZE data set; ratio = share of raw performance)"
"$BENCH" compare --peregrine "$WORK/peregrine.json" --fio "$WORK/fio.json" --json-out "$RESULTS/latest.json"
echo "==> wrote $RESULTS/latest.json"
