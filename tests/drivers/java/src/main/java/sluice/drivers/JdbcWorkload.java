package sluice.drivers;

import java.security.SecureRandom;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.sql.Types;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * pgjdbc through Sluice with prepareThreshold=1: every PreparedStatement is Parsed as a named
 * server statement (S_N) on its first execution and then only Bound and Executed. The workload
 * is described in tests/drivers/README.md.
 *
 * <p>pgjdbc's documented behaviour that the checks rely on (QueryExecutorBase.willHealViaReparse,
 * PgStatement.execute): "cached plan must not change result type" (0A000, routine
 * RevalidateCachedQuery) and "prepared statement does not exist" (26000) invalidate its
 * server-prepared statements, and in autocommit the statement is re-prepared and retried once
 * internally, so the application sees no error; inside a transaction (autosave=never) the error
 * surfaces once and the next transaction re-prepares. A DEALLOCATE ALL command status also
 * invalidates them. Statements evicted from its cache (preparedStatementCacheQueries) are closed
 * with a protocol Close. After DDL on the same connection it closes and re-prepares its statements
 * before their next use (Close and Parse in one round trip), so no error surfaces there either.
 */
public final class JdbcWorkload {
  static final String MODE = env("SLUICE_MODE", "direct");
  static final int CLIENTS = Integer.parseInt(env("DRIVER_CLIENTS", "8"));
  static final int ITERATIONS = Integer.parseInt(env("DRIVER_ITERATIONS", "40"));
  static final double DEADLINE_S = Double.parseDouble(env("DRIVER_DEADLINE_S", "60"));
  static final String TAG = "drv_jdbc_" + randomHex();
  static final String SHARED = TAG + "_shared";
  /**
   * Session mode relays every message untouched, so exactly what pgjdbc does on a direct
   * connection is expected; in transaction mode only the common rule holds (0A000 at most once,
   * then success).
   */
  static final boolean EXACT = MODE.equals("session") || MODE.equals("direct");

  static final long STARTED = System.nanoTime();
  static final AtomicInteger CHECKS = new AtomicInteger();
  static final AtomicInteger RECOVERED = new AtomicInteger();
  static final List<String> FAILURES = new ArrayList<>();

  static final class CheckFailed extends Exception {
    CheckFailed(String what) {
      super(what);
    }
  }

  public static void main(String[] args) throws Exception {
    Thread watchdog =
        new Thread(
            () -> {
              try {
                Thread.sleep((long) (DEADLINE_S * 1000));
              } catch (InterruptedException e) {
                return;
              }
              fail("watchdog", "still running after " + DEADLINE_S + " s");
              System.out.println(summary());
              System.out.flush();
              Runtime.getRuntime().halt(3);
            });
    watchdog.setDaemon(true);
    watchdog.start();

    try (Connection conn = connect(false)) {
      execute(conn, "create table " + SHARED + " (id int primary key, client int not null, n int not null)");
    } catch (SQLException e) {
      failed("setup", null, e);
      System.exit(finish());
    }

    ExecutorService pool = Executors.newFixedThreadPool(CLIENTS);
    List<Future<?>> clients = new ArrayList<>();
    for (int c = 0; c < CLIENTS; c++) {
      final int client = c;
      clients.add(pool.submit(() -> runClient(client)));
    }
    for (Future<?> f : clients) {
      f.get();
    }
    pool.shutdown();
    crossConnection();

    try (Connection conn = connect(false)) {
      long[] totals = sharedTotals();
      try (ResultSet rs = conn.createStatement().executeQuery("select count(*), coalesce(sum(n), 0) from " + SHARED)) {
        rs.next();
        check(rs.getLong(1) == totals[0] * CLIENTS && rs.getLong(2) == totals[1] * CLIENTS,
            "shared table holds " + rs.getLong(1) + " rows, sum " + rs.getLong(2));
      }
      StringBuilder drop = new StringBuilder("drop table if exists " + SHARED + ", " + TAG + "_x");
      for (int c = 0; c < CLIENTS; c++) {
        drop.append(", ").append(TAG).append("_c").append(c);
      }
      execute(conn, drop.toString());
    } catch (CheckFailed | SQLException e) {
      failed("verify", null, e);
    }
    System.exit(finish());
  }

