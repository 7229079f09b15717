"""asyncpg through Sluice with its default statement cache: every query is Parsed once per
connection as a named statement (__asyncpg_stmt_N__) and then only Bound and Executed.
The workload is described in tests/drivers/README.md.

asyncpg's documented behaviour that the checks rely on (Connection._do_execute,
Connection.reload_schema_state):
- "cached plan must not change result type" outside a transaction is retried once
  internally after re-preparing, so the application sees no error;
- inside a transaction it raises InvalidCachedStatementError (SQLSTATE 0A000) and drops the
  cache, so the transaction fails once and the retry works;
- a DEALLOCATE ALL behind its back leaves its cache pointing at missing statements (26000
  on every use); reload_schema_state() is the documented way to tell it the server state
  changed, and it re-prepares afterwards;
- a PreparedStatement that is garbage collected is closed (protocol Close) on the server.
"""

from __future__ import annotations

import asyncio
import gc
import sys

import asyncpg

from _workload import CheckFailed, Report, Settings, shared_totals


def first_line(e: BaseException) -> str:
    # asyncpg appends a long multi-line pgbouncer hint to 26000/42P05 errors.
    return str(e).splitlines()[0] if str(e) else ""


S = Settings("asyncpg")
R = Report(S, message=first_line)


async def connect() -> asyncpg.Connection:
    # Host, port, user, password, database and TLS (PGSSLMODE, PGSSLROOTCERT) come from the
    # environment, which asyncpg reads.
    return await asyncpg.connect(server_settings={"application_name": S.tag})


class _Rollback(Exception):
    pass


async def after_ddl(conn, query: str, args, what: str, direct_errors: int, in_transaction: bool):
    """Runs a cached query after DDL changed its result type: at most one 0A000 may reach
    the application, the next attempt must succeed (no permanent poisoning). Where Sluice is
    transparent (session mode), exactly `direct_errors` must surface, as on a direct
    connection. Returns the row."""
    surfaced = 0
    for _attempt in (1, 2):
        try:
            if in_transaction:
                async with conn.transaction():
                    row = await conn.fetchrow(query, *args)
            else:
                row = await conn.fetchrow(query, *args)
            break
        except asyncpg.PostgresError as e:
            if e.sqlstate != "0A000":
                raise
            surfaced += 1
            R.note_recovered()
    else:
        raise CheckFailed(f"{what}: 0A000 again on the second attempt: statement poisoned")
    if S.exact:
        R.check(surfaced == direct_errors, f"{what}: expected {direct_errors} x 0A000, saw {surfaced}")
    return tuple(row)


async def client(c: int) -> None:
    step = "connect"
    try:
        conn = await connect()
        try:
            step = "arithmetic"
            for i in range(S.iterations):
                v = c * 1000 + i
                got = await conn.fetchval("select $1::int * 2", v)
                R.check(got == 2 * v, f"{step}: select {v}*2 gave {got}")

            step = "insert/select"
            insert = f"insert into {S.shared} (id, client, n) values ($1, $2, $3)"
            select = f"select client, n from {S.shared} where id = $1"
            for i in range(S.iterations):
                rowid = c * 10000 + i
                status = await conn.execute(insert, rowid, c, 7 * i)
                R.check(status == "INSERT 0 1", f"{step}: insert {rowid}: {status}")
                got = tuple(await conn.fetchrow(select, rowid))
                R.check(got == (c, 7 * i), f"{step}: row {rowid} is {got}")

            step = "transactions"
            count = f"select count(*) from {S.shared} where client = $1"
            for k in range(3):
                i = S.iterations + k
                async with conn.transaction():
                    await conn.execute(insert, c * 10000 + i, c, 7 * i)
                    got = await conn.fetchval(count, c)
                    R.check(got == i + 1, f"{step}: {got} rows inside transaction {k}, expected {i + 1}")
            try:
                async with conn.transaction():
                    await conn.execute(insert, c * 10000 + 900, c, 0)
                    raise _Rollback()
            except _Rollback:
                pass
            got = await conn.fetchval(f"select count(*) from {S.shared} where id = $1", c * 10000 + 900)
            R.check(got == 0, f"{step}: rolled-back row is there")

            step = "ddl on own table"
            own = f"{S.tag}_c{c}"
            await conn.execute(f"create table {own} (id int primary key, v int)")
            await conn.execute(f"insert into {own} values (1, $1)", 40 + c)
            q = f"select * from {own} where id = $1"
            for _ in range(2):
                R.check(tuple(await conn.fetchrow(q, 1)) == (1, 40 + c), f"{step}: before ALTER")
            await conn.execute(f"alter table {own} alter column v type bigint")
            row = await after_ddl(conn, q, (1,), f"{step}: int -> bigint", 0, in_transaction=False)
            R.check(row == (1, 40 + c), f"{step}: row after int -> bigint is {row}")
            stmt = await conn.prepare(q)
            v_type = stmt.get_attributes()[1].type.name
            del stmt
            R.check(v_type == "int8", f"{step}: v is {v_type}, not int8")
            await conn.execute(f"alter table {own} add column w text not null default 'w'")
            row = await after_ddl(conn, q, (1,), f"{step}: add column, in a transaction", 1, in_transaction=True)
            R.check(row == (1, 40 + c, "w"), f"{step}: row after add column is {row}")

            step = "DEALLOCATE ALL"
            await conn.execute("DEALLOCATE ALL")
            await conn.reload_schema_state()  # asyncpg's statements are gone: forget them
            for i in range(3):
                got = await conn.fetchval("select $1::int * 2", i)
                R.check(got == 2 * i, f"{step}: select {i}*2 gave {got}")
                got = tuple(await conn.fetchrow(q, 1))
                R.check(got == (1, 40 + c, "w"), f"{step}: own table row is {got}")

            step = "final count"
            rows, total = shared_totals(S)
            got = tuple(await conn.fetchrow(f"select count(*), sum(n) from {S.shared} where client = $1", c))
            R.check(got == (rows, total), f"{step}: {got}, expected {(rows, total)}")
        finally:
            await conn.close()
    except Exception as e:  # noqa: BLE001 - report everything, exit non-zero
        R.failed(f"client {c}", e, step)


