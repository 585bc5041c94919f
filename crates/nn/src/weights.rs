//! How weights are loaded and what they take: load settings (quantization, sharing), the
//! accounting of one load ([`LoadedWeights`]) and the process-wide registry through which two
//! pipelines that load the same weight files hold each tensor once.
//!
//! # Load scopes
//!
//! Family crates build their [`VarBuilder`](crate::VarBuilder) with `VarBuilder::new(source,
//! device)` deep inside their loaders. [`load_scope`] sets, for the current thread and the
//! duration of a closure, the [`LoadSettings`] every root `VarBuilder` made inside picks up: the
//! [`WeightQuantization`] of linear layers and whether weights may be shared. So any family is
//! quantized and shared at load time without a family-specific option. Builders made outside a
//! scope load float weights, unshared (and still count what they hold, [`VarBuilder::weights`](crate::VarBuilder::weights)
//! (crate::VarBuilder::weights)). A loader that builds its `VarBuilder` on another thread does
//! not see the scope of the calling thread.
//!
//! # Sharing
//!
//! Inside a scope, every tensor a `VarBuilder` hands out (in the form it is kept: a linear
//! layer's weight transposed or quantized, the other tensors as f32) is an entry of one
//! process-wide [`SharedTensors`] registry, and the load's [`LoadedWeights`] holds a handle on
//! each. With [`LoadSettings::share`] on and a source that has an
//! [`identity`](ipfs_accelerate_core::TensorSource::identity) (weight files: canonical path, size,
//! modification time), the entry's name is that identity with the tensor name, the requested
//! shape, the kept form (f32, int8 / int4 and block size), the burn backend type and the device:
//! a second load of the same files finds the entry and clones its tensor (burn tensors are
//! reference-counted handles, so the clone shares the storage). Otherwise the entry is private to
//! the load. Entries are freed when the last load holding them is dropped (with the models
//! built from them, which hold the storage itself); [`process_weight_bytes`] counts every entry
//! once.
//!
//! ```
//! use std::sync::Arc;
//!
//! use burn_flex::Flex;
//! use ipfs_accelerate_core::{HostTensor, Result, TensorSource};
//! use ipfs_accelerate_nn::weights::{load_scope, process_weight_bytes, LoadSettings};
//! use ipfs_accelerate_nn::{Linear, VarBuilder, WeightQuantization};
//!
//! /// One `[32, 64]` weight under a stable identity (weight files use path, size and mtime).
//! struct File(HostTensor);
//! impl TensorSource for File {
//!     fn source_name(&self) -> String { "demo".into() }
//!     fn contains(&self, name: &str) -> bool { name == "proj.weight" }
//!     fn shape_of(&self, name: &str) -> Option<Vec<usize>> {
//!         self.contains(name).then(|| self.0.shape().to_vec())
//!     }
//!     fn tensor(&self, name: &str) -> Result<HostTensor> {
//!         match self.contains(name) {
//!             true => Ok(self.0.clone()),
//!             false => Err(ipfs_accelerate_core::Error::MissingTensor {
//!                 name: name.into(),
//!                 source_name: self.source_name(),
//!             }),
//!         }
//!     }
//!     fn names(&self) -> Vec<String> { vec!["proj.weight".into()] }
//!     fn identity(&self) -> Option<String> { Some("demo-weights-v1".into()) }
//! }
//!
//! # fn main() -> Result<()> {
//! let w: Vec<f32> = (0..32 * 64).map(|i| (i as f32 * 0.37).sin()).collect();
//! let source: Arc<dyn TensorSource> = Arc::new(File(HostTensor::from_f32(vec![32, 64], &w)?));
//! let load = || Linear::<Flex>::load(&VarBuilder::new(source.clone(), &Default::default()).pp("proj"), 64, 32, false);
//! let settings = LoadSettings::default()
//!     .quantize(WeightQuantization::Int4 { block_size: 32 })
//!     .share(true);
//! let before = process_weight_bytes();
//! let (a, weights_a) = load_scope(settings.clone(), load);
//! let (b, weights_b) = load_scope(settings, load);
//! let (a, b) = (a?, b?);
//! // 32 × 64 int4 weights: 1 KiB of nibbles plus 64 f32 scales, held once for both layers.
//! assert_eq!(weights_a.stats().linear_bytes, 1024 + 64 * 4);
//! assert_eq!(weights_a.stats().linear_f32_bytes, 32 * 64 * 4);
//! assert_eq!(weights_b.stats().shared_tensors, 1);
//! assert_eq!(process_weight_bytes() - before, 1024 + 64 * 4);
//! // Freed when both loads (models and records) are dropped.
//! drop((a, b, weights_a, weights_b));
//! assert_eq!(process_weight_bytes(), before);
//! # Ok(())
//! # }
//! ```

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_core::shared::{DeviceCopy, SharedError};
use ipfs_accelerate_core::{
    BackendKind, Error, HostTensor, Residency, Result, SharedHandle, SharedTensors, TensorSource,
};

