//! One ONNX graph on one browser provider, run on named host tensors.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use ipfs_accelerate_core::{BrowserProvider, HostTensor, TensorMap};
use serde_json::{json, Value};

use crate::onnx_proto::{graph_inputs, Dim, GraphInput};
use crate::rewrite::rewrite_for_webnn;
use crate::{page_provider, Browser, BrowserError};

/// Sessions kept per graph (WebNN: one per input shape); the oldest is released beyond this.
const MAX_SESSIONS: usize = 32;

/// Options of a browser graph.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphOptions {
    /// Fail (instead of only reporting it) when ONNX Runtime places any node of the graph on
    /// another provider than the one asked for, or cannot tell where it placed them.
    pub require_full_placement: bool,
}

/// onnxruntime-web's name of the execution provider that runs a [`BrowserProvider`]'s nodes.
pub fn provider_ep_name(provider: BrowserProvider) -> &'static str {
    match provider {
        BrowserProvider::WebNn(_) => "WebNNExecutionProvider",
        BrowserProvider::WebGpu => "WebGpuExecutionProvider",
        BrowserProvider::Wasm => "CPUExecutionProvider",
    }
}

/// One created session.
struct Session {
    shape_key: String,
    key: String,
    placement: BTreeMap<String, usize>,
}

#[derive(Default)]
struct State {
    sessions: Vec<Session>,
    outputs: Vec<String>,
    last_run_ms: Option<f64>,
}

/// An ONNX graph served to a browser and run there.
pub struct BrowserGraph {
    browser: Arc<Browser>,
    path: PathBuf,
    model_url: String,
    model_key: String,
    provider: BrowserProvider,
    options: GraphOptions,
    inputs: Vec<GraphInput>,
    rewrites: Vec<String>,
    state: Mutex<State>,
    /// The rewritten model file served instead of `path` (removed on drop).
    _rewritten: Option<tempfile::TempPath>,
}

impl std::fmt::Debug for BrowserGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrowserGraph")
            .field("path", &self.path)
            .field("provider", &self.provider)
            .field("inputs", &self.inputs)
            .field("rewrites", &self.rewrites)
            .finish()
    }
}

static NEXT_MODEL: AtomicU64 = AtomicU64::new(0);

