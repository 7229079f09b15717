'use strict'
// node-postgres (pg) through Sluice with named queries ({name, text, values}): each name is
// Parsed once per connection and then only Bound and Executed. The workload is described in
// tests/drivers/README.md.
//
// pg's behaviour that the checks rely on (lib/client.js, lib/query.js): a name, once
// parsed, is never parsed again on that connection and pg has no API to close it. So after
// DDL changes a statement's result type, that name keeps failing with 0A000 on its
// connection (on a direct connection, and so in session mode); the application recovers with
// a new name, and may DEALLOCATE the stale one with SQL. Another connection may use the
// same name with no trouble.

const fs = require('fs')
const crypto = require('crypto')
const { Client } = require('pg')

const mode = process.env.SLUICE_MODE || 'direct'
const clients = Number(process.env.DRIVER_CLIENTS || 8)
const iterations = Number(process.env.DRIVER_ITERATIONS || 40)
const deadlineS = Number(process.env.DRIVER_DEADLINE_S || 60)
const tag = `drv_node_pg_${crypto.randomBytes(4).toString('hex')}`
const shared = `${tag}_shared`
// Session mode relays every message untouched, so exactly what pg does on a direct connection
// is expected; in transaction mode only the common rule holds (0A000 at most once, then success).
const exact = mode === 'session' || mode === 'direct'
const INT8_OID = 20

const started = Date.now()
let checks = 0
let recovered = 0
const failures = []

class CheckFailed extends Error {}

function check(ok, what) {
  checks++
  if (!ok) throw new CheckFailed(what)
}

function describe(e) {
  if (e instanceof CheckFailed) return e.message
  return e.code ? `${e.code} ${e.message}` : `${e.name}: ${e.message}`
}

// Records the error that ended `who`'s run, in `step` if given: a failed check by its message
// (which names its step), anything else as `step: ` and its description.
function failed(who, e, step) {
  const where = step === undefined || e instanceof CheckFailed ? '' : `${step}: `
  failures.push(`${who}: ${where}${describe(e)}`)
}

function summary() {
  const head = `node-pg/${mode}:`
  const shape = `${clients} clients x ${iterations} iterations, ${checks} checks passed`
  const elapsed = ((Date.now() - started) / 1000).toFixed(1)
  if (failures.length === 0) {
    return `${head} PASS ${shape}, ${recovered} invalidated statements recovered, ${elapsed} s`
  }
  return `${head} FAIL ${failures.length} failure(s), ${shape}; first: ${failures[0]}`
}

setTimeout(() => {
  failures.push(`watchdog: still running after ${deadlineS} s`)
  console.log(summary())
  process.exit(3)
}, deadlineS * 1000).unref()

// TLS from the environment as libpq reads it (pg's own PGSSLMODE handling verifies the
// certificate even for "require").
function sslFromEnv() {
  const sslmode = process.env.PGSSLMODE || 'disable'
  if (['disable', 'allow', 'prefer'].includes(sslmode)) return false
  const ssl = { rejectUnauthorized: sslmode === 'verify-ca' || sslmode === 'verify-full' }
  if (process.env.PGSSLROOTCERT) ssl.ca = fs.readFileSync(process.env.PGSSLROOTCERT, 'utf8')
  if (sslmode === 'verify-ca') ssl.checkServerIdentity = () => undefined
  return ssl
}

// Host, port, user, password and database come from PGHOST, PGPORT, PGUSER, PGPASSWORD and
// PGDATABASE, which pg reads.
async function connect() {
  const client = new Client({ ssl: sslFromEnv(), application_name: tag })
  client.on('error', (e) => failed('connection error', e))
  await client.connect()
  return client
}

function named(name, text, values) {
  return { name, text, values }
}

// Runs a named query after DDL changed its result type: at most one 0A000 may reach the
// application, the next attempt must succeed. Where Sluice is transparent, exactly
// `directErrors` must surface, as on a direct connection. Returns the query result.
async function afterDdl(client, query, what, directErrors) {
  let surfaced = 0
  for (let attempt = 1; attempt <= 2; attempt++) {
    try {
      const result = await client.query(query)
      if (exact) check(surfaced === directErrors, `${what}: expected ${directErrors} x 0A000, saw ${surfaced}`)
      return result
    } catch (e) {
      if (e.code !== '0A000') throw e
      surfaced++
      recovered++
    }
  }
  throw new CheckFailed(`${what}: 0A000 again on the second execution: statement poisoned`)
}

