//! Replicas of one model, each a worker thread with a bounded queue.
//!
//! - **Routing**: a request goes to the healthy replica expected to answer first: (items queued or
//!   running + its own) × the replica's measured time per item (an exponential moving average).
//! - **Batching**: an encoder worker takes the first queued request, then keeps taking compatible
//!   ones (same task, same normalisation) until the batch holds `max_batch` items or `max_wait`
//!   has passed, runs one forward for all of them, and splits the result. A batch that fails is
//!   re-run request by request, so one bad input fails only its own request.
//! - **Faults**: a request that fails on the server's side (not a bad input) is handed to another
//!   healthy replica once. A replica that panics, or fails `MAX_FAULTS` requests in a row, is taken
//!   out with the reason (shown by `/health`); it hands everything still queued to the others.
//! - **Bounds**: each queue holds `queue_capacity` requests; when every healthy replica's queue
//!   is full the request is refused at once (503 with `Retry-After`), so memory stays bounded.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::engine::{Engine, ModelKind};
use crate::error::ApiError;
use crate::generate::{self, GenerateJob};
use crate::metrics::Metrics;
use std::cell::RefCell;

/// Server-side failures in a row that take a replica out.
pub const MAX_FAULTS: u32 = 3;

/// How a pool batches encoder requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// Merge concurrent requests into one forward (off: one forward per request).
    pub enabled: bool,
    /// Items (texts) per forward at most.
    pub max_batch: usize,
    /// How long the first request of a batch waits for others.
    pub max_wait: Duration,
    /// Generation requests decoded together at most (one forward per step for all of them).
    pub max_generations: usize,
    /// Generation requests that arrive while a batch decodes join it between steps (continuous
    /// batching, where the engine can change a running batch); off: they wait for the next
    /// batch (static batches).
    pub continuous: bool,
}

/// A request for an encoder, batchable with others of the same key.
pub(crate) struct EncodeJob {
    pub(crate) texts: Vec<String>,
    pub(crate) task: EncodeTask,
}

/// What an encoder request wants.
pub(crate) enum EncodeTask {
    /// Sentence embeddings, L2-normalised when `normalize`.
    Embed {
        normalize: bool,
        reply: oneshot::Sender<Result<Vec<Vec<f32>>, ApiError>>,
    },
    /// Sequence-classification labels with probabilities.
    Predict {
        reply: oneshot::Sender<Result<Vec<Vec<ipfs_accelerate::Label>>, ApiError>>,
    },
}

impl EncodeJob {
    /// Requests with equal keys can share a forward.
    fn key(&self) -> (u8, bool) {
        match &self.task {
            EncodeTask::Embed { normalize, .. } => (0, *normalize),
            EncodeTask::Predict { .. } => (1, false),
        }
    }

    fn abandoned(&self) -> bool {
        match &self.task {
            EncodeTask::Embed { reply, .. } => reply.is_closed(),
            EncodeTask::Predict { reply } => reply.is_closed(),
        }
    }

    fn fail(self, e: ApiError) {
        match self.task {
            EncodeTask::Embed { reply, .. } => {
                let _ = reply.send(Err(e));
            }
            EncodeTask::Predict { reply } => {
                let _ = reply.send(Err(e));
            }
        }
    }
}

/// A request that runs alone on a replica and answers itself (speech, images).
pub(crate) trait SingleJob: Send {
    /// Runs on `engine`. `Ok` when the request was answered (with a result or the client's own
    /// error); `Err` for a server-side failure, the request still unanswered.
    fn run(&mut self, engine: &Engine) -> Result<(), ApiError>;
    /// Answers with `e`.
    fn fail(self: Box<Self>, e: ApiError);
    /// The client is gone.
    fn abandoned(&self) -> bool;
}

/// [`SingleJob`] of a function of the engine.
pub(crate) struct Call<T, F> {
    pub(crate) run: F,
    pub(crate) reply: Option<oneshot::Sender<Result<T, ApiError>>>,
}

impl<T: Send, F: FnMut(&Engine) -> Result<T, ApiError> + Send> SingleJob for Call<T, F> {
    fn run(&mut self, engine: &Engine) -> Result<(), ApiError> {
        match (self.run)(engine) {
            Err(e) if !e.is_client_error() => Err(e),
            result => {
                if let Some(reply) = self.reply.take() {
                    let _ = reply.send(result);
                }
                Ok(())
            }
        }
    }