impl BrowserGraph {
    /// Serves the ONNX file `path` to `browser` for `provider`, after checking the browser can
    /// run the provider (a WebNN context of the device type, a WebGPU adapter). Providers that
    /// take dynamic shapes (WebGPU, wasm) create their session now; WebNN creates one per input
    /// shape on first use.
    pub fn load(
        browser: Arc<Browser>,
        path: &Path,
        provider: BrowserProvider,
        options: GraphOptions,
    ) -> Result<BrowserGraph, BrowserError> {
        let bytes = std::fs::read(path).map_err(|e| {
            BrowserError::Input(format!("cannot read ONNX model {}: {e}", path.display()))
        })?;
        let inputs = graph_inputs(&bytes).map_err(|e| {
            BrowserError::Input(format!(
                "{} is not a usable ONNX model: {e}",
                path.display()
            ))
        })?;
        // WebNN: exact reformulations of what it cannot build or ONNX Runtime cannot place there.
        let rewritten = match provider {
            BrowserProvider::WebNn(_) => rewrite_for_webnn(&bytes).map_err(|e| {
                BrowserError::Input(format!(
                    "{} is not a usable ONNX model: {e}",
                    path.display()
                ))
            })?,
            _ => None,
        };
        drop(bytes);
        if let Some(bad) = inputs.iter().find(|i| i.web_dtype().is_none()) {
            return Err(BrowserError::Input(format!(
                "{}: input `{}` has ONNX element type {}, which the browser backends do not feed",
                path.display(),
                bad.name,
                bad.elem_type
            )));
        }
        check_provider(&browser, provider)?;
        let model_key = format!("m{}", NEXT_MODEL.fetch_add(1, Ordering::SeqCst));
        let (served, rewrites) = match rewritten {
            Some(r) => {
                let io = |source| BrowserError::Io {
                    context: format!("writing the WebNN rewrite of {}", path.display()),
                    source,
                };
                let mut file = tempfile::Builder::new()
                    .prefix("ipfs-accelerate-webnn-")
                    .suffix(".onnx")
                    .tempfile()
                    .map_err(io)?;
                file.write_all(&r.bytes).map_err(io)?;
                for what in &r.applied {
                    tracing::debug!(model = %path.display(), "WebNN rewrite: {what}");
                }
                (Some(file.into_temp_path()), r.applied)
            }
            None => (None, Vec::new()),
        };
        let model_url = browser.serve_model(&model_key, served.as_deref().unwrap_or(path));
        let graph = BrowserGraph {
            browser,
            path: path.to_path_buf(),
            model_url,
            model_key,
            provider,
            options,
            inputs,
            rewrites,
            state: Mutex::new(State::default()),
            _rewritten: served,
        };
        if !matches!(provider, BrowserProvider::WebNn(_)) {
            let mut state = graph.lock()?;
            graph.session(&mut state, String::new(), BTreeMap::new())?;
        }
        Ok(graph)
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, State>, BrowserError> {
        self.state
            .lock()
            .map_err(|_| BrowserError::Input("graph poisoned by an earlier panic".into()))
    }

    /// The graph file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The provider.
    pub fn provider(&self) -> BrowserProvider {
        self.provider
    }

    /// The browser running the graph.
    pub fn browser(&self) -> &Arc<Browser> {
        &self.browser
    }

    /// The rewrites made to the graph before it was sent (WebNN: see [`crate::rewrite`]); empty
    /// when the file is served as it is.
    pub fn rewrites(&self) -> &[String] {
        &self.rewrites
    }

    /// The graph's input names.
    pub fn input_names(&self) -> Vec<&str> {
        self.inputs.iter().map(|i| i.name.as_str()).collect()
    }

    /// The graph's output names (known once a session exists).
    pub fn output_names(&self) -> Vec<String> {
        self.lock().map(|s| s.outputs.clone()).unwrap_or_default()
    }

    /// Milliseconds `session.run` took in the page on the last run (without the transfers).
    pub fn last_run_ms(&self) -> Option<f64> {
        self.lock().ok().and_then(|s| s.last_run_ms)
    }

    /// Where ONNX Runtime placed the nodes (execution provider → nodes), summed over every
    /// session created so far (WebNN: one per input shape).
    pub fn placement(&self) -> BTreeMap<String, usize> {
        let mut total = BTreeMap::new();
        if let Ok(state) = self.lock() {
            for s in &state.sessions {
                for (ep, n) in &s.placement {
                    *total.entry(ep.clone()).or_default() += n;
                }
            }
        }
        total
    }

    /// True when every session placed every node on the requested provider.
    pub fn fully_placed(&self) -> bool {
        self.lock()
            .map(|s| {
                !s.sessions.is_empty()
                    && s.sessions
                        .iter()
                        .all(|s| wholly_on(&s.placement, self.provider))
            })
            .unwrap_or(false)
    }

    /// The session for `shape_key` (created with `overrides` when new).
    fn session(
        &self,
        state: &mut State,
        shape_key: String,
        overrides: BTreeMap<String, i64>,
    ) -> Result<String, BrowserError> {
        if let Some(s) = state.sessions.iter().find(|s| s.shape_key == shape_key) {
            return Ok(s.key.clone());
        }
        let key = format!("{}:{}", self.model_key, shape_key);
        let device = match self.provider {
            BrowserProvider::WebNn(d) => d.name(),
            _ => "",
        };
        let spec = json!({
            "model": self.model_url,
            "provider": page_provider(self.provider),
            "deviceType": device,
            "threads": self.browser.threads(),
            "freeDimensionOverrides": overrides,
        });
        let created = self
            .browser
            .call("create", &[Value::String(key.clone()), spec])
            .map_err(|e| match e {
                BrowserError::Script(m) => BrowserError::Script(format!(
                    "creating a session of {} on {}: {m}",
                    self.path.display(),
                    self.provider.name()
                )),
                BrowserError::GraphBuild { reason, .. } => BrowserError::GraphBuild {
                    model: self.path.display().to_string(),
                    provider: self.provider.name().to_string(),
                    reason,
                },
                other => other,
            })?;
        let placement: BTreeMap<String, usize> = created
            .get("placement")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_u64()? as usize)))
                    .collect()
            })
            .unwrap_or_default();
        if let Some(outs) = created.get("outputs").and_then(Value::as_array) {
            state.outputs = outs
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
        }
        if self.options.require_full_placement && !wholly_on(&placement, self.provider) {
            let _ = self.browser.call("release", &[Value::String(key)]);
            return Err(BrowserError::Placement {
                model: self.path.display().to_string(),
                provider: provider_ep_name(self.provider).into(),
                placement: format_placement(&placement),
            });
        }
        if state.sessions.len() >= MAX_SESSIONS {
            let old = state.sessions.remove(0);
            let _ = self.browser.call("release", &[Value::String(old.key)]);
        }
        state.sessions.push(Session {
            shape_key,
            key: key.clone(),
            placement,
        });
        Ok(key)
    }

    /// Runs the graph: each graph input is taken from `inputs` by name (converted to the graph's
    /// element type); every graph output comes back by name.
    pub fn run(&self, inputs: &TensorMap) -> Result<TensorMap, BrowserError> {
        let mut feeds = Vec::with_capacity(self.inputs.len());
        let mut overrides: BTreeMap<String, i64> = BTreeMap::new();
        for input in &self.inputs {
            let host = inputs.get(&input.name).ok_or_else(|| {
                BrowserError::Input(format!(
                    "{} needs input `{}` (given: {})",
                    self.path.display(),
                    input.name,
                    inputs.keys().cloned().collect::<Vec<_>>().join(", ")
                ))
            })?;
            check_shape(input, host.shape(), &mut overrides)?;
            feeds.push(feed(input, host)?);
        }
        let mut state = self.lock()?;
        let key = match self.provider {
            BrowserProvider::WebNn(_) => {
                let shape_key = overrides
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",");
                self.session(&mut state, shape_key, overrides)?
            }
            _ => self.session(&mut state, String::new(), BTreeMap::new())?,
        };
        let result = self
            .browser
            .call("run", &[Value::String(key), Value::Array(feeds)])
            .map_err(|e| match e {
                BrowserError::Script(m) => BrowserError::Script(format!(
                    "running {} on {}: {m}",
                    self.path.display(),
                    self.provider.name()
                )),
                other => other,
            })?;
        state.last_run_ms = result.get("ms").and_then(Value::as_f64);
        let outputs = result
            .get("outputs")
            .and_then(Value::as_object)
            .ok_or_else(|| BrowserError::Script("run returned no outputs".into()))?;
        let mut out = TensorMap::new();
        for (name, v) in outputs {
            out.insert(name.clone(), read_output(name, v)?);
        }
        Ok(out)
    }
}

