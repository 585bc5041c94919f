//! Databases, connections, prepared statements and results.

use std::ffi::{c_char, CStr, CString};
use std::sync::Arc;

use crate::ffi::{self, Api, Handle, RawResult};
use crate::{DbError, Library, Value};

/// An open `duckdb_database`; closed when the [`Database`] and all its connections are gone.
struct DbHandle {
    api: Arc<Api>,
    raw: Handle,
    path: String,
}

impl Drop for DbHandle {
    fn drop(&mut self) {
        // SAFETY: `raw` came from a successful duckdb_open and is closed exactly once, here,
        // after every connection (each holds an Arc of this handle) was disconnected.
        unsafe { (self.api.close)(&mut self.raw) };
    }
}

// SAFETY: a duckdb_database is thread-safe (DuckDB serialises access internally); the handle is
// only a pointer to it.
unsafe impl Send for DbHandle {}
// SAFETY: as above; shared references only open connections, which DuckDB allows concurrently.
unsafe impl Sync for DbHandle {}

/// A DuckDB database: a file (created when missing) or `:memory:`.
pub struct Database {
    handle: Arc<DbHandle>,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("path", &self.handle.path)
            .finish()
    }
}

/// Copies a C string owned by DuckDB, or `fallback` when it is null.
///
/// # Safety
/// `p` must be null or point to a NUL-terminated string valid for the duration of the call.
unsafe fn c_text(p: *const c_char, fallback: &str) -> String {
    if p.is_null() {
        fallback.to_string()
    } else {
        // SAFETY: non-null and NUL-terminated per the caller's contract.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// `text` as a C string, or an error naming `what` when it holds a NUL byte.
fn c_string(text: &str, what: &str) -> Result<CString, DbError> {
    CString::new(text).map_err(|_| DbError::InvalidArgument {
        message: format!("{what} contains a NUL byte: {text:?}"),
    })
}

impl Database {
    /// Opens (or creates) the database file at `path`; `":memory:"` opens a private in-memory one.
    pub fn open(lib: &Library, path: &str) -> Result<Database, DbError> {
        let c_path = c_string(path, "database path")?;
        let mut raw: Handle = std::ptr::null_mut();
        let mut error: *mut c_char = std::ptr::null_mut();
        // SAFETY: `c_path` is a valid C string, `raw` and `error` valid out-pointers; a null
        // config selects DuckDB's defaults (as duckdb_open does).
        let state = unsafe {
            (lib.api.open_ext)(c_path.as_ptr(), &mut raw, std::ptr::null_mut(), &mut error)
        };
        if state != ffi::SUCCESS || raw.is_null() {
            // SAFETY: `error` is null or a C string DuckDB allocated for us, copied at once.
            let message = unsafe { c_text(error, "duckdb_open_ext failed") };
            if !error.is_null() {
                // SAFETY: duckdb.h: the error of duckdb_open_ext must be freed with duckdb_free.
                unsafe { (lib.api.free)(error.cast()) };
            }
            if !raw.is_null() {
                // SAFETY: a handle handed back alongside an error is still ours to close.
                unsafe { (lib.api.close)(&mut raw) };
            }
            return Err(DbError::Open {
                path: path.to_string(),
                message,
            });
        }
        Ok(Database {
            handle: Arc::new(DbHandle {
                api: lib.api.clone(),
                raw,
                path: path.to_string(),
            }),
        })
    }

    /// The path the database was opened with.
    pub fn path(&self) -> &str {
        &self.handle.path
    }

    /// Opens a connection (connections hold the transaction state; one per thread).
    pub fn connect(&self) -> Result<Connection, DbError> {
        let mut raw: Handle = std::ptr::null_mut();
        // SAFETY: the database handle is open (owned by `self`), `raw` is a valid out-pointer.
        let state = unsafe { (self.handle.api.connect)(self.handle.raw, &mut raw) };
        if state != ffi::SUCCESS || raw.is_null() {
            if !raw.is_null() {
                // SAFETY: a handle returned alongside an error is still ours to free.
                unsafe { (self.handle.api.disconnect)(&mut raw) };
            }
            return Err(DbError::Connect {
                path: self.handle.path.clone(),
            });
        }
        Ok(Connection {
            db: self.handle.clone(),
            raw,
        })
    }
}

/// A connection to a [`Database`]. It may move between threads but is used by one at a time.
pub struct Connection {
    db: Arc<DbHandle>,
    raw: Handle,
}

// SAFETY: a duckdb_connection may be used from any thread as long as calls on it are not
// concurrent; `Connection` is not `Sync`, so only one thread at a time can reach it.
unsafe impl Send for Connection {}

impl Drop for Connection {
    fn drop(&mut self) {
        // SAFETY: `raw` came from a successful duckdb_connect and is disconnected once, here;
        // statements borrow the connection, so none outlives it.
        unsafe { (self.db.api.disconnect)(&mut self.raw) };
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("database", &self.db.path)
            .finish()
    }
}

/// A materialised `duckdb_result`, destroyed on drop.
struct ResultGuard<'a> {
    api: &'a Api,
    raw: RawResult,
}

impl Drop for ResultGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: `raw` was zero-initialised and then (possibly) filled by DuckDB; destroying
        // either state is allowed and happens exactly once.
        unsafe { (self.api.destroy_result)(&mut self.raw) };
    }
}

