#!/usr/bin/env bash
# One command: `bash bench/run.sh` measures a fake OpenAI upstream directly, through llmgw
# (gunicorn, 2 gevent workers) and through the LiteLLM proxy (2 workers), and prints a Markdown
# summary.  BENCH_QUICK=1 for a short run.  Everything started here is stopped on exit.
#
# Knobs (environment): BENCH_QUICK=1, BENCH_N (non-streamed requests at 0 ms), BENCH_N50 (at 50 ms),
# BENCH_NLAT (requests one at a time, for the latency limits add: 3000, quick 1000),
# BENCH_NSTREAM (streams), BENCH_RSS_N (requests for the RSS run; 100000, quick 5000),
# BENCH_C (concurrency, 32), BENCH_PROCS (load generator processes, 1), BENCH_LITELLM=0 to skip
# LiteLLM, BENCH_PROFILE=1 to take a py-spy profile of an llmgw worker under load,
# BENCH_KEEP=1 to keep the work directory, BENCH_MAX_SECONDS (120): a load run stops sending after
# this long (what was not sent is reported as unsent), BENCH_POSTGRES=postgresql://USER@HOST:PORT
# to run llmgw on a fresh database of that PostgreSQL server instead of SQLite (run under
# `python -m tests.harness.pg`, a private server's URL is taken from LLMGW_TEST_POSTGRES).
set -u
TOP=$(cd "$(dirname "$0")/.." && pwd)
cd "$TOP"
PY=${PYTHON:-python3}
QUICK=${BENCH_QUICK:-0}
if [ "$QUICK" = 1 ]; then
  N=${BENCH_N:-3000}; N50=${BENCH_N50:-1000}; NS=${BENCH_NSTREAM:-1000}; RSS_N=${BENCH_RSS_N:-5000}
  NLAT=${BENCH_NLAT:-1000}
else
  N=${BENCH_N:-20000}; N50=${BENCH_N50:-5000}; NS=${BENCH_NSTREAM:-5000}; RSS_N=${BENCH_RSS_N:-100000}
  NLAT=${BENCH_NLAT:-3000}
fi
C=${BENCH_C:-32}; PROCS=${BENCH_PROCS:-1}; MAXS=${BENCH_MAX_SECONDS:-120}  # per load run
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/llmgw-bench
LITELLM_VENV=$CACHE/litellm-venv
WORK=$(mktemp -d /tmp/llmgw-bench.XXXXXX)
RES=$WORK/results; mkdir -p "$RES"
PIDS=()
log() { echo "[bench $(date +%T)] $*" >&2; }

cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$p" 2>/dev/null
  done
  if [ "${BENCH_KEEP:-0}" = 1 ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start NAME CMD...: run CMD in its own session (so its whole group can be stopped), log to WORK.
start() {
  local name=$1; shift
  setsid "$@" >"$WORK/$name.log" 2>&1 &
  LAST=$!
  PIDS+=("$LAST")
}
free_port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# wait_ok SECONDS CMD...: until CMD succeeds, or fail.
wait_ok() {
  local deadline=$(( $(date +%s) + $1 )); shift
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -ge "$deadline" ] && return 1
    sleep 0.5
  done
}
chat_ok() {  # chat_ok BASE KEY MODEL
  curl -sf -m 10 "$1/chat/completions" -H "Authorization: Bearer $2" -H 'Content-Type: application/json' \
    -d "{\"model\":\"$3\",\"max_tokens\":2,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
}
load() {  # load LABEL BASE KEY MODEL N C [extra...]
  local label=$1 base=$2 key=$3 model=$4 n=$5 c=$6; shift 6
  log "load $label: $n requests at concurrency $c"
  local pids before
  pids=$(worker_pids 2>/dev/null | tr '\n' ' ')
  # shellcheck disable=SC2086
  before=$($PY bench/cpu.py snap $pids)
  $PY bench/load.py --url "$base" --key "$key" --model "$model" -n "$n" -c "$c" --procs "$PROCS" --max-seconds "$MAXS" \
    --label "$label" --json "$RES/$label.json" "$@" >/dev/null || log "load $label had no successes"
  # shellcheck disable=SC2086
  $PY bench/cpu.py since "$label" $before $pids >>"$RES/cpu.jsonl"
}
flaskw() { $PY -m flask --app llmgw:create_app llmgw "$@" --root "$ROOT"; }
worker_pids() {  # gunicorn workers: children of the gunicorn master, itself a child of `serve`
  local master
  for master in $(ps -o pid= --ppid "${SERVE:-0}" 2>/dev/null); do
    grep -q gunicorn "/proc/$master/cmdline" 2>/dev/null && ps -o pid= --ppid "$master" | tr -d " "
  done
}
rss() {  # rss LABEL: VmRSS (kB) of each worker, one JSON line
  local p out="{\"label\":\"$1\",\"workers\":{"
  for p in $(worker_pids); do
    out+="\"$p\":$(awk '/VmRSS/{print $2}' /proc/$p/status),"
  done
  echo "${out%,}}}" >>"$RES/rss.jsonl"
}

