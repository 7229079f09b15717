//! A result set of the admin console and its wire encoding: RowDescription (text or
//! int8 columns, in the text or binary format the client asked for) and DataRows.

use bytes::BytesMut;

use crate::protocol::build;

const TEXT_OID: u32 = 25;
const INT8_OID: u32 = 20;

/// A column's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Text,
    Int8,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Text(String),
    Int(i64),
}

pub fn text(s: impl Into<String>) -> Value {
    Value::Text(s.into())
}

/// A number as int8 (saturating above i64::MAX).
pub fn int<N: TryInto<i64>>(n: N) -> Value {
    Value::Int(n.try_into().unwrap_or(i64::MAX))
}

#[derive(Debug, Clone, Default)]
pub struct Table {
    pub columns: Vec<(String, Kind)>,
    pub rows: Vec<Vec<Value>>,
}

/// Result format codes of a Bind: none (all text), one for all, or one per column.
#[derive(Debug, Clone, Default)]
pub struct Formats(pub Vec<i16>);

impl Formats {
    fn binary(&self, column: usize) -> bool {
        match self.0.as_slice() {
            [] => false,
            [one] => *one == 1,
            many => many.get(column).is_some_and(|f| *f == 1),
        }
    }

    /// Whether the codes fit a result of `n` columns.
    pub fn fits(&self, n: usize) -> bool {
        self.0.len() <= 1 || self.0.len() == n
    }
}

impl Table {
    /// Columns named `names`, typed by `kinds`: `s` text, `i` int8, one per name.
    pub fn new(names: &[&str], kinds: &str) -> Table {
        debug_assert_eq!(names.len(), kinds.len(), "{names:?}");
        let columns = names
            .iter()
            .zip(kinds.bytes())
            .map(|(n, k)| (n.to_string(), if k == b'i' { Kind::Int8 } else { Kind::Text }))
            .collect();
        Table { columns, rows: Vec::new() }
    }

    pub fn push(&mut self, row: Vec<Value>) {
        debug_assert_eq!(row.len(), self.columns.len());
        // Each value of the type its column announces (a driver decodes it by that type).
        debug_assert!(
            row.iter()
                .zip(&self.columns)
                .all(|(v, (_, k))| matches!((v, k), (Value::Text(_), Kind::Text) | (Value::Int(_), Kind::Int8))),
            "{row:?} does not fit {:?}",
            self.columns
        );
        self.rows.push(row);
    }

    pub fn names(&self) -> Vec<&str> {
        self.columns.iter().map(|(n, _)| n.as_str()).collect()
    }

    pub fn describe(&self, out: &mut BytesMut, formats: &Formats) {
        let cols: Vec<(&str, u32, i16, i16)> = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, (name, kind))| {
                let (oid, size) = match kind {
                    Kind::Text => (TEXT_OID, -1),
                    Kind::Int8 => (INT8_OID, 8),
                };
                (name.as_str(), oid, size, formats.binary(i) as i16)
            })
            .collect();
        build::row_description(out, &cols);
    }

    pub fn write_rows(&self, out: &mut BytesMut, formats: &Formats) {
        let mut cells: Vec<Vec<u8>> = Vec::with_capacity(self.columns.len());
        for row in &self.rows {
            cells.clear();
            for (i, v) in row.iter().enumerate() {
                cells.push(match (v, formats.binary(i)) {
                    (Value::Text(s), _) => s.as_bytes().to_vec(),
                    (Value::Int(n), false) => n.to_string().into_bytes(),
                    (Value::Int(n), true) => n.to_be_bytes().to_vec(),
                });
            }
            let refs: Vec<Option<&[u8]>> = cells.iter().map(|c| Some(c.as_slice())).collect();
            build::data_row(out, &refs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_rows() {
        let mut t = Table::new(&["name", "n"], "si");
        t.push(vec![text("a"), int(7u64)]);
        let mut out = BytesMut::new();
        t.write_rows(&mut out, &Formats(vec![]));
        assert!(out.ends_with(b"\0\0\0\x01a\0\0\0\x017"), "{out:?}");
        out.clear();
        t.write_rows(&mut out, &Formats(vec![0, 1]));
        assert!(out.ends_with(b"\0\0\0\x08\0\0\0\0\0\0\0\x07"), "{out:?}");
        assert!(Formats(vec![1]).fits(5) && !Formats(vec![0, 1, 1]).fits(2));
        assert_eq!(int(u64::MAX), Value::Int(i64::MAX));
    }
}