    fn fail(mut self: Box<Self>, e: ApiError) {
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(Err(e));
        }
    }

    fn abandoned(&self) -> bool {
        self.reply.as_ref().is_none_or(|r| r.is_closed())
    }
}

/// What a replica is asked to do.
pub(crate) enum Work {
    Encode(EncodeJob),
    Generate(GenerateJob),
    Single(Box<dyn SingleJob>),
}

impl Work {
    fn items(&self) -> usize {
        match self {
            Work::Encode(j) => j.texts.len().max(1),
            Work::Generate(_) | Work::Single(_) => 1,
        }
    }

    pub(crate) fn abandoned(&self) -> bool {
        match self {
            Work::Encode(j) => j.abandoned(),
            Work::Generate(j) => j.abandoned(),
            Work::Single(j) => j.abandoned(),
        }
    }

    fn fail(self, e: ApiError) {
        match self {
            Work::Encode(j) => j.fail(e),
            Work::Generate(j) => j.fail(e),
            Work::Single(j) => j.fail(e),
        }
    }
}

/// A unit of work on its way through the pool.
pub(crate) struct Envelope {
    pub(crate) work: Work,
    /// Replicas that already failed it on the server's side.
    tried: Vec<usize>,
    /// When the request gives up.
    pub(crate) deadline: Instant,
}

impl Envelope {
    pub(crate) fn new(work: Work, deadline: Instant) -> Self {
        Envelope {
            work,
            tried: Vec::new(),
            deadline,
        }
    }
}

/// One replica's shared state.
pub struct Replica {
    /// Its position in the pool.
    pub index: usize,
    /// The backend it runs on.
    pub backend: String,
    /// The loaded model (its worker runs it; requests read its tokenizer and config).
    pub engine: Arc<Engine>,
    queue: SyncSender<Envelope>,
    /// Items queued or running.
    depth: AtomicUsize,
    /// Requests it answered (with a result or an error; not those skipped or handed on).
    served: AtomicU64,
    /// Moving average of the time per item, in nanoseconds (0: not measured yet).
    ns_per_item: AtomicU64,
    faults: AtomicU32,
    failed: Mutex<Option<String>>,
}

impl Replica {
    /// Why it was taken out, if it was.
    pub fn failure(&self) -> Option<String> {
        self.failed.lock().map(|f| f.clone()).unwrap_or(None)
    }

    /// Items queued or running.
    pub fn depth(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    /// Requests it answered.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    /// Its measured time per item.
    pub fn time_per_item(&self) -> Duration {
        Duration::from_nanos(self.ns_per_item.load(Ordering::Relaxed))
    }

    fn healthy(&self) -> bool {
        self.failure().is_none()
    }

    fn take_out(&self, reason: String) {
        tracing::error!(backend = %self.backend, replica = self.index, %reason, "replica taken out");
        if let Ok(mut f) = self.failed.lock() {
            f.get_or_insert(reason);
        }
    }

    /// Expected time until a new request of `items` would be answered.
    fn score(&self, items: usize) -> u128 {
        let per = self.ns_per_item.load(Ordering::Relaxed).max(1_000);
        (self.depth() + items) as u128 * per as u128
    }

    fn measured(&self, items: usize, took: Duration) {
        let sample = (took.as_nanos() / items.max(1) as u128).min(u64::MAX as u128) as u64;
        let old = self.ns_per_item.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample
        } else {
            (old / 5) * 4 + sample / 5
        };
        self.ns_per_item.store(new, Ordering::Relaxed);
    }
}

/// The replicas of one served model.
pub struct Pool {
    /// The model's name in requests.
    pub name: String,
    /// What it does.
    pub kind: ModelKind,
    /// Its replicas.
    pub replicas: Vec<Arc<Replica>>,
    /// Whether an encoder has a sequence-classification head (`/predict`).
    pub classifies: bool,
    /// Replicas that failed to load: (backend preference, reason).
    pub not_loaded: Vec<(String, String)>,
}

/// What starting a pool needs besides its engines.
pub(crate) struct PoolSettings {
    pub(crate) batching: Batching,
    pub(crate) queue_capacity: usize,
    pub(crate) metrics: Arc<Metrics>,
}