log "work dir $WORK; quick=$QUICK n=$N n50=$N50 streams=$NS rss_n=$RSS_N c=$C procs=$PROCS"
{ echo "date: $(date)"; echo "nproc: $(nproc)"; echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "mem: $(free -g | awk '/Mem:/{print $2" GB total"}')"; echo "loadavg at start: $(cat /proc/loadavg)"
  echo "python: $($PY -V 2>&1)"
  $PY -c 'import importlib.metadata as m; [print(f"{p}: {m.version(p)}") for p in ("llmgw","gunicorn","gevent","Flask","requests")]'
} >"$RES/env.txt"

# 1. Fake upstreams: 0 ms, 50 ms, and 20 ms between stream chunks (for the 1,000-stream check).
U0=$(free_port); U50=$(free_port); USLOW=$(free_port)
start up0 $PY bench/fake_upstream.py --port "$U0"
start up50 $PY bench/fake_upstream.py --port "$U50" --latency-ms 50
start upslow $PY bench/fake_upstream.py --port "$USLOW" --chunk-delay-ms 20
for p in $U0 $U50 $USLOW; do wait_ok 20 curl -sf "http://127.0.0.1:$p/v1/models" || { log "fake upstream $p did not start"; exit 1; }; done

# 2. llmgw: a fresh root, 2 gevent workers, the three upstreams as external endpoints.
ROOT=$WORK/root; GW=$(free_port)
PGURL=${BENCH_POSTGRES:-${LLMGW_TEST_POSTGRES:-}}
if [ -n "$PGURL" ]; then
  PGDB=bench_$$
  psql -q "$PGURL/postgres" -c "CREATE DATABASE $PGDB" || { log "cannot create $PGDB at $PGURL"; exit 1; }
  export LLMGW_DATABASE_URL="$PGURL/$PGDB"
  echo "database: PostgreSQL $(psql -tAq "$PGURL/postgres" -c 'SHOW server_version')" >>"$RES/env.txt"
else
  echo "database: SQLite" >>"$RES/env.txt"
fi
flaskw init --listen "127.0.0.1:$GW" >"$WORK/init.log" 2>&1 || { cat "$WORK/init.log"; exit 1; }
sed -i 's/^\[server\]$/[server]\nworkers = 2/; s/^interval = 5$/interval = 1/' "$ROOT/server.toml"
flaskw endpoint add up0 --url "http://127.0.0.1:$U0/v1" --model fake >/dev/null
flaskw endpoint add up50 --url "http://127.0.0.1:$U50/v1" --model fake50 >/dev/null
flaskw endpoint add upslow --url "http://127.0.0.1:$USLOW/v1" --model fakeslow >/dev/null
KEY=$(flaskw keys create | head -1)
start_llmgw() {
  start "llmgw$1" env -u LLMGW_ROOT "${@:2}" $PY -m flask --app llmgw:create_app llmgw serve --root "$ROOT"
  SERVE=$LAST
  for m in fake fake50 fakeslow; do
    wait_ok 90 chat_ok "http://127.0.0.1:$GW/v1" "$KEY" "$m" || { log "llmgw did not route $m"; tail -20 "$WORK/llmgw$1.log"; exit 1; }
  done
}
start_llmgw "" 
log "llmgw up on :$GW, workers $(worker_pids | tr '\n' ' ')"

