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
jobq reap & pids+=($!)
jobq consume "$APP" --concurrency 4 & pids+=($!)
jobq consume "$APP" --concurrency 4 & pids+=($!)
trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait' INT TERM
echo "jobq running (pids ${pids[*]}). Try:  jobq publish echo '{\"hello\": 1}'  and  jobq stats" >&2
wait
