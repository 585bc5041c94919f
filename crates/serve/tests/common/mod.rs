//! Starting a server in-process on a loopback port, and finding `../shared`.
#![allow(dead_code)] // each test binary uses a different subset

use std::sync::Arc;

use ipfs_accelerate_serve::{ModelSpec, ServeOptions, Server};

/// A server running on `127.0.0.1:<free port>` until dropped (then it shuts down gracefully).
pub struct Running {
    pub base: String,
    pub server: Arc<Server>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Running {
    pub async fn start(options: ServeOptions) -> Running {
        let server = Server::load(options).expect("loading the served models");
        Self::start_loaded(server).await
    }

    pub async fn start_loaded(server: Arc<Server>) -> Running {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(ipfs_accelerate_serve_run(server.clone(), listener, stopped));
        Running {
            base,
            server,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Signals shutdown and waits for the server to drain.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }
}

async fn ipfs_accelerate_serve_run(
    server: Arc<Server>,
    listener: tokio::net::TcpListener,
    stopped: tokio::sync::oneshot::Receiver<()>,
) {
    ipfs_accelerate_serve::serve(server, listener, async {
        let _ = stopped.await;
    })
    .await
    .unwrap();
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Options serving `models` (`NAME=SOURCE` or `SOURCE`) on the CPU backend.
pub fn options(models: &[&str]) -> ServeOptions {
    ServeOptions {
        models: models
            .iter()
            .map(|m| ModelSpec::parse(m).unwrap())
            .collect(),
        backends: Some(vec![ipfs_accelerate::BackendKind::Cpu]),
        offline: true,
        ..ServeOptions::default()
    }
}

/// The sentences of `refs/minilm_public_sentences.txt`, or a few of our own without `../shared`
/// (see `ipfs_accelerate_conformance::shared_dir`, which `test` names the skip in).
pub fn sentences(test: &str) -> Vec<String> {
    match ipfs_accelerate_conformance::shared_dir(test)
        .and_then(|d| std::fs::read_to_string(d.join("refs/minilm_public_sentences.txt")).ok())
    {
        Some(text) => text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect(),
        None => vec![
            "A man is playing a guitar.".into(),
            "Someone plays music.".into(),
            "The stock market fell.".into(),
        ],
    }
}

/// Largest absolute difference between two lists of vectors of equal shape.
pub fn max_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len(), "vector counts differ");
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len(), "vector lengths differ");
            x.iter().zip(y).map(|(p, q)| (p - q).abs())
        })
        .fold(0.0, f32::max)
}

/// GET `url` as JSON.
pub async fn get_json(client: &reqwest::Client, url: &str) -> serde_json::Value {
    client.get(url).send().await.unwrap().json().await.unwrap()
}

/// GET `url` as text.
pub async fn get_text(client: &reqwest::Client, url: &str) -> String {
    client.get(url).send().await.unwrap().text().await.unwrap()
}
