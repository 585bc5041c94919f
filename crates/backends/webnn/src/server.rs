//! The page's HTTP server on 127.0.0.1: the page itself, onnxruntime-web's files and the model
//! files, with the cross-origin isolation headers that give the page `SharedArrayBuffer` (and so
//! multi-threaded WebAssembly).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::discover::ORT_WEB_FILES;
use crate::BrowserError;

/// The page the browser opens.
const PAGE_HTML: &str = include_str!("page.html");
/// The page's module: loads onnxruntime-web, creates sessions, runs them.
const PAGE_JS: &str = include_str!("page.js");

struct Shared {
    ort_dir: PathBuf,
    models: Mutex<HashMap<String, PathBuf>>,
    stop: AtomicBool,
}

/// A running server; stopped on drop.
pub(crate) struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Serves `ort_dir`'s onnxruntime-web files on a free port of 127.0.0.1.
    pub(crate) fn start(ort_dir: &Path) -> Result<Server, BrowserError> {
        let io = |context: &str| {
            let context = context.to_string();
            move |source| BrowserError::Io { context, source }
        };
        let listener = TcpListener::bind("127.0.0.1:0").map_err(io("binding 127.0.0.1"))?;
        let addr = listener.local_addr().map_err(io("reading the port"))?;
        let shared = Arc::new(Shared {
            ort_dir: ort_dir.to_path_buf(),
            models: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
        });
        let serving = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("webnn-http".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if serving.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let shared = Arc::clone(&serving);
                    let _ = std::thread::Builder::new()
                        .name("webnn-http-conn".into())
                        .spawn(move || {
                            let _ = handle(stream, &shared);
                        });
                }
            })
            .map_err(io("starting the HTTP thread"))?;
        Ok(Server {
            addr,
            shared,
            thread: Some(thread),
        })
    }

    /// The page's URL.
    pub(crate) fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Serves the file `path` as `/model/<key>`.
    pub(crate) fn add_model(&self, key: &str, path: &Path) {
        if let Ok(mut m) = self.shared.models.lock() {
            m.insert(key.to_string(), path.to_path_buf());
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn content_type(name: &str) -> &'static str {
    if name.ends_with(".mjs") || name.ends_with(".js") {
        "text/javascript"
    } else if name.ends_with(".wasm") {
        "application/wasm"
    } else if name.ends_with(".html") {
        "text/html; charset=utf-8"
    } else {
        "application/octet-stream"
    }
}

fn respond(stream: &mut TcpStream, status: &str, ctype: &str, body: &[u8]) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\
         Cross-Origin-Opener-Policy: same-origin\r\nCross-Origin-Embedder-Policy: require-corp\r\n\
         Cross-Origin-Resource-Policy: same-origin\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()
}

fn handle(mut stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    // Skip the headers.
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
    }
    let mut parts = request.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" {
        return respond(&mut stream, "405 Method Not Allowed", "text/plain", b"");
    }
    let path = target.split('?').next().unwrap_or("");
    let not_found = |stream: &mut TcpStream| respond(stream, "404 Not Found", "text/plain", b"");
    match path {
        "/" => respond(
            &mut stream,
            "200 OK",
            content_type(".html"),
            PAGE_HTML.as_bytes(),
        ),
        "/page.js" => respond(
            &mut stream,
            "200 OK",
            content_type(".js"),
            PAGE_JS.as_bytes(),
        ),
        _ => {
            let file = if let Some(name) = path.strip_prefix("/ort/") {
                ORT_WEB_FILES
                    .contains(&name)
                    .then(|| shared.ort_dir.join(name))
            } else if let Some(key) = path.strip_prefix("/model/") {
                shared.models.lock().ok().and_then(|m| m.get(key).cloned())
            } else {
                None
            };
            match file.map(|f| (std::fs::read(&f), f)) {
                Some((Ok(body), f)) => respond(
                    &mut stream,
                    "200 OK",
                    content_type(&f.to_string_lossy()),
                    &body,
                ),
                _ => not_found(&mut stream),
            }
        }
    }
}