// Runs a named query whose name pg will never parse again after DDL changed its result
// type: on a direct connection it fails with 0A000 (recovered from with a new name); in
// transaction mode it may also work.
async function staleName(client, query, what) {
  try {
    await client.query(query)
    check(!exact, `${what}: expected 0A000, the statement ran`)
  } catch (e) {
    if (e instanceof CheckFailed || e.code !== '0A000') throw e
    checks++
    recovered++
  }
}

async function runClient(c) {
  let step = 'connect'
  let client
  try {
    client = await connect()
    step = 'arithmetic'
    for (let i = 0; i < iterations; i++) {
      const v = c * 1000 + i
      const { rows } = await client.query(named('arith', 'select $1::int * 2 as v', [v]))
      check(rows[0].v === 2 * v, `${step}: select ${v}*2 gave ${rows[0].v}`)
    }

    step = 'insert/select'
    const insert = `insert into ${shared} (id, client, n) values ($1, $2, $3)`
    const select = `select client, n from ${shared} where id = $1`
    for (let i = 0; i < iterations; i++) {
      const id = c * 10000 + i
      const ins = await client.query(named('insert', insert, [id, c, 7 * i]))
      check(ins.rowCount === 1, `${step}: insert ${id}: rowCount ${ins.rowCount}`)
      const { rows } = await client.query(named('select_shared', select, [id]))
      check(rows.length === 1 && rows[0].client === c && rows[0].n === 7 * i, `${step}: row ${id} is ${JSON.stringify(rows)}`)
    }

    step = 'transactions'
    const count = `select count(*)::int as n from ${shared} where client = $1`
    for (let k = 0; k < 3; k++) {
      const i = iterations + k
      await client.query('begin')
      await client.query(named('insert', insert, [c * 10000 + i, c, 7 * i]))
      const { rows } = await client.query(named('count_client', count, [c]))
      check(rows[0].n === i + 1, `${step}: ${rows[0].n} rows inside transaction ${k}, expected ${i + 1}`)
      await client.query('commit')
    }
    await client.query('begin')
    await client.query(named('insert', insert, [c * 10000 + 900, c, 0]))
    await client.query('rollback')
    const gone = await client.query(named('count_id', `select count(*)::int as n from ${shared} where id = $1`, [c * 10000 + 900]))
    check(gone.rows[0].n === 0, `${step}: rolled-back row is there`)

    step = 'ddl on own table'
    const own = `${tag}_c${c}`
    await client.query(`create table ${own} (id int primary key, v int)`)
    await client.query(`insert into ${own} values (1, $1)`, [40 + c])
    const q = `select * from ${own} where id = $1`
    for (let i = 0; i < 2; i++) {
      const { rows } = await client.query(named('own_select', q, [1]))
      check(rows[0].id === 1 && rows[0].v === 40 + c, `${step}: before ALTER: ${JSON.stringify(rows)}`)
    }
    await client.query(`alter table ${own} alter column v type bigint`)
    await staleName(client, named('own_select', q, [1]), `${step}: int -> bigint, same name`)
    let result = await afterDdl(client, named('own_select_2', q, [1]), `${step}: int -> bigint, new name`, 0)
    // pg returns bigint as a string
    check(result.rows[0].v === String(40 + c), `${step}: row after int -> bigint: ${JSON.stringify(result.rows)}`)
    check(result.fields[1].dataTypeID === INT8_OID, `${step}: v has type oid ${result.fields[1].dataTypeID}`)
    await client.query(`alter table ${own} add column w text not null default 'w'`)
    await staleName(client, named('own_select_2', q, [1]), `${step}: add column, same name`)
    result = await afterDdl(client, named('own_select_3', q, [1]), `${step}: add column, new name`, 0)
    check(result.rows[0].w === 'w' && result.rows[0].v === String(40 + c), `${step}: row after add column: ${JSON.stringify(result.rows)}`)

    step = 'DEALLOCATE name'
    await client.query('deallocate own_select')
    await client.query('deallocate own_select_2')
    for (let i = 0; i < 3; i++) {
      const a = await client.query(named('arith', 'select $1::int * 2 as v', [i]))
      check(a.rows[0].v === 2 * i, `${step}: select ${i}*2 gave ${a.rows[0].v}`)
      const o = await client.query(named('own_select_3', q, [1]))
      check(o.rows[0].w === 'w', `${step}: own table: ${JSON.stringify(o.rows)}`)
    }

    step = 'final count'
    const rows = iterations + 3
    const total = (7 * rows * (rows - 1)) / 2
    const fin = await client.query(named('totals', `select count(*)::int as n, sum(n)::int as s from ${shared} where client = $1`, [c]))
    check(fin.rows[0].n === rows && fin.rows[0].s === total, `${step}: ${JSON.stringify(fin.rows[0])}, expected ${rows}, ${total}`)
  } catch (e) {
    failed(`client ${c}`, e, step)
  } finally {
    if (client) await client.end().catch(() => {})
  }
}