use crate::gptq::CalibratedWeights;
use crate::quant::{Int4Weight, LinearWeight};
use crate::WeightQuantization;

/// How a load keeps its weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadSettings {
    /// Linear layers' weights (embeddings, norms and convolutions stay float).
    pub quantization: WeightQuantization,
    /// Share tensors with other loads of the same weight files (default off).
    pub share: bool,
    /// Where the weights live, for the registry's per-device accounting.
    pub residency: Residency,
    /// The name the load's handles are recorded under (the registry's holder).
    pub holder: String,
    /// Int4 weights chosen by a calibration ([`crate::gptq`]), by linear weight name: those
    /// layers are kept as these codes and scales (whatever `quantization` says), the others as
    /// `quantization` asks.
    pub calibrated: Option<CalibratedWeights>,
}

impl Default for LoadSettings {
    fn default() -> Self {
        LoadSettings {
            quantization: WeightQuantization::None,
            share: false,
            residency: Residency::device(BackendKind::Cpu, 0),
            holder: "model".into(),
            calibrated: None,
        }
    }
}

impl LoadSettings {
    /// With linear weights kept as `q`.
    pub fn quantize(mut self, q: WeightQuantization) -> Self {
        self.quantization = q;
        self
    }

    /// With sharing on or off.
    pub fn share(mut self, share: bool) -> Self {
        self.share = share;
        self
    }

    /// On device `ordinal` of backend `kind`.
    pub fn on(mut self, kind: BackendKind, ordinal: usize) -> Self {
        self.residency = Residency::device(kind, ordinal);
        self
    }

    /// Recorded under `holder` (a model name).
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = holder.into();
        self
    }

    /// With the linear layers `calibrated` names kept as its int4 codes and scales.
    pub fn calibrated(mut self, calibrated: Option<CalibratedWeights>) -> Self {
        self.calibrated = calibrated;
        self
    }
}

/// What one load holds: counts and bytes, as kept in memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct WeightStats {
    /// Distinct tensors handed out (linear weights included).
    pub tensors: usize,
    /// Bytes of those tensors as kept (each counted once per load).
    pub bytes: u64,
    /// Linear layers' weight matrices loaded (biases are counted with the other tensors).
    pub linear_layers: usize,
    /// Of those, kept quantized (as the load asked, or as the file's ggml blocks).
    pub linear_quantized: usize,
    /// Of those, kept float although a quantization was asked for, because the in-features are
    /// not a multiple of the block size.
    pub linear_kept_float: usize,
    /// Bytes of the linear weight matrices as kept.
    pub linear_bytes: u64,
    /// Bytes the linear weight matrices would take as f32.
    pub linear_f32_bytes: u64,
    /// Tensors that were already loaded by another load and are shared with it.
    pub shared_tensors: usize,
    /// Of the quantized linear layers, those kept as a calibration chose
    /// ([`LoadSettings::calibrated`]) rather than rounded to nearest.
    pub linear_calibrated: usize,
}

impl WeightStats {
    /// Bytes the same weights would take as f32.
    pub fn f32_bytes(&self) -> u64 {
        self.bytes - self.linear_bytes + self.linear_f32_bytes
    }
}

#[derive(Default)]
struct Record {
    stats: WeightStats,
    seen: HashSet<String>,
    handles: Vec<SharedHandle>,
    linear: Vec<(String, WeightQuantization)>,
    /// Names of the linear weights built from a calibration's codes.
    calibrated: HashSet<String>,
}

/// The weights of one load: its [`WeightStats`] and the registry handles that keep its shared
/// entries alive. Clones refer to the same record; keep one with the model and drop it with it.
#[derive(Clone, Default)]
pub struct LoadedWeights(Arc<Mutex<Record>>);