impl Pool {
    /// Starts one worker thread per engine.
    pub(crate) fn start(
        name: String,
        kind: ModelKind,
        engines: Vec<Engine>,
        not_loaded: Vec<(String, String)>,
        settings: PoolSettings,
    ) -> Arc<Pool> {
        let classifies = engines.iter().any(|e| match e {
            Engine::Encoder(p) => p.task() == ipfs_accelerate::Task::Classify,
            _ => false,
        });
        let mut receivers = Vec::new();
        let mut replicas = Vec::new();
        for (index, engine) in engines.into_iter().enumerate() {
            let (tx, rx) = mpsc::sync_channel(settings.queue_capacity.max(1));
            receivers.push(rx);
            replicas.push(Arc::new(Replica {
                index,
                backend: engine.backend().to_string(),
                engine: Arc::new(engine),
                queue: tx,
                depth: AtomicUsize::new(0),
                served: AtomicU64::new(0),
                ns_per_item: AtomicU64::new(0),
                faults: AtomicU32::new(0),
                failed: Mutex::new(None),
            }));
        }
        let pool = Arc::new(Pool {
            name,
            kind,
            replicas,
            classifies,
            not_loaded,
        });
        for (rx, replica) in receivers.into_iter().zip(&pool.replicas) {
            let worker = Worker {
                engine: replica.engine.clone(),
                replica: replica.clone(),
                pool: Arc::downgrade(&pool),
                batching: settings.batching,
                metrics: settings.metrics.clone(),
                model: pool.name.clone(),
                pending: VecDeque::new(),
            };
            let thread = format!("{}#{}", pool.name, replica.index);
            std::thread::Builder::new()
                .name(thread)
                .spawn(move || worker.run(rx))
                .expect("spawning a replica worker thread");
        }
        pool
    }

    /// Healthy replicas.
    pub fn healthy(&self) -> usize {
        self.replicas.iter().filter(|r| r.healthy()).count()
    }

    /// Items queued or running over all replicas.
    pub fn depth(&self) -> usize {
        self.replicas.iter().map(|r| r.depth()).sum()
    }

    /// The first replica's model (every replica loads the same checkpoint).
    pub fn engine(&self) -> &Engine {
        &self.replicas[0].engine
    }

    /// Queues `envelope` on the healthy replica expected to answer first (skipping those that
    /// already failed it); gives it back with the reason when none can take it.
    pub(crate) fn submit(&self, envelope: Envelope) -> Result<(), Box<(ApiError, Envelope)>> {
        let items = envelope.work.items();
        let mut candidates: Vec<&Arc<Replica>> = self
            .replicas
            .iter()
            .filter(|r| r.healthy() && !envelope.tried.contains(&r.index))
            .collect();
        if candidates.is_empty() {
            let reasons: Vec<String> = self
                .replicas
                .iter()
                .filter_map(|r| {
                    r.failure()
                        .map(|f| format!("{}#{}: {f}", r.backend, r.index))
                })
                .collect();
            let e = ApiError::unavailable(format!(
                "model `{}` has no healthy replica left ({})",
                self.name,
                reasons.join("; ")
            ));
            return Err(Box::new((e, envelope)));
        }
        candidates.sort_by_key(|r| r.score(items));
        let mut envelope = envelope;
        for replica in candidates {
            replica.depth.fetch_add(items, Ordering::Relaxed);
            match replica.queue.try_send(envelope) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Full(back)) | Err(TrySendError::Disconnected(back)) => {
                    replica.depth.fetch_sub(items, Ordering::Relaxed);
                    envelope = back;
                }
            }
        }
        Err(Box::new((ApiError::overloaded(&self.name, 1), envelope)))
    }
}

/// A replica's thread: owns the engine and serves its queue.
struct Worker {
    engine: Arc<Engine>,
    replica: Arc<Replica>,
    pool: Weak<Pool>,
    batching: Batching,
    metrics: Arc<Metrics>,
    model: String,
    /// Requests taken from the queue while batching that did not fit the batch.
    pending: VecDeque<Envelope>,
}