/// The placement as `WebNN 123, CPU 4`.
pub(crate) fn format_placement(placement: &BTreeMap<String, usize>) -> String {
    if placement.is_empty() {
        return "unknown (no placement in onnxruntime-web's log)".into();
    }
    placement
        .iter()
        .map(|(p, n)| format!("{} {n}", p.trim_end_matches("ExecutionProvider")))
        .collect::<Vec<_>>()
        .join(", ")
}

fn wholly_on(placement: &BTreeMap<String, usize>, provider: BrowserProvider) -> bool {
    let want = provider_ep_name(provider);
    !placement.is_empty() && placement.iter().all(|(ep, n)| ep == want || *n == 0)
}

/// Checks the provider can run in `browser`.
fn check_provider(browser: &Browser, provider: BrowserProvider) -> Result<(), BrowserError> {
    let device = match provider {
        BrowserProvider::WebNn(d) => d.name(),
        _ => "",
    };
    let args = [
        Value::String(page_provider(provider).into()),
        Value::String(device.into()),
        Value::from(browser.threads()),
    ];
    match browser.call("check", &args) {
        Ok(_) => Ok(()),
        Err(BrowserError::Script(reason)) if reason.starts_with("cannot load /ort/") => {
            Err(BrowserError::PageLoad {
                url: browser.page_url().to_string(),
                reason,
            })
        }
        Err(BrowserError::Script(reason)) => Err(match provider {
            BrowserProvider::WebNn(_) => BrowserError::WebNnUnsupported {
                browser: browser.version().to_string(),
                device: device.into(),
                reason,
            },
            _ => BrowserError::WebGpuUnsupported {
                browser: browser.version().to_string(),
                reason,
            },
        }),
        Err(e) => Err(e),
    }
}