// DDL on one connection invalidating a statement cached on another, and a name that is
// stale on one connection used fresh on another. Two connections at once, so it fits a
// pool of 3 in session mode. (pg has no API to close a named statement.)
async function crossConnection() {
  let step = 'connect'
  let reader
  let ddl
  try {
    reader = await connect()
    ddl = await connect()
    step = 'cross-connection ddl'
    const x = `${tag}_x`
    await reader.query(`create table ${x} (id int primary key, v int)`)
    await reader.query(`insert into ${x} values (1, 7)`)
    const q = `select * from ${x} where id = $1`
    for (let i = 0; i < 2; i++) {
      const { rows } = await reader.query(named('sel_x', q, [1]))
      check(rows[0].v === 7, `${step}: before ALTER: ${JSON.stringify(rows)}`)
    }
    await ddl.query(`alter table ${x} alter column v type bigint`)
    await staleName(reader, named('sel_x', q, [1]), `${step}: reader, same name`)
    let result = await afterDdl(ddl, named('sel_x', q, [1]), `${step}: other client, same name, first use`, 0)
    check(result.rows[0].v === '7', `${step}: other client's row: ${JSON.stringify(result.rows)}`)
    await reader.query('deallocate sel_x')
    result = await afterDdl(reader, named('sel_x_2', q, [1]), `${step}: reader, new name`, 0)
    check(result.rows[0].v === '7', `${step}: reader's row: ${JSON.stringify(result.rows)}`)
  } catch (e) {
    failed('cross-connection', e, step)
  } finally {
    if (reader) await reader.end().catch(() => {})
    if (ddl) await ddl.end().catch(() => {})
  }
}

async function main() {
  try {
    const setup = await connect()
    await setup.query(`create table ${shared} (id int primary key, client int not null, n int not null)`)
    await setup.end()
  } catch (e) {
    failed('setup', e)
    return finish()
  }

  await Promise.all([...Array(clients).keys()].map(runClient))
  await crossConnection()

  let verify
  try {
    verify = await connect()
    const rows = iterations + 3
    const total = (7 * rows * (rows - 1)) / 2
    const { rows: got } = await verify.query(`select count(*)::int as n, coalesce(sum(n), 0)::int as s from ${shared}`)
    check(got[0].n === rows * clients && got[0].s === total * clients, `verify: shared table holds ${JSON.stringify(got[0])}`)
    const tables = [shared, `${tag}_x`, ...[...Array(clients).keys()].map((c) => `${tag}_c${c}`)]
    await verify.query(`drop table if exists ${tables.join(', ')}`)
  } catch (e) {
    failed('verify', e)
  } finally {
    if (verify) await verify.end().catch(() => {})
  }
  return finish()
}

function finish() {
  for (const line of failures.slice(0, 20)) console.error(`FAILED ${line}`)
  if (failures.length > 20) console.error(`FAILED ... and ${failures.length - 20} more`)
  console.log(summary())
  return failures.length ? 1 : 0
}

main().then(
  (code) => process.exit(code),
  (e) => {
    console.error(e)
    process.exit(2)
  },
)