impl Worker {
    fn run(mut self, rx: mpsc::Receiver<Envelope>) {
        loop {
            let first = match self.pending.pop_front() {
                Some(e) => e,
                None => match rx.recv() {
                    Ok(e) => e,
                    Err(_) => return,
                },
            };
            if !self.replica.healthy() {
                self.hand_over(first);
                continue;
            }
            match &first.work {
                Work::Encode(job) => {
                    let key = job.key();
                    let fits = |w: &Work| matches!(w, Work::Encode(j) if j.key() == key);
                    let batch = self.collect(first, &rx, fits, self.batching.max_batch);
                    self.encode(batch);
                }
                Work::Generate(_) => {
                    let fits = |w: &Work| matches!(w, Work::Generate(_));
                    let batch = self.collect(first, &rx, fits, self.batching.max_generations);
                    self.generate(batch, Some(&rx));
                }
                _ => self.single(first),
            }
        }
    }

    /// The first request and the ones that `fit` with it, already waiting or arriving within
    /// `max_wait`, up to `max_items` items.
    fn collect(
        &mut self,
        first: Envelope,
        rx: &mpsc::Receiver<Envelope>,
        fits: impl Fn(&Work) -> bool,
        max_items: usize,
    ) -> Vec<Envelope> {
        let mut items = first.work.items();
        let mut batch = vec![first];
        if !self.batching.enabled {
            return batch;
        }
        // Compatible requests already waiting first, then new arrivals until the deadline.
        let mut i = 0;
        while i < self.pending.len() && items < max_items {
            if fits(&self.pending[i].work) {
                let e = self.pending.remove(i).expect("index in range");
                items += e.work.items();
                batch.push(e);
            } else {
                i += 1;
            }
        }
        let deadline = Instant::now() + self.batching.max_wait;
        while items < max_items {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            match rx.recv_timeout(deadline - now) {
                Ok(e) if fits(&e.work) => {
                    items += e.work.items();
                    batch.push(e);
                }
                Ok(e) => self.pending.push_back(e),
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        batch
    }

    /// Runs a batch of encoder requests as one forward; on a failure, each request alone.
    fn encode(&mut self, batch: Vec<Envelope>) {
        let (live, gone): (Vec<Envelope>, Vec<Envelope>) =
            batch.into_iter().partition(|e| !e.work.abandoned());
        for e in gone {
            self.done(&e);
        }
        if live.is_empty() {
            return;
        }
        let items: usize = live.iter().map(|e| e.work.items()).sum();
        self.metrics.observe_batch(&self.model, items);
        match self.forward(&live) {
            Ok(outputs) => {
                let mut outputs = outputs.into_iter();
                for envelope in live {
                    self.done(&envelope);
                    self.answered();
                    let Work::Encode(job) = envelope.work else {
                        unreachable!("encode batches hold encoder work only")
                    };
                    let n = job.texts.len();
                    match (job.task, outputs.next()) {
                        (EncodeTask::Embed { reply, .. }, Some(Output::Vectors(v))) => {
                            let _ = reply.send(Ok(v));
                        }
                        (EncodeTask::Predict { reply }, Some(Output::Labels(l))) => {
                            let _ = reply.send(Ok(l));
                        }
                        (task, _) => EncodeJob {
                            texts: vec![],
                            task,
                        }
                        .fail(ApiError::internal(format!(
                            "the batched forward returned no output for {n} inputs"
                        ))),
                    }
                }
                self.replica.faults.store(0, Ordering::Relaxed);
            }
            Err(_) if live.len() > 1 => {
                for envelope in live {
                    if self.replica.healthy() {
                        self.encode(vec![envelope]);
                    } else {
                        self.hand_over(envelope);
                    }
                }
            }
            Err(e) => {
                let envelope = live.into_iter().next().expect("one request");
                self.done(&envelope);
                if e.is_client_error() {
                    self.answer_error(envelope.work, e);
                } else {
                    self.fault(envelope, e);
                }
            }
        }
    }

    /// One forward over every text of `batch`, split back per request.
    fn forward(&mut self, batch: &[Envelope]) -> Result<Vec<Output>, ApiError> {
        let Engine::Encoder(pipe) = &*self.engine else {
            return Err(ApiError::internal("encoder work on a non-encoder replica"));
        };
        let jobs: Vec<&EncodeJob> = batch
            .iter()
            .map(|e| match &e.work {
                Work::Encode(j) => j,
                _ => unreachable!("encode batches hold encoder work only"),
            })
            .collect();
        let texts: Vec<&str> = jobs
            .iter()
            .flat_map(|j| j.texts.iter().map(String::as_str))
            .collect();
        let counts: Vec<usize> = jobs.iter().map(|j| j.texts.len()).collect();
        let started = Instant::now();
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| match &jobs[0].task {
            EncodeTask::Embed { normalize, .. } => pipe.embed(&texts, *normalize).map(|o| {
                self.metrics
                    .observe_memory(&self.model, &self.replica, &o.metrics);
                split(o.value, &counts)
                    .into_iter()
                    .map(Output::Vectors)
                    .collect()
            }),
            EncodeTask::Predict { .. } => pipe.classify(&texts).map(|o| {
                self.metrics
                    .observe_memory(&self.model, &self.replica, &o.metrics);
                split(o.value, &counts)
                    .into_iter()
                    .map(Output::Labels)
                    .collect()
            }),
        }));
        self.replica.measured(texts.len(), started.elapsed());
        match result {
            Ok(r) => r.map_err(ApiError::from),
            Err(panic) => {
                let reason = format!("the model panicked: {}", panic_message(&panic));
                self.replica.take_out(reason.clone());
                Err(ApiError::internal(reason))
            }
        }
    }

