#!/usr/bin/env bash
# POSIX access to Peregrine next to the raw device, in one run on this machine.
#
# Starts one engine (2 targets, sparse device file), creates pool `posix` and a POSIX
# container `fs` (object class SX, crc32c checksums), mounts it with peregrine-fuse, and
# runs the same fio jobs through (a) the mount, (b) the mount with LD_PRELOAD of the
# interception library (if engine/target/release/libperegrine_il.so exists), then
# peregrine-mdtest on the mount, then (c) fio on a raw device file of the same kind in
# the same directory (engine stopped). Prints one table; writes bench/results/posix.json.
# The mount and the engine are stopped on any exit.
#
#   bench/posix.sh [--size 1GiB] [--secs 10] [--device-size 8GiB] [--dir /var/tmp]
#                  [--items 1000] [--threads 4] [--no-build] [--no-raw]
#
# Needs fio, fuse3 (hack/install-deps.sh installs them), python3 (for the table), /dev/fuse,
# and a filesystem with O_DIRECT for --dir (not tmpfs).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="$ROOT/engine/target/release"
PEREGRINE="$BIN/peregrine"
ENGINE="$BIN/peregrine-engine"
FUSE="$BIN/peregrine-fuse"
MDTEST="$BIN/peregrine-mdtest"
IL="$BIN/libperegrine_il.so"
RESULTS="$ROOT/bench/results"

SIZE=1GiB
SECS=10
DEVICE_SIZE=8GiB
TARGETS=2
PARENT=${TMPDIR:-/var/tmp}
ITEMS=1000
THREADS=4
BUILD=1
RAW=1

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
die() {
  echo "posix-bench: $*" >&2
  exit 1
}

while (($#)); do
  case $1 in
    --size) SIZE=$2; shift 2 ;;
    --secs) SECS=$2; shift 2 ;;
    --device-size) DEVICE_SIZE=$2; shift 2 ;;
    --dir) PARENT=$2; shift 2 ;;
    --items) ITEMS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --no-raw) RAW=0; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown option $1" ;;
  esac
done
[[ $SECS =~ ^[1-9][0-9]*$ ]] || die "--secs wants whole seconds, got $SECS"
[[ $ITEMS =~ ^[1-9][0-9]*$ ]] || die "--items wants a positive number, got $ITEMS"
[[ $THREADS =~ ^[1-9][0-9]*$ ]] || die "--threads wants a positive number, got $THREADS"

export PEREGRINE_MGMT=127.0.0.1:10001
# shellcheck source=hack/engines.sh
source "$ROOT/hack/engines.sh"

# ---- build and prerequisites ----
if ((BUILD)); then
  echo "==> cargo build --release"
  (cd "$ROOT/engine" && cargo build --release -p peregrine-engine -p peregrine-cli \
    -p peregrine-bench -p peregrine-fuse) || die "build failed"
fi
for b in "$PEREGRINE" "$ENGINE" "$FUSE" "$MDTEST"; do
  [[ -x "$b" ]] || die "$b is missing (run without --no-build)"
done
command -v fio >/dev/null || die "fio not found: run hack/install-deps.sh"
command -v python3 >/dev/null || die "python3 not found (it formats the table)"
[[ -e /dev/fuse ]] || die "/dev/fuse is missing: no FUSE on this machine"
engines_check_ports_free || die "refusing to start"

bytes_of() {
  local s=${1%B}
  numfmt --from=iec "${s%i}"
}
SIZE_BYTES=$(bytes_of "$SIZE") || die "--size: cannot parse $SIZE"
DEVICE_BYTES=$(bytes_of "$DEVICE_SIZE") || die "--device-size: cannot parse $DEVICE_SIZE"
QUARTER=$((SIZE_BYTES / 4))

# ---- temp dir and cleanup ----
WORK=$(mktemp -d "$PARENT/peregrine-posix.XXXXXX")
MNT="$WORK/mnt"
FUSE_PID=""
if [[ $(stat -f -c %T "$WORK") == tmpfs ]]; then
  echo "posix-bench: warning: $WORK is on tmpfs (no O_DIRECT): raw fio will fail; use --dir" >&2
