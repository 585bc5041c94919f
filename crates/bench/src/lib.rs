//! The benchmark runner of ipfs-accelerate (`cargo xtask bench`, `ipfs-accelerate bench`).

pub mod record;

pub use record::{LatencyStats, Measurement, RunInfo, Status};
