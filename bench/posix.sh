#!/usr/bin/env bash
# POSIX access to Peregrine next to the raw device, in one run on this machine.
#
# Starts one engine (2 targets, a device file), creates pool `posix` and a POSIX
# container `fs` (object class SX, crc32c checksums), mounts it with peregrine-fuse, and
# runs the same fio jobs through (a) the mount, (b) the mount with LD_PRELOAD of the
# interception library (if engine/target/release/libperegrine_il.so exists), and (c) on
# a raw device file of the same kind in the same directory (engine idle); the
# sequential writes also with an fdatasync after each write, through the library (b')
# and on the raw file (c'); then peregrine-mdtest on the mount, on the mount through the
# library (LD_PRELOAD: its path calls, issue 19 point 6) and on a local directory of
# --dir's file system (ext4 here), one after the other. The sequential jobs run
# --rounds times, the paths one after the other in each round, so that each round's
# ratios compare runs seconds apart (the speed of a VM's disk and CPUs changes from
# minute to minute: the table shows the CPU time the hypervisor stole during each run). Prints one table; writes
# bench/results/posix.json. The mount and the engine are stopped on any exit.
#
# The device files (the engine's and the raw one) are written in full with zeros first, as
# an NVMe namespace has all its blocks; --sparse leaves them sparse (then every fdatasync after
# writes into fresh blocks also commits the file system's journal, on both sides).
#
#   bench/posix.sh [--size 1GiB] [--secs 10] [--rounds 8] [--device-size 8GiB] [--sparse]
#                  [--dir /var/tmp] [--items 1000] [--threads 4] [--procs 1] [--md-sizes 0,3901]
#                  [--md-layout unique,shared] [--md-rounds 1] [--md-gap-ms 0] [--md-only] [--no-build] [--no-raw]
#                  [--io-uring on|off|auto]
#
# The mount takes the kernel's requests over FUSE over io_uring where the kernel has it (the
# daemon turns fuse.enable_uring on; --io-uring off: /dev/fuse). mdtest also runs on a second
# mount of the same container over /dev/fuse ("mount /dev/fuse"), so that the table compares
# the two transports in one run.
#
# mdtest runs --procs processes of --threads threads, --items files each per phase;
# --md-rounds times, the three paths one after the other in each round (the table shows
# each cell's median and, over several rounds, its range: one run on this VM varies by
# half). --md-only skips fio (the metadata table alone). The issue's metadata goal:
#   bench/posix.sh --md-only --procs 2 --threads 1 --items 5000 --md-sizes 3901 --md-layout unique --md-rounds 5
# --md-gap-ms waits that long between mdtest's phases (peregrine-mdtest --gap-ms): past the
# library's and the kernel's cache bounds (1000 ms), each phase finds no cached entry.
#
# Needs fio, fuse3 (hack/install-deps.sh installs them), python3 (for the table), /dev/fuse,
# and a filesystem with O_DIRECT for --dir (not tmpfs).
set -euo pipefail

BENCH_NAME=posix-bench
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
MDTEST="$BIN/peregrine-mdtest"
IL="$BIN/libperegrine_il.so"

SIZE=1GiB
SECS=10
ROUNDS=8
DEVICE_WRITTEN=1
DEVICE_SIZE=8GiB
TARGETS=2
ITEMS=1000
THREADS=4
PROCS=1
MD_SIZES=0,3901
MD_LAYOUT=unique,shared
MD_ONLY=0
MD_ROUNDS=1
MD_GAP_MS=0
RAW=1

while (($#)); do
  case $1 in
    --size) SIZE=$2; shift 2 ;;
    --secs) SECS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --device-size) DEVICE_SIZE=$2; shift 2 ;;
    --dir) PARENT=$2; shift 2 ;;
    --items) ITEMS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --procs) PROCS=$2; shift 2 ;;
    --md-sizes) MD_SIZES=$2; shift 2 ;;
    --md-layout) MD_LAYOUT=$2; shift 2 ;;
    --md-only) MD_ONLY=1; shift ;;
    --md-rounds) MD_ROUNDS=$2; shift 2 ;;
    --md-gap-ms) MD_GAP_MS=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --no-raw) RAW=0; shift ;;
    --sparse) DEVICE_WRITTEN=0; shift ;;
    --io-uring) want_io_uring "$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown option $1" ;;
  esac