fi
unmount() {
  if [[ -n $FUSE_PID ]]; then
    kill -TERM "$FUSE_PID" 2>/dev/null || true
    for _ in $(seq 1 100); do
      kill -0 "$FUSE_PID" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$FUSE_PID" 2>/dev/null || true
    wait "$FUSE_PID" 2>/dev/null || true
    FUSE_PID=""
  fi
  if grep -q " $MNT fuse.peregrine " /proc/mounts; then
    umount -l "$MNT" 2>/dev/null || fusermount3 -uz "$MNT" 2>/dev/null || true
  fi
}
cleanup() {
  local rc=$?
  trap - EXIT
  if ((rc != 0)); then
    echo "posix-bench: FAILED (exit $rc); logs follow" >&2
    engines_dump_logs
    [[ -s $WORK/fuse.log ]] && tail -n 15 "$WORK/fuse.log" >&2
  fi
  unmount
  engines_stop
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- engine, pool, container, mount ----
echo "==> 1 engine, $DEVICE_SIZE sparse device, $TARGETS targets, in $WORK"
engines_start 1 "$DEVICE_SIZE" "$TARGETS" 1GiB
engines_up 1 || die "engine did not come up"
"$PEREGRINE" pool create posix --scm-size $((256 * 1024 * 1024)) --nvme-size $((DEVICE_BYTES / 2)) >/dev/null
"$PEREGRINE" cont create posix fs --type POSIX --oclass SX --checksum crc32c >/dev/null
mkdir -p "$MNT"
"$FUSE" --pool posix --cont fs --mountpoint "$MNT" --foreground >"$WORK/fuse.log" 2>&1 &
FUSE_PID=$!
is_mounted() { grep -q " $MNT fuse.peregrine " /proc/mounts; }
wait_until 30 "the peregrine-fuse mount" is_mounted || die "mount failed: $(cat "$WORK/fuse.log")"
echo "==> pool posix, container fs (POSIX, oclass SX, crc32c) mounted on $MNT"

# ---- fio jobs, the same for every path ----
# fio_jobs FILE: seq write/read 1 MiB x4 jobs (each its quarter), 4 KiB random read QD1 and
# 4 jobs x QD1, all O_DIRECT (no page cache on either side).
fio_jobs() {
  cat <<EOF
[global]
filename=$1
direct=1
ioengine=psync
group_reporting=1
stonewall
thread=1

[seq_write]
rw=write
bs=1M
numjobs=4
size=$QUARTER
offset_increment=$QUARTER

[seq_read]
rw=read
bs=1M
numjobs=4
size=$QUARTER
offset_increment=$QUARTER

[rand_read_qd1]
rw=randread
bs=4k
size=$SIZE_BYTES
time_based=1
runtime=$SECS
percentile_list=50:99

[rand_read_4jobs]
rw=randread
bs=4k
numjobs=4
size=$SIZE_BYTES
time_based=1
runtime=$SECS
percentile_list=50:99
EOF
}

# run_fio NAME FILE [ENV...]: fio with the jobs above on FILE, JSON to $WORK/NAME.json.
run_fio() {
  local name=$1 file=$2
  shift 2
  fio_jobs "$file" >"$WORK/$name.fio"
  echo "==> fio ($name) on $file"
  if ! env "$@" fio --output-format=json --output="$WORK/$name.json" "$WORK/$name.fio" 2>"$WORK/$name.err"; then
    cat "$WORK/$name.err" >&2
    die "fio ($name) failed"
  fi
}

run_fio mount "$MNT/fio.data"
rm -f "$MNT/fio.data"
if [[ -f $IL ]]; then
  run_fio il "$MNT/fio-il.data" LD_PRELOAD="$IL" PEREGRINE_IL_REPORT=1
  # fio runs its jobs as threads (thread=1), so the report covers all of them;
  # (b) means nothing unless the library really carried the data.
  report=$(grep "peregrine-il.*intercepted" "$WORK/il.err" || true)
  echo "$report"
  [[ $report =~ reads=[1-9] && $report =~ writes=[1-9] ]] ||
    die "the interception library did not intercept fio's reads and writes: ${report:-no report}"
  rm -f "$MNT/fio-il.data"
else
  echo "==> interception library not built: skipped ($IL is absent)"
fi

echo "==> peregrine-mdtest on $MNT ($THREADS threads x $ITEMS files)"
# Its own table goes to a file; the summary below repeats it.
"$MDTEST" --dir "$MNT" --threads "$THREADS" --items "$ITEMS" --json-out "$WORK/mdtest.json" >"$WORK/mdtest.out"

# The engine is done: stop it before raw fio so they do not compete for the disk.
unmount
engines_stop

if ((RAW)); then
  truncate -s "$DEVICE_SIZE" "$WORK/raw.img"
  run_fio raw "$WORK/raw.img"
  # Peregrine acknowledges a write once it is durable (fdatasync); plain fio
  # writes are not. The same sequential writes with an fdatasync after each
  # one, on a fresh sparse file, give the durable reference (c').
  rm -f "$WORK/raw.img"
  truncate -s "$DEVICE_SIZE" "$WORK/raw.img"
  echo "==> fio (raw, fdatasync after each write) on $WORK/raw.img"
  fio_jobs "$WORK/raw.img" | sed -n '1,/^\[seq_read\]/p' | sed '$d' >"$WORK/rawsync.fio"
  echo "fdatasync=1" >>"$WORK/rawsync.fio"
  fio --output-format=json --output="$WORK/rawsync.json" "$WORK/rawsync.fio" 2>"$WORK/rawsync.err" ||
    die "fio (raw, fdatasync) failed: $(cat "$WORK/rawsync.err")"
fi

# ---- the table and the JSON ----
mkdir -p "$RESULTS"
python3 - "$WORK" "$RESULTS/posix.json" "$SIZE" "$SECS" <<'PY'
import json, os, sys
work, out, size, secs = sys.argv[1:5]
def load(name):
    p = os.path.join(work, name + ".json")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        txt = f.read()
    return json.loads(txt[txt.index("{"):])  # fio may print notes before the JSON
def fio_metrics(doc):
    if doc is None:
        return None
    jobs = {j["jobname"]: j for j in doc["jobs"]}
    def pct(j, side, p):
        return j[side]["clat_ns"]["percentile"].get(p, 0) / 1000.0
    m = {}
    m["seq write 1MiB x4 (MB/s)"] = jobs["seq_write"]["write"]["bw_bytes"] / 1e6
    m["seq read 1MiB x4 (MB/s)"] = jobs["seq_read"]["read"]["bw_bytes"] / 1e6
    q1 = jobs["rand_read_qd1"]["read"]
    m["rand read 4KiB QD1 (IOPS)"] = q1["iops"]
    m["rand read 4KiB QD1 p50 (us)"] = pct(jobs["rand_read_qd1"], "read", "50.000000")
    m["rand read 4KiB QD1 p99 (us)"] = pct(jobs["rand_read_qd1"], "read", "99.000000")
    m["rand read 4KiB 4 jobs (IOPS)"] = jobs["rand_read_4jobs"]["read"]["iops"]
    return m
cols = {"mount": fio_metrics(load("mount")), "mount+il": fio_metrics(load("il")),
        "raw": fio_metrics(load("raw"))}
rows = list(cols["mount"].keys())
def fmt(v):
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"
hdr = f"{'test':<30} {'(a) mount':>10} {'(b) mount+il':>13} {'(c) raw':>10} {'a/c':>6} {'b/c':>6}"
print("\nPOSIX: peregrine-fuse mount vs raw device file (fio, O_DIRECT, psync; ratio = share of raw)")
print(hdr)
print("-" * len(hdr))
result = {"size": size, "secs": secs, "fio": {}, "mdtest": None}
for r in rows:
    vals = {k: (c or {}).get(r) for k, c in cols.items()}
    lat = "(us)" in r
    def ratio(x):
        raw = vals["raw"]
        if x is None or raw is None or x == 0 or raw == 0:
            return None
        return raw / x if lat else x / raw
    ra, rb = ratio(vals["mount"]), ratio(vals["mount+il"])
    print(f"{r:<30} {fmt(vals['mount']):>10} {fmt(vals['mount+il']):>13} {fmt(vals['raw']):>10} "
          f"{'-' if ra is None else f'{ra:.2f}':>6} {'-' if rb is None else f'{rb:.2f}':>6}")
    result["fio"][r] = {"mount": vals["mount"], "mount_il": vals["mount+il"], "raw": vals["raw"],
                        "mount_ratio": ra, "mount_il_ratio": rb}
sync = load("rawsync")
if sync:
    durable = {j["jobname"]: j for j in sync["jobs"]}["seq_write"]["write"]["bw_bytes"] / 1e6
    b = cols["mount+il"] and cols["mount+il"]["seq write 1MiB x4 (MB/s)"]
    a = cols["mount"]["seq write 1MiB x4 (MB/s)"]
    name = "(c') raw, fdatasync each write"
    rb = "-" if not b else f"{b / durable:.2f}"
    print(f"{name:<30} {'':>10} {'':>13} {fmt(durable):>10} {a / durable:>6.2f} {rb:>6}"
          "   (seq write made durable, as Peregrine's are)")
    result["fio"]["seq write 1MiB x4, raw with fdatasync (MB/s)"] = {
        "raw_fdatasync": durable, "mount_ratio": a / durable,
        "mount_il_ratio": b / durable if b else None}
md = load("mdtest")
if md:
    result["mdtest"] = md
    print(f"\nmdtest on the mount: {md['threads']} threads x {md['items_per_thread']} files, ops/s")
    runs = []
    for x in md["results"]:
        k = (x["size"], x["layout"])
        if k not in runs:
            runs.append(k)
    names = [("empty" if s == 0 else f"{s}B") + " " + l for s, l in runs]
    print(f"{'phase':<8}" + "".join(f" {n:>14}" for n in names))
    for ph in ["create", "stat", "read", "delete"]:
        vals = {(x["size"], x["layout"]): x["ops_per_sec"] for x in md["results"] if x["phase"] == ph}
        print(f"{ph:<8}" + "".join(f" {vals[k]:>14.0f}" for k in runs))
if cols["mount+il"] is None:
    print("\n(b): interception library not built: skipped")
with open(out, "w") as f:
    json.dump(result, f, indent=2)
    f.write("\n")
PY
echo "==> wrote $RESULTS/posix.json"
