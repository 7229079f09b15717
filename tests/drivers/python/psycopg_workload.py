"""psycopg 3 through Sluice with server-side prepares forced (prepare_threshold=0): every
statement is Parsed as a named statement (_pg3_N) on its first execution and then only
Bound and Executed. The workload is described in tests/drivers/README.md.

psycopg's documented behaviour that the checks rely on (psycopg/_preparing.py):
- a command status of ALTER, DROP, ROLLBACK, DISCARD ALL or DEALLOCATE ALL empties its
  statement cache (and sends DEALLOCATE ALL), so DDL on the same connection never
  surfaces "cached plan must not change result type";
- DDL from another connection does: the error (0A000) reaches the application, and the
  statement stays cached (still failing) until something empties the cache; the usual
  recovery is the one for any error, rolling the transaction back (ROLLBACK empties it),
  so the checks run such queries in a transaction block, which fails once and then works;
- statements evicted from the cache (prepared_max) are closed with a protocol Close.
"""

from __future__ import annotations

import sys
import threading

import psycopg

from _workload import CheckFailed, Report, Settings, shared_totals

S = Settings("psycopg")
R = Report(S)
INT8_OID = 20


def connect() -> psycopg.Connection:
    # Host, port, user, password, database and TLS (PGSSLMODE, PGSSLROOTCERT) come from the
    # environment, which libpq reads.
    return psycopg.connect(autocommit=True, prepare_threshold=0, application_name=S.tag)


def one(conn: psycopg.Connection, query: str, params=()) -> tuple:
    return conn.execute(query, params).fetchone()


def after_ddl(conn: psycopg.Connection, query: str, params, what: str, direct_errors: int):
    """Runs a cached query, in a transaction block, after DDL changed its result type: the
    first execution may fail with 0A000 once (the block then rolls back, which empties
    psycopg's cache), the second must succeed (no permanent poisoning). Where Sluice is
    transparent (session mode), exactly `direct_errors` such errors must surface, as on a
    direct connection. Returns the first row and the column type OIDs."""
    surfaced = 0
    for _attempt in (1, 2):
        try:
            with conn.transaction():
                cur = conn.execute(query, params)
                row, types = cur.fetchone(), [col.type_code for col in cur.description]
            break
        except psycopg.Error as e:
            if e.sqlstate != "0A000":
                raise
            surfaced += 1
            R.note_recovered()
    else:
        raise CheckFailed(f"{what}: 0A000 again on the second execution: statement poisoned")
    if S.exact:
        R.check(surfaced == direct_errors, f"{what}: expected {direct_errors} x 0A000, saw {surfaced}")
    return row, types


