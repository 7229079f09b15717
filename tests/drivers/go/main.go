// Command pgx-workload runs pgx v5 through Sluice with its default statement cache
// (QueryExecModeCacheStatement): every query with arguments is Parsed once per connection
// as a named statement (stmtcache_<hash of the SQL>) and then only Bound and Executed. The
// workload is described in tests/drivers/README.md.
//
// pgx's behaviour that the checks rely on (Conn.Exec, Rows.Close,
// Conn.deallocateInvalidatedCachedStatements): any error from a cached statement
// invalidates it, and before the next query pgx closes it (protocol Close) and then
// prepares it again under the same name. So after DDL changes a result type, or after a
// DEALLOCATE ALL behind pgx's back, each cached statement fails once (0A000 or 26000) and
// works on the next call. Conn.DeallocateAll empties its caches and sends DEALLOCATE ALL;
// Conn.Deallocate closes one named statement.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const int8OID = 20

var (
	mode       = env("SLUICE_MODE", "direct")
	clients    = envInt("DRIVER_CLIENTS", 8)
	iterations = envInt("DRIVER_ITERATIONS", 40)
	deadline   = time.Duration(envInt("DRIVER_DEADLINE_S", 60)) * time.Second
	tag        = "drv_pgx_" + randomHex()
	shared     = tag + "_shared"
	// Session mode relays every message untouched, so exactly what pgx does on a direct
	// connection is expected; in transaction mode only the common rule holds (an
	// invalidated statement fails at most once, then works).
	exact = mode == "session" || mode == "direct"

	started   = time.Now()
	checks    atomic.Int64
	recovered atomic.Int64
	mu        sync.Mutex
	failures  []string
)

type checkFailed struct{ what string }

func (e checkFailed) Error() string { return e.what }

func check(ok bool, format string, args ...any) {
	checks.Add(1)
	if !ok {
		panic(checkFailed{fmt.Sprintf(format, args...)})
	}
}

// must turns an unexpected error into a failure of the running client.
func must(err error, step string) {
	if err != nil {
		panic(fmt.Errorf("%s: %s", step, describe(err)))
	}
}

func describe(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code + " " + pgErr.Message
	}
	return err.Error()
}