async def cross_connection() -> None:
    """DDL on one connection invalidating a statement cached on another, and statement close
    followed by reuse. Two connections at once, so it fits a pool of 3 in session mode."""
    step = "connect"
    try:
        reader, ddl = await connect(), await connect()
        try:
            step = "cross-connection ddl"
            x = f"{S.tag}_x"
            await reader.execute(f"create table {x} (id int primary key, v int)")
            await reader.execute(f"insert into {x} values (1, 7)")
            q = f"select * from {x} where id = $1"
            for _ in range(2):
                R.check(tuple(await reader.fetchrow(q, 1)) == (1, 7), f"{step}: before ALTER")
            await ddl.execute(f"alter table {x} alter column v type bigint")
            row = await after_ddl(reader, q, (1,), f"{step}: reader", 0, in_transaction=False)
            R.check(row == (1, 7), f"{step}: reader's row is {row}")
            row = await after_ddl(ddl, q, (1,), f"{step}: other client, first use", 0, in_transaction=False)
            R.check(row == (1, 7), f"{step}: other client's row is {row}")

            step = "close and reuse"
            for rnd in range(3):
                stmt = await ddl.prepare("select $1::int + 100")
                got = await stmt.fetchval(rnd)
                R.check(got == rnd + 100, f"{step}: round {rnd} gave {got}")
                del stmt  # closed on the server before the next statement asyncpg prepares
                gc.collect()
                got = await ddl.fetchval("select $1::int + 200", rnd)
                R.check(got == rnd + 200, f"{step}: round {rnd}, cached statement gave {got}")
        finally:
            await reader.close()
            await ddl.close()
    except Exception as e:  # noqa: BLE001
        R.failed("cross-connection", e, step)


async def main() -> int:
    try:
        conn = await connect()
        await conn.execute(f"create table {S.shared} (id int primary key, client int not null, n int not null)")
        await conn.close()
    except Exception as e:  # noqa: BLE001
        R.failed("setup", e)
        return R.finish()

    await asyncio.gather(*(client(c) for c in range(S.clients)))
    await cross_connection()

    try:
        conn = await connect()
        rows, total = shared_totals(S)
        got = tuple(await conn.fetchrow(f"select count(*), coalesce(sum(n), 0) from {S.shared}"))
        R.check(got == (rows * S.clients, total * S.clients), f"shared table holds {got}")
        tables = [S.shared, f"{S.tag}_x"] + [f"{S.tag}_c{c}" for c in range(S.clients)]
        await conn.execute("drop table if exists " + ", ".join(tables))
        await conn.close()
    except Exception as e:  # noqa: BLE001
        R.failed("verify", e)
    return R.finish()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
