//! Benchmark results in DuckDB: the schema ([`SCHEMA`]) and [`Store`], which writes
//! [`RunInfo`]s and [`Measurement`]s and reads them back.
//!
//! ```no_run
//! use ipfs_accelerate_bench::store::Store;
//!
//! # fn main() -> Result<(), ipfs_accelerate_bench::store::StoreError> {
//! let store = Store::open("bench.duckdb")?; // finds libduckdb (`cargo xtask fetch-duckdb`)
//! let (runs, measurements) = store.load_all()?;
//! println!("{} runs, {} grid points", runs.len(), measurements.len());
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::path::Path;

use ipfs_accelerate_benchdb::{Connection, Database, DbError, Library, Value};

use crate::record::{LatencyStats, Measurement, RunInfo, Status};

/// The database schema, applied by [`Store::open`] (idempotent: `IF NOT EXISTS`).
///
/// - `runs`: one row per [`RunInfo`] (one `bench` invocation and the machine it ran on).
///   `started_at` is the RFC 3339 UTC text as recorded (it sorts chronologically;
///   `started_at::TIMESTAMP` gives it as a UTC timestamp).
/// - `configs`: one row per grid point of a run: what was measured. `config_id` comes from
///   the sequence `config_id_seq` when the point is saved, so it is unique within the file and
///   follows the order points were measured in.
/// - `measurements`: the outcome of each config (one row per `config_id`); numbers that could
///   not be measured are NULL (all seven latency columns are NULL together). Latencies are in
///   ms, memory in bytes, `flops` per iteration (multiply-add = 2), `peak_flops_pct` in percent.
/// - `timings`: the raw per-iteration latency in ms, `iter` counting timed iterations from 0.
///
/// `runs.build_profile` / `runs.opt_level` say how the measuring binary was built (NULL: a run
/// stored before they were recorded, shown as unknown); `configs.engine` is `ipfs-accelerate` for
/// ours and the peer's name (`torch`, `onnxruntime`) for a peer measured in the same run, with
/// `engine_version`; `configs.round` counts the rounds of an alternating comparison.
/// Generation points (`bench --new N`) store two rows per shape: `shape_kind` `prefill` (timings:
/// time to the first new token of each iteration) and `decode` (timings: ms per new token after
/// the first), both with `configs.new_tokens` and the medians `measurements.ttft_ms` and
/// `measurements.decode_tokens_per_s`; forward points leave those three NULL.
/// Files written before these columns existed get them from [`MIGRATION`] when opened.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS runs (
    run_id       VARCHAR PRIMARY KEY,
    started_at   VARCHAR NOT NULL,
    git_commit   VARCHAR,
    host         VARCHAR NOT NULL,
    os           VARCHAR NOT NULL,
    cpu_model    VARCHAR NOT NULL,
    cores        UINTEGER NOT NULL,
    gpu          VARCHAR,
    driver       VARCHAR,
    command      VARCHAR NOT NULL,
    build_profile VARCHAR,
    opt_level    VARCHAR
);
CREATE SEQUENCE IF NOT EXISTS config_id_seq START 1;
CREATE TABLE IF NOT EXISTS configs (
    config_id    BIGINT PRIMARY KEY DEFAULT nextval('config_id_seq'),
    run_id       VARCHAR NOT NULL REFERENCES runs (run_id),
    family       VARCHAR NOT NULL,
    model        VARCHAR NOT NULL,
    backend      VARCHAR NOT NULL,
    dtype        VARCHAR NOT NULL,
    batch        UINTEGER NOT NULL,
    seq          UINTEGER NOT NULL,
    shape_kind   VARCHAR NOT NULL,
    warmup       UINTEGER NOT NULL,
    iters_asked  UINTEGER NOT NULL,
    engine       VARCHAR NOT NULL DEFAULT 'ipfs-accelerate',
    engine_version VARCHAR,
    round        UINTEGER NOT NULL DEFAULT 0,
    new_tokens   UINTEGER
);
CREATE TABLE IF NOT EXISTS measurements (
    config_id            BIGINT PRIMARY KEY REFERENCES configs (config_id),
    status               VARCHAR NOT NULL
                         CHECK (status IN ('ok', 'unavailable', 'failed', 'interrupted')),
    reason               VARCHAR,
    iters_done           UINTEGER NOT NULL,
    load_ms              DOUBLE,
    mean_ms              DOUBLE,
    p50_ms               DOUBLE,
    p90_ms               DOUBLE,
    p99_ms               DOUBLE,
    min_ms               DOUBLE,
    max_ms               DOUBLE,
    stddev_ms            DOUBLE,
    items_per_s          DOUBLE,
    tokens_per_s         DOUBLE,
    host_rss_peak_bytes  UBIGINT,
    device_memory_bytes  UBIGINT,
    flops                DOUBLE,
    achieved_flops_per_s DOUBLE,
    peak_flops_pct       DOUBLE,
    ttft_ms              DOUBLE,
    decode_tokens_per_s  DOUBLE
);
CREATE TABLE IF NOT EXISTS timings (
    config_id    BIGINT NOT NULL REFERENCES configs (config_id),
    iter         UINTEGER NOT NULL,
    ms           DOUBLE NOT NULL,
    PRIMARY KEY (config_id, iter)
);
";