impl ResultGuard<'_> {
    /// DuckDB's error message of a failed query.
    fn error(&mut self) -> String {
        // SAFETY: the result is live; the returned string is owned by it and copied at once.
        unsafe {
            c_text(
                (self.api.result_error)(&mut self.raw),
                "unknown DuckDB error",
            )
        }
    }

    /// Rows changed by an INSERT / UPDATE / DELETE.
    fn rows_changed(&mut self) -> u64 {
        // SAFETY: the result is live.
        unsafe { (self.api.rows_changed)(&mut self.raw) }
    }

    /// Reads every cell, picking the [`Value`] variant from each column's type.
    fn read(&mut self, sql: &str) -> Result<Rows, DbError> {
        let api = self.api;
        let res: *mut RawResult = &mut self.raw;
        // SAFETY (for every call below): `res` points to this live, successfully executed
        // result; column and row indices are bounded by its own column and row counts.
        let (cols, rows) = unsafe { ((api.column_count)(res), (api.row_count)(res)) };
        let mut names = Vec::new();
        let mut types = Vec::new();
        for c in 0..cols {
            // SAFETY: see above; the name is owned by the result and copied at once.
            names.push(unsafe { c_text((api.column_name)(res, c), "") });
            // SAFETY: see above.
            types.push(unsafe { (api.column_type)(res, c) });
        }
        if let Some(c) = types.iter().position(|&t| !ffi::readable(t)) {
            return Err(DbError::UnsupportedType {
                sql: sql.to_string(),
                column: names[c].clone(),
                type_id: types[c],
            });
        }
        let mut out = Vec::new();
        for r in 0..rows {
            let mut row = Vec::with_capacity(types.len());
            for (c, &ty) in (0..cols).zip(&types) {
                // SAFETY: see above.
                let v = if unsafe { (api.value_is_null)(res, c, r) } || ty == ffi::TYPE_SQLNULL {
                    Value::Null
                } else {
                    match ty {
                        // SAFETY: see above.
                        ffi::TYPE_BOOLEAN => Value::Bool(unsafe { (api.value_boolean)(res, c, r) }),
                        ffi::TYPE_TINYINT
                        | ffi::TYPE_SMALLINT
                        | ffi::TYPE_INTEGER
                        | ffi::TYPE_BIGINT
                        | ffi::TYPE_UTINYINT
                        | ffi::TYPE_USMALLINT
                        // SAFETY: see above; these types all fit in i64.
                        | ffi::TYPE_UINTEGER => Value::Int(unsafe { (api.value_int64)(res, c, r) }),
                        ffi::TYPE_FLOAT | ffi::TYPE_DOUBLE | ffi::TYPE_DECIMAL => {
                            // SAFETY: see above.
                            Value::Double(unsafe { (api.value_double)(res, c, r) })
                        }
                        ffi::TYPE_UBIGINT | ffi::TYPE_HUGEINT | ffi::TYPE_UHUGEINT => {
                            // Wider than i64: exact through text, Int when it fits.
                            let text = varchar(api, res, c, r, sql, &names)?;
                            match text.parse::<i64>() {
                                Ok(i) => Value::Int(i),
                                Err(_) => Value::Text(text),
                            }
                        }
                        // VARCHAR, BLOB, TIMESTAMP, DATE, TIME, INTERVAL.
                        _ => Value::Text(varchar(api, res, c, r, sql, &names)?),
                    }
                };
                row.push(v);
            }
            out.push(row);
        }
        Ok(Rows {
            columns: names,
            rows: out,
        })
    }
}