def client(c: int) -> None:
    step = "connect"
    try:
        with connect() as conn:
            step = "arithmetic"
            for i in range(S.iterations):
                v = c * 1000 + i
                got = one(conn, "select %s::int * 2", (v,))[0]
                R.check(got == 2 * v, f"{step}: select {v}*2 gave {got}")

            step = "insert/select"
            insert = f"insert into {S.shared} (id, client, n) values (%s, %s, %s)"
            select = f"select client, n from {S.shared} where id = %s"
            for i in range(S.iterations):
                rowid = c * 10000 + i
                R.check(conn.execute(insert, (rowid, c, 7 * i)).rowcount == 1, f"{step}: insert {rowid}")
                got = one(conn, select, (rowid,))
                R.check(got == (c, 7 * i), f"{step}: row {rowid} is {got}")

            step = "transactions"
            count = f"select count(*) from {S.shared} where client = %s"
            for k in range(3):
                i = S.iterations + k
                with conn.transaction():
                    conn.execute(insert, (c * 10000 + i, c, 7 * i))
                    got = one(conn, count, (c,))[0]
                    R.check(got == i + 1, f"{step}: {got} rows inside transaction {k}, expected {i + 1}")
            with conn.transaction():  # ROLLBACK: psycopg empties its cache (DEALLOCATE ALL)
                conn.execute(insert, (c * 10000 + 900, c, 0))
                raise psycopg.Rollback()
            got = one(conn, f"select count(*) from {S.shared} where id = %s", (c * 10000 + 900,))[0]
            R.check(got == 0, f"{step}: rolled-back row is there")

            step = "ddl on own table"
            own = f"{S.tag}_c{c}"
            conn.execute(f"create table {own} (id int primary key, v int)")
            conn.execute(f"insert into {own} values (1, %s)", (40 + c,))
            q = f"select * from {own} where id = %s"
            for _ in range(2):
                R.check(one(conn, q, (1,)) == (1, 40 + c), f"{step}: before ALTER")
            conn.execute(f"alter table {own} alter column v type bigint")
            row, types = after_ddl(conn, q, (1,), f"{step}: int -> bigint", direct_errors=0)
            R.check(row == (1, 40 + c), f"{step}: row after int -> bigint is {row}")
            R.check(types[1] == INT8_OID, f"{step}: v has type oid {types[1]}, not bigint")
            conn.execute(f"alter table {own} add column w text not null default 'w'")
            row, _ = after_ddl(conn, q, (1,), f"{step}: add column", direct_errors=0)
            R.check(row == (1, 40 + c, "w"), f"{step}: row after add column is {row}")

            step = "DEALLOCATE ALL"
            conn.execute("DEALLOCATE ALL")  # psycopg sees the command status and forgets its statements
            for i in range(3):
                got = one(conn, "select %s::int * 2", (i,))[0]
                R.check(got == 2 * i, f"{step}: select {i}*2 gave {got}")
                R.check(one(conn, q, (1,)) == (1, 40 + c, "w"), f"{step}: own table")

            step = "final count"
            rows, total = shared_totals(S)
            got = one(conn, f"select count(*), sum(n) from {S.shared} where client = %s", (c,))
            R.check(got == (rows, total), f"{step}: {got}, expected {(rows, total)}")
    except Exception as e:  # noqa: BLE001 - report everything, exit non-zero
        R.failed(f"client {c}", e, step)


def cross_connection() -> None:
    """DDL on one connection invalidating a statement cached on another, and statement close
    (cache eviction) followed by reuse. Two connections at once, so it fits a pool of 3 in
    session mode."""
    step = "connect"
    try:
        with connect() as reader, connect() as ddl:
            step = "cross-connection ddl"
            x = f"{S.tag}_x"
            reader.execute(f"create table {x} (id int primary key, v int)")
            reader.execute(f"insert into {x} values (1, 7)")
            q = f"select * from {x} where id = %s"
            for _ in range(2):
                R.check(one(reader, q, (1,)) == (1, 7), f"{step}: before ALTER")
            ddl.execute(f"alter table {x} alter column v type bigint")
            row, types = after_ddl(reader, q, (1,), f"{step}: reader", direct_errors=1)
            R.check(row == (1, 7) and types[1] == INT8_OID, f"{step}: reader's row {row} {types}")
            R.check(one(reader, q, (1,)) == (1, 7), f"{step}: reader's next execution")
            row, _ = after_ddl(ddl, q, (1,), f"{step}: other client, first use", direct_errors=0)
            R.check(row == (1, 7), f"{step}: other client's row is {row}")

            step = "close and reuse"
            ddl.prepared_max = 2  # evictions send a protocol Close for the oldest statement
            for rnd in range(3):
                for k in range(1, 5):
                    got = one(ddl, f"select %s::int + {k}", (10 * rnd,))[0]
                    R.check(got == 10 * rnd + k, f"{step}: round {rnd}, +{k} gave {got}")
    except Exception as e:  # noqa: BLE001
        R.failed("cross-connection", e, step)


def main() -> int:
    try:
        with connect() as conn:
            conn.execute(f"create table {S.shared} (id int primary key, client int not null, n int not null)")
    except Exception as e:  # noqa: BLE001
        R.failed("setup", e)
        return R.finish()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(S.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cross_connection()

    try:
        with connect() as conn:
            rows, total = shared_totals(S)
            got = one(conn, f"select count(*), coalesce(sum(n), 0) from {S.shared}")
            R.check(got == (rows * S.clients, total * S.clients), f"shared table holds {got}")
            tables = [S.shared, f"{S.tag}_x"] + [f"{S.tag}_c{c}" for c in range(S.clients)]
            conn.execute("drop table if exists " + ", ".join(tables))
    except Exception as e:  # noqa: BLE001
        R.failed("verify", e)
    return R.finish()


if __name__ == "__main__":
    sys.exit(main())