done
[[ $SECS =~ ^[1-9][0-9]*$ ]] || die "--secs wants whole seconds, got $SECS"
want_positive --rounds "$ROUNDS"
want_positive --items "$ITEMS"
want_positive --threads "$THREADS"
want_positive --procs "$PROCS"
want_positive --md-rounds "$MD_ROUNDS"
[[ $MD_GAP_MS =~ ^[0-9]+$ ]] || die "--md-gap-ms wants whole milliseconds, got $MD_GAP_MS"
((MD_ONLY)) && RAW=0

bench_build peregrine-engine peregrine-cli peregrine-bench peregrine-fuse peregrine-il \
  -- "$PEREGRINE" "$ENGINE" "$FUSE" "$MDTEST"
command -v fio >/dev/null || die "fio not found: run hack/install-deps.sh"
command -v python3 >/dev/null || die "python3 not found (it formats the table)"
[[ -e /dev/fuse ]] || die "/dev/fuse is missing: no FUSE on this machine"
engines_check_ports_free || die "refusing to start"
SIZE_BYTES=$(bytes_of "$SIZE") || die "--size: cannot parse $SIZE"
DEVICE_BYTES=$(bytes_of "$DEVICE_SIZE") || die "--device-size: cannot parse $DEVICE_SIZE"
QUARTER=$((SIZE_BYTES / 4))

# ---- work directory, and the mount removed before the engine stops ----
bench_workdir peregrine-posix
bench_before_stop() {
  if (($1 != 0)) && [[ -s $WORK/mnt.log ]]; then
    echo "--- $WORK/mnt.log" >&2
    tail -n 15 "$WORK/mnt.log" >&2
  fi
  bench_unmount
}

# ---- engine, pool, container, mount ----
echo "==> 1 engine, $DEVICE_SIZE device ($( ((DEVICE_WRITTEN)) && echo written || echo sparse)), $TARGETS targets, in $WORK"
engines_start 1 "$DEVICE_SIZE" "$TARGETS" 1GiB
engines_up 1 || die "engine did not come up"
"$PEREGRINE" pool create posix --scm-size $((256 * 1024 * 1024)) --nvme-size $((DEVICE_BYTES / 2)) >/dev/null
"$PEREGRINE" cont create posix fs --type POSIX --oclass SX --checksum crc32c >/dev/null
bench_mount posix fs
echo "==> pool posix, container fs (POSIX, oclass SX, crc32c) mounted on $MNT"
# Offset+bytes of each target's data blocks in the device file, from the engine's log (for (c'')).
DATA_REGIONS=$(grep -o 'data_regions=[0-9+,]*' "$WORK/engine0.log" | tail -n 1 | cut -d= -f2)
[[ -n $DATA_REGIONS ]] || ((!RAW)) || die "the engine's log does not say where its data regions are"

