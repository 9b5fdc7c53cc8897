# shellcheck shell=bash
# Helpers to run local Peregrine engines on sparse device files; sourced by
# hack/quickstart.sh and bench/run.sh. Engine i is rank i, control port 10001+i,
# data port 10101+i; rank 0 hosts the management service.
#
# The caller sets: PEREGRINE (the CLI), ENGINE (the engine binary), WORK (a temp dir).
# Engine pids accumulate in ENGINE_PIDS; call engines_stop from an EXIT trap.
#
# The control plane runs mutual TLS (docs/tls.md): engines_start makes a CA and
# certificates with `peregrine certs` under $WORK/certs and exports
# PEREGRINE_TLS_DIR=$WORK/certs/admin, which every client these scripts start
# (the CLI, peregrine-fuse, peregrine-bench) reads. ENGINES_INSECURE=1 runs it
# without TLS instead (allow_insecure: true, PEREGRINE_INSECURE=1).
#
# ENGINES_EXTRA (default empty): YAML lines appended to every engine's config,
# e.g. ENGINES_EXTRA='access_checks: false' (bench/access.sh sets it); ENGINES_EXTRA_<rank>:
# lines for that engine alone.

ENGINE_PIDS=()

# device_file PATH SIZE: an emulated NVMe device. Sparse (allocated as it is
# written), unless DEVICE_WRITTEN=1: then written in full with zeros first, as
# an NVMe namespace has all its blocks from the start. In a sparse file every
# fdatasync after writes into fresh blocks also commits the file system's
# journal (the allocation), which a device never does.
device_file() {
  local path=$1 size=$2 bytes
  truncate -s "$size" "$path"
  if [[ ${DEVICE_WRITTEN:-0} == 1 ]]; then
    bytes=$(stat -c %s "$path")
    dd if=/dev/zero of="$path" bs=4M count=$((bytes / 4194304)) oflag=direct conv=notrunc status=none
  fi
}

# engines_start COUNT DEVICE_SIZE TARGETS SCM_SIZE
engines_start() {
  local count=$1 dev_size=$2 targets=$3 scm_size=$4 rank security own
  if [[ ${ENGINES_INSECURE:-0} == 1 ]]; then
    unset PEREGRINE_TLS_DIR
    export PEREGRINE_INSECURE=1
  else
    "$PEREGRINE" certs --system peregrine --out "$WORK/certs" --ranks "$count" --admin >/dev/null
    unset PEREGRINE_INSECURE
    export PEREGRINE_TLS_DIR="$WORK/certs/admin"
  fi
  for ((rank = 0; rank < count; rank++)); do
    if [[ ${ENGINES_INSECURE:-0} == 1 ]]; then
      security="allow_insecure: true"
    else
      security="tls_dir: $WORK/certs/engine-$rank"
    fi
    device_file "$WORK/nvme$rank.img" "$dev_size"
    cat >"$WORK/engine$rank.yaml" <<EOF
name: peregrine
rank: $rank
fault_domain: /host$rank
listen_addr: 127.0.0.1
control_port: $((10001 + rank))
data_port: $((10101 + rank))
targets: $targets
hugepages: true
scm: {class: ram, size: $scm_size}
bdev: {class: file, path: $WORK/nvme$rank.img, size: $dev_size}
mgmt_svc_replicas: ["127.0.0.1:10001"]
log_level: info
log_file: $WORK/engine$rank.log
$security
EOF
    if [[ -n ${ENGINES_EXTRA:-} ]]; then
      printf '%s\n' "$ENGINES_EXTRA" >>"$WORK/engine$rank.yaml"
    fi
    # One engine's own lines: ENGINES_EXTRA_<rank> (bench/access.sh --paired).
    own="ENGINES_EXTRA_$rank"
    if [[ -n ${!own:-} ]]; then
      printf '%s\n' "${!own}" >>"$WORK/engine$rank.yaml"
    fi
    "$ENGINE" --config "$WORK/engine$rank.yaml" >>"$WORK/engine$rank.out" 2>&1 &
    ENGINE_PIDS+=($!)
  done
}

# SIGTERM every engine, wait up to 10 s each, then SIGKILL the stragglers.
engines_stop() {
  local pid
  for pid in "${ENGINE_PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${ENGINE_PIDS[@]}"; do
    for _ in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "engine pid $pid ignored SIGTERM for 10s; killing it" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
  done
  ENGINE_PIDS=()
}

# Each target's commit figures from its closing log line (after engines_stop): commits,
# operations per commit, and the mean microseconds from a commit's start to its answer and to
# its last device write; where a commit's time goes when a benchmark is slower than expected.
engines_commit_stats() {
  local f
  for f in "$WORK"/engine*.log; do
    [[ -s "$f" ]] || continue
    # sed, not grep: a log without the line (an engine killed) is no failure.
    sed -nE 's/.*target closing.*target=([0-9]+) commits=([0-9]+) ops_per_commit=([0-9.]{1,4})[0-9]* us_per_commit=([0-9]+) us_writing=([0-9]+).*/\1 \2 \3 \4 \5/p' "$f" |
      while read -r t commits ops us writing; do
        ((commits > 0)) || continue
        echo "$(basename "$f" .log) target $t: $commits commits, $ops ops each, ${us} us each (${writing} us to written)"
      done
  done
}

# Last lines of every engine log, for failure reports.
engines_dump_logs() {
  local f
  for f in "$WORK"/engine*.log "$WORK"/engine*.out; do
    [[ -s "$f" ]] || continue
    echo "--- $f" >&2
    tail -n 15 "$f" >&2
  done
}

# Pretty JSON puts one `"key": value` per line, so counting matching lines is
# enough here and spares the scripts a jq or python dependency.
# json_count PATTERN CMD...
json_count() {
  local pattern=$1
  shift
  "$@" 2>/dev/null | grep -c -- "$pattern" || true
}

# wait_until SECS WHAT CMD...: poll CMD every 0.5 s; fail naming WHAT on timeout
# or as soon as an engine dies (no point waiting for a dead process).
wait_until() {
  local secs=$1 what=$2 deadline pid
  shift 2
  deadline=$((SECONDS + secs))
  until "$@"; do
    for pid in "${ENGINE_PIDS[@]}"; do
      if ! kill -0 "$pid" 2>/dev/null; then
        echo "an engine (pid $pid) exited while waiting for $what" >&2
        return 1
      fi
    done
    if ((SECONDS >= deadline)); then
      echo "timed out after ${secs}s waiting for $what" >&2
      return 1
    fi
    sleep 0.5
  done
}

# engines_joined COUNT: all engines are in the system map (any state).
engines_joined() { (($(json_count '"control_addr"' "$PEREGRINE" --json system query) >= $1)); }
# engines_ready COUNT: all engines are formatted and serving.
engines_ready() { (($(json_count '"state": "ready"' "$PEREGRINE" --json storage scan) >= $1)); }

# engines_up COUNT: wait for COUNT engines to join, format them, wait until ready.
engines_up() {
  local count=$1
  wait_until 60 "$count engine(s) to join the management service" engines_joined "$count"
  "$PEREGRINE" storage format >/dev/null
  wait_until 60 "$count engine(s) to be ready after format" engines_ready "$count"
}

# Refuse to start over somebody else's engines: our format would act on theirs.
# (A connect, not a query: the service may speak TLS with a CA we do not have.)
engines_check_ports_free() {
  if (exec 3<>/dev/tcp/127.0.0.1/10001) 2>/dev/null; then
    echo "something already listens on 127.0.0.1:10001 (a management service?); stop it first" >&2
    return 1
  fi
}