impl std::fmt::Debug for LoadedWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("LoadedWeights").field(&self.stats()).finish()
    }
}

impl LoadedWeights {
    /// The counts and bytes so far.
    pub fn stats(&self) -> WeightStats {
        self.lock().stats
    }

    /// Every linear weight matrix loaded, by its name in the source, with how it is kept.
    pub fn linear_weights(&self) -> Vec<(String, WeightQuantization)> {
        self.lock().linear.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Record> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What a loaded tensor is, for the accounting.
pub(crate) enum Kind {
    /// Any tensor but a linear weight.
    Tensor,
    /// A linear layer's weight matrix.
    Linear {
        /// Its name in the source.
        name: String,
        /// Its size as f32.
        f32_bytes: u64,
        /// Whether a quantization was asked for but the shape did not allow it.
        kept_float: bool,
    },
}

/// A value the registry can hold for a load: its bytes and a read-back to the host.
pub(crate) trait HeldWeight: Clone + Send + Sync + 'static {
    /// Bytes as kept.
    fn bytes(&self) -> u64;
    /// The value as the f32 host tensor it was built from.
    fn read_back(&self) -> Result<HostTensor>;
    /// How it is kept.
    fn quantization(&self) -> WeightQuantization {
        WeightQuantization::None
    }
    /// Whether it is kept quantized (as [`quantization`](Self::quantization) says, or as ggml
    /// blocks).
    fn is_quantized(&self) -> bool {
        self.quantization() != WeightQuantization::None
    }
    /// The value recorded under `name`, its name in the source (linear weights remember it).
    fn named(self, _name: &str) -> Self {
        self
    }
}

impl<B: Backend, const D: usize> HeldWeight for Tensor<B, D> {
    fn bytes(&self) -> u64 {
        (self.shape().num_elements() * self.dtype().size()) as u64
    }

    fn read_back(&self) -> Result<HostTensor> {
        let values = crate::quant::to_f32_vec(self.clone())?;
        HostTensor::from_f32(self.dims().to_vec(), &values)
    }
}

impl<B: Backend> HeldWeight for LinearWeight<B> {
    fn bytes(&self) -> u64 {
        LinearWeight::bytes(self) as u64
    }

    fn read_back(&self) -> Result<HostTensor> {
        HostTensor::from_f32(vec![self.out_dim(), self.in_dim()], &self.to_out_in_f32()?)
    }

    fn quantization(&self) -> WeightQuantization {
        LinearWeight::quantization(self)
    }

    fn is_quantized(&self) -> bool {
        self.quantization() != WeightQuantization::None || self.ggml().is_some()
    }

    fn named(self, name: &str) -> Self {
        self.with_name(name)
    }
}

/// A registry entry's device copy: the value as the load keeps it.
struct Held<T>(T);

impl<T: HeldWeight> DeviceCopy for Held<T> {
    fn bytes(&self) -> u64 {
        self.0.bytes()
    }