# ---- fio jobs, the same for every path ----
# All O_DIRECT (no page cache on either side), psync, one file.
fio_global() {
  cat <<EOF
[global]
filename=$1
direct=1
ioengine=psync
group_reporting=1
stonewall
thread=1
EOF
}
# Sequential write then read, 1 MiB, 4 jobs each on its quarter.
seq_jobs() {
  fio_global "$1"
  cat <<EOF

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
EOF
}
# The same writes with an fdatasync after each one: each write survives a power cut
# before the next starts ((c') on the raw file, (b') through the library).
seq_jobs_durable() {
  seq_jobs "$1" | sed '/^\[seq_read\]/,$d'
  echo "fdatasync=1"
}
# The same writes where the engine's targets put theirs, (c''): each target's
# first-fit allocator fills its data region from the start, so write job k goes
# to target k mod T's region, after the jobs before it there. (A virtual disk's
# host may serve a small span of rewritten blocks faster, which favours (c).)
seq_jobs_placed() {
  local regions k
  IFS=, read -ra regions <<<"$DATA_REGIONS"
  # No stonewall: the four jobs run at once, reported as one group named after the first.
  fio_global "$1" | sed '/^stonewall$/d'
  for ((k = 0; k < 4; k++)); do
    cat <<EOF

[seq_write$( ((k)) && echo "_$k")]
rw=write
bs=1M
size=$QUARTER
offset=$((${regions[k % ${#regions[@]}]%+*} + k / ${#regions[@]} * QUARTER))
EOF
  done
}
# 4 KiB random reads at QD1 and 4 jobs x QD1, over a data set laid down first.
rand_jobs() {
  fio_global "$1"
  cat <<EOF

[fill]
rw=write
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

# Steal ticks and all ticks of the cpu line of /proc/stat, and the CPU ticks
# (user + system) the engine and the FUSE daemon have used.
cpu_ticks() {
  local ours=0 pid
  for pid in "${ENGINE_PIDS[@]}" $FUSE_PID; do
    ours=$((ours + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)))
  done
  awk -v ours="$ours" '/^cpu /{t=0; for (i=2; i<=NF; i++) t+=$i; print $9, t, ours}' /proc/stat
}

# The raw device file: written once, or (--sparse) a fresh sparse one before each run.
fresh_raw() {
  rm -f "$WORK/raw.img"
  device_file "$WORK/raw.img" "$DEVICE_SIZE"
}

# run_fio NAME JOBS FILE [ENV...]: fio with the jobs that function JOBS prints, on
# FILE (a file in the mount is removed before and after), JSON to
# $WORK/NAME.json, the per mille of CPU time the hypervisor stole meanwhile to
# $WORK/NAME.steal, and the CPU seconds the engine and the daemon used to $WORK/NAME.cpu.
run_fio() {
  local name=$1 jobs=$2 file=$3 s0 t0 o0 s1 t1 o1
  shift 3
  "$jobs" "$file" >"$WORK/$name.fio"
  if [[ $file == "$WORK/raw.img" ]]; then
    ((DEVICE_WRITTEN)) || fresh_raw
  else
    rm -f "$file"
  fi
  echo "==> fio $name on $file"
  read -r s0 t0 o0 < <(cpu_ticks)
  if ! env "$@" fio --output-format=json --output="$WORK/$name.json" "$WORK/$name.fio" 2>"$WORK/$name.err"; then
    cat "$WORK/$name.err" >&2
    die "fio ($name) failed"
  fi
  read -r s1 t1 o1 < <(cpu_ticks)
  echo $(((s1 - s0) * 1000 / (t1 - t0 + 1))) >"$WORK/$name.steal"
  echo "$o0 $o1 $(getconf CLK_TCK)" | awk '{print ($2 - $1) / $3}' >"$WORK/$name.cpu"
  [[ $file == "$WORK/raw.img" ]] || rm -f "$file"
}

# run_il NAME JOBS: run_fio through the interception library, which must have
# carried the data (fio runs its jobs as threads, so the report covers them all).
run_il() {
  run_fio "$1" "$2" "$MNT/fio-il.data" LD_PRELOAD="$IL" PEREGRINE_IL_REPORT=1
  local report reads=1
  report=$(grep "peregrine-il.*intercepted" "$WORK/$1.err" || true)
  echo "$report"
  grep -q "^rw=.*read" "$WORK/$1.fio" || reads=0
  [[ $report =~ writes=[1-9] ]] && { ((!reads)) || [[ $report =~ reads=[1-9] ]]; } ||
    die "the interception library did not intercept fio's reads and writes: ${report:-no report}"
}

# The raw runs leave the engine up but idle: it has no I/O of its own to do
# (no request comes in), and keeping it lets each round put the paths side by side.
if ((RAW && DEVICE_WRITTEN)); then
  echo "==> raw device file: $DEVICE_SIZE written with zeros"
  fresh_raw
fi
HAVE_IL=0
[[ -f $IL ]] && HAVE_IL=1
((HAVE_IL)) || echo "==> interception library not built: (b) skipped ($IL is absent)"
((MD_ONLY)) && ROUNDS=0
for ((r = 1; r <= ROUNDS; r++)); do
  echo "==> sequential round $r of $ROUNDS"
  run_fio "seq-a-$r" seq_jobs "$MNT/fio.data"
  if ((HAVE_IL)); then
    run_il "seq-b-$r" seq_jobs
    run_il "seq-bs-$r" seq_jobs_durable
  fi
  if ((RAW)); then
    run_fio "seq-c-$r" seq_jobs "$WORK/raw.img"
    run_fio "seq-cs-$r" seq_jobs_durable "$WORK/raw.img"
    run_fio "seq-cp-$r" seq_jobs_placed "$WORK/raw.img"
  fi
done
if ((!MD_ONLY)); then
  run_fio rand-a rand_jobs "$MNT/fio.data"
  if ((HAVE_IL)); then run_il rand-b rand_jobs; fi
  if ((RAW)); then run_fio rand-c rand_jobs "$WORK/raw.img"; fi
fi

# run_md NAME DIR [ENV...]: peregrine-mdtest in DIR, JSON to $WORK/NAME.json, its
# stderr (the library's report lines) to $WORK/NAME.err.
run_md() {
  local name=$1 dir=$2
  shift 2
  echo "==> peregrine-mdtest ($name) in $dir: $PROCS processes x $THREADS threads x $ITEMS files"
  # Its own table goes to a file; the summary below repeats it.
  env "$@" "$MDTEST" --dir "$dir" --threads "$THREADS" --procs "$PROCS" --items "$ITEMS" \
    --sizes "$MD_SIZES" --layout "$MD_LAYOUT" --gap-ms "$MD_GAP_MS" --json-out "$WORK/$name.json" \
    >"$WORK/$name.out" 2>"$WORK/$name.err" || { cat "$WORK/$name.err" >&2; die "mdtest ($name) failed"; }
}
mkdir -p "$WORK/local-md"
DEV_MNT=
if [[ $IO_URING != off ]]; then
  DEV_MNT="$WORK/mnt-dev"
  bench_fuse posix fs "$DEV_MNT" --io-uring off
fi
echo "==> mount: $(grep -q 'FUSE over io_uring' "$MNT.log" && echo 'FUSE over io_uring' || echo /dev/fuse)${DEV_MNT:+; $DEV_MNT: /dev/fuse}"
for ((r = 1; r <= MD_ROUNDS; r++)); do
  run_md "mdtest-r$r" "$MNT"
  if [[ -n $DEV_MNT ]]; then run_md "mdtest-dev-r$r" "$DEV_MNT"; fi
  if ((HAVE_IL)); then
    run_md "mdtest-il-r$r" "$MNT" LD_PRELOAD="$IL" PEREGRINE_IL_REPORT=1
    grep "peregrine-il.*path_creates=[1-9]" "$WORK/mdtest-il-r$r.err" | tail -n "$PROCS" ||
      die "the library served no creates of mdtest: $(grep peregrine-il "$WORK/mdtest-il-r$r.err" | tail -n 3)"
  fi
  run_md "mdtest-local-r$r" "$WORK/local-md"
done
# statfs names ext2, ext3 and ext4 alike ("ext2/ext3"); the mount table tells them apart.
LOCAL_FS=$(findmnt -n -o FSTYPE --target "$WORK/local-md" 2>/dev/null || stat -f -c %T "$WORK/local-md")
bench_unmount
engines_stop

# ---- the table and the JSON ----
mkdir -p "$RESULTS"
python3 - "$WORK" "$RESULTS/posix.json" "$SIZE" "$SECS" "$ROUNDS" "$LOCAL_FS" "$MD_ONLY" "$MD_ROUNDS" <<'PY'
import json, os, statistics, sys
work, out, size, secs, rounds, local_fs, md_only, md_rounds = sys.argv[1:9]
rounds, md_rounds = int(rounds), int(md_rounds)


def load(name):
    p = os.path.join(work, name + ".json")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        txt = f.read()
    return json.loads(txt[txt.index("{"):])  # fio may print notes before the JSON


def steal(name):
    p = os.path.join(work, name + ".steal")
    return int(open(p).read()) / 10.0 if os.path.exists(p) else None


def server_cpu(name):
    p = os.path.join(work, name + ".cpu")
    return float(open(p).read()) if os.path.exists(p) else None


def fio_cpu(doc):
    # CPU seconds of fio's own threads (the client side: library, copies, checksums).
    return sum((j["usr_cpu"] + j["sys_cpu"]) / 100.0 * j["job_runtime"] / 1000.0
               for j in doc["jobs"]) if doc else None


def jobs(doc):
    return {j["jobname"]: j for j in doc["jobs"]} if doc else None


def pct(j, p):
    return j["read"]["clat_ns"]["percentile"].get(p, 0) / 1000.0


SEQ = {
    "seq write 1MiB x4 (MB/s)": lambda j: j["seq_write"]["write"]["bw_bytes"] / 1e6,
    "seq read 1MiB x4 (MB/s)": lambda j: j["seq_read"]["read"]["bw_bytes"] / 1e6,
}
RAND = {
    "rand read 4KiB QD1 (IOPS)": lambda j: j["rand_read_qd1"]["read"]["iops"],
    "rand read 4KiB QD1 p50 (us)": lambda j: pct(j["rand_read_qd1"], "50.000000"),
    "rand read 4KiB QD1 p99 (us)": lambda j: pct(j["rand_read_qd1"], "99.000000"),
    "rand read 4KiB 4 jobs (IOPS)": lambda j: j["rand_read_4jobs"]["read"]["iops"],
}
PATHS = {"a": "mount", "b": "mount_il", "c": "raw"}


def ratio(x, raw, lat):
    if x is None or raw is None or x == 0 or raw == 0:
        return None
    return raw / x if lat else x / raw


def fmt(v):
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.2f}" if v < 10 else f"{v:.1f}"


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


result = {"size": size, "secs": secs, "rounds": rounds, "fio": {}, "mdtest": None}
if md_only == "1":
    rounds = 0
print("\nPOSIX: peregrine-fuse mount vs raw device file (fio, O_DIRECT, psync)")
print("ratio = share of raw, per round (paths run seconds apart) and their median; "
      "steal = CPU time the hypervisor took, per round")
hdr = (f"{'test':<28} {'(a) mount':>10} {'(b) +il':>10} {'(c) raw':>10} "
       f"{'a/c':>6} {'b/c':>6}  {'b/c per round':<18} {'steal % per round (b, c)'}")
print(hdr)
print("-" * len(hdr))
for name, get in SEQ.items():
    per = {k: [] for k in PATHS}
    for r in range(1, rounds + 1):
        for k in PATHS:
            j = jobs(load(f"seq-{k}-{r}"))
            per[k].append(get(j) if j else None)
    ra = [ratio(a, c, False) for a, c in zip(per["a"], per["c"])]
    rb = [ratio(b, c, False) for b, c in zip(per["b"], per["c"])]
    st = [f"{fmt(steal(f'seq-b-{r}'))}/{fmt(steal(f'seq-c-{r}'))}" for r in range(1, rounds + 1)]
    m = {k: med(v) for k, v in per.items()}
    rounds_b = ", ".join(fmt(x) for x in rb)
    print(f"{name:<28} {fmt(m['a']):>10} {fmt(m['b']):>10} {fmt(m['c']):>10} "
          f"{fmt(med(ra)):>6} {fmt(med(rb)):>6}  {rounds_b:<18} {', '.join(st)}")
    result["fio"][name] = {
        **{PATHS[k]: m[k] for k in PATHS},
        **{PATHS[k] + "_rounds": per[k] for k in PATHS},
        "mount_ratio": med(ra), "mount_il_ratio": med(rb),
        "mount_il_ratio_rounds": rb,
        "steal_pct_rounds": {PATHS[k]: [steal(f"seq-{k}-{r}") for r in range(1, rounds + 1)]
                             for k in PATHS},
    }
def seq_writes(key):
    """MB/s of the seq_write job of path `key`, per round."""
    return [(lambda j: j["seq_write"]["write"]["bw_bytes"] / 1e6 if j else None)(
        jobs(load(f"seq-{key}-{r}"))) for r in range(1, rounds + 1)]


# Other raw references for the writes: (c') each write flushed before the next;
# (c'') where the engine's targets write.
for key, row, what, label, note in [
        ("cs", "seq write vs (c) + fdatasync", "raw with fdatasync", "raw_fdatasync",
         "(c'): raw writes each followed by fdatasync"),
        ("cp", "seq write vs (c) placed", "raw at the targets' offsets", "raw_placed",
         "(c''): raw writes where the engine's targets put theirs")]:
    ref = seq_writes(key)
    if all(d is None for d in ref):
        continue
    w = result["fio"]["seq write 1MiB x4 (MB/s)"]
    ra = [ratio(a, d, False) for a, d in zip(w["mount_rounds"], ref)]
    rb = [ratio(b, d, False) for b, d in zip(w["mount_il_rounds"], ref)]
    print(f"{row:<28} {'':>10} {'':>10} {fmt(med(ref)):>10} "
          f"{fmt(med(ra)):>6} {fmt(med(rb)):>6}  {', '.join(fmt(x) for x in rb):<18} {note}")
    result["fio"][f"seq write 1MiB x4, {what} (MB/s)"] = {
        label: med(ref), label + "_rounds": ref,
        "mount_ratio": med(ra), "mount_il_ratio": med(rb), "mount_il_ratio_rounds": rb}
# (b') against (c'): an fdatasync after each write on both sides, so every write
# survives a power cut before the next starts (what sync=always containers give).
bs, cs = seq_writes("bs"), seq_writes("cs")
if any(x is not None for x in bs):
    rr = [ratio(b, c, False) for b, c in zip(bs, cs)]
    print(f"{'seq write + fdatasync':<28} {'':>10} {fmt(med(bs)):>10} {fmt(med(cs)):>10} "
          f"{'':>6} {fmt(med(rr)):>6}  {', '.join(fmt(x) for x in rr):<18} (b') vs (c'): both flush each write")
    result["fio"]["seq write 1MiB x4, each followed by fdatasync (MB/s)"] = {
        "mount_il": med(bs), "raw": med(cs), "mount_il_rounds": bs, "raw_rounds": cs,
        "mount_il_ratio": med(rr), "mount_il_ratio_rounds": rr}
for name, get in RAND.items():
    lat = "(us)" in name
    v = {k: (get(jobs(load(f"rand-{k}"))) if load(f"rand-{k}") else None) for k in PATHS}
    ra, rb = ratio(v["a"], v["c"], lat), ratio(v["b"], v["c"], lat)
    st = f"{fmt(steal('rand-b'))}/{fmt(steal('rand-c'))}"
    print(f"{name:<28} {fmt(v['a']):>10} {fmt(v['b']):>10} {fmt(v['c']):>10} "
          f"{fmt(ra):>6} {fmt(rb):>6}  {'(one round)':<18} {st}")
    result["fio"][name] = {**{PATHS[k]: v[k] for k in PATHS},
                           "mount_ratio": ra, "mount_il_ratio": rb}

# CPU seconds a round of the sequential jobs (--size written, then read) costs,
# whatever the VM's speed: the engine's and the daemon's, and fio's own (the
# client side: library, copies, checksums).
cpu = {}
for k in ["a", "b", "c"]:
    srv = med([server_cpu(f"seq-{k}-{r}") for r in range(1, rounds + 1)])
    cli = med([fio_cpu(load(f"seq-{k}-{r}")) for r in range(1, rounds + 1)])
    cpu[PATHS[k]] = {"engine_daemon_s": srv, "fio_s": cli}
result["cpu_seconds_per_seq_round"] = cpu
print("CPU s per round of seq write + read (median): " + ", ".join(
    f"({k}) engine+daemon {fmt(cpu[PATHS[k]]['engine_daemon_s'])} fio {fmt(cpu[PATHS[k]]['fio_s'])}"
    for k in ["a", "b", "c"]))

# mdtest: one row per phase and path (mount, mount through the library, local
# directory), one column per (size, layout): the median over the rounds and, over
# several, the range; the library's share of the local rate (of the medians).
def load_rounds(name):
    docs = [load(f"{name}-r{r}") for r in range(1, md_rounds + 1)]
    return [d for d in docs if d]


mds = {"mount": load_rounds("mdtest"), "mount /dev/fuse": load_rounds("mdtest-dev"),
       "mount + il": load_rounds("mdtest-il"), f"local {local_fs}": load_rounds("mdtest-local")}
if mds["mount"]:
    md = mds["mount"][0]
    result["mdtest"] = {k: v for k, v in mds.items() if v}
    print(f"\nmdtest: {md.get('procs', 1)} processes x {md['threads']} threads x "
          f"{md['items_per_thread']} files, ops/s, median of {md_rounds} round(s)"
          + (" [min-max]" if md_rounds > 1 else "")
          + "; il/local = the library's share of the local rate")
    runs = []
    for x in md["results"]:
        k = (x["size"], x["layout"])
        if k not in runs:
            runs.append(k)
    names = [("empty" if s == 0 else f"{s}B") + " " + l for s, l in runs]
    width = 24 if md_rounds > 1 else 14
    print(f"{'phase':<8} {'path':<16}" + "".join(f" {n:>{width}}" for n in names))

    def cell(xs):
        m = statistics.median(xs)
        return f"{m:.0f}" + (f" [{min(xs):.0f}-{max(xs):.0f}]" if len(xs) > 1 else "")

    for ph in ["create", "stat", "read", "delete"]:
        medians = {}
        for path, docs in mds.items():
            if not docs:
                continue
            per = {k: [x["ops_per_sec"] for d in docs for x in d["results"]
                       if x["phase"] == ph and (x["size"], x["layout"]) == k] for k in runs}
            medians[path] = {k: statistics.median(v) for k, v in per.items()}
            print(f"{ph:<8} {path:<16}" + "".join(f" {cell(per[k]):>{width}}" for k in runs))
        il, loc = medians.get("mount + il"), medians.get(f"local {local_fs}")
        if il and loc:
            print(f"{ph:<8} {'il/local':<16}" + "".join(f" {il[k] / loc[k]:>{width}.2f}" for k in runs))
    # How many of the library's reads its own writes answered (data_cache.rs), from
    # the report lines of its runs: the read row is a page-cache-like rate then.
    counts = {"reads": 0, "cached_reads": 0}
    for r in range(1, md_rounds + 1):
        p = os.path.join(work, f"mdtest-il-r{r}.err")
        for line in open(p) if os.path.exists(p) else []:
            if line.startswith("peregrine-il["):
                for kv in line.split():
                    k, _, v = kv.partition("=")
                    if k in counts and v.isdigit():
                        counts[k] += int(v)
    if counts["reads"]:
        result["mdtest_il_reads"] = counts
        print(f"library: {counts['cached_reads']} of {counts['reads']} reads answered from the "
              "process's own writes (PEREGRINE_IL_DATA_CACHE_MB=0 turns that off)")
with open(out, "w") as f:
    json.dump(result, f, indent=2)
    f.write("\n")
PY
echo "==> wrote $RESULTS/posix.json"
