//! DuckDB for ipfs-accelerate's benchmark results, through DuckDB's stable C API with
//! `libduckdb.so` loaded at run time (nothing is compiled or linked at build time).
//!
//! The library is found by [`Library::find`]: `$IPFS_ACCELERATE_DUCKDB` (a file), then
//! `$IPFS_ACCELERATE_DUCKDB_DIR/libduckdb.so`, then `~/.cache/ipfs-accelerate/duckdb/libduckdb.so`
//! ([`default_dir`]), then the system loader. `cargo xtask fetch-duckdb` puts it there, taken from
//! the npm package [`NPM_PACKAGE`].
//!
//! ```no_run
//! use ipfs_accelerate_benchdb::{Database, Library, Value};
//!
//! # fn main() -> Result<(), ipfs_accelerate_benchdb::DbError> {
//! let lib = Library::find()?;
//! let db = Database::open(&lib, "bench.duckdb")?;
//! let conn = db.connect()?;
//! conn.execute("CREATE TABLE IF NOT EXISTS t (name VARCHAR, ms DOUBLE, n BIGINT)")?;
//! conn.execute_params(
//!     "INSERT INTO t VALUES (?, ?, ?)",
//!     &[Value::from("bert"), Value::Double(1.5), Value::Null],
//! )?;
//! for row in conn.query("SELECT name, ms, n FROM t WHERE ms > ?", &[Value::Double(1.0)])? {
//!     println!("{:?} {:?} {:?}", row[0].as_str(), row[1].as_f64(), row[2].as_i64());
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Transactions: `execute("BEGIN")` / `execute("COMMIT")`, or [`Connection::transaction`].
//! Every C object (result, prepared statement, connection, database) is freed when its Rust
//! owner is dropped.

mod db;
mod ffi;
mod library;

pub use db::{Connection, Database, Rows, Statement};
pub use library::{
    default_dir, find_for_test, library_required, Library, DUCKDB_DIR_ENV, DUCKDB_ENV,
    LIBRARY_FILE, NPM_PACKAGE, REQUIRE_ENV,
};

/// Errors of the DuckDB layer; query errors carry DuckDB's message and the SQL.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// No DuckDB library was found.
    #[error("DuckDB library not found (searched: {}); run `cargo xtask fetch-duckdb` (it unpacks libduckdb.so from the npm package {NPM_PACKAGE}) or set {DUCKDB_ENV} to a libduckdb.so", searched.join(", "))]
    LibraryNotFound {
        /// Every place looked at, in order.
        searched: Vec<String>,
    },
    /// A library file exists but cannot be loaded or is not DuckDB's.
    #[error("cannot load DuckDB from {path}: {message}")]
    LibraryLoad {
        /// The file (or system-loader name).
        path: String,
        /// The loader's message or the missing symbol.
        message: String,
    },
    /// `duckdb_open` failed.
    #[error("cannot open DuckDB database {path}: {message}")]
    Open {
        /// The database path.
        path: String,
        /// DuckDB's message.
        message: String,
    },
    /// `duckdb_connect` failed.
    #[error("cannot connect to DuckDB database {path}")]
    Connect {
        /// The database path.
        path: String,
    },
    /// Executing SQL failed.
    #[error("DuckDB error: {message}\n  in SQL: {sql}")]
    Query {
        /// The statement(s).
        sql: String,
        /// DuckDB's message (`duckdb_result_error`).
        message: String,
    },
    /// Preparing a statement failed.
    #[error("DuckDB error preparing: {message}\n  in SQL: {sql}")]
    Prepare {
        /// The statement.
        sql: String,
        /// DuckDB's message (`duckdb_prepare_error`).
        message: String,
    },
    /// The number of parameters given differs from the statement's.
    #[error("statement takes {expected} parameters, {given} given\n  in SQL: {sql}")]
    ParameterCount {
        /// The statement.
        sql: String,
        /// Parameters of the statement.
        expected: u64,
        /// Parameters given.
        given: usize,
    },
    /// Binding a parameter failed.
    #[error("cannot bind parameter {index} ({value})\n  in SQL: {sql}")]
    Bind {
        /// The statement.
        sql: String,
        /// 1-based parameter index.
        index: u64,
        /// The value, debug-printed.
        value: String,
    },
    /// A result cell could not be read as text.
    #[error("cannot read column {column:?} of row {row} as text\n  in SQL: {sql}")]
    Conversion {
        /// The query.
        sql: String,
        /// Column name.
        column: String,
        /// 0-based row.
        row: u64,
    },
    /// A result column has a type this API does not read (cast it to VARCHAR in SQL).
    #[error("column {column:?} has DuckDB type id {type_id}, which is not read directly: cast it in SQL (`{column}::VARCHAR`)\n  in SQL: {sql}")]
    UnsupportedType {
        /// The query.
        sql: String,
        /// Column name.
        column: String,
        /// Its `duckdb_type` value.
        type_id: i32,
    },
    /// An argument cannot be passed to C (a NUL byte in SQL or a path).
    #[error("invalid argument: {message}")]
    InvalidArgument {
        /// What is wrong.
        message: String,
    },
}

/// A parameter or a result cell.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// Integers (BIGINT and narrower).
    Int(i64),
    /// Floating point (DOUBLE, FLOAT, DECIMAL when read).
    Double(f64),
    /// Text (VARCHAR; other types when read, see [`Statement::query_rows`]).
    Text(String),
    /// BOOLEAN.
    Bool(bool),
}

impl Value {
    /// Whether this is [`Value::Null`].
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The integer of [`Value::Int`].
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(v) => Some(*v),
            _ => None,
        }
    }

    /// The number of [`Value::Double`] or [`Value::Int`] (converted).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Double(v) => Some(*v),
            Value::Int(v) => Some(*v as f64),
            _ => None,
        }
    }

    /// The text of [`Value::Text`].
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Text(s) => Some(s),
            _ => None,
        }
    }

    /// The flag of [`Value::Bool`].
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Int(v)
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Value {
        Value::Int(i64::from(v))
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Double(v)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Text(v.to_string())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Text(v)
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Value {
        v.map_or(Value::Null, Into::into)
    }
}