/// Cell (`col`, `row`) of `res` converted to text by DuckDB (`duckdb_value_varchar`).
fn varchar(
    api: &Api,
    res: *mut RawResult,
    col: u64,
    row: u64,
    sql: &str,
    names: &[String],
) -> Result<String, DbError> {
    // SAFETY: `res` is a live result and (`col`, `row`) within its bounds (checked by the caller).
    let p = unsafe { (api.value_varchar)(res, col, row) };
    if p.is_null() {
        return Err(DbError::Conversion {
            sql: sql.to_string(),
            column: names.get(col as usize).cloned().unwrap_or_default(),
            row,
        });
    }
    // SAFETY: `p` is a non-null NUL-terminated string allocated by DuckDB for us.
    let text = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    // SAFETY: duckdb_value_varchar's result must be released with duckdb_free, once.
    unsafe { (api.free)(p.cast()) };
    Ok(text)
}

/// The rows of a query with their column names.
#[derive(Debug, Clone, PartialEq)]
pub struct Rows {
    /// Column names, in order.
    pub columns: Vec<String>,
    /// One `Vec<Value>` per row, one value per column.
    pub rows: Vec<Vec<Value>>,
}

impl Connection {
    /// Runs one or more `;`-separated statements without parameters (DDL, `BEGIN`, `COMMIT`,
    /// `INSERT ...`); any rows they return are discarded.
    pub fn execute(&self, sql: &str) -> Result<(), DbError> {
        let c_sql = c_string(sql, "SQL")?;
        let mut res = ResultGuard {
            api: &self.db.api,
            raw: RawResult::zeroed(),
        };
        // SAFETY: the connection is open, `c_sql` a valid C string, `res.raw` a writable result
        // that the guard destroys whatever the outcome.
        let state = unsafe { (self.db.api.query)(self.raw, c_sql.as_ptr(), &mut res.raw) };
        if state != ffi::SUCCESS {
            return Err(DbError::Query {
                sql: sql.to_string(),
                message: res.error(),
            });
        }
        Ok(())
    }

    /// Prepares one statement with `?` (or `$1`) parameters, for executing it repeatedly.
    pub fn prepare(&self, sql: &str) -> Result<Statement<'_>, DbError> {
        let c_sql = c_string(sql, "SQL")?;
        let mut raw: Handle = std::ptr::null_mut();
        // SAFETY: the connection is open, `c_sql` a valid C string, `raw` a valid out-pointer.
        let state = unsafe { (self.db.api.prepare)(self.raw, c_sql.as_ptr(), &mut raw) };
        // Wrap first, so the statement is destroyed on the error path too (duckdb.h requires it).
        let stmt = Statement {
            conn: self,
            raw,
            sql: sql.to_string(),
        };
        if state != ffi::SUCCESS || raw.is_null() {
            let message = if raw.is_null() {
                "duckdb_prepare failed".to_string()
            } else {
                // SAFETY: `raw` is a (failed) prepared statement; its error string lives until
                // it is destroyed and is copied at once.
                unsafe { c_text((self.db.api.prepare_error)(raw), "duckdb_prepare failed") }
            };
            return Err(DbError::Prepare {
                sql: sql.to_string(),
                message,
            });
        }
        Ok(stmt)
    }

    /// Prepares and executes one statement with `params`; returns the rows it changed.
    pub fn execute_params(&self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        self.prepare(sql)?.execute(params)
    }

    /// Prepares and runs one query with `params`; returns its rows (see [`Statement::query`]
    /// for how column types map to [`Value`]s).
    pub fn query(&self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
        Ok(self.prepare(sql)?.query_rows(params)?.rows)
    }

    /// Runs `f` inside `BEGIN` ... `COMMIT`; rolls back when `f` (or the commit) fails and
    /// returns that error.
    pub fn transaction<T, E: From<DbError>>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, E>,
    ) -> Result<T, E> {
        self.execute("BEGIN TRANSACTION")?;
        let out = f(self).and_then(|v| self.execute("COMMIT").map(|_| v).map_err(E::from));
        if out.is_err() {
            // The first error is the one worth reporting; a failing ROLLBACK (nothing active
            // after a failed COMMIT) adds nothing.
            let _ = self.execute("ROLLBACK");
        }
        out
    }
}

/// A prepared statement of a [`Connection`], destroyed on drop.
pub struct Statement<'c> {
    conn: &'c Connection,
    raw: Handle,
    sql: String,
}

