//! One headless Chromium: started in its own process group with a fresh profile, driven over the
//! DevTools protocol (`headless_chrome`), killed (with its helpers) on drop, on a timeout, or
//! when anything goes wrong on the way up.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use headless_chrome::protocol::cdp::Runtime;
use headless_chrome::Tab;
use serde_json::Value;

use crate::discover::{find_browser, find_ort_web};
use crate::server::Server;
use crate::BrowserError;

/// Environment variable: the default [`BrowserOptions::call_timeout`] in seconds.
pub const TIMEOUT_ENV: &str = "IPFS_ACCELERATE_BROWSER_TIMEOUT";

/// How a browser is started.
#[derive(Debug, Clone)]
pub struct BrowserOptions {
    /// The Chromium executable (`None`: [`find_browser`]).
    pub executable: Option<PathBuf>,
    /// The folder with onnxruntime-web's files (`None`: [`find_ort_web`]).
    pub ort_web_dir: Option<PathBuf>,
    /// How long the browser may take to start and open the page.
    pub launch_timeout: Duration,
    /// How long one call into the page (creating a session, one run) may take before the
    /// browser is taken as hung and killed (default: `$IPFS_ACCELERATE_BROWSER_TIMEOUT` seconds,
    /// else 300 s).
    pub call_timeout: Duration,
    /// WebAssembly threads (`None`: the machine's cores, at most 16).
    pub threads: Option<usize>,
    /// More command-line switches.
    pub extra_args: Vec<String>,
}

impl Default for BrowserOptions {
    fn default() -> Self {
        BrowserOptions {
            executable: None,
            ort_web_dir: None,
            launch_timeout: Duration::from_secs(60),
            call_timeout: std::env::var(TIMEOUT_ENV)
                .ok()
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s > 0.0)
                .map(Duration::from_secs_f64)
                .unwrap_or(Duration::from_secs(300)),
            threads: None,
            extra_args: Vec::new(),
        }
    }
}

/// The switches every browser is started with (headless, no sandbox so it runs as root, no
/// network services, WebNN and WebGPU on).
pub fn chromium_args(profile: &Path) -> Vec<String> {
    [
        "--headless",
        "--no-sandbox",
        "--disable-quic",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--enable-features=WebMachineLearningNeuralNetwork",
        "--enable-unsafe-webgpu",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("--user-data-dir={}", profile.display())])
    .collect()
}

/// The DevTools connection: re-made when headless_chrome drops it after an idle period.
struct Connection {
    browser: headless_chrome::Browser,
    tab: Arc<Tab>,
}

/// A running headless Chromium with the backend page open.
pub struct Browser {
    child: Mutex<Child>,
    pid: u32,
    executable: PathBuf,
    version: String,
    ws_url: String,
    page_url: String,
    call_timeout: Duration,
    threads: usize,
    connection: Mutex<Option<Connection>>,
    dead: AtomicBool,
    server: Server,
    stderr_path: PathBuf,
    // Last: removed after the process is gone.
    _profile: tempfile::TempDir,
}

impl std::fmt::Debug for Browser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Browser")
            .field("pid", &self.pid)
            .field("executable", &self.executable)
            .field("version", &self.version)
            .finish()
    }
}

/// Kills the process group `pgid` and the child, and reaps it.
fn kill_tree(child: &mut Child, pgid: u32) {
    ipfs_accelerate_chromium::kill_group(pgid);
    let _ = child.kill();
    let _ = child.wait();
}

/// The last 1500 characters of the browser's log.
fn log_tail(path: &Path) -> String {
    ipfs_accelerate_chromium::log_tail(path, 1500)
}