    fn download(&self) -> Result<HostTensor> {
        self.0.read_back()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One tensor a load asks for: where it comes from and the form it is kept in.
struct Request<'a, B: Backend> {
    source: &'a dyn TensorSource,
    name: &'a str,
    shape: &'a [usize],
    form: &'a str,
    device: &'a B::Device,
    kind: Kind,
}

/// `w` as the linear weight type `T` of a load on backend `B`.
fn calibrated_weight<B: Backend, T: HeldWeight>(w: &Int4Weight, device: &B::Device) -> Result<T> {
    let value: Box<dyn Any> = Box::new(LinearWeight::<B>::from_int4(w, device)?);
    value.downcast::<T>().map(|v| *v).map_err(|_| {
        Error::Compute("a calibrated int4 weight was asked for as another tensor type".into())
    })
}

/// The registry every load scope's weights are entries of.
fn registry() -> &'static SharedTensors {
    static REGISTRY: OnceLock<SharedTensors> = OnceLock::new();
    REGISTRY.get_or_init(SharedTensors::new)
}

/// Bytes of every weight tensor loaded inside [`load_scope`]s that is still held, each shared
/// tensor counted once: the process's weight memory, by the registry's accounting.
pub fn process_weight_bytes() -> u64 {
    registry().bytes_total()
}

/// Number of distinct weight tensors loaded inside [`load_scope`]s that are still held.
pub fn process_weight_tensors() -> usize {
    registry().len()
}

struct Scope {
    settings: LoadSettings,
    weights: LoadedWeights,
}

thread_local! {
    static SCOPES: RefCell<Vec<Arc<Scope>>> = const { RefCell::new(Vec::new()) };
}

/// Pops the scope pushed by [`load_scope`], also when the closure panics.
struct PopOnDrop;

impl Drop for PopOnDrop {
    fn drop(&mut self) {
        SCOPES.with(|s| s.borrow_mut().pop());
    }
}

/// Runs `load` with `settings` applied to every root [`VarBuilder`](crate::VarBuilder) it makes
/// on this thread, and returns its result with the weights it loaded. Keep the
/// [`LoadedWeights`] as long as the model: dropping it releases the load's registry entries.
pub fn load_scope<T>(settings: LoadSettings, load: impl FnOnce() -> T) -> (T, LoadedWeights) {
    let weights = LoadedWeights::default();
    let scope = Arc::new(Scope {
        settings,
        weights: weights.clone(),
    });
    SCOPES.with(|s| s.borrow_mut().push(scope));
    let guard = PopOnDrop;
    let out = load();
    drop(guard);
    (out, weights)
}

/// The loading state a root builder and its sub-builders share.
pub(crate) struct LoadContext {
    weights: LoadedWeights,
    /// The enclosing scope's settings; `None` outside a scope (plain loads, no registry).
    settings: Option<LoadSettings>,
    /// Namespace of the entries private to this root builder.
    root: u64,
}

impl LoadContext {
    /// The context of a new root builder: the innermost scope's, or a plain one.
    pub(crate) fn current() -> (WeightQuantization, Arc<LoadContext>) {
        static ROOTS: AtomicU64 = AtomicU64::new(0);
        let root = ROOTS.fetch_add(1, Ordering::Relaxed);
        let scope = SCOPES.with(|s| s.borrow().last().cloned());
        let (quantization, settings, weights) = match scope {
            Some(s) => (
                s.settings.quantization,
                Some(s.settings.clone()),
                s.weights.clone(),
            ),
            None => (WeightQuantization::None, None, LoadedWeights::default()),
        };
        let ctx = LoadContext {
            weights,
            settings,
            root,
        };
        (quantization, Arc::new(ctx))
    }

    /// The load's record.
    pub(crate) fn weights(&self) -> &LoadedWeights {
        &self.weights
    }

    /// The registry entry name of tensor `name` of `source` kept as `form`: shared across loads
    /// when sharing is on and the source has an identity, private to this root otherwise.
    fn entry_name<B: Backend>(
        &self,
        source: &dyn TensorSource,
        name: &str,
        shape: &[usize],
        form: &str,
        device: &B::Device,
    ) -> String {
        let shared = self
            .settings
            .as_ref()
            .filter(|s| s.share)
            .and_then(|_| source.identity());
        match shared {
            Some(id) => format!(
                "{id}|{name}|{shape:?}|{form}|{}|{device:?}",
                std::any::type_name::<B>()
            ),
            None => format!("#{}|{name}|{shape:?}|{form}", self.root),
        }
    }

    /// Loads one tensor: reads the host copy with `host` and builds the kept value with `build`,
    /// or, when another load (or this one) already holds the same entry, clones its value. A
    /// linear weight the settings' calibration covers is built from its int4 codes instead.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fetch<B: Backend, T: HeldWeight>(
        &self,
        source: &dyn TensorSource,
        name: &str,
        shape: &[usize],
        form: &str,
        device: &B::Device,
        kind: Kind,
        host: impl FnOnce() -> Result<HostTensor>,
        build: impl FnOnce(&HostTensor) -> Result<T>,
    ) -> Result<T> {
        let calibrated = match (&kind, &self.settings) {
            (Kind::Linear { .. }, Some(s)) => s
                .calibrated
                .as_ref()
                .and_then(|c| c.get(name).map(|w| (c.id(), w))),
            _ => None,
        };
        let mut request = Request::<B> {
            source,
            name,
            shape,
            form,
            device,
            kind,
        };
        let Some((id, w)) = calibrated else {
            return Ok(self.fetch_built(request, host, build)?.named(name));
        };
        if shape != [w.out_dim, w.in_dim] {
            return Err(Error::ShapeMismatch {
                name: name.to_string(),
                expected: shape.to_vec(),
                actual: vec![w.out_dim, w.in_dim],
            });
        }
        let form = format!("linear-int4-{}-calibrated-{id}", w.block_size);
        request.form = &form;
        // Kept quantized, whatever the settings' own quantization would have done.
        if let Kind::Linear { kept_float, .. } = &mut request.kind {
            *kept_float = false;
        }
        let value = self.fetch_built(
            request,
            || HostTensor::from_f32(shape.to_vec(), &w.dequantize()),
            |_: &HostTensor| calibrated_weight::<B, T>(w, device),
        )?;
        let mut record = self.weights.lock();
        if record.calibrated.insert(name.to_string()) {
            record.stats.linear_calibrated += 1;
        }
        Ok(value.named(name))
    }

