//! DuckDB through its C API, loaded at run time (placeholder: being written).