impl Browser {
    /// Starts the browser, serves the page and opens it.
    pub fn launch(options: &BrowserOptions) -> Result<Browser, BrowserError> {
        let executable = match &options.executable {
            Some(p) => p.clone(),
            None => find_browser()?,
        };
        let ort_dir = match &options.ort_web_dir {
            Some(d) => {
                crate::discover::check_ort_web(d)?;
                d.clone()
            }
            None => find_ort_web()?,
        };
        let server = Server::start(&ort_dir)?;
        let profile = tempfile::Builder::new()
            .prefix("ipfs-accelerate-browser-")
            .tempdir()
            .map_err(|source| BrowserError::Io {
                context: "creating the browser profile".into(),
                source,
            })?;
        let stderr_path = profile.path().join("chromium.log");
        let log = File::create(&stderr_path).map_err(|source| BrowserError::Io {
            context: "creating the browser log".into(),
            source,
        })?;
        let user_data = profile.path().join("profile");
        let mut command = Command::new(&executable);
        command
            .args(chromium_args(&user_data))
            .args(&options.extra_args)
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            // Its own process group, so its helpers (zygote, GPU, renderers) end with it.
            command.process_group(0);
        }
        let mut child = command.spawn().map_err(|e| BrowserError::Launch {
            executable: executable.display().to_string(),
            reason: e.to_string(),
        })?;
        let pid = child.id();
        let threads = options
            .threads
            .unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1)
            })
            .clamp(1, 16);
        // From here on the process is killed on every error path.
        let started = Instant::now();
        let port_file = user_data.join("DevToolsActivePort");
        let ws_url = loop {
            if let Ok(text) = std::fs::read_to_string(&port_file) {
                let mut lines = text.lines();
                if let (Some(port), Some(path)) = (lines.next(), lines.next()) {
                    break format!("ws://127.0.0.1:{}{}", port.trim(), path.trim());
                }
            }
            match child.try_wait() {
                Ok(Some(status)) => {
                    kill_tree(&mut child, pid);
                    return Err(BrowserError::Launch {
                        executable: executable.display().to_string(),
                        reason: format!("exited with {status}: {}", log_tail(&stderr_path)),
                    });
                }
                Ok(None) if started.elapsed() >= options.launch_timeout => {
                    kill_tree(&mut child, pid);
                    return Err(BrowserError::Timeout {
                        what: "starting the browser (no DevTools port)".into(),
                        seconds: options.launch_timeout.as_secs_f64(),
                    });
                }
                _ => std::thread::sleep(Duration::from_millis(25)),
            }
        };
        let browser = Browser {
            child: Mutex::new(child),
            pid,
            executable,
            version: String::new(),
            ws_url,
            page_url: server.url(),
            call_timeout: options.call_timeout,
            threads,
            connection: Mutex::new(None),
            dead: AtomicBool::new(false),
            server,
            stderr_path,
            _profile: profile,
        };
        // Drop kills the process if opening the page fails.
        browser.open_page(options.launch_timeout)
    }

    fn open_page(mut self, timeout: Duration) -> Result<Browser, BrowserError> {
        let conn = self.connect(false)?;
        self.version = conn
            .browser
            .get_version()
            .map(|v| v.product)
            .unwrap_or_default();
        conn.tab.set_default_timeout(timeout);
        let nav = conn
            .tab
            .navigate_to(&self.page_url)
            .and_then(|t| t.wait_until_navigated());
        if let Err(e) = nav {
            return Err(BrowserError::PageLoad {
                url: self.page_url.clone(),
                reason: e.to_string(),
            });
        }
        if let Ok(mut c) = self.connection.lock() {
            *c = Some(conn);
        }
        let ready = self.evaluate("window.ipfsAccelReady === true", false)?;
        if ready != Value::Bool(true) {
            return Err(BrowserError::PageLoad {
                url: self.page_url.clone(),
                reason: "the page's script did not run".into(),
            });
        }
        Ok(self)
    }

    /// A DevTools connection whose calls wait at most the call timeout (headless_chrome also
    /// drops it after that long without any message; [`Browser::evaluate`] then reconnects):
    /// to a new tab, or (`existing`) to the tab that has the page open, with its sessions.
    fn connect(&self, existing: bool) -> Result<Connection, BrowserError> {
        let cdp = |e: anyhow::Error| BrowserError::Protocol(e.to_string());
        let browser =
            headless_chrome::Browser::connect_with_timeout(self.ws_url.clone(), self.call_timeout)
                .map_err(cdp)?;
        if !existing {
            let tab = browser.new_tab().map_err(cdp)?;
            return Ok(Connection { browser, tab });
        }
        // The existing targets arrive as events after connecting.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found = browser.get_tabs().lock().ok().and_then(|tabs| {
                tabs.iter()
                    .find(|t| t.get_url().starts_with(&self.page_url))
                    .cloned()
            });
            if let Some(tab) = found {
                return Ok(Connection { browser, tab });
            }
            if Instant::now() >= deadline {
                return Err(BrowserError::Protocol(
                    "reconnected, but the backend page's tab is gone".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The browser's product string (`Chrome/153.0.8010.0`, `HeadlessChrome/...`).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The executable.
    pub fn executable(&self) -> &Path {
        &self.executable
    }

    /// The URL of the backend page.
    pub fn page_url(&self) -> &str {
        &self.page_url
    }

    /// The browser's process id (its process group).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// WebAssembly threads the page asks for.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Serves the file `path` as `/model/<key>`; returns its URL path.
    pub(crate) fn serve_model(&self, key: &str, path: &Path) -> String {
        self.server.add_model(key, path);
        format!("/model/{key}")
    }

    /// Kills the browser (and its helpers) now; later calls fail.
    pub fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
        if let Ok(mut c) = self.connection.lock() {
            *c = None;
        }
        if let Ok(mut child) = self.child.lock() {
            kill_tree(&mut child, self.pid);
        }
    }

    /// Evaluates `expression` in the page (awaiting it when it is a promise when `await_promise`)
    /// and returns its value. A call that takes longer than the call timeout kills the browser.
    pub fn evaluate(&self, expression: &str, await_promise: bool) -> Result<Value, BrowserError> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(BrowserError::Dead(log_tail(&self.stderr_path)));
        }
        let mut guard = self
            .connection
            .lock()
            .map_err(|_| BrowserError::Protocol("connection poisoned by a panic".into()))?;
        let method = || Runtime::Evaluate {
            expression: expression.to_string(),
            return_by_value: Some(true),
            generate_preview: None,
            silent: Some(false),
            await_promise: Some(await_promise),
            include_command_line_api: None,
            user_gesture: None,
            object_group: None,
            context_id: None,
            throw_on_side_effect: None,
            timeout: None,
            disable_breaks: None,
            repl_mode: None,
            allow_unsafe_eval_blocked_by_csp: None,
            unique_context_id: None,
            serialization_options: None,
        };
        let mut attempt = 0;
        let result = loop {
            if guard.is_none() {
                // headless_chrome drops an idle connection; the page lives on in the browser.
                *guard = Some(self.connect(true)?);
            }
            let Some(conn) = guard.as_ref() else {
                continue;
            };
            let started = Instant::now();
            match conn.tab.call_method(method()) {
                Ok(r) => break r,
                // A call that outlived the timeout: headless_chrome's own timeout, or its
                // message loop giving up on the silent browser and cancelling the call.
                Err(e)
                    if e.downcast_ref::<headless_chrome::util::Timeout>().is_some()
                        || started.elapsed() >= self.call_timeout.mul_f64(0.9) =>
                {
                    drop(guard);
                    self.kill();
                    return Err(BrowserError::Timeout {
                        what: format!(
                            "evaluating `{}`",
                            expression.chars().take(80).collect::<String>()
                        ),
                        seconds: self.call_timeout.as_secs_f64(),
                    });
                }
                Err(e) if attempt == 0 && self.alive() => {
                    tracing::debug!(error = %e, "DevTools connection lost, reconnecting");
                    *guard = None;
                    attempt += 1;
                }
                Err(e) => {
                    let alive = self.alive();
                    drop(guard);
                    self.kill();
                    return Err(if alive {
                        BrowserError::Protocol(e.to_string())
                    } else {
                        BrowserError::Dead(log_tail(&self.stderr_path))
                    });
                }
            }
        };
        if let Some(ex) = result.exception_details {
            let text = ex.exception.and_then(|e| e.description).unwrap_or(ex.text);
            return Err(BrowserError::Script(text));
        }
        Ok(result.result.value.unwrap_or(Value::Null))
    }

    /// Calls `window.ipfsAccel.<function>(args...)` (which resolves to a JSON string
    /// `{ok, error?, ...}`) and returns the parsed object, or the page's error.
    pub(crate) fn call(&self, function: &str, args: &[Value]) -> Result<Value, BrowserError> {
        let args: Vec<String> = args.iter().map(Value::to_string).collect();
        let expr = format!("window.ipfsAccel.{function}({})", args.join(", "));
        let value = self.evaluate(&expr, true)?;
        let text = value.as_str().ok_or_else(|| {
            BrowserError::Script(format!(
                "{function} returned {value} instead of a JSON string"
            ))
        })?;
        let parsed: Value = serde_json::from_str(text)
            .map_err(|e| BrowserError::Script(format!("{function} returned bad JSON: {e}")))?;
        if parsed.get("ok") == Some(&Value::Bool(true)) {
            return Ok(parsed);
        }
        let error = parsed
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("unknown error")
            .to_string();
        Err(match parsed.get("kind").and_then(Value::as_str) {
            // The graph's caller fills in the model and the provider.
            Some("graph-build") => BrowserError::GraphBuild {
                model: String::new(),
                provider: String::new(),
                reason: error,
            },
            _ => BrowserError::Script(error),
        })
    }

    /// True while the browser process runs.
    pub fn alive(&self) -> bool {
        if self.dead.load(Ordering::SeqCst) {
            return false;
        }
        self.child
            .lock()
            .map(|mut c| matches!(c.try_wait(), Ok(None)))
            .unwrap_or(false)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.kill();
    }
}