/// Brings a file of an older schema up to [`SCHEMA`] (idempotent): the columns added since, with
/// old rows reading as unknown build, engine `ipfs-accelerate` (the only engine then) and round 0.
pub const MIGRATION: &str = "
ALTER TABLE runs ADD COLUMN IF NOT EXISTS build_profile VARCHAR;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS opt_level VARCHAR;
ALTER TABLE configs ADD COLUMN IF NOT EXISTS engine VARCHAR DEFAULT 'ipfs-accelerate';
ALTER TABLE configs ADD COLUMN IF NOT EXISTS engine_version VARCHAR;
ALTER TABLE configs ADD COLUMN IF NOT EXISTS round UINTEGER DEFAULT 0;
ALTER TABLE configs ADD COLUMN IF NOT EXISTS new_tokens UINTEGER;
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS ttft_ms DOUBLE;
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS decode_tokens_per_s DOUBLE;
";

/// Errors of the result store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// DuckDB (or finding its library) failed.
    #[error(transparent)]
    Db(#[from] DbError),
    /// The path is not valid UTF-8.
    #[error("database path {0:?} is not valid UTF-8")]
    Path(std::path::PathBuf),
    /// A stored value does not fit its record field (a database written by something else).
    #[error("benchmark database {path}: {message}")]
    Corrupt {
        /// The database file.
        path: String,
        /// What is wrong.
        message: String,
    },
}

/// A benchmark-result database with [`SCHEMA`] applied.
pub struct Store {
    conn: Connection,
    db: Database,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.db.path())
            .finish()
    }
}

/// Columns of `configs` + `measurements` read by the loaders, in the order `load_measurements` reads them.
const MEASUREMENT_COLUMNS: &str = "c.config_id, c.run_id, c.family, c.model, c.backend, \
    c.dtype, c.batch, c.seq, c.shape_kind, c.warmup, c.iters_asked, m.status, m.reason, \
    m.iters_done, m.load_ms, m.mean_ms, m.p50_ms, m.p90_ms, m.p99_ms, m.min_ms, m.max_ms, \
    m.stddev_ms, m.items_per_s, m.tokens_per_s, m.host_rss_peak_bytes, m.device_memory_bytes, \
    m.flops, m.achieved_flops_per_s, m.peak_flops_pct, c.engine, c.engine_version, c.round, \
    c.new_tokens, m.ttft_ms, m.decode_tokens_per_s";