/// Checks `shape` against the input's dimensions and records the sizes of its named dimensions.
fn check_shape(
    input: &GraphInput,
    shape: &[usize],
    overrides: &mut BTreeMap<String, i64>,
) -> Result<(), BrowserError> {
    if !input.dims.is_empty() && input.dims.len() != shape.len() {
        return Err(BrowserError::Input(format!(
            "input `{}` has shape {shape:?}, the graph takes rank {}",
            input.name,
            input.dims.len()
        )));
    }
    for (dim, &size) in input.dims.iter().zip(shape) {
        let size = size as i64;
        match dim {
            Dim::Fixed(d) if *d != size => {
                return Err(BrowserError::Input(format!(
                    "input `{}` has shape {shape:?}, the graph takes {:?}",
                    input.name, input.dims
                )))
            }
            Dim::Named(name) => match overrides.get(name) {
                Some(&other) if other != size => {
                    return Err(BrowserError::Input(format!(
                        "dimension `{name}` is {other} in one input and {size} in `{}`",
                        input.name
                    )))
                }
                _ => {
                    overrides.insert(name.clone(), size);
                }
            },
            _ => {}
        }
    }
    Ok(())
}

/// The page's feed of one input, converted to the graph's element type.
fn feed(input: &GraphInput, host: &HostTensor) -> Result<Value, BrowserError> {
    let bad = |e: ipfs_accelerate_core::Error| {
        BrowserError::Input(format!("input `{}`: {e}", input.name))
    };
    let dtype = input.web_dtype().unwrap_or("float32");
    let bytes: Vec<u8> = match dtype {
        "float32" => host
            .to_f32_vec()
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
        "float64" => host
            .to_f64_vec()
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
        "int64" => int_values(host)
            .map_err(bad)?
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
        "int32" => int_values(host)
            .map_err(bad)?
            .iter()
            .flat_map(|&x| (x as i32).to_le_bytes())
            .collect(),
        _ => int_values(host)
            .map_err(bad)?
            .iter()
            .map(|&x| {
                if dtype == "bool" {
                    u8::from(x != 0)
                } else {
                    x as u8
                }
            })
            .collect(),
    };
    Ok(json!({
        "name": input.name,
        "dtype": dtype,
        "dims": host.shape(),
        "b64": B64.encode(bytes),
    }))
}

/// Integer values of a host tensor (float tensors are truncated, as ONNX Runtime's Cast does).
fn int_values(host: &HostTensor) -> ipfs_accelerate_core::Result<Vec<i64>> {
    if host.dtype().is_float() {
        Ok(host.to_f64_vec().iter().map(|&x| x as i64).collect())
    } else {
        host.to_i64_vec()
    }
}

/// One output of the page as a host tensor.
fn read_output(name: &str, v: &Value) -> Result<HostTensor, BrowserError> {
    let bad = |what: &str| BrowserError::Script(format!("output `{name}`: {what}"));
    let dtype = v
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("no dtype"))?;
    let dims: Vec<usize> = v
        .get("dims")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("no dims"))?
        .iter()
        .map(|d| d.as_u64().map(|d| d as usize))
        .collect::<Option<_>>()
        .ok_or_else(|| bad("bad dims"))?;
    let bytes = B64
        .decode(v.get("b64").and_then(Value::as_str).unwrap_or(""))
        .map_err(|e| bad(&format!("bad base64: {e}")))?;
    let wrap = |r: ipfs_accelerate_core::Result<HostTensor>| {
        r.map_err(|e| BrowserError::Script(format!("output `{name}`: {e}")))
    };
    fn words<const N: usize>(bytes: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
        bytes
            .chunks_exact(N)
            .map(|c| c.try_into().unwrap_or([0; N]))
    }
    match dtype {
        "float32" => {
            let v: Vec<f32> = words::<4>(&bytes).map(f32::from_le_bytes).collect();
            wrap(HostTensor::from_f32(dims, &v))
        }
        "float64" => {
            let v: Vec<f64> = words::<8>(&bytes).map(f64::from_le_bytes).collect();
            wrap(HostTensor::from_f64(dims, &v))
        }
        "int64" => {
            let v: Vec<i64> = words::<8>(&bytes).map(i64::from_le_bytes).collect();
            wrap(HostTensor::from_i64(dims, &v))
        }
        "int32" => {
            let v: Vec<i64> = words::<4>(&bytes)
                .map(|w| i64::from(i32::from_le_bytes(w)))
                .collect();
            wrap(HostTensor::from_i64(dims, &v))
        }
        "bool" | "uint8" => {
            let v: Vec<i64> = bytes.iter().map(|&b| i64::from(b)).collect();
            wrap(HostTensor::from_i64(dims, &v))
        }
        "int8" => {
            let v: Vec<i64> = bytes.iter().map(|&b| i64::from(b as i8)).collect();
            wrap(HostTensor::from_i64(dims, &v))
        }
        other => Err(bad(&format!("unsupported dtype {other}"))),
    }
}