impl Drop for Statement<'_> {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            // SAFETY: `raw` came from duckdb_prepare (successful or not) and is destroyed once.
            unsafe { (self.conn.db.api.destroy_prepare)(&mut self.raw) };
        }
    }
}

impl std::fmt::Debug for Statement<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Statement").field("sql", &self.sql).finish()
    }
}

impl Statement<'_> {
    /// Number of parameters the statement takes.
    pub fn parameter_count(&self) -> u64 {
        // SAFETY: `raw` is a successfully prepared statement.
        unsafe { (self.conn.db.api.nparams)(self.raw) }
    }

    /// Binds `params` to parameters 1..=n (replacing earlier bindings).
    fn bind(&self, params: &[Value]) -> Result<(), DbError> {
        let api = &self.conn.db.api;
        let expected = self.parameter_count();
        if params.len() as u64 != expected {
            return Err(DbError::ParameterCount {
                sql: self.sql.clone(),
                expected,
                given: params.len(),
            });
        }
        // SAFETY: `raw` is a successfully prepared statement.
        unsafe { (api.clear_bindings)(self.raw) };
        for (i, p) in params.iter().enumerate() {
            let idx = i as u64 + 1;
            // SAFETY: `raw` is a prepared statement and `idx` in 1..=nparams; the text pointer
            // and length describe `s`'s bytes, which DuckDB copies during the call.
            let state = unsafe {
                match p {
                    Value::Null => (api.bind_null)(self.raw, idx),
                    Value::Int(v) => (api.bind_int64)(self.raw, idx, *v),
                    Value::Double(v) => (api.bind_double)(self.raw, idx, *v),
                    Value::Bool(v) => (api.bind_boolean)(self.raw, idx, *v),
                    Value::Text(s) => {
                        (api.bind_varchar_length)(self.raw, idx, s.as_ptr().cast(), s.len() as u64)
                    }
                }
            };
            if state != ffi::SUCCESS {
                return Err(DbError::Bind {
                    sql: self.sql.clone(),
                    index: idx,
                    value: format!("{p:?}"),
                });
            }
        }
        Ok(())
    }

    /// Binds `params`, executes, and hands the live result to `f`.
    fn run<T>(
        &self,
        params: &[Value],
        f: impl FnOnce(&mut ResultGuard<'_>) -> Result<T, DbError>,
    ) -> Result<T, DbError> {
        self.bind(params)?;
        let mut res = ResultGuard {
            api: &self.conn.db.api,
            raw: RawResult::zeroed(),
        };
        // SAFETY: the statement is prepared with every parameter bound; `res.raw` is writable
        // and destroyed by its guard whatever the outcome.
        let state = unsafe { (self.conn.db.api.execute_prepared)(self.raw, &mut res.raw) };
        if state != ffi::SUCCESS {
            return Err(DbError::Query {
                sql: self.sql.clone(),
                message: res.error(),
            });
        }
        f(&mut res)
    }

    /// Executes with `params`; returns the rows changed (0 for statements that change none).
    pub fn execute(&self, params: &[Value]) -> Result<u64, DbError> {
        self.run(params, |res| Ok(res.rows_changed()))
    }

    /// Executes with `params` and reads every row. Column types map to values as follows:
    /// BOOLEAN → [`Value::Bool`]; TINYINT..BIGINT, UTINYINT..UINTEGER → [`Value::Int`];
    /// UBIGINT, HUGEINT, UHUGEINT → [`Value::Int`] when in range, else their decimal
    /// [`Value::Text`]; FLOAT, DOUBLE, DECIMAL → [`Value::Double`]; NULL → [`Value::Null`];
    /// VARCHAR, BLOB, TIMESTAMP, DATE, TIME, INTERVAL → DuckDB's text form as [`Value::Text`]
    /// (a TIMESTAMP reads as `2026-11-22 10:47:33`; format it in SQL, e.g.
    /// `strftime(ts, '%Y-%m-%dT%H:%M:%SZ')`, for another form). Other types (TIMESTAMPTZ,
    /// TIMESTAMP_NS, UUID, ENUM, LIST, STRUCT, MAP, ...) give [`DbError::UnsupportedType`]:
    /// cast them in SQL (`col::VARCHAR`).
    pub fn query_rows(&self, params: &[Value]) -> Result<Rows, DbError> {
        let sql = self.sql.clone();
        self.run(params, |res| res.read(&sql))
    }

    /// [`Statement::query_rows`] without the column names.
    pub fn query(&self, params: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
        Ok(self.query_rows(params)?.rows)
    }
}
