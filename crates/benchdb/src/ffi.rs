//! The part of DuckDB's C API this crate uses, resolved from a loaded `libduckdb`.
//!
//! Declarations follow `src/include/duckdb.h` of DuckDB 1.5 (checked against tag v1.5.5; the
//! npm package `@duckdb/node-bindings-linux-x64@1.5.6-r.1` exports every symbol below).

use std::ffi::{c_char, c_int, c_void};

/// `idx_t`.
pub(crate) type Idx = u64;
/// `duckdb_state` (`DuckDBSuccess = 0`, `DuckDBError = 1`).
pub(crate) type State = c_int;
/// `duckdb_type`, a C enum.
pub(crate) type TypeId = c_int;
/// `duckdb_database`, `duckdb_connection`, `duckdb_prepared_statement`: pointers to opaque structs.
pub(crate) type Handle = *mut c_void;

/// `DuckDBSuccess`.
pub(crate) const SUCCESS: State = 0;

// `duckdb_type` values (explicit in duckdb.h since 1.0).
pub(crate) const TYPE_BOOLEAN: TypeId = 1;
pub(crate) const TYPE_TINYINT: TypeId = 2;
pub(crate) const TYPE_SMALLINT: TypeId = 3;
pub(crate) const TYPE_INTEGER: TypeId = 4;
pub(crate) const TYPE_BIGINT: TypeId = 5;
pub(crate) const TYPE_UTINYINT: TypeId = 6;
pub(crate) const TYPE_USMALLINT: TypeId = 7;
pub(crate) const TYPE_UINTEGER: TypeId = 8;
pub(crate) const TYPE_UBIGINT: TypeId = 9;
pub(crate) const TYPE_FLOAT: TypeId = 10;
pub(crate) const TYPE_DOUBLE: TypeId = 11;
pub(crate) const TYPE_TIMESTAMP: TypeId = 12;
pub(crate) const TYPE_DATE: TypeId = 13;
pub(crate) const TYPE_TIME: TypeId = 14;
pub(crate) const TYPE_INTERVAL: TypeId = 15;
pub(crate) const TYPE_HUGEINT: TypeId = 16;
pub(crate) const TYPE_VARCHAR: TypeId = 17;
pub(crate) const TYPE_BLOB: TypeId = 18;
pub(crate) const TYPE_DECIMAL: TypeId = 19;
pub(crate) const TYPE_UHUGEINT: TypeId = 32;
pub(crate) const TYPE_SQLNULL: TypeId = 36;
pub(crate) const TYPE_TIME_NS: TypeId = 39;

/// Whether the `duckdb_value_*` functions can read a column of type `ty` (the types DuckDB's
/// `GetInternalCValue` handles, plus SQL NULL). Others read as NULL or fail silently there.
pub(crate) fn readable(ty: TypeId) -> bool {
    matches!(
        ty,
        TYPE_BOOLEAN
            | TYPE_TINYINT
            | TYPE_SMALLINT
            | TYPE_INTEGER
            | TYPE_BIGINT
            | TYPE_UTINYINT
            | TYPE_USMALLINT
            | TYPE_UINTEGER
            | TYPE_UBIGINT
            | TYPE_FLOAT
            | TYPE_DOUBLE
            | TYPE_TIMESTAMP
            | TYPE_DATE
            | TYPE_TIME
            | TYPE_INTERVAL
            | TYPE_HUGEINT
            | TYPE_VARCHAR
            | TYPE_BLOB
            | TYPE_DECIMAL
            | TYPE_UHUGEINT
            | TYPE_SQLNULL
            | TYPE_TIME_NS
    )
}

/// `duckdb_result` of duckdb.h 1.5: five deprecated fields and the internal pointer.
/// Only its address is handed to DuckDB; the fields are never read here.
#[repr(C)]
pub(crate) struct RawResult {
    deprecated_column_count: Idx,
    deprecated_row_count: Idx,
    deprecated_rows_changed: Idx,
    deprecated_columns: *mut c_void,
    deprecated_error_message: *mut c_char,
    internal_data: *mut c_void,
}

impl RawResult {
    /// An all-zero result, as DuckDB's own clients pass to `duckdb_query`: destroying it is a
    /// no-op even when DuckDB never filled it.
    pub(crate) fn zeroed() -> RawResult {
        RawResult {
            deprecated_column_count: 0,
            deprecated_row_count: 0,
            deprecated_rows_changed: 0,
            deprecated_columns: std::ptr::null_mut(),
            deprecated_error_message: std::ptr::null_mut(),
            internal_data: std::ptr::null_mut(),
        }
    }
}

