//! DuckDB through the run-time loaded C API: round trips, persistence, errors.
//! Tests that need the library skip (printing why) when it is absent, unless
//! `IPFS_ACCELERATE_REQUIRE_DUCKDB=1`.

use ipfs_accelerate_benchdb::{find_for_test, Database, DbError, Library, Value};

/// The library, or `None` (test skipped) when absent and not required.
fn lib(test: &str) -> Option<Library> {
    find_for_test(test).expect("DuckDB library required (IPFS_ACCELERATE_REQUIRE_DUCKDB=1)")
}

/// Rows inserted by the round-trip test: NULLs, quotes, extreme numbers, unicode.
fn sample_rows() -> Vec<Vec<Value>> {
    vec![
        vec![
            Value::Int(1),
            Value::from("plain"),
            Value::Double(0.1 + 0.2),
            Value::Bool(true),
            Value::Null,
        ],
        vec![
            Value::Int(i64::MAX),
            Value::from("it's \"quoted\"; DROP TABLE t; -- ünïcödé ✓"),
            Value::Double(-1.25e-300),
            Value::Bool(false),
            Value::Int(i64::MIN),
        ],
        vec![
            Value::Int(-7),
            Value::from(""),
            Value::Double(f64::MAX),
            Value::Null,
            Value::Int(0),
        ],
        vec![
            Value::Int(3),
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
        ],
    ]
}