/// The latency columns of `measurements`, in [`LatencyStats`] field order.
const LATENCY_COLUMNS: [&str; 7] = [
    "mean_ms",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "min_ms",
    "max_ms",
    "stddev_ms",
];

/// Columns of `runs` read by the loaders, in [`RunInfo`] field order.
const RUN_COLUMNS: &str = "run_id, started_at, git_commit, host, os, cpu_model, cores, gpu, \
    driver, command, build_profile, opt_level";

impl Store {
    /// Opens (or creates) the database file at `path` with the library [`Library::find`] finds,
    /// and applies [`SCHEMA`].
    pub fn open(path: impl AsRef<Path>) -> Result<Store, StoreError> {
        let lib = Library::find()?;
        Self::open_with(&lib, path)
    }

    /// [`Store::open`] with a given library.
    pub fn open_with(lib: &Library, path: impl AsRef<Path>) -> Result<Store, StoreError> {
        let path = path.as_ref();
        let text = path
            .to_str()
            .ok_or_else(|| StoreError::Path(path.to_path_buf()))?;
        let db = Database::open(lib, text)?;
        let conn = db.connect()?;
        conn.execute(SCHEMA)?;
        let store = Store { conn, db };
        store.migrate()?;
        Ok(store)
    }

    /// Adds the columns of [`MIGRATION`] that a file of an older schema lacks.
    fn migrate(&self) -> Result<(), StoreError> {
        let missing = self.conn.query(
            "SELECT count(*) FROM information_schema.columns WHERE \
             (table_name = 'runs' AND column_name IN ('build_profile', 'opt_level')) OR \
             (table_name = 'configs' AND column_name IN ('engine', 'engine_version', 'round', \
             'new_tokens')) OR \
             (table_name = 'measurements' AND column_name IN ('ttft_ms', 'decode_tokens_per_s'))",
            &[],
        )?;
        let present = missing
            .first()
            .and_then(|r| r.first())
            .and_then(Value::as_i64);
        if present == Some(8) {
            return Ok(());
        }
        self.conn.execute(MIGRATION).map_err(|e| {
            self.corrupt(format!(
                "migrating a file of an older schema to the current one failed (the file is \
                 unchanged): {e}"
            ))
        })?;
        Ok(())
    }

