#!/usr/bin/env bash
# Run jobq without Docker on a machine that already runs PostgreSQL and
# RabbitMQ: migrate, then one reaper and two consumers of the demo app, in the
# foreground. Ctrl-C (or SIGTERM) drains the consumers and stops everything.
set -euo pipefail
: "${JOBQ_DATABASE_URL:=postgresql://postgres@127.0.0.1:5432/postgres}"
: "${JOBQ_AMQP_URL:=amqp://guest:guest@127.0.0.1:5672/}"
export JOBQ_DATABASE_URL JOBQ_AMQP_URL
APP="${JOBQ_DEMO_APP:-jobq.demo:app}"

jobq migrate
pids=()
# A consumer the demo's crash jobs kill is started again, as an orchestrator
# would (compose and Kubernetes restart it the same way). SIGTERM is passed
# on, and a consumer that drained and exited 0 is not restarted.
supervise() {
  local child=
  trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null; wait "$child"; exit 0' TERM
  while true; do
    "$@" & child=$!
    wait "$child" && break
    echo "run-local: $* exited; restarting it" >&2
    sleep 1
  done
}
jobq reap & pids+=($!)
supervise jobq consume "$APP" --concurrency 4 & pids+=($!)
supervise jobq consume "$APP" --concurrency 4 & pids+=($!)
# A demo producer: a few jobs a second of every kind, crashes included.
python -m jobq.demo --rate "${JOBQ_DEMO_RATE:-5}" & pids+=($!)
trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait' INT TERM
echo "jobq running (pids ${pids[*]}), with a demo producer. Watch it:  jobq stats" >&2
wait
