#!/usr/bin/env bash
# What the data-plane access checks cost (issue 20, point 7), in one run.
#
# For each of --rounds rounds, starts local engines with `access_checks: true`
# and runs peregrine-bench, then with `access_checks: false` and runs it again
# (odd rounds on then off, even rounds off then on, to cancel drift); same
# engines, pool, container and object class as bench/run.sh, fresh engines and
# device files for every run. Prints one table: each line's median with the
# checks on and off and their ratio (1.00 = no cost; 0.97 = 3% loss).
# Results: bench/results/access.json. Engines are stopped on any exit. Then
# the check alone (cargo bench -p peregrine-engine --bench access_check),
# against the engine's time per request at the fastest line's rate.
#
#   bench/access.sh [--rounds 3] [--secs 10] [--size 1GiB] [--device-size 8GiB]
#                   [--dir /var/tmp] [--transport auto|tcp|shm] [--engines 1]
#                   [--oclass S1] [--max-loss 3] [--tests seq,rand,lat,small] [--no-build]
#
# --tests picks peregrine-bench's tests (rand and lat read the data seq
# writes), e.g. `--tests small --rounds 15` to look again at one line.
# The small-value test runs --small-ops operations each way (default:
# 20,000 per second of --secs; peregrine-bench's own 40,000 fetches take
# a third of a second here, too short a window on a shared VM).
#
# Needs python3 (it formats the table) and a filesystem with O_DIRECT for --dir.
set -euo pipefail

BENCH_NAME=access
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BENCH="$BIN/peregrine-bench"

ROUNDS=3
COUNT=1
SIZE=1GiB
SECS=10
DEVICE_SIZE=8GiB
TARGETS=2
OCLASS=S1
TRANSPORT=${PEREGRINE_TRANSPORT:-auto}
MAX_LOSS=3
TESTS=seq,rand,lat,small
SMALL_OPS=

while (($#)); do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --engines) COUNT=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --secs) SECS=$2; shift 2 ;;
    --device-size) DEVICE_SIZE=$2; shift 2 ;;
    --dir) PARENT=$2; shift 2 ;;
    --oclass) OCLASS=$2; shift 2 ;;
    --transport) TRANSPORT=$2; shift 2 ;;
    --max-loss) MAX_LOSS=$2; shift 2 ;;
    --tests) TESTS=$2; shift 2 ;;
    --small-ops) SMALL_OPS=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown option $1" ;;
  esac
done
want_positive --rounds "$ROUNDS"
want_positive --engines "$COUNT"
[[ $SECS =~ ^[0-9]+$ ]] || die "--secs wants whole seconds, got $SECS"
: "${SMALL_OPS:=$((SECS * 20000))}"
want_positive --small-ops "$SMALL_OPS"
want_percent --max-loss "$MAX_LOSS"
use_transport "$TRANSPORT"

bench_build peregrine-engine peregrine-cli peregrine-bench -- "$PEREGRINE" "$ENGINE" "$BENCH"
command -v python3 >/dev/null || die "python3 not found (it formats the table)"
engines_check_ports_free || die "refusing to start"
SIZE_BYTES=$(bytes_of "$SIZE") || die "--size: cannot parse $SIZE"
DEVICE_BYTES=$(bytes_of "$DEVICE_SIZE") || die "--device-size: cannot parse $DEVICE_SIZE"
# BENCH_TOP keeps every run's results; each run gets a fresh WORK under it (device files,
# certificates, configs, logs), removed once the run is done.
bench_workdir peregrine-access
TOP=$BENCH_TOP

# CPU counters of /proc/stat: "total steal" in clock ticks.
cpu_ticks() {
  local _cpu user nice system idle iowait irq softirq steal _rest
  read -r _cpu user nice system idle iowait irq softirq steal _rest </proc/stat
  echo "$((user + nice + system + idle + iowait + irq + softirq + steal)) $steal"
}