    /// Decodes a batch of generation requests together; with `rx` (and batching on), requests
    /// that arrive while it decodes join it between steps (continuous batching, up to
    /// `max_generations` rows, where the engine can change a running batch; non-generation work
    /// waiting stops admissions so the batch drains). When a step fails as a whole, each request
    /// that streamed nothing yet runs alone (one bad prompt fails only itself).
    fn generate(&mut self, batch: Vec<Envelope>, rx: Option<&mpsc::Receiver<Envelope>>) {
        let (live, gone): (Vec<Envelope>, Vec<Envelope>) =
            batch.into_iter().partition(|e| !e.work.abandoned());
        for e in gone {
            self.done(&e);
        }
        if live.is_empty() {
            return;
        }
        let max_rows = if self.batching.enabled {
            self.batching.max_generations.max(1)
        } else {
            1
        };
        self.metrics.observe_batch(&self.model, live.len());
        let entries = RefCell::new(Vec::new());
        let (engine, metrics) = (self.engine.clone(), self.metrics.clone());
        let started = Instant::now();
        let pending = &mut self.pending;
        let continuous = self.batching.continuous;
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
            generate::run(
                &entries,
                live,
                &engine,
                &metrics,
                &self.model,
                max_rows,
                |free| match rx {
                    Some(rx) if max_rows > 1 && continuous => admit_generations(pending, rx, free),
                    _ => Vec::new(),
                },
            )
        }));
        let entries = entries.into_inner();
        self.replica.measured(entries.len(), started.elapsed());
        let whole = entries.len() > 1;
        match result {
            Ok(result) => {
                if result.is_ok() {
                    self.replica.faults.store(0, Ordering::Relaxed);
                }
                for entry in entries {
                    let streamed = matches!(&entry.envelope.work, Work::Generate(j) if j.started());
                    // A step of several requests failed: each that streamed nothing yet runs
                    // alone (still counted in the replica's depth), so a bad one fails by itself.
                    if whole
                        && result.is_err()
                        && !entry.answered
                        && entry.failure.is_none()
                        && !streamed
                    {
                        self.generate(vec![entry.envelope], None);
                        continue;
                    }
                    self.done(&entry.envelope);
                    if entry.answered {
                        self.answered();
                        continue;
                    }
                    let envelope = entry.envelope;
                    match (entry.failure, &result) {
                        (Some(e), _) => self.fault(envelope, e),
                        (None, Ok(())) => self.answer_error(
                            envelope.work,
                            ApiError::internal("the generation ended without an answer"),
                        ),
                        (None, Err(e)) if streamed || e.is_client_error() => {
                            self.answer_error(envelope.work, e.clone())
                        }
                        (None, Err(e)) => self.fault(envelope, e.clone()),
                    }
                }
            }
            Err(panic) => {
                let reason = format!("the model panicked: {}", panic_message(&panic));
                self.replica.take_out(reason.clone());
                for entry in entries {
                    self.done(&entry.envelope);
                    if entry.answered {
                        self.answered();
                    } else {
                        self.answer_error(entry.envelope.work, ApiError::internal(reason.clone()));
                    }
                }
            }
        }
    }

    /// Runs a request that is not batched.
    fn single(&mut self, mut envelope: Envelope) {
        if envelope.work.abandoned() {
            self.done(&envelope);
            return;
        }
        let started = Instant::now();
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| match &mut envelope.work {
            Work::Single(job) => job.run(&self.engine),
            Work::Generate(_) | Work::Encode(_) => {
                unreachable!("generation and encoder work run in batches")
            }
        }));
        self.replica.measured(1, started.elapsed());
        self.done(&envelope);
        match result {
            Ok(Ok(())) => {
                self.answered();
                self.replica.faults.store(0, Ordering::Relaxed);
            }
            Ok(Err(e)) if e.is_client_error() => self.answer_error(envelope.work, e),
            Ok(Err(e)) => self.fault(envelope, e),
            Err(panic) => {
                let reason = format!("the model panicked: {}", panic_message(&panic));
                self.replica.take_out(reason.clone());
                self.answer_error(envelope.work, ApiError::internal(reason));
            }
        }
    }

    /// The request left this replica's queue (answered, skipped or handed on).
    fn done(&self, envelope: &Envelope) {
        self.replica
            .depth
            .fetch_sub(envelope.work.items(), Ordering::Relaxed);
    }

    /// This replica answered a request (with its result or an error).
    fn answered(&self) {
        self.replica.served.fetch_add(1, Ordering::Relaxed);
    }

    /// Answers `work` with `e` from this replica.
    fn answer_error(&self, work: Work, e: ApiError) {
        self.answered();
        work.fail(e);
    }

    /// A server-side failure of `envelope` here: counts it against the replica, and hands the
    /// request to another replica when one is left that has not failed it.
    fn fault(&mut self, mut envelope: Envelope, e: ApiError) {
        let faults = self.replica.faults.fetch_add(1, Ordering::Relaxed) + 1;
        if faults >= MAX_FAULTS {
            self.replica.take_out(format!(
                "{faults} requests in a row failed on the server's side; the last: {}",
                e.message
            ));
        }
        let restartable = match &envelope.work {
            Work::Generate(job) => !job.started(),
            _ => true,
        };
        if !restartable {
            self.answer_error(envelope.work, e);
            return;
        }
        envelope.tried.push(self.replica.index);
        match self.pool.upgrade() {
            Some(pool) => {
                if let Err(refused) = pool.submit(envelope) {
                    self.answer_error(refused.1.work, e);
                }
            }
            None => self.answer_error(envelope.work, e),
        }
    }

    /// This replica is out: gives a queued request to another one.
    fn hand_over(&mut self, mut envelope: Envelope) {
        self.done(&envelope);
        envelope.tried.push(self.replica.index);
        match self.pool.upgrade() {
            Some(pool) => {
                if let Err(refused) = pool.submit(envelope) {
                    let (e, back) = *refused;
                    back.work.fail(e);
                }
            }
            None => envelope
                .work
                .fail(ApiError::unavailable("the server is shutting down")),
        }
    }
}