# 3. LiteLLM proxy in its own venv, 2 workers.
LL=""; LL_NOTE=""
if [ "${BENCH_LITELLM:-1}" = 1 ]; then
  if [ ! -x "$LITELLM_VENV/bin/litellm" ]; then
    log "installing litellm[proxy] into $LITELLM_VENV (once)"
    t0=$(date +%s)
    if $PY -m venv "$LITELLM_VENV" && "$LITELLM_VENV/bin/pip" install -q 'litellm[proxy]' >"$WORK/litellm-install.log" 2>&1; then
      LL_NOTE="installed in $(( $(date +%s) - t0 )) s; "
    else
      LL_NOTE="install failed: $(tail -3 "$WORK/litellm-install.log" | tr '\n' ' ')"
    fi
  fi
  if [ -x "$LITELLM_VENV/bin/litellm" ]; then
    LLP=$(free_port)
    # The proxy refuses to start without a master key that is not weak.
    LL_KEY=sk-bench-$($PY -c 'import secrets; print(secrets.token_hex(16))')
    cat >"$WORK/litellm.yaml" <<EOF
model_list:
  - model_name: fake
    litellm_params: {model: openai/fake, api_base: "http://127.0.0.1:$U0/v1", api_key: "none"}
  - model_name: fake50
    litellm_params: {model: openai/fake, api_base: "http://127.0.0.1:$U50/v1", api_key: "none"}
  - model_name: fakeslow
    litellm_params: {model: openai/fake, api_base: "http://127.0.0.1:$USLOW/v1", api_key: "none"}
litellm_settings:
  drop_params: true
general_settings:
  master_key: "$LL_KEY"
EOF
    t0=$(date +%s)
    start litellm env LITELLM_LOG=ERROR "$LITELLM_VENV/bin/litellm" --config "$WORK/litellm.yaml" \
      --host 127.0.0.1 --port "$LLP" --num_workers 2
    LLPID=$LAST
    ll_ready() { kill -0 "$LLPID" 2>/dev/null || return 0; chat_ok "http://127.0.0.1:$LLP/v1" "$LL_KEY" fake50; }
    if wait_ok 240 ll_ready && kill -0 "$LLPID" 2>/dev/null && chat_ok "http://127.0.0.1:$LLP/v1" "$LL_KEY" fake >/dev/null; then
      LL="http://127.0.0.1:$LLP/v1"
      LL_NOTE+="litellm $("$LITELLM_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("litellm"))'), "
      LL_NOTE+="started with --num_workers 2 (uvicorn), ready in $(( $(date +%s) - t0 )) s"
    else
      LL_NOTE+="exited or did not answer within 240 s of start: $(tail -5 "$WORK/litellm.log" | tr '\n' ' ')"
    fi
  fi
else
  LL_NOTE="skipped (BENCH_LITELLM=0)"
fi
echo "litellm: $LL_NOTE" >>"$RES/env.txt"
log "litellm: $LL_NOTE"