# one_run ROUND on|off: fresh engines with the checks on or off, pool,
# container, peregrine-bench, engines stopped. Results in $TOP/ROUND-MODE.json.
one_run() {
  local round=$1 mode=$2 checks t0 s0 t1 s1 load calls
  [[ $mode == on ]] && checks=true || checks=false
  WORK="$TOP/run-$round-$mode"
  mkdir -p "$WORK"
  engines_check_ports_free || die "refusing to start"
  echo "==> round $round, access_checks: $checks: $COUNT engine(s), $DEVICE_SIZE sparse device each, $TARGETS targets, in $WORK"
  ENGINES_EXTRA="access_checks: $checks" engines_start "$COUNT" "$DEVICE_SIZE" "$TARGETS" 1GiB
  grep -qx "access_checks: $checks" "$WORK/engine0.yaml" || die "engine config lacks access_checks: $checks"
  engines_up "$COUNT" || die "engines did not come up"
  "$PEREGRINE" pool create bench --scm-size "$((256 * 1024 * 1024 * COUNT))" \
    --nvme-size "$((DEVICE_BYTES * COUNT / 2))" >/dev/null
  "$PEREGRINE" cont create bench raw --oclass "$OCLASS" --checksum off >/dev/null
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  read -r t0 s0 < <(cpu_ticks)
  # Its progress lines (stderr) end with the transport's call counts, kept for the summary.
  if ! "$BENCH" --pool bench --cont raw --tests "$TESTS" --small-ops "$SMALL_OPS" --seq-bytes "$SIZE_BYTES" --rand-secs "$SECS" --lat-secs "$SECS" \
    --json-out "$TOP/$round-$mode.json" 2>"$WORK/bench.err"; then
    cat "$WORK/bench.err" >&2
    die "peregrine-bench failed (round $round, checks $mode)"
  fi
  read -r t1 s1 < <(cpu_ticks)
  cat "$WORK/bench.err" >&2
  calls=$(sed -n 's/^peregrine-bench: transport [A-Za-z]*: //p' "$WORK/bench.err")
  engines_stop
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$mode" "$load" "$((t1 - t0))" "$((s1 - s0))" "${calls:--}" >>"$TOP/runs.tsv"
  rm -rf "$WORK"
  WORK=$TOP
}

echo "==> $ROUNDS round(s), transport $TRANSPORT, oclass $OCLASS, $SIZE data set, ${SECS}s random tests; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for ((round = 1; round <= ROUNDS; round++)); do
  if ((round % 2)); then order=(on off); else order=(off on); fi
  for mode in "${order[@]}"; do
    one_run "$round" "$mode"
  done
done
echo "==> done; load average $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- the table ----
mkdir -p "$RESULTS"
echo
echo "Access checks on vs off ($COUNT engine(s), oclass $OCLASS, $SIZE data set, transport $TRANSPORT, $ROUNDS round(s); ratio = on/off for rates, off/on for latencies: 1.00 = no cost, below $(python3 -c "print(f'{1 - $MAX_LOSS / 100:.2f}')") = more than $MAX_LOSS% loss)"
python3 - "$TOP" "$RESULTS/access.json" "$MAX_LOSS" "$COUNT" "$OCLASS" "$SIZE" "$SECS" "$TRANSPORT" "$DEVICE_SIZE" <<'PY'
import json, statistics, sys

top, out, max_loss = sys.argv[1], sys.argv[2], float(sys.argv[3])
count, oclass, size, secs, transport, device_size = sys.argv[4:10]

runs = []
for line in open(f"{top}/runs.tsv"):
    rnd, mode, load, ticks, steal, calls = line.rstrip("\n").split("\t")
    runs.append({
        "round": int(rnd), "access_checks": mode == "on", "load_average": load,
        "steal_pct": round(100 * int(steal) / max(int(ticks), 1), 1), "calls": calls,
        "results": json.load(open(f"{top}/{rnd}-{mode}.json")),
    })

# (test, unit, how to get it from a result, lower is better)
def get(*path):
    def f(r):
        for p in path:
            r = r.get(p) if isinstance(r, dict) else None
        return r
    return f

qd = next((r["results"]["rand_read"]["queue_depth"] for r in runs if "rand_read" in r["results"]), 32)
small = next((r["results"]["small"]["value_bytes"] for r in runs if "small" in r["results"]), 64)
LINES = [
    ("seq write 1MiB x4", "MB/s", get("seq_write", "mbps"), False),
    ("seq read 1MiB x4", "MB/s", get("seq_read", "mbps"), False),
    (f"rand read 4KiB QD{qd}", "IOPS", get("rand_read", "iops"), False),
    ("read 4KiB QD1 p50", "us", get("latency", "p50_us"), True),
    ("read 4KiB QD1 p99", "us", get("latency", "p99_us"), True),
    ("read 4KiB QD1 mean", "us", get("latency", "mean_us"), True),
    (f"small update {small}B", "ops/s", get("small", "update_ops"), False),
    (f"small fetch {small}B", "ops/s", get("small", "fetch_ops"), False),
]

