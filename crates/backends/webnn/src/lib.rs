//! # ipfs-accelerate-backend-webnn
//!
//! The browser backends: a family's ONNX export runs on onnxruntime-web inside a headless
//! Chromium, on one of its execution providers — `BackendKind::Browser(provider)`:
//!
//! | kind | provider | bundle |
//! | --- | --- | --- |
//! | `webnn` (`webnn-gpu`, `webnn-npu`) | WebNN, `deviceType` cpu / gpu / npu | `ort.min.mjs` |
//! | `webgpu-browser` | WebGPU (onnxruntime's native WebGPU provider) | `ort.webgpu.min.mjs` |
//! | `wasm` | WebAssembly (multi-threaded when the page is cross-origin isolated) | `ort.min.mjs` |
//!
//! From Rust, [`Browser::launch`] starts Chromium (its own process group, a fresh profile in a
//! temporary folder, `--enable-features=WebMachineLearningNeuralNetwork --enable-unsafe-webgpu`),
//! serves a small page, onnxruntime-web and the model files on 127.0.0.1, and drives the page over
//! the DevTools protocol. One browser serves every graph of a backend instance and is killed on
//! drop, on a call that outlives [`BrowserOptions::call_timeout`], and on any failure while it
//! starts. [`BrowserGraph`] sends the inputs, creates the session (WebNN: with
//! `freeDimensionOverrides` from the actual input shapes, one session per shape, because WebNN
//! only takes static shapes) and returns the outputs as [`HostTensor`]s together with where ONNX
//! Runtime placed the nodes.
//!
//! Setup: `cargo xtask fetch-browser` puts onnxruntime-web and a Chromium with WebNN (the npm
//! packages [`discover::ORT_WEB_PACKAGE`] and [`discover::CHROMIUM_PACKAGE`]) into
//! `~/.cache/ipfs-accelerate/browser` ([`discover::BROWSER_DIR_ENV`] overrides it);
//! `$IPFS_ACCELERATE_CHROMIUM` picks another browser. Debian's `chromium` runs `webgpu-browser`
//! and `wasm` but has no WebNN backend ([`BrowserError::WebNnUnsupported`]).
//!
//! ```no_run
//! use std::sync::Arc;
//! use ipfs_accelerate_backend_webnn::{Browser, BrowserGraph, BrowserOptions, GraphOptions};
//! use ipfs_accelerate_core::{BrowserProvider, HostTensor, TensorMap, WebNnDevice};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let browser = Arc::new(Browser::launch(&BrowserOptions::default())?);
//! let graph = BrowserGraph::load(
//!     browser,
//!     "model.onnx".as_ref(),
//!     BrowserProvider::WebNn(WebNnDevice::Cpu),
//!     GraphOptions { require_full_placement: true },
//! )?;
//! let mut inputs = TensorMap::new();
//! inputs.insert("input_ids".into(), HostTensor::from_i64(vec![1, 3], &[101, 7592, 102])?);
//! let outputs = graph.run(&inputs)?;
//! println!("{:?} on {:?}", outputs.keys(), graph.placement());
//! # Ok(())
//! # }
//! ```

mod browser;
pub mod discover;
mod graph;
pub mod onnx_proto;
mod probe;
pub mod rewrite;
mod server;

pub use browser::{chromium_args, Browser, BrowserOptions, TIMEOUT_ENV};
pub use graph::{provider_ep_name, BrowserGraph, GraphOptions};
pub use probe::{probe_browser, BrowserBackend, BrowserReport, WebGpuAdapter};

#[allow(unused_imports)] // linked from the crate doc
use ipfs_accelerate_core::HostTensor;
use ipfs_accelerate_core::{BrowserProvider, Error};