/// Up to `free` generation requests for a running batch: those set aside in `pending` first,
/// then what the queue holds now (other work is set aside). None while other work waits, so the
/// running batch drains and that work is served.
fn admit_generations(
    pending: &mut VecDeque<Envelope>,
    rx: &mpsc::Receiver<Envelope>,
    free: usize,
) -> Vec<Envelope> {
    let generation = |e: &Envelope| matches!(e.work, Work::Generate(_));
    let mut out = Vec::new();
    if !pending.iter().all(generation) {
        return out;
    }
    while out.len() < free {
        match pending.pop_front() {
            Some(e) => out.push(e),
            None => break,
        }
    }
    while out.len() < free {
        match rx.try_recv() {
            Ok(e) if generation(&e) => out.push(e),
            Ok(e) => {
                pending.push_back(e);
                break;
            }
            Err(_) => break,
        }
    }
    out
}

/// A request's share of a batched forward.
enum Output {
    Vectors(Vec<Vec<f32>>),
    Labels(Vec<Vec<ipfs_accelerate::Label>>),
}

/// `rows` cut into consecutive runs of `counts`.
fn split<T>(rows: Vec<T>, counts: &[usize]) -> Vec<Vec<T>> {
    let mut rows = rows.into_iter();
    counts
        .iter()
        .map(|&n| rows.by_ref().take(n).collect())
        .collect()
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn split_cuts_consecutive_runs() {
        let parts = split(vec![1, 2, 3, 4, 5, 6], &[1, 3, 2]);
        assert_eq!(parts, vec![vec![1], vec![2, 3, 4], vec![5, 6]]);
    }
}
