//! The DuckDB result store: records saved and loaded back unchanged. Skips (printing why) when
//! the DuckDB library is absent, unless `IPFS_ACCELERATE_REQUIRE_DUCKDB=1`.

use ipfs_accelerate_bench::store::{Store, StoreError};
use ipfs_accelerate_bench::{LatencyStats, Measurement, RunInfo, Status, OURS};
use ipfs_accelerate_benchdb::{find_for_test, Value};

fn run(run_id: &str, started_at: &str) -> RunInfo {
    RunInfo {
        run_id: run_id.into(),
        started_at: started_at.into(),
        git_commit: Some("0123456789abcdef0123456789abcdef01234567".into()),
        host: "bench-host".into(),
        os: "linux 6.1 x86_64".into(),
        cpu_model: "Some CPU @ 2.10GHz".into(),
        cores: 2,
        gpu: None,
        driver: None,
        command: "cargo xtask bench --family bert --config 'minilm-l6' --batch 1,8".into(),
        build_profile: Some("release".into()),
        opt_level: Some("3".into()),
    }
}

/// A point that ran: every number present, timings in order.
fn ok_point(run_id: &str) -> Measurement {
    Measurement {
        run_id: run_id.into(),
        family: "bert".into(),
        model: "minilm-l6".into(),
        backend: "cpu".into(),
        dtype: "f32".into(),
        batch: 8,
        seq: 128,
        shape_kind: "tokens".into(),
        warmup: 2,
        iters_asked: 5,
        iters_done: 5,
        status: Status::Ok,
        reason: None,
        load_ms: Some(12.375),
        latency: Some(LatencyStats {
            mean_ms: 10.2,
            p50_ms: 10.1,
            p90_ms: 10.9,
            p99_ms: 11.3,
            min_ms: 9.4,
            max_ms: 11.3,
            stddev_ms: 0.7416198487095663,
        }),
        items_per_s: Some(8.0 / 0.0102),
        tokens_per_s: Some(1024.0 / 0.0102),
        host_rss_peak_bytes: Some(123_456_789),
        device_memory_bytes: Some(u64::MAX),
        flops: Some(2.9e10),
        achieved_flops_per_s: Some(2.9e10 / 0.0102),
        peak_flops_pct: Some(3.25),
        timings_ms: vec![11.3, 9.4, 10.1, 10.9, 9.3 + 0.1],
        engine: OURS.into(),
        engine_version: Some("0.1.0".into()),
        round: 0,
        new_tokens: None,
        ttft_ms: None,
        decode_tokens_per_s: None,
    }
}

/// A point on an absent backend: no numbers, a reason.
fn unavailable_point(run_id: &str) -> Measurement {
    Measurement {
        backend: "cuda".into(),
        status: Status::Unavailable,
        reason: Some("backend `cuda` not compiled in (it's a \"feature\")".into()),
        ..Measurement {
            run_id: run_id.into(),
            family: "bert".into(),
            model: "minilm-l6".into(),
            dtype: "f32".into(),
            batch: 8,
            seq: 128,
            shape_kind: "tokens".into(),
            warmup: 2,
            iters_asked: 5,
            engine: OURS.into(),
            ..Default::default()
        }
    }
}