/// Errors of the browser backends.
#[derive(Debug, thiserror::Error)]
pub enum BrowserError {
    /// No browser was found.
    #[error("no Chromium found ({searched}); run `cargo xtask fetch-browser` (Chromium with WebNN + onnxruntime-web from npm) or set IPFS_ACCELERATE_CHROMIUM")]
    NotFound {
        /// Where it was looked for.
        searched: String,
    },
    /// onnxruntime-web's files are not there.
    #[error("onnxruntime-web not found in {dir} (missing {missing}); run `cargo xtask fetch-browser` or set IPFS_ACCELERATE_ORT_WEB")]
    OrtWebMissing {
        /// The folder searched.
        dir: String,
        /// The missing files.
        missing: String,
    },
    /// The browser could not be started, or exited while starting.
    #[error("cannot start the browser {executable}: {reason}")]
    Launch {
        /// The executable.
        executable: String,
        /// What happened.
        reason: String,
    },
    /// The page (or onnxruntime-web inside it) did not load.
    #[error("the backend page {url} failed to load: {reason}")]
    PageLoad {
        /// The page.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The browser has no usable WebNN context for the device type.
    #[error("this browser ({browser}) has no WebNN {device} context: {reason}; `cargo xtask fetch-browser` installs a Chromium with WebNN")]
    WebNnUnsupported {
        /// The browser's version.
        browser: String,
        /// The device type.
        device: String,
        /// The browser's message.
        reason: String,
    },
    /// The browser has no WebGPU adapter.
    #[error("this browser ({browser}) has no WebGPU adapter: {reason}")]
    WebGpuUnsupported {
        /// The browser's version.
        browser: String,
        /// The browser's message.
        reason: String,
    },
    /// The browser did not answer in time and was killed.
    #[error("the browser hung: {what} took longer than {seconds} s; it was killed")]
    Timeout {
        /// What was being done.
        what: String,
        /// The timeout.
        seconds: f64,
    },
    /// The browser process is gone.
    #[error("the browser process is gone; its log ends with: {0}")]
    Dead(String),
    /// The DevTools connection failed.
    #[error("DevTools protocol: {0}")]
    Protocol(String),
    /// The page's script failed (onnxruntime-web's error, e.g. an operator it cannot run).
    #[error("onnxruntime-web: {0}")]
    Script(String),
    /// The browser's WebNN could not build the graph (`MLGraphBuilder.build` rejected it: an
    /// operator, data type or shape it does not take; the reason names the WebNN operator).
    /// Reported as soon as the build fails, instead of waiting for a session that
    /// onnxruntime-web never settles.
    #[error("{provider} cannot build {model}: {reason}")]
    GraphBuild {
        /// The model file.
        model: String,
        /// The provider asked for.
        provider: String,
        /// The browser's reason.
        reason: String,
    },
    /// A graph was not placed wholly on the requested provider (with `require_full_placement`).
    #[error("{model}: not every node runs on {provider} (placement: {placement})")]
    Placement {
        /// The model file.
        model: String,
        /// The provider asked for.
        provider: String,
        /// Nodes per execution provider.
        placement: String,
    },
    /// The inputs do not fit the graph, or the model file is unusable.
    #[error("{0}")]
    Input(String),
    /// A local file or socket operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl From<BrowserError> for Error {
    fn from(e: BrowserError) -> Self {
        match e {
            BrowserError::Input(m) => Error::InvalidInput(m),
            BrowserError::NotFound { .. }
            | BrowserError::OrtWebMissing { .. }
            | BrowserError::Launch { .. }
            | BrowserError::WebNnUnsupported { .. }
            | BrowserError::WebGpuUnsupported { .. } => Error::BackendUnavailable {
                kind: "browser".into(),
                reason: e.to_string(),
            },
            other => Error::Compute(other.to_string()),
        }
    }
}

/// The page's name of a provider (`webnn`, `webgpu`, `wasm`).
fn page_provider(provider: BrowserProvider) -> &'static str {
    match provider {
        BrowserProvider::WebNn(_) => "webnn",
        BrowserProvider::WebGpu => "webgpu",
        BrowserProvider::Wasm => "wasm",
    }
}