    /// The connection, for queries of reports (`SELECT ... FROM measurements JOIN configs ...`).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Saves a run (before its measurements; a second save of the same `run_id` is an error).
    pub fn save_run(&self, run: &RunInfo) -> Result<(), StoreError> {
        self.conn.execute_params(
            &format!(
                "INSERT INTO runs ({RUN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            ),
            &[
                run.run_id.as_str().into(),
                run.started_at.as_str().into(),
                run.git_commit.clone().into(),
                run.host.as_str().into(),
                run.os.as_str().into(),
                run.cpu_model.as_str().into(),
                run.cores.into(),
                run.gpu.clone().into(),
                run.driver.clone().into(),
                run.command.as_str().into(),
                run.build_profile.clone().into(),
                run.opt_level.clone().into(),
            ],
        )?;
        Ok(())
    }

    /// Saves one grid point with its timings in one transaction (an interrupted process loses
    /// at most the point being written). Its run must have been saved; returns its `config_id`.
    pub fn save_measurement(&self, m: &Measurement) -> Result<i64, StoreError> {
        self.conn.transaction(|conn| {
            let rows = conn.query(
                "INSERT INTO configs (run_id, family, model, backend, dtype, batch, seq, \
                 shape_kind, warmup, iters_asked, engine, engine_version, round, new_tokens) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING config_id",
                &[
                    m.run_id.as_str().into(),
                    m.family.as_str().into(),
                    m.model.as_str().into(),
                    m.backend.as_str().into(),
                    m.dtype.as_str().into(),
                    m.batch.into(),
                    m.seq.into(),
                    m.shape_kind.as_str().into(),
                    m.warmup.into(),
                    m.iters_asked.into(),
                    if m.engine.is_empty() {
                        crate::OURS.into()
                    } else {
                        m.engine.as_str().into()
                    },
                    m.engine_version.clone().into(),
                    m.round.into(),
                    m.new_tokens.into(),
                ],
            )?;
            let config_id = rows
                .first()
                .and_then(|r| r.first())
                .and_then(Value::as_i64)
                .ok_or_else(|| self.corrupt("INSERT INTO configs returned no config_id"))?;
            let lat = m.latency.as_ref();
            let stat = |f: fn(&LatencyStats) -> f64| Value::from(lat.map(f));
            conn.execute_params(
                "INSERT INTO measurements VALUES \
                 (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                &[
                    config_id.into(),
                    m.status.as_str().into(),
                    m.reason.clone().into(),
                    m.iters_done.into(),
                    m.load_ms.into(),
                    stat(|l| l.mean_ms),
                    stat(|l| l.p50_ms),
                    stat(|l| l.p90_ms),
                    stat(|l| l.p99_ms),
                    stat(|l| l.min_ms),
                    stat(|l| l.max_ms),
                    stat(|l| l.stddev_ms),
                    m.items_per_s.into(),
                    m.tokens_per_s.into(),
                    bytes(m.host_rss_peak_bytes),
                    bytes(m.device_memory_bytes),
                    m.flops.into(),
                    m.achieved_flops_per_s.into(),
                    m.peak_flops_pct.into(),
                    m.ttft_ms.into(),
                    m.decode_tokens_per_s.into(),
                ],
            )?;
            if !m.timings_ms.is_empty() {
                let insert = conn.prepare("INSERT INTO timings VALUES (?, ?, ?)")?;
                for (i, ms) in m.timings_ms.iter().enumerate() {
                    insert.execute(&[config_id.into(), Value::Int(i as i64), (*ms).into()])?;
                }
            }
            Ok(config_id)
        })
    }

    /// Every run (by start time) and every measurement (in the order saved), timings included.
    pub fn load_all(&self) -> Result<(Vec<RunInfo>, Vec<Measurement>), StoreError> {
        let runs = self
            .conn
            .query(
                &format!("SELECT {RUN_COLUMNS} FROM runs ORDER BY started_at, run_id"),
                &[],
            )?
            .iter()
            .map(|r| self.run_from_row(r))
            .collect::<Result<Vec<_>, _>>()?;
        let measurements = self.load_measurements(None)?;
        Ok((runs, measurements))
    }

    /// One run and its measurements (in the order saved); `None` when `run_id` is not stored.
    pub fn load_run(
        &self,
        run_id: &str,
    ) -> Result<Option<(RunInfo, Vec<Measurement>)>, StoreError> {
        let rows = self.conn.query(
            &format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?"),
            &[run_id.into()],
        )?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let run = self.run_from_row(row)?;
        Ok(Some((run, self.load_measurements(Some(run_id))?)))
    }

