//! The benchmark runner of ipfs-accelerate (`cargo xtask bench`, `ipfs-accelerate bench`): runs
//! a family over backends × dtypes × batch sizes × sizes, measures latency (mean, percentiles),
//! throughput, memory and FLOPs, stores everything in DuckDB ([`store`]) and renders an HTML
//! report ([`report`]).
//!
//! ```no_run
//! use ipfs_accelerate_bench::{run_benchmark, BenchSpec};
//! use ipfs_accelerate::BackendKind;
//!
//! let spec = BenchSpec {
//!     model: "minilm-l6".into(),
//!     backends: vec![BackendKind::Cpu],
//!     batches: vec![1, 8],
//!     sizes: vec![32, 128],
//!     iters: 10,
//!     ..Default::default()
//! };
//! let (run, measurements) = run_benchmark(&spec, |_, _| Ok(()))?;
//! for m in &measurements {
//!     println!("{} b{} s{}: {:?}", m.backend, m.batch, m.seq, m.latency.map(|l| l.p50_ms));
//! }
//! # Ok::<(), ipfs_accelerate_bench::BenchError>(())
//! ```

pub mod build;
pub mod chromium;
pub mod cli;
pub mod configs;
pub mod flops;
pub mod generation;
pub mod inputs;
pub mod peers;
pub mod ratios;
pub mod record;
pub mod report;
pub mod runner;
pub mod stats;
pub mod store;
pub mod sysinfo;

use std::path::PathBuf;

pub use record::{LatencyStats, Measurement, RunInfo, Status, OURS};
pub use runner::{install_interrupt_handler, interrupted, run_benchmark, BenchSpec};

/// Errors of the benchmark runner.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The benchmark was asked for something it cannot do (unknown model, empty grid, ...).
    #[error("{0}")]
    Spec(String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An error of the SDK's core (inputs, tensors, configs).
    #[error(transparent)]
    Core(#[from] ipfs_accelerate_core::Error),
    /// An error of the SDK (loading, backends).
    #[error(transparent)]
    Sdk(#[from] ipfs_accelerate::Error),
    /// Storing or reading results failed.
    #[error("benchmark database: {0}")]
    Store(String),
}

impl BenchError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        BenchError::Io {
            path: path.into(),
            source,
        }
    }
}