  /**
   * Host, port, user, password, database and TLS (PGSSLMODE, PGSSLROOTCERT) come from the
   * environment, as libpq reads it.
   */
  static Connection connect(boolean tinyStatementCache) throws SQLException {
    String url = "jdbc:postgresql://" + env("PGHOST", "127.0.0.1") + ":" + env("PGPORT", "5432") + "/"
        + env("PGDATABASE", "postgres");
    Properties props = new Properties();
    props.setProperty("user", env("PGUSER", System.getProperty("user.name")));
    props.setProperty("password", env("PGPASSWORD", ""));
    props.setProperty("prepareThreshold", "1");
    props.setProperty("sslmode", env("PGSSLMODE", "prefer"));
    if (System.getenv("PGSSLROOTCERT") != null) {
      props.setProperty("sslrootcert", System.getenv("PGSSLROOTCERT"));
    }
    props.setProperty("ApplicationName", TAG);
    props.setProperty("connectTimeout", env("PGCONNECT_TIMEOUT", "10"));
    if (tinyStatementCache) {
      props.setProperty("preparedStatementCacheQueries", "2");
    }
    return DriverManager.getConnection(url, props);
  }

  static void runClient(int c) {
    String step = "connect";
    try (Connection conn = connect(false)) {
      step = "arithmetic";
      try (PreparedStatement ps = conn.prepareStatement("select ?::int * 2")) {
        for (int i = 0; i < ITERATIONS; i++) {
          int v = c * 1000 + i;
          ps.setInt(1, v);
          long got = single(ps);
          check(got == 2L * v, step + ": select " + v + "*2 gave " + got);
        }
      }

      step = "insert/select";
      String insert = "insert into " + SHARED + " (id, client, n) values (?, ?, ?)";
      try (PreparedStatement ins = conn.prepareStatement(insert);
          PreparedStatement sel = conn.prepareStatement("select client, n from " + SHARED + " where id = ?")) {
        for (int i = 0; i < ITERATIONS; i++) {
          int id = c * 10000 + i;
          ins.setInt(1, id);
          ins.setInt(2, c);
          ins.setInt(3, 7 * i);
          check(ins.executeUpdate() == 1, step + ": insert " + id);
          sel.setInt(1, id);
          try (ResultSet rs = sel.executeQuery()) {
            check(rs.next() && rs.getInt(1) == c && rs.getInt(2) == 7 * i, step + ": row " + id);
          }
        }

        step = "transactions";
        try (PreparedStatement count = conn.prepareStatement("select count(*) from " + SHARED + " where client = ?")) {
          for (int k = 0; k < 3; k++) {
            int i = ITERATIONS + k;
            conn.setAutoCommit(false);
            ins.setInt(1, c * 10000 + i);
            ins.setInt(2, c);
            ins.setInt(3, 7 * i);
            ins.executeUpdate();
            count.setInt(1, c);
            long got = single(count);
            check(got == i + 1, step + ": " + got + " rows inside transaction " + k + ", expected " + (i + 1));
            conn.commit();
            conn.setAutoCommit(true);
          }
        }
        conn.setAutoCommit(false);
        ins.setInt(1, c * 10000 + 900);
        ins.setInt(2, c);
        ins.setInt(3, 0);
        ins.executeUpdate();
        conn.rollback();
        conn.setAutoCommit(true);
        try (PreparedStatement ps = conn.prepareStatement("select count(*) from " + SHARED + " where id = ?")) {
          ps.setInt(1, c * 10000 + 900);
          check(single(ps) == 0, step + ": rolled-back row is there");
        }
      }

      step = "ddl on own table";
      String own = TAG + "_c" + c;
      execute(conn, "create table " + own + " (id int primary key, v int)");
      execute(conn, "insert into " + own + " values (1, " + (40 + c) + ")");
      try (PreparedStatement q = conn.prepareStatement("select * from " + own + " where id = ?")) {
        q.setInt(1, 1);
        for (int i = 0; i < 2; i++) {
          check(row(q).equals(List.of("1", String.valueOf(40 + c))), step + ": before ALTER");
        }
        execute(conn, "alter table " + own + " alter column v type bigint");
        List<String> got = afterDdl(conn, q, step + ": int -> bigint", 0, false);
        check(got.equals(List.of("1", String.valueOf(40 + c))), step + ": row after int -> bigint is " + got);
        try (ResultSet rs = q.executeQuery()) {
          int type = rs.getMetaData().getColumnType(2);
          check(type == Types.BIGINT, step + ": v has JDBC type " + type + ", not BIGINT");
        }
        execute(conn, "alter table " + own + " add column w text not null default 'w'");
        got = afterDdl(conn, q, step + ": add column, in a transaction", 0, true);
        check(got.equals(List.of("1", String.valueOf(40 + c), "w")), step + ": row after add column is " + got);

        step = "DEALLOCATE ALL";
        execute(conn, "DEALLOCATE ALL"); // pgjdbc sees the command status and re-prepares
        try (PreparedStatement ps = conn.prepareStatement("select ?::int * 2")) {
          for (int i = 0; i < 3; i++) {
            ps.setInt(1, i);
            long v = single(ps);
            check(v == 2L * i, step + ": select " + i + "*2 gave " + v);
            check(row(q).equals(List.of("1", String.valueOf(40 + c), "w")), step + ": own table");
          }
        }
      }

      step = "final count";
      long[] totals = sharedTotals();
      try (PreparedStatement ps = conn.prepareStatement("select count(*), sum(n) from " + SHARED + " where client = ?")) {
        ps.setInt(1, c);
        try (ResultSet rs = ps.executeQuery()) {
          rs.next();
          check(rs.getLong(1) == totals[0] && rs.getLong(2) == totals[1],
              step + ": " + rs.getLong(1) + " rows, sum " + rs.getLong(2));
        }
      }
    } catch (CheckFailed | SQLException | RuntimeException e) {
      failed("client " + c, step, e);
    }
  }

