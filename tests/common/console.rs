//! The admin console from a test: a client on it, the rows and cells of its answers, the
//! message of an error it sent, and KILL_CLIENT by psql.

use tokio_postgres::{Client, SimpleQueryMessage, SimpleQueryRow};

use super::{Role, connect, psql_cmd};

/// The console as `u_scram` (who must be in `admin_users`).
pub async fn admin(port: u16) -> Client {
    connect(port, Role::SCRAM.name, Role::SCRAM.password, "pgbouncer").await
}

/// The rows of the answer to `sql`, sent with the simple protocol.
pub async fn rows(c: &Client, sql: &str) -> Vec<SimpleQueryRow> {
    let msgs = c.simple_query(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    msgs.into_iter().filter_map(|m| if let SimpleQueryMessage::Row(r) = m { Some(r) } else { None }).collect()
}

/// The value of `column` in the first row of the answer to `sql` whose `key_col` is `key`.
pub async fn cell(c: &Client, sql: &str, key_col: &str, key: &str, column: &str) -> Option<String> {
    rows(c, sql).await.into_iter().find(|r| r.get(key_col) == Some(key)).and_then(|r| r.get(column).map(String::from))
}

/// The message of an error the server (here Sluice) sent, else the error's text.
pub fn message(e: &tokio_postgres::Error) -> String {
    e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_string())
}

/// KILL_CLIENT, from the console by psql as `user` (an admin that logs in without a
/// password), of the one client of database `db`; panics if none is listed or psql
/// fails.
pub fn kill_client_of(port: u16, user: &str, db: &str) {
    let console = |sql: &str| {
        let out = psql_cmd(port, "127.0.0.1", user, "", "pgbouncer")
            .args(["-P", "tuples_only=off", "-P", "footer=off", "-F", "|", "-c", sql])
            .output()
            .expect("psql runs");
        assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let clients = console("SHOW CLIENTS");
    let mut lines = clients.lines().map(|l| l.split('|').collect::<Vec<_>>());
    let header = lines.next().expect("a header");
    let column = |name: &str| header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("{clients}"));
    let (id, database) = (column("id"), column("database"));
    let row = lines.find(|r| r.get(database) == Some(&db)).unwrap_or_else(|| panic!("no client of {db}: {clients}"));
    console(&format!("KILL_CLIENT {}", row[id]));
}
