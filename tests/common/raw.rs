//! A minimal blocking wire-protocol client for black-box tests that need exact control
//! of the bytes sent (pipelines, Flush without Sync, malformed packets).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

pub struct Raw {
    pub s: TcpStream,
}

pub fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![tag];
    v.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    v.extend_from_slice(body);
    v
}

fn cstr(v: &mut Vec<u8>, s: &str) {
    v.extend_from_slice(s.as_bytes());
    v.push(0);
}

pub fn startup(params: &[(&str, &str)], version: u32) -> Vec<u8> {
    let mut body = version.to_be_bytes().to_vec();
    for (k, v) in params {
        cstr(&mut body, k);
        cstr(&mut body, v);
    }
    body.push(0);
    let mut out = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    out.extend(body);
    out
}

/// A CancelRequest packet for the key (`pid`, `secret`).
pub fn cancel_request(pid: u32, secret: u32) -> Vec<u8> {
    [16u32, 80877102, pid, secret].map(u32::to_be_bytes).concat()
}

pub fn query(sql: &str) -> Vec<u8> {
    let mut b = Vec::new();
    cstr(&mut b, sql);
    msg(b'Q', &b)
}

pub fn parse(name: &str, sql: &str) -> Vec<u8> {
    let mut b = Vec::new();
    cstr(&mut b, name);
    cstr(&mut b, sql);
    b.extend_from_slice(&0u16.to_be_bytes());
    msg(b'P', &b)
}

/// Bind with text parameters and text results.
pub fn bind(portal: &str, stmt: &str, params: &[&str]) -> Vec<u8> {
    let mut b = Vec::new();
    cstr(&mut b, portal);
    cstr(&mut b, stmt);
    b.extend_from_slice(&0u16.to_be_bytes());
    b.extend_from_slice(&(params.len() as u16).to_be_bytes());
    for p in params {
        b.extend_from_slice(&(p.len() as i32).to_be_bytes());
        b.extend_from_slice(p.as_bytes());
    }
    b.extend_from_slice(&0u16.to_be_bytes());
    msg(b'B', &b)
}

pub fn describe_portal(portal: &str) -> Vec<u8> {
    let mut b = vec![b'P'];
    cstr(&mut b, portal);
    msg(b'D', &b)
}

pub fn execute(portal: &str, max_rows: i32) -> Vec<u8> {
    let mut b = Vec::new();
    cstr(&mut b, portal);
    b.extend_from_slice(&max_rows.to_be_bytes());
    msg(b'E', &b)
}

/// `sql` through the extended protocol, unnamed: Parse, Bind, Execute (all rows), Sync.
pub fn extended_query(sql: &str) -> Vec<u8> {
    [parse("", sql), bind("", "", &[]), execute("", 0), sync()].concat()
}

/// `rows` as one CopyData, then CopyDone.
pub fn copy_rows(rows: &[u8]) -> Vec<u8> {
    [msg(b'd', rows), msg(b'c', b"")].concat()
}

pub fn sync() -> Vec<u8> {
    msg(b'S', b"")
}

pub fn flush() -> Vec<u8> {
    msg(b'H', b"")
}

impl Raw {
    pub fn open(port: u16) -> Raw {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to sluice");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.set_nodelay(true).unwrap();
        Raw { s }
    }

    /// Connects and logs in with trust auth; returns after the first ReadyForQuery.
    pub fn login(port: u16, user: &str, db: &str) -> Raw {
        let mut r = Raw::open(port);
        r.send(&startup(&[("user", user), ("database", db)], 3 << 16));
        let msgs = r.until_ready();
        assert_eq!(msgs[0].0, b'R', "expected authentication, got {msgs:?}");
        r
    }

    /// The connection itself, to read raw bytes.
    pub fn stream(&mut self) -> &mut TcpStream {
        &mut self.s
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).expect("write to sluice");
    }

    /// Reads one message; None on EOF.
    pub fn recv(&mut self) -> Option<(u8, Vec<u8>)> {
        let mut head = [0u8; 5];
        if self.s.read_exact(&mut head).is_err() {
            return None;
        }
        let len = u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len - 4];
        self.s.read_exact(&mut body).ok()?;
        Some((head[0], body))
    }

    /// Reads messages up to and including the next ReadyForQuery.
    pub fn until_ready(&mut self) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        loop {
            let m = self.recv().unwrap_or_else(|| panic!("connection closed; got so far: {out:?}"));
            let done = m.0 == b'Z';
            out.push(m);
            if done {
                return out;
            }
        }
    }

    /// Reads `n` messages.
    pub fn take(&mut self, n: usize) -> Vec<(u8, Vec<u8>)> {
        (0..n).map(|_| self.recv().expect("message")).collect()
    }

    /// Reads the next message, which must be an ErrorResponse with SQLSTATE `code` and
    /// a message containing `text`.
    pub fn expect_error(&mut self, code: &str, text: &str) {
        let (tag, body) = self.recv().unwrap_or_else(|| panic!("connection closed before the {code} error"));
        assert_eq!(tag, b'E', "expected the {code} error, got {:?}", String::from_utf8_lossy(&body));
        assert_eq!(sqlstate(&body), code, "{:?}", String::from_utf8_lossy(&body));
        assert!(field(&body, b'M').contains(text), "{:?} lacks {text:?}", field(&body, b'M'));
    }

    /// Whether the peer closed the connection, after draining any pending messages;
    /// false when it stays open (the read times out).
    pub fn closed(&mut self) -> bool {
        let mut head = [0u8; 5];
        loop {
            let r = self.s.read_exact(&mut head).and_then(|()| {
                let len = u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
                self.s.read_exact(&mut vec![0u8; len.saturating_sub(4)])
            });
            match r {
                Ok(()) => continue,
                Err(e) => {
                    use std::io::ErrorKind::*;
                    return matches!(e.kind(), UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe);
                }
            }
        }
    }
}

pub fn tags(msgs: &[(u8, Vec<u8>)]) -> String {
    msgs.iter().map(|(t, _)| *t as char).collect()
}

/// The SQLSTATE of an ErrorResponse body.
pub fn sqlstate(body: &[u8]) -> String {
    field(body, b'C')
}

pub fn field(body: &[u8], kind: u8) -> String {
    let mut rest = body;
    while let Some((&k, tail)) = rest.split_first() {
        if k == 0 {
            break;
        }
        let end = tail.iter().position(|&b| b == 0).unwrap();
        if k == kind {
            return String::from_utf8_lossy(&tail[..end]).into_owned();
        }
        rest = &tail[end + 1..];
    }
    String::new()
}

/// The first column of the first DataRow in `msgs`, as text.
pub fn first_value(msgs: &[(u8, Vec<u8>)]) -> String {
    let (_, row) = msgs.iter().find(|(t, _)| *t == b'D').expect("a DataRow");
    first_column(row)
}

/// The first column of a DataRow body, as text.
pub fn first_column(row: &[u8]) -> String {
    let len = i32::from_be_bytes(row[2..6].try_into().unwrap());
    String::from_utf8_lossy(&row[6..6 + len as usize]).into_owned()
}