    /// Measurements of one run or of all, with their timings.
    fn load_measurements(&self, run_id: Option<&str>) -> Result<Vec<Measurement>, StoreError> {
        let (filter, params): (&str, Vec<Value>) = match run_id {
            Some(id) => ("WHERE c.run_id = ?", vec![id.into()]),
            None => ("", Vec::new()),
        };
        let mut timings: HashMap<i64, Vec<f64>> = HashMap::new();
        let sql = format!(
            "SELECT t.config_id, t.ms FROM timings t JOIN configs c USING (config_id) {filter} \
             ORDER BY t.config_id, t.iter"
        );
        for row in self.conn.query(&sql, &params)? {
            let cells = Cells {
                store: self,
                row: &row,
                table: "timings",
            };
            timings
                .entry(cells.int(0, "config_id")?)
                .or_default()
                .push(cells.f64(1, "ms")?);
        }
        let sql = format!(
            "SELECT {MEASUREMENT_COLUMNS} FROM configs c JOIN measurements m USING (config_id) \
             {filter} ORDER BY c.config_id"
        );
        self.conn
            .query(&sql, &params)?
            .iter()
            .map(|row| {
                let c = Cells {
                    store: self,
                    row,
                    table: "measurements",
                };
                let config_id = c.int(0, "config_id")?;
                let status = c.text(11, "status")?;
                let status = Status::parse(&status)
                    .ok_or_else(|| self.corrupt(format!("unknown status {status:?}")))?;
                let stats = LATENCY_COLUMNS
                    .iter()
                    .enumerate()
                    .map(|(i, name)| c.opt_f64(15 + i, name))
                    .collect::<Result<Vec<_>, _>>()?;
                let latency = if stats.iter().all(Option::is_none) {
                    None
                } else {
                    let v = stats.iter().copied().collect::<Option<Vec<f64>>>();
                    let Some(&[mean_ms, p50_ms, p90_ms, p99_ms, min_ms, max_ms, stddev_ms]) =
                        v.as_deref()
                    else {
                        return Err(self
                            .corrupt(format!("config {config_id}: latency columns partly NULL")));
                    };
                    Some(LatencyStats {
                        mean_ms,
                        p50_ms,
                        p90_ms,
                        p99_ms,
                        min_ms,
                        max_ms,
                        stddev_ms,
                    })
                };
                Ok(Measurement {
                    run_id: c.text(1, "run_id")?,
                    family: c.text(2, "family")?,
                    model: c.text(3, "model")?,
                    backend: c.text(4, "backend")?,
                    dtype: c.text(5, "dtype")?,
                    batch: c.u32(6, "batch")?,
                    seq: c.u32(7, "seq")?,
                    shape_kind: c.text(8, "shape_kind")?,
                    warmup: c.u32(9, "warmup")?,
                    iters_asked: c.u32(10, "iters_asked")?,
                    status,
                    reason: c.opt_text(12, "reason")?,
                    iters_done: c.u32(13, "iters_done")?,
                    load_ms: c.opt_f64(14, "load_ms")?,
                    latency,
                    items_per_s: c.opt_f64(22, "items_per_s")?,
                    tokens_per_s: c.opt_f64(23, "tokens_per_s")?,
                    host_rss_peak_bytes: c.opt_u64(24, "host_rss_peak_bytes")?,
                    device_memory_bytes: c.opt_u64(25, "device_memory_bytes")?,
                    flops: c.opt_f64(26, "flops")?,
                    achieved_flops_per_s: c.opt_f64(27, "achieved_flops_per_s")?,
                    peak_flops_pct: c.opt_f64(28, "peak_flops_pct")?,
                    timings_ms: timings.remove(&config_id).unwrap_or_default(),
                    engine: c
                        .opt_text(29, "engine")?
                        .unwrap_or_else(|| crate::OURS.to_string()),
                    engine_version: c.opt_text(30, "engine_version")?,
                    round: c.opt_u32(31, "round")?.unwrap_or(0),
                    new_tokens: c.opt_u32(32, "new_tokens")?,
                    ttft_ms: c.opt_f64(33, "ttft_ms")?,
                    decode_tokens_per_s: c.opt_f64(34, "decode_tokens_per_s")?,
                })
            })
            .collect()
    }

    /// A [`RunInfo`] from a row of [`RUN_COLUMNS`].
    fn run_from_row(&self, row: &[Value]) -> Result<RunInfo, StoreError> {
        let c = Cells {
            store: self,
            row,
            table: "runs",
        };
        Ok(RunInfo {
            run_id: c.text(0, "run_id")?,
            started_at: c.text(1, "started_at")?,
            git_commit: c.opt_text(2, "git_commit")?,
            host: c.text(3, "host")?,
            os: c.text(4, "os")?,
            cpu_model: c.text(5, "cpu_model")?,
            cores: c.u32(6, "cores")?,
            gpu: c.opt_text(7, "gpu")?,
            driver: c.opt_text(8, "driver")?,
            command: c.text(9, "command")?,
            build_profile: c.opt_text(10, "build_profile")?,
            opt_level: c.opt_text(11, "opt_level")?,
        })
    }