/// Resolved entry points, kept together with the library that owns them.
pub(crate) struct Api {
    pub(crate) library_version: unsafe extern "C" fn() -> *const c_char,
    pub(crate) open_ext:
        unsafe extern "C" fn(*const c_char, *mut Handle, Handle, *mut *mut c_char) -> State,
    pub(crate) close: unsafe extern "C" fn(*mut Handle),
    pub(crate) connect: unsafe extern "C" fn(Handle, *mut Handle) -> State,
    pub(crate) disconnect: unsafe extern "C" fn(*mut Handle),
    pub(crate) query: unsafe extern "C" fn(Handle, *const c_char, *mut RawResult) -> State,
    pub(crate) destroy_result: unsafe extern "C" fn(*mut RawResult),
    pub(crate) result_error: unsafe extern "C" fn(*mut RawResult) -> *const c_char,
    pub(crate) row_count: unsafe extern "C" fn(*mut RawResult) -> Idx,
    pub(crate) column_count: unsafe extern "C" fn(*mut RawResult) -> Idx,
    pub(crate) rows_changed: unsafe extern "C" fn(*mut RawResult) -> Idx,
    pub(crate) column_type: unsafe extern "C" fn(*mut RawResult, Idx) -> TypeId,
    pub(crate) column_name: unsafe extern "C" fn(*mut RawResult, Idx) -> *const c_char,
    pub(crate) value_is_null: unsafe extern "C" fn(*mut RawResult, Idx, Idx) -> bool,
    pub(crate) value_boolean: unsafe extern "C" fn(*mut RawResult, Idx, Idx) -> bool,
    pub(crate) value_int64: unsafe extern "C" fn(*mut RawResult, Idx, Idx) -> i64,
    pub(crate) value_double: unsafe extern "C" fn(*mut RawResult, Idx, Idx) -> f64,
    pub(crate) value_varchar: unsafe extern "C" fn(*mut RawResult, Idx, Idx) -> *mut c_char,
    pub(crate) free: unsafe extern "C" fn(*mut c_void),
    pub(crate) prepare: unsafe extern "C" fn(Handle, *const c_char, *mut Handle) -> State,
    pub(crate) prepare_error: unsafe extern "C" fn(Handle) -> *const c_char,
    pub(crate) destroy_prepare: unsafe extern "C" fn(*mut Handle),
    pub(crate) nparams: unsafe extern "C" fn(Handle) -> Idx,
    pub(crate) clear_bindings: unsafe extern "C" fn(Handle) -> State,
    pub(crate) bind_null: unsafe extern "C" fn(Handle, Idx) -> State,
    pub(crate) bind_boolean: unsafe extern "C" fn(Handle, Idx, bool) -> State,
    pub(crate) bind_int64: unsafe extern "C" fn(Handle, Idx, i64) -> State,
    pub(crate) bind_double: unsafe extern "C" fn(Handle, Idx, f64) -> State,
    pub(crate) bind_varchar_length: unsafe extern "C" fn(Handle, Idx, *const c_char, Idx) -> State,
    pub(crate) execute_prepared: unsafe extern "C" fn(Handle, *mut RawResult) -> State,
    /// Last field: the library is unloaded only after every pointer above is unreachable.
    _lib: libloading::Library,
}

/// Resolves one symbol as a function pointer of type `T`, or names the missing symbol.
///
/// # Safety
/// `T` must be the exact C signature of `name` in duckdb.h.
unsafe fn sym<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T, String> {
    // SAFETY: the caller guarantees `T` matches the symbol's C declaration; the copied pointer
    // stays valid while `lib` is loaded, which `Api` guarantees by owning `lib`.
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| format!("symbol {name} missing: {e}"))
}

impl Api {
    /// Resolves every entry point of `lib`.
    pub(crate) fn resolve(lib: libloading::Library) -> Result<Api, String> {
        // SAFETY: every type below is transcribed from the matching declaration of duckdb.h 1.5
        // (pointer handles as `*mut c_void`, `idx_t` as u64, enums as c_int, C `bool` as bool).
        unsafe {
            Ok(Api {
                library_version: sym(&lib, "duckdb_library_version")?,
                open_ext: sym(&lib, "duckdb_open_ext")?,
                close: sym(&lib, "duckdb_close")?,
                connect: sym(&lib, "duckdb_connect")?,
                disconnect: sym(&lib, "duckdb_disconnect")?,
                query: sym(&lib, "duckdb_query")?,
                destroy_result: sym(&lib, "duckdb_destroy_result")?,
                result_error: sym(&lib, "duckdb_result_error")?,
                row_count: sym(&lib, "duckdb_row_count")?,
                column_count: sym(&lib, "duckdb_column_count")?,
                rows_changed: sym(&lib, "duckdb_rows_changed")?,
                column_type: sym(&lib, "duckdb_column_type")?,
                column_name: sym(&lib, "duckdb_column_name")?,
                value_is_null: sym(&lib, "duckdb_value_is_null")?,
                value_boolean: sym(&lib, "duckdb_value_boolean")?,
                value_int64: sym(&lib, "duckdb_value_int64")?,
                value_double: sym(&lib, "duckdb_value_double")?,
                value_varchar: sym(&lib, "duckdb_value_varchar")?,
                free: sym(&lib, "duckdb_free")?,
                prepare: sym(&lib, "duckdb_prepare")?,
                prepare_error: sym(&lib, "duckdb_prepare_error")?,
                destroy_prepare: sym(&lib, "duckdb_destroy_prepare")?,
                nparams: sym(&lib, "duckdb_nparams")?,
                clear_bindings: sym(&lib, "duckdb_clear_bindings")?,
                bind_null: sym(&lib, "duckdb_bind_null")?,
                bind_boolean: sym(&lib, "duckdb_bind_boolean")?,
                bind_int64: sym(&lib, "duckdb_bind_int64")?,
                bind_double: sym(&lib, "duckdb_bind_double")?,
                bind_varchar_length: sym(&lib, "duckdb_bind_varchar_length")?,
                execute_prepared: sym(&lib, "duckdb_execute_prepared")?,
                _lib: lib,
            })
        }
    }
}