#[test]
fn round_trip_and_persistence() {
    let Some(lib) = lib("round_trip_and_persistence") else {
        return;
    };
    assert!(
        lib.version().starts_with('v'),
        "version {:?}",
        lib.version()
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.duckdb");
    let path = path.to_str().unwrap();
    let rows = sample_rows();
    let select = "SELECT id, name, x, flag, n FROM t ORDER BY id";
    let mut expected = rows.clone();
    expected.sort_by_key(|r| r[0].as_i64());
    {
        let db = Database::open(&lib, path).unwrap();
        let conn = db.connect().unwrap();
        conn.execute(
            "CREATE TABLE t (id BIGINT PRIMARY KEY, name VARCHAR, x DOUBLE, flag BOOLEAN, n BIGINT);\
             CREATE TABLE IF NOT EXISTS t (id BIGINT)",
        )
        .unwrap();
        // One statement, executed repeatedly with new bindings.
        let insert = conn
            .prepare("INSERT INTO t VALUES (?, ?, ?, ?, ?)")
            .unwrap();
        assert_eq!(insert.parameter_count(), 5);
        for row in &rows[..3] {
            assert_eq!(insert.execute(row).unwrap(), 1);
        }
        drop(insert);
        assert_eq!(
            conn.execute_params(
                "INSERT INTO t (id, name) VALUES ($1, $2)",
                &[Value::Int(3), Value::Null]
            )
            .unwrap(),
            1
        );
        assert_eq!(conn.query(select, &[]).unwrap(), expected);
        // Parameters in a query.
        let got = conn
            .query(
                "SELECT id FROM t WHERE name = ? OR x < ? ORDER BY id",
                &[Value::from("plain"), Value::Double(0.0)],
            )
            .unwrap();
        assert_eq!(got, vec![vec![Value::Int(1)], vec![Value::Int(i64::MAX)]]);
    }
    // Reopen: the rows persisted.
    let db = Database::open(&lib, path).unwrap();
    let conn = db.connect().unwrap();
    let got = conn.query(select, &[]).unwrap();
    assert_eq!(got, expected);
    assert_eq!(got[1][1].as_str(), Some("plain"));
}

#[test]
fn column_types_map_to_values() {
    let Some(lib) = lib("column_types_map_to_values") else {
        return;
    };
    let db = Database::open(&lib, ":memory:").unwrap();
    let conn = db.connect().unwrap();
    let rows = conn
        .prepare(
            "SELECT 5::TINYINT AS a, 4000000000::UINTEGER AS b, 18446744073709551615::UBIGINT AS c, \
             42::HUGEINT AS d, 1.5::FLOAT AS e, 12.25::DECIMAL(10, 2) AS f, \
             TIMESTAMP '2026-11-22 10:47:33' AS g, \
             strftime(TIMESTAMP '2026-11-22 10:47:33', '%Y-%m-%dT%H:%M:%SZ') AS h, \
             NULL AS i, true AS j, [1, 2]::VARCHAR AS k, 'x'::VARCHAR AS l, \
             INTERVAL 90 MINUTES AS m, DATE '2026-11-22' AS n, '\\xAB'::BLOB AS o",
        )
        .unwrap()
        .query_rows(&[])
        .unwrap();
    assert_eq!(
        rows.columns,
        ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o"]
    );
    assert_eq!(
        rows.rows,
        vec![vec![
            Value::Int(5),
            Value::Int(4_000_000_000),
            Value::from("18446744073709551615"),
            Value::Int(42),
            Value::Double(1.5),
            Value::Double(12.25),
            Value::from("2026-11-22 10:47:33"),
            Value::from("2026-11-22T10:47:33Z"),
            Value::Null,
            Value::Bool(true),
            Value::from("[1, 2]"),
            Value::from("x"),
            Value::from("01:30:00"),
            Value::from("2026-11-22"),
            Value::from("\\xAB"),
        ]]
    );
    assert!(conn.query("SELECT 1 WHERE false", &[]).unwrap().is_empty());
    // Types the value API cannot read: a typed error naming the column, before any row.
    for (sql, column) in [
        ("SELECT [1, 2] AS nested", "nested"),
        ("SELECT TIMESTAMPTZ '2026-11-22 10:47:33+00' AS tz", "tz"),
        ("SELECT uuid() AS u WHERE false", "u"),
    ] {
        match conn.query(sql, &[]) {
            Err(e @ DbError::UnsupportedType { .. }) => {
                assert!(e.to_string().contains(&format!("{column}::VARCHAR")), "{e}")
            }
            other => panic!("expected an unsupported-type error, got {other:?}"),
        }
    }
    assert_eq!(
        conn.query(
            "SELECT TIMESTAMPTZ '2026-11-22 10:47:33+00'::TIMESTAMP::VARCHAR",
            &[]
        )
        .unwrap(),
        vec![vec![Value::from("2026-11-22 10:47:33")]]
    );
}

#[test]
fn errors_carry_duckdbs_message() {
    let Some(lib) = lib("errors_carry_duckdbs_message") else {
        return;
    };
    let db = Database::open(&lib, ":memory:").unwrap();
    let conn = db.connect().unwrap();
    match conn.execute("SELEC 1") {
        Err(e @ DbError::Query { .. }) => {
            let text = e.to_string();
            assert!(text.contains("syntax error"), "{text}");
            assert!(text.contains("SELEC 1"), "{text}");
        }
        other => panic!("expected a query error, got {other:?}"),
    }
    match conn.query("SELECT * FROM no_such_table", &[]) {
        Err(DbError::Prepare { message, sql }) => {
            assert!(message.contains("no_such_table"), "{message}");
            assert_eq!(sql, "SELECT * FROM no_such_table");
        }
        other => panic!("expected a prepare error, got {other:?}"),
    }
    conn.execute("CREATE TABLE n (v BIGINT NOT NULL)").unwrap();
    match conn.execute_params("INSERT INTO n VALUES (?)", &[Value::from("not a number")]) {
        Err(DbError::Query { message, .. }) => {
            assert!(message.contains("not a number"), "{message}")
        }
        other => panic!("expected a conversion error, got {other:?}"),
    }
    match conn.execute_params("INSERT INTO n VALUES (?)", &[Value::Null]) {
        Err(DbError::Query { message, .. }) => assert!(message.contains("NOT NULL"), "{message}"),
        other => panic!("expected a constraint error, got {other:?}"),
    }
    match conn.execute_params("INSERT INTO n VALUES (?)", &[]) {
        Err(DbError::ParameterCount {
            expected: 1,
            given: 0,
            ..
        }) => {}
        other => panic!("expected a parameter-count error, got {other:?}"),
    }
    assert!(matches!(
        conn.execute("SELECT '\0'"),
        Err(DbError::InvalidArgument { .. })
    ));
    // The connection still works after errors.
    assert_eq!(
        conn.query("SELECT count(*) FROM n", &[]).unwrap(),
        vec![vec![Value::Int(0)]]
    );
    // Not a database file.
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.duckdb");
    std::fs::write(
        &junk,
        b"this is not a DuckDB file, just some text long enough to have a header",
    )
    .unwrap();
    match Database::open(&lib, junk.to_str().unwrap()) {
        Err(DbError::Open { message, .. }) => assert!(!message.is_empty()),
        other => panic!("expected an open error, got {other:?}"),
    }
    let missing = dir.path().join("no/such/folder/x.duckdb");
    assert!(matches!(
        Database::open(&lib, missing.to_str().unwrap()),
        Err(DbError::Open { .. })
    ));
}

#[test]
fn transactions_commit_or_roll_back() {
    let Some(lib) = lib("transactions_commit_or_roll_back") else {
        return;
    };
    let db = Database::open(&lib, ":memory:").unwrap();
    let conn = db.connect().unwrap();
    conn.execute("CREATE TABLE t (v BIGINT PRIMARY KEY)")
        .unwrap();
    conn.transaction(|c| c.execute_params("INSERT INTO t VALUES (?)", &[Value::Int(1)]))
        .unwrap();
    // The second insert violates the key: the whole transaction is rolled back.
    let failed = conn.transaction(|c| {
        c.execute_params("INSERT INTO t VALUES (?)", &[Value::Int(2)])?;
        c.execute_params("INSERT INTO t VALUES (?)", &[Value::Int(1)])
    });
    assert!(matches!(failed, Err(DbError::Query { .. })), "{failed:?}");
    conn.execute("BEGIN; INSERT INTO t VALUES (3); ROLLBACK")
        .unwrap();
    assert_eq!(
        conn.query("SELECT v FROM t ORDER BY v", &[]).unwrap(),
        vec![vec![Value::Int(1)]]
    );
}

#[test]
fn missing_or_bad_library_is_a_typed_error() {
    let missing = "/nonexistent/folder/libduckdb.so";
    match Library::load(missing) {
        Err(e @ DbError::LibraryNotFound { .. }) => {
            assert!(e.to_string().contains("cargo xtask fetch-duckdb"), "{e}");
            let DbError::LibraryNotFound { searched } = e else {
                unreachable!()
            };
            assert_eq!(searched, [missing]);
        }
        other => panic!("expected LibraryNotFound, got {other:?}"),
    }
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("libduckdb.so");
    std::fs::write(&fake, b"not an ELF file").unwrap();
    assert!(matches!(
        Library::load(&fake),
        Err(DbError::LibraryLoad { .. })
    ));
}
