#!/usr/bin/env bash
# The small-value lines of bench/access.sh (issue 20, point 7), measured side by side.
#
# bench/access.sh compares whole runs on fresh engines, one after the other; on this 2-vCPU VM
# such runs move by 10-30%, and its small update and fetch lines (tens of thousands of tiny
# requests, the lines where a per-request check weighs most) cannot tell a 3% cost from none.
# Here one system of two engines runs throughout: one with `access_checks: true`, the other with
# `access_checks: false`, a pool on each (--ranks), and peregrine-bench's small-paired test
# switches the same threads between the two containers every block of a few tens of
# milliseconds (A B B A ...), so the machine's drift weighs on both sides alike. Each round
# starts the engines afresh with the roles swapped (odd rounds: rank 0 checks, even: rank 1), so
# that what differs between the two engines (rank 0 hosts the management service) cancels too.
# Prints, per line, the ratio checked/unchecked of each round, their median and the ratio of the
# rates over all rounds; results in bench/results/access-paired.json.
#
#   bench/access-paired.sh [--rounds 6] [--ops 400000] [--blocks 40] [--threads 4]
#                          [--device-size 8GiB] [--dir /var/tmp] [--transport auto|tcp|shm]
#                          [--max-loss 3] [--no-build]
#
# --ops: small operations of each kind per side and round (split among --blocks blocks).
set -euo pipefail

BENCH_NAME=access-paired
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BENCH="$BIN/peregrine-bench"

ROUNDS=6
OPS=400000
BLOCKS=40
THREADS=4
DEVICE_SIZE=8GiB
TARGETS=2
TRANSPORT=${PEREGRINE_TRANSPORT:-auto}
MAX_LOSS=3

while (($#)); do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --ops) OPS=$2; shift 2 ;;
    --blocks) BLOCKS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --device-size) DEVICE_SIZE=$2; shift 2 ;;
    --dir) PARENT=$2; shift 2 ;;
    --transport) TRANSPORT=$2; shift 2 ;;
    --max-loss) MAX_LOSS=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown option $1" ;;
  esac
done
want_positive --rounds "$ROUNDS"
want_positive --ops "$OPS"
want_positive --blocks "$BLOCKS"
want_positive --threads "$THREADS"
want_percent --max-loss "$MAX_LOSS"
use_transport "$TRANSPORT"

bench_build peregrine-engine peregrine-cli peregrine-bench -- "$PEREGRINE" "$ENGINE" "$BENCH"
command -v python3 >/dev/null || die "python3 not found (it formats the table)"
engines_check_ports_free || die "refusing to start"
DEVICE_BYTES=$(bytes_of "$DEVICE_SIZE") || die "--device-size: cannot parse $DEVICE_SIZE"
bench_workdir peregrine-access-paired
TOP=$BENCH_TOP

echo "==> $ROUNDS round(s), 2 engines, $OPS small operations of each kind per side and round in $BLOCKS blocks, $THREADS threads, transport $TRANSPORT; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for ((round = 1; round <= ROUNDS; round++)); do
  checked=$(((round + 1) % 2))
  WORK="$TOP/run-$round"
  mkdir -p "$WORK"
  engines_check_ports_free || die "refusing to start"
  echo "==> round $round: rank $checked checks, rank $((1 - checked)) does not"
  declare "ENGINES_EXTRA_$checked=access_checks: true"
  declare "ENGINES_EXTRA_$((1 - checked))=access_checks: false"
  export ENGINES_EXTRA_0 ENGINES_EXTRA_1
  engines_start 2 "$DEVICE_SIZE" "$TARGETS" 1GiB
  grep -qx "access_checks: true" "$WORK/engine$checked.yaml" || die "engine $checked's config lacks access_checks: true"
  engines_up 2 || die "engines did not come up"
  for side in on off; do
    rank=$checked
    [[ $side == on ]] || rank=$((1 - checked))
    "$PEREGRINE" pool create "$side" --ranks "$rank" --scm-size $((256 * 1024 * 1024)) \
      --nvme-size "$((DEVICE_BYTES / 2))" >/dev/null
    "$PEREGRINE" cont create "$side" raw --oclass S1 --checksum off >/dev/null
  done
  "$BENCH" --pool on --cont raw --pair-pool off --pair-cont raw --tests small-paired \
    --small-ops "$OPS" --small-threads "$THREADS" --pair-blocks "$BLOCKS" \
    --json-out "$TOP/$round.json" 2>"$WORK/bench.err" || {
    cat "$WORK/bench.err" >&2
    die "peregrine-bench failed (round $round)"
  }
  grep 'paired' "$WORK/bench.err" >&2 || true
  engines_stop
  rm -rf "$WORK"
  WORK=$TOP
done

mkdir -p "$RESULTS"
echo
echo "Access checks on (side A) vs off (side B), two engines side by side, $ROUNDS round(s): ratio = on/off, 1.00 = no cost, below $(python3 -c "print(f'{1 - $MAX_LOSS / 100:.2f}')") = more than $MAX_LOSS% loss"
python3 - "$TOP" "$ROUNDS" "$RESULTS/access-paired.json" "$MAX_LOSS" <<'PY'
import json, statistics, sys

top, rounds, out, max_loss = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
runs = [json.load(open(f"{top}/{r}.json"))["small_paired"] for r in range(1, rounds + 1)]
rows = []
for kind in ("update", "fetch"):
    per_round = [r[f"{kind}_ops"][0] / r[f"{kind}_ops"][1] for r in runs]
    blocks = [x for r in runs for x in r[f"{kind}_ratio_per_block"]]
    # Over all rounds: the same ops on each side, so the ratio of total times.
    on = sum(r["ops_per_side"] / r[f"{kind}_ops"][0] for r in runs)
    off = sum(r["ops_per_side"] / r[f"{kind}_ops"][1] for r in runs)
    rows.append({
        "test": f"small {kind} {runs[0]['value_bytes']}B", "unit": "ops/s",
        "on_ops": [r[f"{kind}_ops"][0] for r in runs], "off_ops": [r[f"{kind}_ops"][1] for r in runs],
        "ratio_per_round": per_round, "ratio_median": statistics.median(per_round),
        "ratio_all": off / on, "block_ratio_median": statistics.median(blocks),
        "within": statistics.median(per_round) >= 1 - max_loss / 100,
    })
print(f"{'test':<18} {'ratio per round':<48} {'median':>7} {'all':>7} {'blocks':>7}  verdict")
for x in rows:
    print(f"{x['test']:<18} {', '.join(f'{v:.3f}' for v in x['ratio_per_round']):<48} "
          f"{x['ratio_median']:>7.3f} {x['ratio_all']:>7.3f} {x['block_ratio_median']:>7.3f}  "
          f"{'ok' if x['within'] else f'LOSS > {max_loss:g}%'}")
print("(median: of the rounds' ratios; all: the rates over every round; blocks: the median of every block's ratio)")
with open(out, "w") as fh:
    json.dump({"rounds": rounds, "runs": runs, "rows": rows}, fh, indent=1)
    fh.write("\n")
print(f"every line within {max_loss:g}%: {'yes' if all(x['within'] for x in rows) else 'no'}")
PY
echo "==> wrote $RESULTS/access-paired.json"