    /// [`fetch`](Self::fetch) of a value made by `build`.
    fn fetch_built<B: Backend, T: HeldWeight>(
        &self,
        request: Request<'_, B>,
        host: impl FnOnce() -> Result<HostTensor>,
        build: impl FnOnce(&HostTensor) -> Result<T>,
    ) -> Result<T> {
        let key = self.entry_name::<B>(
            request.source,
            request.name,
            request.shape,
            request.form,
            request.device,
        );
        let kind = request.kind;
        let Some(settings) = &self.settings else {
            let value = build(&host()?)?;
            self.count(None, &value, kind, false, None);
            return Ok(value);
        };
        let registry = registry();
        let mut fresh = false;
        let handle = registry.get_or_publish_with::<Error>(&settings.holder, &key, || {
            fresh = true;
            host()
        })?;
        let mut build = Some(build);
        let (kind_r, ordinal) = match settings.residency {
            Residency::Device { kind, ordinal } => (kind, ordinal),
            Residency::Host => (BackendKind::Cpu, 0),
        };
        // At most: install our copy, or see the copy a concurrent load installed.
        for _ in 0..3 {
            match handle.device_copy() {
                Ok(copy) => {
                    let Some(held) = copy.as_any().downcast_ref::<Held<T>>() else {
                        return Err(Error::Compute(format!(
                            "weight registry entry `{key}` holds another type"
                        )));
                    };
                    let value = held.0.clone();
                    self.count(Some(&key), &value, kind, !fresh, Some(handle));
                    return Ok(value);
                }
                Err(SharedError::NotOnDevice { .. }) => {
                    let Some(build) = build.take() else { break };
                    let mut failure = None;
                    let installed = registry.to_device_with(&key, kind_r, ordinal, |h| {
                        build(h)
                            .map(|v| Arc::new(Held(v)) as Arc<dyn DeviceCopy>)
                            .map_err(|e| {
                                let reason = e.to_string();
                                failure = Some(e);
                                Error::Compute(reason)
                            })
                    });
                    // The build's own (typed) error, not the registry's wrapping of it.
                    if let (Err(_), Some(e)) = (&installed, failure) {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Compute(format!(
            "weight registry entry `{key}` was moved while loading"
        )))
    }

    /// Adds a loaded tensor to the record: once per registry entry (`key`), every time for plain
    /// loads (`None`: each call made its own copy).
    fn count<T: HeldWeight>(
        &self,
        key: Option<&str>,
        value: &T,
        kind: Kind,
        shared: bool,
        handle: Option<SharedHandle>,
    ) {
        let mut guard = self.weights.lock();
        let record = &mut *guard;
        if let Some(h) = handle {
            record.handles.push(h);
        }
        if let Some(key) = key {
            if !record.seen.insert(key.to_string()) {
                return;
            }
        }
        let bytes = value.bytes();
        let stats = &mut record.stats;
        stats.tensors += 1;
        stats.bytes += bytes;
        stats.shared_tensors += usize::from(shared);
        if let Kind::Linear {
            name,
            f32_bytes,
            kept_float,
        } = kind
        {
            let kept = value.quantization();
            stats.linear_layers += 1;
            stats.linear_bytes += bytes;
            stats.linear_f32_bytes += f32_bytes;
            stats.linear_quantized += usize::from(value.is_quantized());
            stats.linear_kept_float += usize::from(kept_float);
            record.linear.push((name, kept));
        }
    }
}
