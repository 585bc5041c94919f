//! `Library::find`'s search order (its own test binary: it changes environment variables).

use ipfs_accelerate_benchdb::{find_for_test, DbError, Library, DUCKDB_DIR_ENV, DUCKDB_ENV};

#[test]
fn search_order_and_not_found() {
    // The real library, found before the environment is changed (None: only the not-found
    // part can run).
    let real = find_for_test("search_order_and_not_found (found part)")
        .expect("DuckDB library required (IPFS_ACCELERATE_REQUIRE_DUCKDB=1)")
        .and_then(|l| std::fs::canonicalize(l.path()).ok());
    let home = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let missing = home.path().join("missing.so");
    // This test binary has one test, so no other thread reads the environment meanwhile.
    std::env::set_var("HOME", home.path());
    std::env::set_var("XDG_CACHE_HOME", home.path().join("cache"));
    std::env::set_var(DUCKDB_ENV, &missing);
    std::env::set_var(DUCKDB_DIR_ENV, dir.path());
    match Library::find() {
        Err(e @ DbError::LibraryNotFound { .. }) => {
            assert!(e.to_string().contains("cargo xtask fetch-duckdb"), "{e}");
            let DbError::LibraryNotFound { searched } = e else {
                unreachable!()
            };
            assert_eq!(searched.len(), 4, "{searched:?}");
            assert!(searched[0].starts_with(missing.to_str().unwrap()));
            assert!(searched[1].starts_with(dir.path().join("libduckdb.so").to_str().unwrap()));
            let default = home
                .path()
                .join("cache/ipfs-accelerate/duckdb/libduckdb.so");
            assert!(
                searched[2].starts_with(default.to_str().unwrap()),
                "{searched:?}"
            );
            assert!(searched[3].starts_with("libduckdb.so (system loader"));
        }
        // A system-wide libduckdb.so: only the system loader may have found it.
        Ok(lib) => assert_eq!(lib.path(), "libduckdb.so"),
        Err(e) => panic!("unexpected error {e}"),
    }
    let Some(real) = real else {
        return;
    };
    // The folder variable is searched when the file variable points nowhere.
    std::os::unix::fs::symlink(&real, dir.path().join("libduckdb.so")).unwrap();
    let lib = Library::find().unwrap();
    assert_eq!(
        lib.path(),
        dir.path().join("libduckdb.so").to_str().unwrap()
    );
    // The file variable comes first.
    let other = home.path().join("other.so");
    std::os::unix::fs::symlink(&real, &other).unwrap();
    std::env::set_var(DUCKDB_ENV, &other);
    assert_eq!(Library::find().unwrap().path(), other.to_str().unwrap());
    // The default folder comes after both.
    std::env::remove_var(DUCKDB_ENV);
    std::env::remove_var(DUCKDB_DIR_ENV);
    let default = home.path().join("cache/ipfs-accelerate/duckdb");
    std::fs::create_dir_all(&default).unwrap();
    std::os::unix::fs::symlink(&real, default.join("libduckdb.so")).unwrap();
    assert_eq!(
        Library::find().unwrap().path(),
        default.join("libduckdb.so").to_str().unwrap()
    );
    assert_eq!(ipfs_accelerate_benchdb::default_dir(), Some(default));
}