  /**
   * DDL on one connection invalidating a statement cached on another, and statement close (cache
   * eviction) followed by reuse. Two connections at once, so it fits a pool of 3 in session mode.
   */
  static void crossConnection() {
    String step = "connect";
    try (Connection reader = connect(false);
        Connection ddl = connect(true)) {
      step = "cross-connection ddl";
      String x = TAG + "_x";
      execute(reader, "create table " + x + " (id int primary key, v int)");
      execute(reader, "insert into " + x + " values (1, 7)");
      String sql = "select * from " + x + " where id = ?";
      try (PreparedStatement q = reader.prepareStatement(sql)) {
        q.setInt(1, 1);
        for (int i = 0; i < 2; i++) {
          check(row(q).equals(List.of("1", "7")), step + ": before ALTER");
        }
        execute(ddl, "alter table " + x + " alter column v type bigint");
        List<String> got = afterDdl(reader, q, step + ": reader", 0, false);
        check(got.equals(List.of("1", "7")), step + ": reader's row is " + got);
        execute(ddl, "alter table " + x + " add column w text not null default 'w'");
        got = afterDdl(reader, q, step + ": reader, add column, in a transaction", 1, true);
        check(got.equals(List.of("1", "7", "w")), step + ": reader's row after add column is " + got);
      }
      try (PreparedStatement q = ddl.prepareStatement(sql)) {
        q.setInt(1, 1);
        List<String> got = afterDdl(ddl, q, step + ": other client, first use", 0, false);
        check(got.equals(List.of("1", "7", "w")), step + ": other client's row is " + got);
      }

      step = "close and reuse";
      for (int round = 0; round < 3; round++) {
        for (int k = 1; k <= 4; k++) {
          try (PreparedStatement ps = ddl.prepareStatement("select ?::int + " + k)) {
            ps.setInt(1, 10 * round);
            long got = single(ps);
            check(got == 10L * round + k, step + ": round " + round + ", +" + k + " gave " + got);
          }
        }
      }
    } catch (CheckFailed | SQLException | RuntimeException e) {
      failed("cross-connection", step, e);
    }
  }

