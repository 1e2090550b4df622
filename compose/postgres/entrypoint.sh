#!/bin/sh
# First start on an empty volume: a cluster whose superuser is POSTGRES_USER (password
# POSTGRES_PASSWORD, SCRAM over TCP from anywhere, as the official image), owning POSTGRES_DB.
set -eu
: "${POSTGRES_USER:?}" "${POSTGRES_PASSWORD:?}" "${POSTGRES_DB:=$POSTGRES_USER}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    password=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" >"$password"
    initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$password" \
        --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$password"
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    if [ "$POSTGRES_DB" != postgres ]; then
        psql -X -q -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d postgres -c "CREATE DATABASE \"$POSTGRES_DB\""
    fi
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec postgres -D "$PGDATA" -c listen_addresses='*'