#[test]
fn runs_and_measurements_round_trip() {
    let Some(lib) = find_for_test("runs_and_measurements_round_trip")
        .expect("DuckDB library required (IPFS_ACCELERATE_REQUIRE_DUCKDB=1)")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.duckdb");
    let first = run("20261122T104733Z-1", "2026-11-22T10:47:33Z");
    let mut second = run("20261122T114733Z-2", "2026-11-22T11:47:33Z");
    second.gpu = Some("NVIDIA H100 80GB HBM3".into());
    second.driver = Some("580.65.06".into());
    // A run that did not record its build reads back as unknown.
    second.build_profile = None;
    second.opt_level = None;
    let first_points = vec![ok_point(&first.run_id), unavailable_point(&first.run_id)];
    let mut second_point = ok_point(&second.run_id);
    second_point.status = Status::Interrupted;
    second_point.reason = Some("Ctrl-C".into());
    second_point.iters_done = 2;
    second_point.timings_ms.truncate(2);
    {
        let store = Store::open_with(&lib, &path).unwrap();
        // Saved out of time order: loading sorts runs by start time.
        store.save_run(&second).unwrap();
        store.save_run(&first).unwrap();
        let id_a = store.save_measurement(&first_points[0]).unwrap();
        store.save_measurement(&second_point).unwrap();
        let id_b = store.save_measurement(&first_points[1]).unwrap();
        assert!(id_b > id_a);
        // A duplicate run and a point of an unknown run are refused, leaving nothing behind.
        assert!(matches!(store.save_run(&first), Err(StoreError::Db(_))));
        assert!(store.save_measurement(&ok_point("no-such-run")).is_err());
        let counts = store
            .connection()
            .query(
                "SELECT (SELECT count(*) FROM configs), (SELECT count(*) FROM measurements), \
                 (SELECT count(*) FROM timings)",
                &[],
            )
            .unwrap();
        assert_eq!(
            counts,
            vec![vec![Value::Int(3), Value::Int(3), Value::Int(7)]]
        );
        // The unavailable point's numbers are NULL in the table.
        let nulls = store
            .connection()
            .query(
                "SELECT mean_ms IS NULL AND load_ms IS NULL AND host_rss_peak_bytes IS NULL, reason \
                 FROM measurements WHERE config_id = ?",
                &[Value::Int(id_b)],
            )
            .unwrap();
        assert_eq!(nulls[0][0], Value::Bool(true));
    }
    // Reopened from the file.
    let store = Store::open_with(&lib, &path).unwrap();
    let (runs, points) = store.load_all().unwrap();
    assert_eq!(runs, vec![first.clone(), second.clone()]);
    assert_eq!(
        points,
        vec![
            first_points[0].clone(),
            second_point.clone(),
            first_points[1].clone()
        ]
    );
    let (got_run, got_points) = store.load_run(&first.run_id).unwrap().unwrap();
    assert_eq!(got_run, first);
    assert_eq!(got_points, first_points);
    let (got_run, got_points) = store.load_run(&second.run_id).unwrap().unwrap();
    assert_eq!(got_run, second);
    assert_eq!(got_points, vec![second_point]);
    assert!(store.load_run("absent").unwrap().is_none());
    // Rows no Store wrote: a typed error, not a wrong record.
    store
        .connection()
        .execute("UPDATE measurements SET p90_ms = NULL WHERE status = 'interrupted'")
        .unwrap();
    match store.load_all() {
        Err(e @ StoreError::Corrupt { .. }) => {
            assert!(e.to_string().contains("partly NULL"), "{e}")
        }
        other => panic!("expected a corrupt-database error, got {other:?}"),
    }
}

/// The schema of files written before builds, engines and rounds were recorded (kept verbatim).
const OLD_SCHEMA: &str = "
CREATE TABLE runs (run_id VARCHAR PRIMARY KEY, started_at VARCHAR NOT NULL, git_commit VARCHAR,
    host VARCHAR NOT NULL, os VARCHAR NOT NULL, cpu_model VARCHAR NOT NULL, cores UINTEGER NOT NULL,
    gpu VARCHAR, driver VARCHAR, command VARCHAR NOT NULL);
CREATE SEQUENCE config_id_seq START 1;
CREATE TABLE configs (config_id BIGINT PRIMARY KEY DEFAULT nextval('config_id_seq'),
    run_id VARCHAR NOT NULL REFERENCES runs (run_id), family VARCHAR NOT NULL, model VARCHAR NOT NULL,
    backend VARCHAR NOT NULL, dtype VARCHAR NOT NULL, batch UINTEGER NOT NULL, seq UINTEGER NOT NULL,
    shape_kind VARCHAR NOT NULL, warmup UINTEGER NOT NULL, iters_asked UINTEGER NOT NULL);