  /**
   * Runs a cached statement after DDL changed its result type: at most one 0A000 may reach the
   * application, the next attempt must succeed (no permanent poisoning). Where Sluice is
   * transparent (session mode), exactly {@code directErrors} must surface, as on a direct
   * connection.
   */
  static List<String> afterDdl(Connection conn, PreparedStatement q, String what, int directErrors,
      boolean inTransaction) throws SQLException, CheckFailed {
    int surfaced = 0;
    for (int attempt = 1; attempt <= 2; attempt++) {
      try {
        conn.setAutoCommit(!inTransaction);
        List<String> got = row(q);
        if (inTransaction) {
          conn.commit();
          conn.setAutoCommit(true);
        }
        if (EXACT) {
          check(surfaced == directErrors, what + ": expected " + directErrors + " x 0A000, saw " + surfaced);
        }
        return got;
      } catch (SQLException e) {
        if (inTransaction) {
          conn.rollback();
          conn.setAutoCommit(true);
        }
        if (!"0A000".equals(e.getSQLState())) {
          throw e;
        }
        surfaced++;
        RECOVERED.incrementAndGet();
      }
    }
    throw new CheckFailed(what + ": 0A000 again on the second attempt: statement poisoned");
  }

  static long single(PreparedStatement ps) throws SQLException, CheckFailed {
    try (ResultSet rs = ps.executeQuery()) {
      check(rs.next(), "no row");
      return rs.getLong(1);
    }
  }

  static List<String> row(PreparedStatement ps) throws SQLException, CheckFailed {
    try (ResultSet rs = ps.executeQuery()) {
      check(rs.next(), "no row");
      List<String> values = new ArrayList<>();
      for (int i = 1; i <= rs.getMetaData().getColumnCount(); i++) {
        values.add(rs.getString(i));
      }
      return values;
    }
  }

  static void execute(Connection conn, String sql) throws SQLException {
    try (Statement st = conn.createStatement()) {
      st.execute(sql);
    }
  }

  /** Rows and sum(n) a client leaves in the shared table: ids i = 0..ITERATIONS+2, n = 7 * i. */
  static long[] sharedTotals() {
    long rows = ITERATIONS + 3;
    return new long[] {rows, 7 * rows * (rows - 1) / 2};
  }

  static void check(boolean ok, String what) throws CheckFailed {
    CHECKS.incrementAndGet();
    if (!ok) {
      throw new CheckFailed(what);
    }
  }

  static synchronized void fail(String who, String what) {
    FAILURES.add(who + ": " + what);
  }

  /**
   * Records the exception that ended {@code who}'s run, in {@code step} if not null: a failed check
   * by its message (which names its step), anything else as {@code step: what}, a driver error by
   * its SQLSTATE and the first line of its message.
   */
  static void failed(String who, String step, Exception e) {
    if (e instanceof CheckFailed) {
      fail(who, e.getMessage());
      return;
    }
    String what = e instanceof SQLException sql ? describe(sql) : e.toString();
    fail(who, step == null ? what : step + ": " + what);
  }

  static String describe(SQLException e) {
    String message = e.getMessage() == null ? "" : e.getMessage().lines().findFirst().orElse("");
    return e.getSQLState() + " " + message;
  }

  static synchronized String summary() {
    String head = "jdbc/" + MODE + ":";
    String shape = CLIENTS + " clients x " + ITERATIONS + " iterations, " + CHECKS.get() + " checks passed";
    if (FAILURES.isEmpty()) {
      double elapsed = (System.nanoTime() - STARTED) / 1e9;
      return String.format("%s PASS %s, %d invalidated statements recovered, %.1f s", head, shape,
          RECOVERED.get(), elapsed);
    }
    return head + " FAIL " + FAILURES.size() + " failure(s), " + shape + "; first: " + FAILURES.get(0);
  }

  static synchronized int finish() {
    for (int i = 0; i < Math.min(20, FAILURES.size()); i++) {
      System.err.println("FAILED " + FAILURES.get(i));
    }
    if (FAILURES.size() > 20) {
      System.err.println("FAILED ... and " + (FAILURES.size() - 20) + " more");
    }
    System.err.flush();
    System.out.println(summary());
    System.out.flush();
    return FAILURES.isEmpty() ? 0 : 1;
  }

  static String env(String name, String fallback) {
    String value = System.getenv(name);
    return value == null || value.isEmpty() ? fallback : value;
  }

  static String randomHex() {
    byte[] bytes = new byte[4];
    new SecureRandom().nextBytes(bytes);
    StringBuilder hex = new StringBuilder();
    for (byte b : bytes) {
      hex.append(String.format("%02x", b));
    }
    return hex.toString();
  }

  private JdbcWorkload() {}
}