func sqlstate(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

func fail(who, what string) {
	mu.Lock()
	defer mu.Unlock()
	failures = append(failures, who+": "+what)
}

// guard records a panic of one client (a failed check or an unexpected error) as its failure.
func guard(who string) {
	if r := recover(); r != nil {
		fail(who, fmt.Sprint(r))
	}
}

// connect reads host, port, user, password, database and TLS (PGSSLMODE, PGSSLROOTCERT)
// from the environment, as libpq does.
func connect(ctx context.Context) *pgx.Conn {
	config, err := pgx.ParseConfig("")
	must(err, "parse config")
	config.RuntimeParams["application_name"] = tag
	conn, err := pgx.ConnectConfig(ctx, config)
	must(err, "connect")
	return conn
}

func row(ctx context.Context, conn *pgx.Conn, sql string, args ...any) ([]any, []uint32, error) {
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	if !rows.Next() {
		rows.Close()
		if rows.Err() != nil {
			return nil, nil, rows.Err()
		}
		return nil, nil, errors.New("no row")
	}
	values, err := rows.Values()
	if err != nil {
		return nil, nil, err
	}
	var types []uint32
	for _, f := range rows.FieldDescriptions() {
		types = append(types, f.DataTypeOID)
	}
	rows.Close()
	return values, types, rows.Err()
}

// afterInvalidation runs a cached query whose server statement was invalidated (DDL changed
// its result type: 0A000; DEALLOCATE ALL behind pgx's back: 26000): it may fail once with
// that SQLSTATE, the next call must work (no permanent poisoning). Where Sluice is
// transparent (session mode), exactly `directErrors` failures must surface.
func afterInvalidation(ctx context.Context, conn *pgx.Conn, what, code string, directErrors int, sql string, args ...any) ([]any, []uint32) {
	surfaced := 0
	for attempt := 1; attempt <= 2; attempt++ {
		values, types, err := row(ctx, conn, sql, args...)
		if err == nil {
			if exact {
				check(surfaced == directErrors, "%s: expected %d x %s, saw %d", what, directErrors, code, surfaced)
			}
			return values, types
		}
		if sqlstate(err) != code {
			panic(fmt.Errorf("%s: attempt %d: %s", what, attempt, describe(err)))
		}
		surfaced++
		recovered.Add(1)
	}
	panic(checkFailed{fmt.Sprintf("%s: %s again on the second call: statement poisoned", what, code)})
}

func runClient(ctx context.Context, c int) {
	defer guard(fmt.Sprintf("client %d", c))
	conn := connect(ctx)
	defer conn.Close(context.Background())

	step := "arithmetic"
	for i := 0; i < iterations; i++ {
		v := c*1000 + i
		var got int
		must(conn.QueryRow(ctx, "select $1::int * 2", v).Scan(&got), step)
		check(got == 2*v, "%s: select %d*2 gave %d", step, v, got)
	}

	step = "insert/select"
	insert := "insert into " + shared + " (id, client, n) values ($1, $2, $3)"
	sel := "select client, n from " + shared + " where id = $1"
	for i := 0; i < iterations; i++ {
		id := c*10000 + i
		ct, err := conn.Exec(ctx, insert, id, c, 7*i)
		must(err, step)
		check(ct.RowsAffected() == 1, "%s: insert %d affected %d rows", step, id, ct.RowsAffected())
		var client, n int
		must(conn.QueryRow(ctx, sel, id).Scan(&client, &n), step)
		check(client == c && n == 7*i, "%s: row %d is (%d, %d)", step, id, client, n)
	}

	step = "transactions"
	count := "select count(*) from " + shared + " where client = $1"
	for k := 0; k < 3; k++ {
		i := iterations + k
		tx, err := conn.Begin(ctx)
		must(err, step)
		_, err = tx.Exec(ctx, insert, c*10000+i, c, 7*i)
		must(err, step)
		var got int
		must(tx.QueryRow(ctx, count, c).Scan(&got), step)
		check(got == i+1, "%s: %d rows inside transaction %d, expected %d", step, got, k, i+1)
		must(tx.Commit(ctx), step)
	}
	tx, err := conn.Begin(ctx)
	must(err, step)
	_, err = tx.Exec(ctx, insert, c*10000+900, c, 0)
	must(err, step)
	must(tx.Rollback(ctx), step)
	var gone int
	must(conn.QueryRow(ctx, "select count(*) from "+shared+" where id = $1", c*10000+900).Scan(&gone), step)
	check(gone == 0, "%s: rolled-back row is there", step)

	step = "ddl on own table"
	own := fmt.Sprintf("%s_c%d", tag, c)
	_, err = conn.Exec(ctx, "create table "+own+" (id int primary key, v int)")
	must(err, step)
	_, err = conn.Exec(ctx, "insert into "+own+" values (1, $1)", 40+c)
	must(err, step)
	q := "select * from " + own + " where id = $1"
	for i := 0; i < 2; i++ {
		values, _, err := row(ctx, conn, q, 1)
		must(err, step)
		check(fmt.Sprint(values) == fmt.Sprintf("[1 %d]", 40+c), "%s: before ALTER: %v", step, values)
	}
	_, err = conn.Exec(ctx, "alter table "+own+" alter column v type bigint")
	must(err, step)
	values, types := afterInvalidation(ctx, conn, step+": int -> bigint", "0A000", 1, q, 1)
	check(fmt.Sprint(values) == fmt.Sprintf("[1 %d]", 40+c), "%s: row after int -> bigint: %v", step, values)
	check(types[1] == int8OID && reflect.TypeOf(values[1]).Kind() == reflect.Int64, "%s: v has type oid %d", step, types[1])
	_, err = conn.Exec(ctx, "alter table "+own+" add column w text not null default 'w'")
	must(err, step)
	values, _ = afterInvalidation(ctx, conn, step+": add column", "0A000", 1, q, 1)
	check(fmt.Sprint(values) == fmt.Sprintf("[1 %d w]", 40+c), "%s: row after add column: %v", step, values)

	step = "DEALLOCATE ALL behind pgx's back"
	_, err = conn.Exec(ctx, "DEALLOCATE ALL")
	must(err, step)
	values, _ = afterInvalidation(ctx, conn, step+": arithmetic", "26000", 1, "select $1::int * 2", 21)
	check(fmt.Sprint(values) == "[42]", "%s: select 21*2 gave %v", step, values)
	values, _ = afterInvalidation(ctx, conn, step+": own table", "26000", 1, q, 1)
	check(fmt.Sprint(values) == fmt.Sprintf("[1 %d w]", 40+c), "%s: own table: %v", step, values)

	step = "DeallocateAll"
	must(conn.DeallocateAll(ctx), step)
	for i := 0; i < 3; i++ {
		var got int
		must(conn.QueryRow(ctx, "select $1::int * 2", i).Scan(&got), step)
		check(got == 2*i, "%s: select %d*2 gave %d", step, i, got)
		values, _, err := row(ctx, conn, q, 1)
		must(err, step)
		check(fmt.Sprint(values) == fmt.Sprintf("[1 %d w]", 40+c), "%s: own table: %v", step, values)
	}

	step = "final count"
	rows := iterations + 3
	total := 7 * rows * (rows - 1) / 2
	var n, s int
	must(conn.QueryRow(ctx, "select count(*), sum(n) from "+shared+" where client = $1", c).Scan(&n, &s), step)
	check(n == rows && s == total, "%s: %d rows, sum %d, expected %d, %d", step, n, s, rows, total)
}

// crossConnection: DDL on one connection invalidating a statement cached on another, and a
// named statement closed (Deallocate) then prepared again under the same name. Two
// connections at once, so it fits a pool of 3 in session mode.
func crossConnection(ctx context.Context) {
	defer guard("cross-connection")
	reader := connect(ctx)
	defer reader.Close(context.Background())
	ddl := connect(ctx)
	defer ddl.Close(context.Background())

	step := "cross-connection ddl"
	x := tag + "_x"
	_, err := reader.Exec(ctx, "create table "+x+" (id int primary key, v int)")
	must(err, step)
	_, err = reader.Exec(ctx, "insert into "+x+" values (1, 7)")
	must(err, step)
	q := "select * from " + x + " where id = $1"
	for i := 0; i < 2; i++ {
		values, _, err := row(ctx, reader, q, 1)
		must(err, step)
		check(fmt.Sprint(values) == "[1 7]", "%s: before ALTER: %v", step, values)
	}
	_, err = ddl.Exec(ctx, "alter table "+x+" alter column v type bigint")
	must(err, step)
	values, _ := afterInvalidation(ctx, reader, step+": reader", "0A000", 1, q, 1)
	check(fmt.Sprint(values) == "[1 7]", "%s: reader's row: %v", step, values)
	values, _ = afterInvalidation(ctx, ddl, step+": other client, first use", "0A000", 0, q, 1)
	check(fmt.Sprint(values) == "[1 7]", "%s: other client's row: %v", step, values)

	step = "close and reuse"
	for round := 0; round < 3; round++ {
		_, err := ddl.Prepare(ctx, "sluice_named", "select $1::int + 100")
		must(err, step)
		var got int
		must(ddl.QueryRow(ctx, "sluice_named", round).Scan(&got), step)
		check(got == round+100, "%s: round %d gave %d", step, round, got)
		must(ddl.Deallocate(ctx, "sluice_named"), step)
	}
}

func main() {
	watchdog := time.AfterFunc(deadline, func() {
		fail("watchdog", fmt.Sprintf("still running after %s", deadline))
		fmt.Println(summary())
		os.Exit(3)
	})
	defer watchdog.Stop()
	ctx := context.Background()

	func() {
		defer guard("setup")
		conn := connect(ctx)
		defer conn.Close(ctx)
		_, err := conn.Exec(ctx, "create table "+shared+" (id int primary key, client int not null, n int not null)")
		must(err, "create table")
	}()
	if len(failures) > 0 {
		os.Exit(finish())
	}

	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runClient(ctx, c)
		}()
	}
	wg.Wait()
	crossConnection(ctx)

	func() {
		defer guard("verify")
		conn := connect(ctx)
		defer conn.Close(ctx)
		rows := iterations + 3
		total := 7 * rows * (rows - 1) / 2
		var n, s int
		must(conn.QueryRow(ctx, "select count(*), coalesce(sum(n), 0) from "+shared).Scan(&n, &s), "verify")
		check(n == rows*clients && s == total*clients, "shared table holds %d rows, sum %d", n, s)
		tables := []string{shared, tag + "_x"}
		for c := 0; c < clients; c++ {
			tables = append(tables, fmt.Sprintf("%s_c%d", tag, c))
		}
		_, err := conn.Exec(ctx, "drop table if exists "+strings.Join(tables, ", "))
		must(err, "drop tables")
	}()
	os.Exit(finish())
}

func summary() string {
	mu.Lock()
	defer mu.Unlock()
	head := "pgx/" + mode + ":"
	shape := fmt.Sprintf("%d clients x %d iterations, %d checks passed", clients, iterations, checks.Load())
	if len(failures) == 0 {
		return fmt.Sprintf("%s PASS %s, %d invalidated statements recovered, %.1f s", head, shape,
			recovered.Load(), time.Since(started).Seconds())
	}
	return fmt.Sprintf("%s FAIL %d failure(s), %s; first: %s", head, len(failures), shape, failures[0])
}

func finish() int {
	mu.Lock()
	for i, line := range failures {
		if i == 20 {
			fmt.Fprintf(os.Stderr, "FAILED ... and %d more\n", len(failures)-20)
			break
		}
		fmt.Fprintln(os.Stderr, "FAILED "+line)
	}
	n := len(failures)
	mu.Unlock()
	fmt.Println(summary())
	if n > 0 {
		return 1
	}
	return 0
}

func env(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

func envInt(name string, fallback int) int {
	v, err := strconv.Atoi(env(name, strconv.Itoa(fallback)))
	if err != nil {
		return fallback
	}
	return v
}

func randomHex() string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