# 4. The same load against each: direct, llmgw, litellm.
targets="direct:http://127.0.0.1:PORT/v1 llmgw:http://127.0.0.1:$GW/v1"
[ -n "$LL" ] && targets+=" litellm:$LL"
for t in $targets; do
  name=${t%%:*}; base=${t#*:}; key=$KEY
  [ "$name" = litellm ] && key=$LL_KEY
  b0=${base/PORT/$U0}; b50=${base/PORT/$U50}
  load "warm-$name" "$b0" "$key" fake 500 "$C"
  load "ns0-$name" "$b0" "$key" fake "$N" "$C"
  load "ns50-$name" "$b50" "$key" fake50 "$N50" "$C"
  load "stream-$name" "$b0" "$key" fake "$NS" "$C" --stream --max-tokens 100
done
# 4b. llmgw again with rpm, tpm and a budget binding on the key and on its project: set high
# enough that nothing is refused, so every request is admitted against all of them. Runs with
# no limit just before and just after it are its baseline: the database grows during the bench,
# and the machine's other work changes, so runs far apart differ by more than limits cost. The
# model has a price in all three: spend is counted in every scope's budget periods whether a
# limit binds or not, so only what limits add is compared.
flaskw prices set fake --prompt 0.000001 --completion 0.000001 >/dev/null
sleep 1.5  # workers read prices at most once a second
load "ns0-before" "http://127.0.0.1:$GW/v1" "$KEY" fake "$N" "$C"
load "lat-before" "http://127.0.0.1:$GW/v1" "$KEY" fake "$NLAT" 1
PREFIX=$($PY -c 'import sys; from llmgw.security import display_prefix; print(display_prefix(sys.argv[1]))' "$KEY")
for scope in "--key $PREFIX" "--project default"; do
  flaskw limits set $scope --rpm 100000000 --tpm 2000000000 --budget 1000000 --period month >/dev/null
done
sleep 1.5  # workers read limits at most once a second
load "warm-limits" "http://127.0.0.1:$GW/v1" "$KEY" fake 500 "$C"
load "ns0-limits" "http://127.0.0.1:$GW/v1" "$KEY" fake "$N" "$C"
load "lat-limits" "http://127.0.0.1:$GW/v1" "$KEY" fake "$NLAT" 1
if [ "${BENCH_PROFILE:-0}" = 1 ]; then  # one worker under the same load with limits binding
  SPY=$CACHE/tools-venv/bin/py-spy
  [ -x "$SPY" ] || { $PY -m venv "$CACHE/tools-venv" && "$CACHE/tools-venv/bin/pip" install -q py-spy; }
  load "profile-limits-load" "http://127.0.0.1:$GW/v1" "$KEY" fake 1000000 "$C" --max-seconds 25 &
  lp=$!
  sleep 3
  timeout 60 "$SPY" record -p "$(worker_pids | head -1)" -d 15 -r 200 --format raw \
    -o "$RES/profile-limits.txt" >"$WORK/pyspy-limits.log" 2>&1 || log "py-spy failed: $(tail -2 "$WORK/pyspy-limits.log")"
  wait $lp
fi
for scope in "--key $PREFIX" "--project default"; do
  flaskw limits set $scope --rpm 0 --tpm 0 --budget 0 >/dev/null
done
sleep 1.5
load "ns0-after" "http://127.0.0.1:$GW/v1" "$KEY" fake "$N" "$C"
load "lat-after" "http://127.0.0.1:$GW/v1" "$KEY" fake "$NLAT" 1
# LiteLLM is done with: stop it so that it takes no CPU from what follows.
[ -n "$LL" ] && kill -TERM -- "-$LLPID" 2>/dev/null

# 5. Optional profile of one llmgw worker under non-streamed load.
if [ "${BENCH_PROFILE:-0}" = 1 ]; then
  SPY=$CACHE/tools-venv/bin/py-spy
  [ -x "$SPY" ] || { $PY -m venv "$CACHE/tools-venv" && "$CACHE/tools-venv/bin/pip" install -q py-spy; }
  w=$(worker_pids | head -1)
  load "profile-load" "http://127.0.0.1:$GW/v1" "$KEY" fake 1000000 "$C" --max-seconds 25 &
  lp=$!
  sleep 3
  timeout 60 "$SPY" record -p "$w" -d 15 -r 200 --format raw -o "$RES/profile.txt" >"$WORK/pyspy.log" 2>&1 \
    || log "py-spy failed: $(tail -2 "$WORK/pyspy.log")"
  wait $lp
  load "profile-stream-load" "http://127.0.0.1:$GW/v1" "$KEY" fake 1000000 "$C" --stream --max-seconds 25 &
  lp=$!
  sleep 3
  timeout 60 "$SPY" record -p "$w" -d 15 -r 200 --format raw -o "$RES/profile-stream.txt" >>"$WORK/pyspy.log" 2>&1 \
    || log "py-spy failed: $(tail -2 "$WORK/pyspy.log")"
  wait $lp
fi

# 6. Worker RSS before and after RSS_N requests (sampled after each quarter).
rss "before"
for q in 1 2 3 4; do
  load "rss-$q" "http://127.0.0.1:$GW/v1" "$KEY" fake $(( RSS_N / 4 )) "$C" --max-seconds 1200
  rss "after $(( RSS_N * q / 4 ))"
done

# 7. 1,000 concurrent streams (100 chunks, 20 ms apart) against one worker.
kill -TERM -- "-$SERVE" 2>/dev/null
for _ in $(seq 1 300); do kill -0 "$SERVE" 2>/dev/null || break; sleep 0.1; done
start_llmgw 1 LLMGW_SERVER_WORKERS=1
log "llmgw restarted with workers $(worker_pids | tr '\n' ' ')"
load "c1000-llmgw-1worker" "http://127.0.0.1:$GW/v1" "$KEY" fakeslow 1000 1000 --stream --max-tokens 100 --timeout 120
load "c1000-direct" "http://127.0.0.1:$USLOW/v1" "" fakeslow 1000 1000 --stream --max-tokens 100 --timeout 120
echo "loadavg at end: $(cat /proc/loadavg)" >>"$RES/env.txt"
ps -eo pid,ppid,pcpu,etime,args --sort=-pcpu | head -12 >"$RES/ps-end.txt"

$PY bench/report.py "$RES"
