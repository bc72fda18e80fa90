#!/usr/bin/env bash
# Run jobq without Docker on a machine that already runs PostgreSQL and
# RabbitMQ: migrate (into a database of its own, created if missing), then one
# reaper, two consumers of the demo app and a demo producer, in the
# foreground. Ctrl-C, SIGTERM or the end of the parent (make killed) stops
# everything: consumers drain, and it says when all have exited.
set -euo pipefail
: "${JOBQ_DATABASE_URL:=postgresql://postgres@127.0.0.1:5432/jobq_demo}"
: "${JOBQ_AMQP_URL:=amqp://guest:guest@127.0.0.1:5672/}"
: "${JOBQ_NAMESPACE:=jobq_demo}"
export JOBQ_DATABASE_URL JOBQ_AMQP_URL JOBQ_NAMESPACE
APP="${JOBQ_DEMO_APP:-jobq.demo:app}"
JOBQ="$(command -v jobq)"
parent=$PPID

"$JOBQ" migrate --create-database --declare
pids=()
# A consumer the demo's crash jobs kill (SIGKILL, exit 137) is started again,
# as an orchestrator would; any other exit (a drain after SIGTERM or Ctrl-C,
# a configuration error) ends its supervisor. SIGTERM is passed on.
supervise() {
  local child= code=0
  trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null; wait "$child"; exit 0' TERM
  trap '' INT  # Ctrl-C reaches the consumer itself; stopping is the script's job
  while true; do
    "$@" & child=$!
    code=0; wait "$child" || code=$?
    [ "$code" -eq 137 ] || exit "$code"
    echo "run-local: a demo crash job killed a consumer; starting it again" >&2
    sleep 1
  done
}
stopping=
stop() {
  [ -n "$stopping" ] && return
  stopping=1
  echo "run-local: stopping; consumers finish or release their jobs..." >&2
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  echo "run-local: stopped: the reaper, both consumers and the producer have exited" >&2
  exit 0
}
trap stop INT TERM HUP
"$JOBQ" reap & pids+=($!)
supervise "$JOBQ" consume "$APP" --concurrency 4 & pids+=($!)
supervise "$JOBQ" consume "$APP" --concurrency 4 & pids+=($!)
# A demo producer: a few jobs a second of every kind, a crash now and then.
python -m jobq.demo --rate "${JOBQ_DEMO_RATE:-5}" & pids+=($!)
# If whoever started this dies without a word (make killed), stop as well.
( while kill -0 "$parent" 2>/dev/null; do sleep 1; done; kill -TERM $$ 2>/dev/null ) &
watchdog=$!
echo "jobq running (database $(basename "${JOBQ_DATABASE_URL%%\?*}"), namespace $JOBQ_NAMESPACE). Watch it from another terminal:" >&2
echo "  JOBQ_DATABASE_URL=<the same URL> $JOBQ stats" >&2
echo "Ctrl-C stops it all." >&2
wait "${pids[@]}" 2>/dev/null || true  # a signal runs stop() first
kill "$watchdog" 2>/dev/null || true
echo "run-local: every process exited" >&2