CREATE TABLE measurements (config_id BIGINT PRIMARY KEY REFERENCES configs (config_id),
    status VARCHAR NOT NULL CHECK (status IN ('ok', 'unavailable', 'failed', 'interrupted')),
    reason VARCHAR, iters_done UINTEGER NOT NULL, load_ms DOUBLE, mean_ms DOUBLE, p50_ms DOUBLE,
    p90_ms DOUBLE, p99_ms DOUBLE, min_ms DOUBLE, max_ms DOUBLE, stddev_ms DOUBLE, items_per_s DOUBLE,
    tokens_per_s DOUBLE, host_rss_peak_bytes UBIGINT, device_memory_bytes UBIGINT, flops DOUBLE,
    achieved_flops_per_s DOUBLE, peak_flops_pct DOUBLE);
CREATE TABLE timings (config_id BIGINT NOT NULL REFERENCES configs (config_id), iter UINTEGER NOT NULL,
    ms DOUBLE NOT NULL, PRIMARY KEY (config_id, iter));
INSERT INTO runs VALUES ('old-run', '2026-11-01T00:00:00Z', NULL, 'h', 'linux', 'cpu', 2, NULL, NULL, 'old');
INSERT INTO configs (run_id, family, model, backend, dtype, batch, seq, shape_kind, warmup, iters_asked)
    VALUES ('old-run', 'bert', 'minilm-l6', 'cpu', 'f32', 8, 128, 'tokens', 2, 2);
INSERT INTO measurements (config_id, status, iters_done, mean_ms, p50_ms, p90_ms, p99_ms, min_ms, max_ms,
    stddev_ms) VALUES (1, 'ok', 2, 10.5, 10.0, 11.0, 11.0, 10.0, 11.0, 0.7);
INSERT INTO timings VALUES (1, 0, 10.0), (1, 1, 11.0);
";

#[test]
fn an_old_schema_file_is_migrated_and_keeps_its_rows() {
    let Some(lib) = find_for_test("an_old_schema_file_is_migrated_and_keeps_its_rows")
        .expect("DuckDB library required (IPFS_ACCELERATE_REQUIRE_DUCKDB=1)")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.duckdb");
    {
        let db = ipfs_accelerate_benchdb::Database::open(&lib, path.to_str().unwrap()).unwrap();
        db.connect().unwrap().execute(OLD_SCHEMA).unwrap();
    }
    for _ in 0..2 {
        // Opening migrates (and a second open finds nothing to do); the old rows read back with
        // the build unknown, engine ipfs-accelerate, round 0.
        let store = Store::open_with(&lib, &path).unwrap();
        let (runs, points) = store.load_all().unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(
            (runs[0].build_profile.clone(), runs[0].opt_level.clone()),
            (None, None)
        );
        assert_eq!(runs[0].optimized(), None);
        assert_eq!(points.len(), 1);
        assert_eq!(points[0].engine, OURS);
        assert_eq!(
            (points[0].round, points[0].engine_version.clone()),
            (0, None)
        );
        assert_eq!(points[0].timings_ms, vec![10.0, 11.0]);
    }
    // New rows (a peer's among them) go into the migrated file.
    let store = Store::open_with(&lib, &path).unwrap();
    let new_run = run("new-run", "2026-11-25T00:00:00Z");
    store.save_run(&new_run).unwrap();
    let mut peer = ok_point("new-run");
    peer.engine = "torch".into();
    peer.round = 3;
    // A generation row: the columns the migration added.
    peer.shape_kind = "decode".into();
    peer.new_tokens = Some(16);
    peer.ttft_ms = Some(12.5);
    peer.decode_tokens_per_s = Some(99.0);
    store.save_measurement(&peer).unwrap();
    let (runs, points) = store.load_all().unwrap();
    assert_eq!(runs[1], new_run);
    assert_eq!(points[1], peer);
}
