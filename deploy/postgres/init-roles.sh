#!/bin/sh
# compose.yaml runs this once, when the PostgreSQL volume is new
# (docker-entrypoint-initdb.d). It creates jobq's group roles (`jobq migrate`
# would create them too, given CREATEROLE; creating them here lets the logins
# be granted now) and one login per service, each a member of exactly one
# group (README "Deploying with least privilege"). Passwords come from the
# environment; the defaults are for a laptop only.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v migrate_pw="${DB_MIGRATE_PASSWORD:-migrate-dev}" \
  -v producer_pw="${DB_PRODUCER_PASSWORD:-producer-dev}" \
  -v consumer_pw="${DB_CONSUMER_PASSWORD:-consumer-dev}" \
  -v reaper_pw="${DB_REAPER_PASSWORD:-reaper-dev}" \
  -v reader_pw="${DB_READER_PASSWORD:-reader-dev}" <<'SQL'
CREATE ROLE jobq_owner NOLOGIN;
CREATE ROLE jobq_producer NOLOGIN;
CREATE ROLE jobq_consumer NOLOGIN;
CREATE ROLE jobq_reaper NOLOGIN;
CREATE ROLE jobq_reader NOLOGIN;
-- migrations: owns the schema through jobq_owner; CREATE on the database
-- only for the first run (CREATE SCHEMA jobq)
CREATE ROLE app_migrate LOGIN PASSWORD :'migrate_pw' IN ROLE jobq_owner;
GRANT CREATE ON DATABASE :"DBNAME" TO app_migrate;
CREATE ROLE app_producer LOGIN PASSWORD :'producer_pw' IN ROLE jobq_producer;
-- handlers of the demo app enqueue nothing and it declares no schedule; add
-- jobq_producer if yours do either (a schedule enqueues jobs)
CREATE ROLE app_consumer LOGIN PASSWORD :'consumer_pw' IN ROLE jobq_consumer;
CREATE ROLE app_reaper LOGIN PASSWORD :'reaper_pw' IN ROLE jobq_reaper;
CREATE ROLE app_reader LOGIN PASSWORD :'reader_pw' IN ROLE jobq_reader;
SQL