    /// A [`StoreError::Corrupt`] about this database.
    fn corrupt(&self, message: impl Into<String>) -> StoreError {
        StoreError::Corrupt {
            path: self.db.path().to_string(),
            message: message.into(),
        }
    }
}

/// A byte count as a parameter of a UBIGINT column: an integer, or its decimal text beyond
/// i64 (DuckDB casts it).
fn bytes(v: Option<u64>) -> Value {
    match v {
        None => Value::Null,
        Some(b) => i64::try_from(b).map_or_else(|_| Value::Text(b.to_string()), Value::Int),
    }
}

/// Typed reads of one result row, with errors naming the table and column.
struct Cells<'a> {
    store: &'a Store,
    row: &'a [Value],
    table: &'static str,
}

impl Cells<'_> {
    /// The cell, or an error when the row is shorter than expected.
    fn get(&self, i: usize, name: &str) -> Result<&Value, StoreError> {
        self.row.get(i).ok_or_else(|| {
            self.store
                .corrupt(format!("{}.{name}: missing column", self.table))
        })
    }

    /// An error about a cell of the wrong type or range.
    fn bad(&self, name: &str, v: &Value, want: &str) -> StoreError {
        self.store
            .corrupt(format!("{}.{name}: {v:?} is not {want}", self.table))
    }

    fn opt_text(&self, i: usize, name: &str) -> Result<Option<String>, StoreError> {
        match self.get(i, name)? {
            Value::Null => Ok(None),
            Value::Text(s) => Ok(Some(s.clone())),
            v => Err(self.bad(name, v, "text")),
        }
    }

    fn text(&self, i: usize, name: &str) -> Result<String, StoreError> {
        self.opt_text(i, name)?
            .ok_or_else(|| self.bad(name, &Value::Null, "text"))
    }

    fn opt_f64(&self, i: usize, name: &str) -> Result<Option<f64>, StoreError> {
        match self.get(i, name)? {
            Value::Null => Ok(None),
            v => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.bad(name, v, "a number")),
        }
    }

    fn f64(&self, i: usize, name: &str) -> Result<f64, StoreError> {
        self.opt_f64(i, name)?
            .ok_or_else(|| self.bad(name, &Value::Null, "a number"))
    }

    fn int(&self, i: usize, name: &str) -> Result<i64, StoreError> {
        let v = self.get(i, name)?;
        v.as_i64().ok_or_else(|| self.bad(name, v, "an integer"))
    }

    fn u32(&self, i: usize, name: &str) -> Result<u32, StoreError> {
        let v = self.get(i, name)?;
        v.as_i64()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| self.bad(name, v, "a u32"))
    }

    fn opt_u32(&self, i: usize, name: &str) -> Result<Option<u32>, StoreError> {
        match self.get(i, name)? {
            Value::Null => Ok(None),
            _ => self.u32(i, name).map(Some),
        }
    }

    fn opt_u64(&self, i: usize, name: &str) -> Result<Option<u64>, StoreError> {
        match self.get(i, name)? {
            Value::Null => Ok(None),
            Value::Int(x) => u64::try_from(*x)
                .map(Some)
                .map_err(|_| self.bad(name, &Value::Int(*x), "a u64")),
            // UBIGINT beyond i64 reads as its decimal text.
            Value::Text(s) => s
                .parse::<u64>()
                .map(Some)
                .map_err(|_| self.bad(name, &Value::Text(s.clone()), "a u64")),
            v => Err(self.bad(name, v, "a u64")),
        }
    }
}