def ratio(on, off, lower):
    if not on or not off:
        return None
    return off / on if lower else on / off

def fmt(v):
    if v is None:
        return "-"
    return f"{v:.1f}" if abs(v) < 100 else f"{v:,.0f}"

floor = 1 - max_loss / 100
rows = []
for test, unit, f, lower in LINES:
    on = {r["round"]: f(r["results"]) for r in runs if r["access_checks"]}
    off = {r["round"]: f(r["results"]) for r in runs if not r["access_checks"]}
    on_v = [v for v in on.values() if v is not None]
    off_v = [v for v in off.values() if v is not None]
    if not on_v or not off_v:
        continue
    mon, moff = statistics.median(on_v), statistics.median(off_v)
    per_round = [ratio(on.get(k), off.get(k), lower) for k in sorted(on)]
    paired = [v for v in per_round if v is not None]
    r = ratio(mon, moff, lower)
    rows.append({
        "test": test, "unit": unit, "lower_is_better": lower,
        "on": [on[k] for k in sorted(on)], "off": [off[k] for k in sorted(off)],
        "on_median": mon, "off_median": moff, "ratio": r,
        "ratio_per_round": per_round,
        "ratio_per_round_median": statistics.median(paired) if paired else None,
        "within": r is not None and r >= floor,
    })

head = ["test", "unit", "on (median)", "off (median)", "ratio", "ratio per round", "their median", "verdict"]
cells = [[
    x["test"], x["unit"], fmt(x["on_median"]), fmt(x["off_median"]),
    f"{x['ratio']:.3f}" if x["ratio"] is not None else "-",
    ", ".join(f"{v:.2f}" if v is not None else "-" for v in x["ratio_per_round"]),
    f"{x['ratio_per_round_median']:.3f}" if x["ratio_per_round_median"] is not None else "-",
    "ok" if x["within"] else f"LOSS > {max_loss:g}%",
] for x in rows]
w = [max(len(c[i]) for c in [head] + cells) for i in range(len(head))]
right = {2, 3, 4, 6}
def line(c):
    print("  ".join(s.rjust(w[i]) if i in right else s.ljust(w[i]) for i, s in enumerate(c)).rstrip())
line(head)
line(["-" * n for n in w])
for c in cells:
    line(c)

print()
print("runs (in order):")
for r in runs:
    print(f"  round {r['round']} checks {'on ' if r['access_checks'] else 'off'}  "
          f"load average {r['load_average']}  steal {r['steal_pct']}%  {r['calls']}")
ok = all(x["within"] for x in rows)
bad = [x["test"] for x in rows if not x["within"]]
print()
print(f"every line within {max_loss:g}%: {'yes' if ok else 'no (' + ', '.join(bad) + ')'}")

with open(out, "w") as fh:
    json.dump({
        "config": {"engines": int(count), "oclass": oclass, "size": size, "secs": int(secs),
                   "transport": transport, "device_size": device_size, "rounds": max(r["round"] for r in runs),
                   "max_loss_pct": max_loss,
                   "ratio": "on/off for rates, off/on for latencies; 1.0 = no cost"},
        "rows": rows, "all_within": ok, "runs": runs,
    }, fh, indent=2)
    fh.write("\n")
PY
echo "==> wrote $RESULTS/access.json"

# The check alone, apart from the noise of whole runs: what it costs per
# request against the engine's CPU time per request at the fastest line.
FASTEST=$(python3 -c 'import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
print(max(x["off_median"] for x in rows if x["unit"] in ("IOPS", "ops/s")))' "$RESULTS/access.json")
echo
echo "==> cargo bench -p peregrine-engine --bench access_check -- --per-second $FASTEST"
(cd "$ROOT/engine" && cargo bench -q -p peregrine-engine --bench access_check -- --per-second "$FASTEST") ||
  die "the access_check benchmark failed"
