//! What the browser offers (for `devices` and backend selection): its version, WebNN context
//! support per device type, the WebGPU adapter.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use ipfs_accelerate_core::{
    Availability, BackendKind, BrowserProvider, Capabilities, DeviceInfo, Error, ProbeBackend,
};
use serde_json::Value;

use crate::{Browser, BrowserError, BrowserOptions};

/// The WebGPU adapter a browser reports (`GPUAdapter.info`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WebGpuAdapter {
    /// Vendor (`google` for SwiftShader).
    pub vendor: String,
    /// Architecture (`swiftshader`, ...).
    pub architecture: String,
    /// Device, when the browser says.
    pub device: String,
    /// Description, when the browser says.
    pub description: String,
}

/// What one browser supports.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BrowserReport {
    /// The executable.
    pub executable: PathBuf,
    /// Its product string (`HeadlessChrome/153.0.8010.0`).
    pub version: String,
    /// WebNN per device type (`cpu`, `gpu`, `npu`): `Ok(())` or the browser's error.
    pub webnn: BTreeMap<String, Result<(), String>>,
    /// The WebGPU adapter, or why there is none.
    pub webgpu: Result<WebGpuAdapter, String>,
    /// Whether the page got cross-origin isolation (multi-threaded WebAssembly).
    pub cross_origin_isolated: bool,
    /// `navigator.hardwareConcurrency`.
    pub threads: u32,
}

impl BrowserReport {
    /// Why `provider` cannot run in this browser, or `None` when it can.
    pub fn unusable_reason(&self, provider: BrowserProvider) -> Option<String> {
        match provider {
            BrowserProvider::WebNn(d) => match self.webnn.get(d.name()) {
                Some(Ok(())) => None,
                Some(Err(e)) => Some(format!("{}: WebNN {}: {e}", self.version, d.name())),
                None => Some(format!("{}: WebNN {} not probed", self.version, d.name())),
            },
            BrowserProvider::WebGpu => self
                .webgpu
                .as_ref()
                .err()
                .map(|e| format!("{}: WebGPU: {e}", self.version)),
            BrowserProvider::Wasm => None,
        }
    }
}

fn text(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// Reports what `browser` supports.
pub fn report(browser: &Browser) -> Result<BrowserReport, BrowserError> {
    let v = browser.call("probe", &[])?;
    let outcome = |e: &Value| {
        if e.get("ok") == Some(&Value::Bool(true)) {
            Ok(())
        } else {
            Err(text(e, "error"))
        }
    };
    let webnn = v
        .get("webnn")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, e)| (k.clone(), outcome(e))).collect())
        .unwrap_or_default();
    let gpu = v.get("webgpu").cloned().unwrap_or(Value::Null);
    let webgpu = outcome(&gpu).map(|()| WebGpuAdapter {
        vendor: text(&gpu, "vendor"),
        architecture: text(&gpu, "architecture"),
        device: text(&gpu, "device"),
        description: text(&gpu, "description"),
    });
    Ok(BrowserReport {
        executable: browser.executable().to_path_buf(),
        version: browser.version().to_string(),
        webnn,
        webgpu,
        cross_origin_isolated: v.get("crossOriginIsolated") == Some(&Value::Bool(true)),
        threads: v
            .get("hardwareConcurrency")
            .and_then(Value::as_u64)
            .unwrap_or(0) as u32,
    })
}

/// Starts the browser `options` name (or find), reports what it supports, and closes it.
pub fn probe_browser(options: &BrowserOptions) -> Result<BrowserReport, BrowserError> {
    let browser = Browser::launch(options)?;
    report(&browser)
}

/// The report of the default browser, probed once per process.
fn cached_report() -> &'static Result<BrowserReport, String> {
    static REPORT: OnceLock<Result<BrowserReport, String>> = OnceLock::new();
    REPORT.get_or_init(|| probe_browser(&BrowserOptions::default()).map_err(|e| e.to_string()))
}

/// One browser provider as a probe-able backend (the browser is started once per process to
/// probe, and closed again).
#[derive(Debug, Clone, Copy)]
pub struct BrowserBackend {
    provider: BrowserProvider,
}

impl BrowserBackend {
    /// The backend for `provider`.
    pub fn new(provider: BrowserProvider) -> Self {
        BrowserBackend { provider }
    }

    /// Every browser provider.
    pub fn all() -> Vec<BrowserBackend> {
        BrowserProvider::ALL
            .into_iter()
            .map(BrowserBackend::new)
            .collect()
    }

    /// The provider.
    pub fn provider(&self) -> BrowserProvider {
        self.provider
    }
}

impl ProbeBackend for BrowserBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Browser(self.provider)
    }

    fn probe(&self) -> Availability {
        let report = match cached_report() {
            Ok(r) => r,
            Err(e) => return Availability::Unavailable(e.clone()),
        };
        if let Some(reason) = report.unusable_reason(self.provider) {
            return Availability::Unavailable(reason);
        }
        let mut features = vec![
            format!("browser={}", report.executable.display()),
            format!("cross_origin_isolated={}", report.cross_origin_isolated),
        ];
        let name = match self.provider {
            BrowserProvider::WebNn(d) => format!("{} WebNN {}", report.version, d.name()),
            BrowserProvider::WebGpu => {
                let a = report.webgpu.as_ref().ok();
                let adapter = a
                    .map(|a| {
                        [&a.vendor, &a.architecture, &a.device, &a.description]
                            .iter()
                            .filter(|s| !s.is_empty())
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .unwrap_or_default();
                features.push(format!("webgpu_adapter={adapter}"));
                format!("{} WebGPU ({adapter})", report.version)
            }
            BrowserProvider::Wasm => format!("{} WebAssembly", report.version),
        };
        Availability::Available(DeviceInfo {
            kind: self.kind(),
            name,
            memory_total: None,
            compute_units: Some(report.threads),
            capabilities: Capabilities {
                f16: false,
                bf16: false,
                int8: false,
                features,
            },
            driver: Some(format!(
                "onnxruntime-web {}",
                crate::discover::ORT_WEB_PACKAGE
            )),
        })
    }

    fn synchronize(&self) -> Result<(), Error> {
        // A run returns when its outputs are back on the host.
        Ok(())
    }

    fn memory_in_use(&self) -> Option<u64> {
        None
    }
}
