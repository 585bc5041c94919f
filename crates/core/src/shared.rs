//! Cross-model tensor sharing: a thread-safe registry of named, reference-counted tensors with
//! zero-copy views, explicit host/device residency and memory accounting.
//!
//! One model *publishes* a tensor under a name (BERT's `text_embedding`, a shared encoder weight)
//! and other models *acquire* it by name. Every [`SharedHandle`] counts as one reference.
//!
//! # Lifetime rule
//!
//! An entry lives while at least one [`SharedHandle`] (or a [`TensorView`], which holds one) to it
//! exists, or while it is *pinned* ([`SharedTensors::pin`]). The registry holds no strong
//! reference of its own otherwise: dropping the last handle of an unpinned entry frees it at once
//! and removes its bytes from the accounting. A pinned entry with no holders stays available to
//! later [`SharedTensors::acquire`] calls (a cache) until [`SharedTensors::unpin`] or
//! [`SharedTensors::optimize_memory`] reclaims it.
//!
//! # Storage, views and residency
//!
//! Shared tensors are immutable. The host copy is a [`HostTensor`] whose `Bytes` are shared, so
//! [`SharedHandle::narrow`] / [`SharedHandle::slice`] give [`TensorView`]s over the same storage
//! (no copy, for any dimension: views are strided). A view that is contiguous (a narrow of the
//! leading dimension, for instance) converts to a [`HostTensor`] that is a byte slice of the same
//! storage ([`TensorView::as_host_tensor`]).
//!
//! Each entry has a [`Residency`]: on the host, or on a device (a [`BackendKind`] and an ordinal).
//! [`SharedTensors::to_device`] uploads the host copy with `Tensor::<B, D, K>::from_data` on any
//! burn backend and releases the registry's host copy; [`SharedTensors::to_host`] reads the device
//! copy back and releases it. Moves are explicit: nothing moves behind a caller's back except in
//! [`SharedTensors::optimize_memory`], which sends the least recently used device tensors to the
//! host until every device is within a byte budget, and frees entries that have no holders.
//!
//! The accounting ([`SharedTensors::bytes_total`], [`SharedTensors::bytes_by_owner`],
//! [`SharedTensors::bytes_by_device`], [`SharedTensors::entries`]) counts the copies the registry
//! holds: host bytes for host-resident entries, the device tensor's bytes (its element count times
//! the backend's element size) for device-resident ones. `HostTensor`s handed out by
//! [`SharedHandle::host`] share the storage and keep it alive until they are dropped.
//!
//! # Example
//!
//! ```
//! use burn::tensor::{Float, Tensor};
//! use burn_flex::Flex;
//! use ipfs_accelerate_core::shared::{Residency, SharedTensors};
//! use ipfs_accelerate_core::{BackendKind, HostTensor};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = SharedTensors::new();
//! let table = HostTensor::from_f32(vec![4, 2], &[0., 1., 2., 3., 4., 5., 6., 7.])?;
//!
//! // "bert" publishes, "clip" acquires the same storage.
//! let published = registry.publish("bert", "text_embedding", table)?;
//! let acquired = registry.acquire("clip", "text_embedding")?;
//! assert_eq!(acquired.refcount(), 2);
//! assert_eq!(registry.bytes_total(), 32);
//!
//! // Rows 1..3 without a copy: same storage, 8 bytes in.
//! let rows = acquired.narrow(0, 1, 2)?;
//! assert_eq!(rows.to_host_tensor().to_f32_vec(), vec![2., 3., 4., 5.]);
//! assert_eq!(rows.as_ptr(), published.host()?.bytes().as_ptr().wrapping_add(8));
//! drop(rows);
//!
//! // Explicit move to a device (burn-flex's CPU "device" here) and back.
//! let device = Default::default();
//! registry.to_device::<Flex, 2, Float>("text_embedding", &device, BackendKind::Cpu, 0)?;
//! let on_device: Tensor<Flex, 2> = acquired.device_tensor::<Flex, 2, Float>()?;
//! assert_eq!(on_device.dims(), [4, 2]);
//! assert_eq!(acquired.residency(), Residency::device(BackendKind::Cpu, 0));
//! assert_eq!(registry.bytes_by_device()[&Residency::device(BackendKind::Cpu, 0)], 32);
//!
//! // A zero budget sends the least recently used device tensors back to the host.
//! let report = registry.optimize_memory(0);
//! assert_eq!(report.moved.len(), 1);
//! assert!(acquired.residency().is_host());
//!
//! // Dropping the last handle frees the entry.
//! drop(published);
//! drop(acquired);
//! assert_eq!(registry.bytes_total(), 0);
//! assert!(registry.entries().is_empty());
//! # Ok(())
//! # }
//! ```

use std::any::{type_name, Any};
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use burn::tensor::backend::Backend as BurnBackend;
use burn::tensor::{BasicOps, Element, Tensor, TensorData};
use bytes::Bytes;
use half::{bf16, f16};

use crate::{BackendKind, DType, Error, HostTensor};

/// Where an entry's copy lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Residency {
    /// Host memory (the [`HostTensor`] copy).
    Host,
    /// A device of a backend.
    Device {
        /// The backend the device belongs to.
        kind: BackendKind,
        /// The device's ordinal within that backend (0 for the first GPU).
        ordinal: usize,
    },
}

impl Residency {
    /// A device residency.
    pub fn device(kind: BackendKind, ordinal: usize) -> Residency {
        Residency::Device { kind, ordinal }
    }

    /// Whether this is the host.
    pub fn is_host(self) -> bool {
        self == Residency::Host
    }

    fn sort_key(self) -> (u8, String, usize) {
        match self {
            Residency::Host => (0, String::new(), 0),
            Residency::Device { kind, ordinal } => (1, kind.to_string(), ordinal),
        }
    }
}

impl PartialOrd for Residency {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Residency {
    /// The host first, then devices by backend name and ordinal.
    fn cmp(&self, other: &Self) -> Ordering {
        self.sort_key().cmp(&other.sort_key())
    }
}

impl fmt::Display for Residency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Residency::Host => f.write_str("host"),
            Residency::Device { kind, ordinal } => write!(f, "{kind}:{ordinal}"),
        }
    }
}

/// Errors of the shared-tensor registry. Each converts into the crate's [`Error`] (a missing name
/// becomes [`Error::MissingTensor`], a failed transfer [`Error::Compute`], the rest
/// [`Error::InvalidInput`]), so `?` works in functions returning [`crate::Result`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SharedError {
    /// No entry has this name (never published, or already freed).
    #[error("no shared tensor named `{name}`")]
    NotFound {
        /// The name asked for.
        name: String,
    },
    /// [`SharedTensors::publish`] was called with a name that is already published.
    #[error("shared tensor `{name}` is already published by `{owner}`")]
    AlreadyPublished {
        /// The name.
        name: String,
        /// Who published it first.
        owner: String,
    },
    /// [`SharedTensors::publish_or_get`] found an entry of another shape or dtype.
    #[error(
        "shared tensor `{name}` exists as {existing_dtype} {existing_shape:?}, \
         offered {offered_dtype} {offered_shape:?}"
    )]
    Conflict {
        /// The name.
        name: String,
        /// Shape of the published entry.
        existing_shape: Vec<usize>,
        /// Dtype of the published entry.
        existing_dtype: DType,
        /// Shape offered.
        offered_shape: Vec<usize>,
        /// Dtype offered.
        offered_dtype: DType,
    },
    /// An owner, holder or tensor name is empty.
    #[error("invalid shared tensor {what}: must not be empty")]
    EmptyName {
        /// Which name (`owner`, `holder`, `tensor name`).
        what: &'static str,
    },
    /// The host copy was asked for while the entry lives on a device.
    #[error("shared tensor `{name}` is on {residency}, not on the host (call to_host first)")]
    NotOnHost {
        /// The name.
        name: String,
        /// Where it is.
        residency: Residency,
    },
    /// A device copy was asked for while the entry lives on the host.
    #[error("shared tensor `{name}` is on the host, not on a device (call to_device first)")]
    NotOnDevice {
        /// The name.
        name: String,
    },
    /// The device copy is not of the requested burn tensor type (backend, rank or kind).
    #[error("shared tensor `{name}` on {residency} is not a `{requested}`")]
    DeviceTypeMismatch {
        /// The name.
        name: String,
        /// Where it is.
        residency: Residency,
        /// The type asked for.
        requested: &'static str,
    },
    /// The tensor's rank differs from the rank of the requested burn tensor.
    #[error("shared tensor `{name}` has shape {shape:?}, which is not of rank {rank}")]
    RankMismatch {
        /// The name.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
        /// The rank asked for.
        rank: usize,
    },
    /// The tensor's dtype does not fit the requested burn tensor kind (a float tensor uploads as
    /// `Float`, integers as `Int`, booleans as `Bool`).
    #[error("shared tensor `{name}` of dtype {dtype} cannot be uploaded as a {kind} tensor")]
    KindMismatch {
        /// The name.
        name: String,
        /// Its dtype.
        dtype: DType,
        /// The burn kind asked for.
        kind: &'static str,
    },
    /// A view's dimension or range is out of bounds.
    #[error("bad view of shared tensor `{name}`: {reason}")]
    BadView {
        /// The name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// An upload or a read-back failed, or the entry moved while it was being transferred.
    #[error("moving shared tensor `{name}` failed: {reason}")]
    Transfer {
        /// The name.
        name: String,
        /// Why.
        reason: String,
    },
}

impl From<SharedError> for Error {
    fn from(e: SharedError) -> Error {
        match e {
            SharedError::NotFound { name } => Error::MissingTensor {
                name,
                source_name: "the shared tensor registry".into(),
            },
            SharedError::Transfer { .. } => Error::Compute(e.to_string()),
            other => Error::InvalidInput(other.to_string()),
        }
    }
}

/// Result alias for registry operations.
pub type SharedResult<T> = std::result::Result<T, SharedError>;

/// A type-erased device copy of a shared tensor. [`BurnDeviceCopy`] implements it for any burn
/// backend; other runtimes can implement it and install copies with
/// [`SharedTensors::to_device_with`]. Implementations must not call back into the registry
/// (`download` may run while the registry is locked, in [`SharedTensors::optimize_memory`]).
pub trait DeviceCopy: Send + Sync + 'static {
    /// Bytes the copy occupies on its device.
    fn bytes(&self) -> u64;
    /// Reads the copy back to the host, in the dtype the entry was published with.
    fn download(&self) -> crate::Result<HostTensor>;
    /// The concrete copy, for downcasting.
    fn as_any(&self) -> &dyn Any;
}

/// A shared tensor uploaded to a burn backend as a `Tensor<B, D, K>`.
pub struct BurnDeviceCopy<B: BurnBackend, const D: usize, K: BasicOps<B>> {
    tensor: Tensor<B, D, K>,
    dtype: DType,
}

impl<B: BurnBackend, const D: usize, K: BasicOps<B>> BurnDeviceCopy<B, D, K> {
    /// Uploads `host` with `Tensor::from_data` on `device`. The rank must be `D`, and the kind
    /// must fit the dtype (floats as `Float`, integers as `Int`, booleans as `Bool`).
    pub fn upload(name: &str, host: &HostTensor, device: &B::Device) -> SharedResult<Self> {
        Self::check(name, host.shape(), host.dtype())?;
        let tensor = Tensor::<B, D, K>::from_data(tensor_data(host), device);
        Ok(BurnDeviceCopy {
            tensor,
            dtype: host.dtype(),
        })
    }

    /// Whether a tensor of `shape` and `dtype` can be uploaded as a `Tensor<B, D, K>`.
    pub fn check(name: &str, shape: &[usize], dtype: DType) -> SharedResult<()> {
        if shape.len() != D {
            return Err(SharedError::RankMismatch {
                name: name.to_string(),
                shape: shape.to_vec(),
                rank: D,
            });
        }
        let kind = K::name();
        let wanted = match dtype {
            d if d.is_float() => "Float",
            DType::Bool => "Bool",
            _ => "Int",
        };
        if kind != wanted {
            return Err(SharedError::KindMismatch {
                name: name.to_string(),
                dtype,
                kind,
            });
        }
        Ok(())
    }

    /// The device tensor (a cheap handle clone).
    pub fn tensor(&self) -> Tensor<B, D, K> {
        self.tensor.clone()
    }
}

impl<B: BurnBackend, const D: usize, K: BasicOps<B> + 'static> DeviceCopy
    for BurnDeviceCopy<B, D, K>
{
    fn bytes(&self) -> u64 {
        (self.tensor.shape().num_elements() * self.tensor.dtype().size()) as u64
    }

    fn download(&self) -> crate::Result<HostTensor> {
        let shape = self.tensor.dims().to_vec();
        let data = self
            .tensor
            .clone()
            .try_into_data()
            .map_err(|e| Error::Compute(format!("reading a device tensor back: {e:?}")))?;
        host_from_data(shape, self.dtype, &data)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A host tensor as burn tensor data of the same element type.
fn tensor_data(t: &HostTensor) -> TensorData {
    let shape = t.shape().to_vec();
    let b = &t.bytes()[..];
    match t.dtype() {
        DType::F64 => TensorData::new(t.to_f64_vec(), shape),
        DType::F32 => TensorData::new(t.to_f32_vec(), shape),
        DType::F16 => TensorData::new(decode(b, f16::from_le_bytes), shape),
        DType::BF16 => TensorData::new(decode(b, bf16::from_le_bytes), shape),
        DType::I64 => TensorData::new(decode(b, i64::from_le_bytes), shape),
        DType::I32 => TensorData::new(decode(b, i32::from_le_bytes), shape),
        DType::I8 => TensorData::new(b.iter().map(|&v| v as i8).collect::<Vec<_>>(), shape),
        DType::U8 => TensorData::new(b.to_vec(), shape),
        DType::Bool => TensorData::new(b.iter().map(|&v| v != 0).collect::<Vec<_>>(), shape),
    }
}

fn decode<T, const N: usize>(bytes: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(N)
        .filter_map(|c| <[u8; N]>::try_from(c).ok())
        .map(f)
        .collect()
}

/// Burn tensor data converted back to a host tensor of `dtype`.
fn host_from_data(shape: Vec<usize>, dtype: DType, data: &TensorData) -> crate::Result<HostTensor> {
    fn encode<E: Element, const N: usize>(data: &TensorData, f: fn(E) -> [u8; N]) -> Vec<u8> {
        data.iter::<E>().flat_map(f).collect()
    }
    let bytes = match dtype {
        DType::F64 => encode::<f64, 8>(data, f64::to_le_bytes),
        DType::F32 => encode::<f32, 4>(data, f32::to_le_bytes),
        DType::F16 => encode::<f16, 2>(data, f16::to_le_bytes),
        DType::BF16 => encode::<bf16, 2>(data, bf16::to_le_bytes),
        DType::I64 => encode::<i64, 8>(data, i64::to_le_bytes),
        DType::I32 => encode::<i32, 4>(data, i32::to_le_bytes),
        DType::I8 => encode::<i8, 1>(data, i8::to_le_bytes),
        DType::U8 => encode::<u8, 1>(data, u8::to_le_bytes),
        DType::Bool => encode::<bool, 1>(data, |v| [u8::from(v)]),
    };
    HostTensor::from_bytes("device read-back", shape, dtype, Bytes::from(bytes))
}

/// Where an entry's data is.
#[derive(Clone)]
enum Storage {
    Host(HostTensor),
    Device {
        residency: Residency,
        copy: Arc<dyn DeviceCopy>,
    },
}

struct Entry {
    id: u64,
    owner: String,
    shape: Vec<usize>,
    dtype: DType,
    pinned: bool,
    refcount: usize,
    holders: BTreeMap<String, usize>,
    last_used: u64,
    copy: Storage,
}

impl Entry {
    fn residency(&self) -> Residency {
        match &self.copy {
            Storage::Host(_) => Residency::Host,
            Storage::Device { residency, .. } => *residency,
        }
    }

    fn bytes(&self) -> u64 {
        match &self.copy {
            Storage::Host(t) => t.bytes().len() as u64,
            Storage::Device { copy, .. } => copy.bytes(),
        }
    }

    fn info(&self, name: &str) -> EntryInfo {
        EntryInfo {
            name: name.to_string(),
            owner: self.owner.clone(),
            shape: self.shape.clone(),
            dtype: self.dtype,
            residency: self.residency(),
            bytes: self.bytes(),
            refcount: self.refcount,
            holders: self.holders.clone(),
            pinned: self.pinned,
            last_used: self.last_used,
        }
    }
}

#[derive(Default)]
struct State {
    entries: BTreeMap<String, Entry>,
    clock: u64,
    next_id: u64,
}

impl State {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn entry(&mut self, name: &str) -> SharedResult<&mut Entry> {
        self.entries
            .get_mut(name)
            .ok_or_else(|| SharedError::NotFound {
                name: name.to_string(),
            })
    }

    /// The entry named `name` if it is still the one with `id`, marked as used now.
    fn touch(&mut self, name: &str, id: u64) -> SharedResult<&mut Entry> {
        let now = self.tick();
        match self.entries.get_mut(name) {
            Some(e) if e.id == id => {
                e.last_used = now;
                Ok(e)
            }
            _ => Err(SharedError::NotFound {
                name: name.to_string(),
            }),
        }
    }
}

struct Inner {
    state: Mutex<State>,
}

/// Snapshot of one registry entry, for accounting and diagnostics.
#[derive(Debug, Clone, PartialEq)]
pub struct EntryInfo {
    /// The tensor's name.
    pub name: String,
    /// The model that published it; its bytes count towards this owner.
    pub owner: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Element type as published.
    pub dtype: DType,
    /// Where the registry's copy is.
    pub residency: Residency,
    /// Bytes of the registry's copy.
    pub bytes: u64,
    /// Live handles (views included).
    pub refcount: usize,
    /// Live handles per holder name.
    pub holders: BTreeMap<String, usize>,
    /// Whether the registry keeps it with no holders.
    pub pinned: bool,
    /// Logical time of the last access (a counter, larger is more recent).
    pub last_used: u64,
}

/// An entry freed by [`SharedTensors::optimize_memory`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreedEntry {
    /// The tensor's name.
    pub name: String,
    /// Who published it.
    pub owner: String,
    /// Where it was.
    pub residency: Residency,
    /// Bytes released.
    pub bytes: u64,
}

/// A device tensor sent to the host by [`SharedTensors::optimize_memory`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedEntry {
    /// The tensor's name.
    pub name: String,
    /// The device it left.
    pub from: Residency,
    /// Device bytes released.
    pub bytes: u64,
    /// Its last access time (moves happen in increasing order of it).
    pub last_used: u64,
}

/// A device tensor [`SharedTensors::optimize_memory`] could not read back (it stays on the device).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedMove {
    /// The tensor's name.
    pub name: String,
    /// The device it is on.
    pub from: Residency,
    /// Why the read-back failed.
    pub reason: String,
}

/// What [`SharedTensors::optimize_memory`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemoryReport {
    /// The per-device budget it worked towards.
    pub budget_bytes_per_device: u64,
    /// Entries with no holders that were freed.
    pub freed: Vec<FreedEntry>,
    /// Device tensors moved to the host, least recently used first.
    pub moved: Vec<MovedEntry>,
    /// Device tensors that could not be moved.
    pub failed: Vec<FailedMove>,
    /// Total bytes freed.
    pub bytes_freed: u64,
    /// Total device bytes released by moves.
    pub bytes_moved: u64,
    /// Bytes on each device afterwards (devices holding at least one entry).
    pub device_bytes: BTreeMap<Residency, u64>,
}

impl MemoryReport {
    /// Whether every device ended within the budget.
    pub fn within_budget(&self) -> bool {
        self.device_bytes
            .values()
            .all(|&b| b <= self.budget_bytes_per_device)
    }
}

/// The registry. Cloning it is cheap and gives another handle to the same registry; it is `Send +
/// Sync` and every method takes `&self`.
#[derive(Clone)]
pub struct SharedTensors {
    inner: Arc<Inner>,
}

impl Default for SharedTensors {
    fn default() -> Self {
        SharedTensors::new()
    }
}

impl fmt::Debug for SharedTensors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedTensors")
            .field("entries", &self.entries())
            .finish()
    }
}

fn non_empty(what: &'static str, s: &str) -> SharedResult<()> {
    if s.is_empty() {
        Err(SharedError::EmptyName { what })
    } else {
        Ok(())
    }
}

impl SharedTensors {
    /// An empty registry.
    pub fn new() -> SharedTensors {
        SharedTensors {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A handle for `holder` on the existing entry `name` (the caller holds the lock).
    fn handle_locked(
        &self,
        state: &mut State,
        holder: &str,
        name: &str,
    ) -> SharedResult<SharedHandle> {
        let now = state.tick();
        let entry = state.entry(name)?;
        entry.last_used = now;
        entry.refcount += 1;
        *entry.holders.entry(holder.to_string()).or_insert(0) += 1;
        Ok(SharedHandle {
            registry: self.clone(),
            id: entry.id,
            name: Arc::from(name),
            holder: Arc::from(holder),
            owner: Arc::from(entry.owner.as_str()),
            shape: entry.shape.clone(),
            dtype: entry.dtype,
        })
    }

    fn insert_locked(
        &self,
        state: &mut State,
        owner: &str,
        name: &str,
        tensor: HostTensor,
    ) -> SharedResult<SharedHandle> {
        state.next_id += 1;
        let entry = Entry {
            id: state.next_id,
            owner: owner.to_string(),
            shape: tensor.shape().to_vec(),
            dtype: tensor.dtype(),
            pinned: false,
            refcount: 0,
            holders: BTreeMap::new(),
            last_used: 0,
            copy: Storage::Host(tensor),
        };
        state.entries.insert(name.to_string(), entry);
        self.handle_locked(state, owner, name)
    }

    /// Publishes `tensor` as `name`, owned (for accounting) by `owner`, and returns `owner`'s
    /// handle on it. A name that is already published is [`SharedError::AlreadyPublished`].
    pub fn publish(
        &self,
        owner: &str,
        name: &str,
        tensor: HostTensor,
    ) -> SharedResult<SharedHandle> {
        non_empty("owner", owner)?;
        non_empty("tensor name", name)?;
        let mut state = self.lock();
        if let Some(e) = state.entries.get(name) {
            return Err(SharedError::AlreadyPublished {
                name: name.to_string(),
                owner: e.owner.clone(),
            });
        }
        self.insert_locked(&mut state, owner, name, tensor)
    }

    /// Weight-sharing publish: if `name` exists, acquires it for `owner` and drops `tensor`
    /// (the entry keeps its first owner); otherwise publishes `tensor`. An existing entry of
    /// another shape or dtype is [`SharedError::Conflict`].
    pub fn publish_or_get(
        &self,
        owner: &str,
        name: &str,
        tensor: HostTensor,
    ) -> SharedResult<SharedHandle> {
        non_empty("owner", owner)?;
        non_empty("tensor name", name)?;
        let mut state = self.lock();
        match state.entries.get(name) {
            Some(e) if e.shape != tensor.shape() || e.dtype != tensor.dtype() => {
                Err(SharedError::Conflict {
                    name: name.to_string(),
                    existing_shape: e.shape.clone(),
                    existing_dtype: e.dtype,
                    offered_shape: tensor.shape().to_vec(),
                    offered_dtype: tensor.dtype(),
                })
            }
            Some(_) => self.handle_locked(&mut state, owner, name),
            None => self.insert_locked(&mut state, owner, name, tensor),
        }
    }

    /// Lazy weight-sharing publish: acquires `name` for `owner` if it exists, otherwise runs
    /// `load` (outside the registry's lock) and publishes its result. When two callers race, both
    /// may load but only the first result is kept; the others get handles on it.
    pub fn get_or_publish_with<E: From<SharedError>>(
        &self,
        owner: &str,
        name: &str,
        load: impl FnOnce() -> Result<HostTensor, E>,
    ) -> Result<SharedHandle, E> {
        non_empty("owner", owner)?;
        non_empty("tensor name", name)?;
        {
            let mut state = self.lock();
            if state.entries.contains_key(name) {
                return Ok(self.handle_locked(&mut state, owner, name)?);
            }
        }
        let tensor = load()?;
        let mut state = self.lock();
        if state.entries.contains_key(name) {
            Ok(self.handle_locked(&mut state, owner, name)?)
        } else {
            Ok(self.insert_locked(&mut state, owner, name, tensor)?)
        }
    }

    /// A handle on `name` for `holder` (a model name). A name that is not published is
    /// [`SharedError::NotFound`].
    pub fn acquire(&self, holder: &str, name: &str) -> SharedResult<SharedHandle> {
        non_empty("holder", holder)?;
        let mut state = self.lock();
        self.handle_locked(&mut state, holder, name)
    }

    /// Whether `name` is published.
    pub fn contains(&self, name: &str) -> bool {
        self.lock().entries.contains_key(name)
    }

    /// Keeps `name` alive when it has no holders (until [`SharedTensors::unpin`] or
    /// [`SharedTensors::optimize_memory`]).
    pub fn pin(&self, name: &str) -> SharedResult<()> {
        self.lock().entry(name)?.pinned = true;
        Ok(())
    }

    /// Undoes [`SharedTensors::pin`]; an entry with no holders is freed now. Returns whether it was
    /// freed.
    pub fn unpin(&self, name: &str) -> SharedResult<bool> {
        let removed = {
            let mut state = self.lock();
            let entry = state.entry(name)?;
            entry.pinned = false;
            if entry.refcount == 0 {
                state.entries.remove(name)
            } else {
                None
            }
        };
        Ok(removed.is_some())
    }

    /// Moves `name` to a device of backend `B` as a `Tensor<B, D, K>` (uploaded with
    /// `Tensor::from_data`), recorded as residency `kind:ordinal`, and releases the registry's host
    /// copy. Already there as that type: nothing to do. On another device, or there as another
    /// type: read back to the host first, then uploaded. Marks the entry as used.
    pub fn to_device<B: BurnBackend, const D: usize, K: BasicOps<B> + 'static>(
        &self,
        name: &str,
        device: &B::Device,
        kind: BackendKind,
        ordinal: usize,
    ) -> SharedResult<()> {
        let target = Residency::device(kind, ordinal);
        {
            let mut state = self.lock();
            let now = state.tick();
            let entry = state.entry(name)?;
            BurnDeviceCopy::<B, D, K>::check(name, &entry.shape, entry.dtype)?;
            if let Storage::Device { residency, copy } = &entry.copy {
                if *residency == target && copy.as_any().is::<BurnDeviceCopy<B, D, K>>() {
                    entry.last_used = now;
                    return Ok(());
                }
            }
        }
        self.to_host(name)?;
        self.install(name, target, |host| {
            let copy = BurnDeviceCopy::<B, D, K>::upload(name, host, device)?;
            Ok(Arc::new(copy) as Arc<dyn DeviceCopy>)
        })
    }

    /// Moves `name` to residency `kind:ordinal` with a caller-supplied upload (for runtimes that
    /// are not burn backends); the registry's host copy is released. Already at that residency:
    /// nothing to do. On another device: read back to the host first. `upload` runs outside the
    /// registry's lock.
    pub fn to_device_with(
        &self,
        name: &str,
        kind: BackendKind,
        ordinal: usize,
        upload: impl FnOnce(&HostTensor) -> crate::Result<Arc<dyn DeviceCopy>>,
    ) -> SharedResult<()> {
        let target = Residency::device(kind, ordinal);
        {
            let mut state = self.lock();
            let now = state.tick();
            let entry = state.entry(name)?;
            if entry.residency() == target {
                entry.last_used = now;
                return Ok(());
            }
        }
        self.to_host(name)?;
        self.install(name, target, |host| {
            upload(host).map_err(|e| SharedError::Transfer {
                name: name.to_string(),
                reason: e.to_string(),
            })
        })
    }

    /// Uploads the host copy of `name` (outside the lock) and installs the result.
    fn install(
        &self,
        name: &str,
        target: Residency,
        upload: impl FnOnce(&HostTensor) -> SharedResult<Arc<dyn DeviceCopy>>,
    ) -> SharedResult<()> {
        let (id, host) = {
            let mut state = self.lock();
            let entry = state.entry(name)?;
            match &entry.copy {
                Storage::Host(t) => (entry.id, t.clone()),
                Storage::Device { residency, .. } => {
                    return Err(SharedError::Transfer {
                        name: name.to_string(),
                        reason: format!("moved to {residency} concurrently"),
                    })
                }
            }
        };
        let copy = upload(&host)?;
        let mut state = self.lock();
        let entry = state.touch(name, id)?;
        match &entry.copy {
            Storage::Host(t) if t.bytes().as_ptr() == host.bytes().as_ptr() => {
                entry.copy = Storage::Device {
                    residency: target,
                    copy,
                };
                Ok(())
            }
            _ => Err(SharedError::Transfer {
                name: name.to_string(),
                reason: "moved concurrently".into(),
            }),
        }
    }

    /// Moves `name` back to the host: reads the device copy back (outside the lock), keeps it as
    /// the host copy in the published dtype, and releases the device copy. Already on the host:
    /// nothing to do.
    pub fn to_host(&self, name: &str) -> SharedResult<()> {
        let (id, copy) = {
            let mut state = self.lock();
            let entry = state.entry(name)?;
            match &entry.copy {
                Storage::Host(_) => return Ok(()),
                Storage::Device { copy, .. } => (entry.id, copy.clone()),
            }
        };
        let host = copy.download().map_err(|e| SharedError::Transfer {
            name: name.to_string(),
            reason: e.to_string(),
        })?;
        let mut state = self.lock();
        let entry = state.touch(name, id)?;
        match &entry.copy {
            Storage::Device { copy: now, .. } if Arc::ptr_eq(now, &copy) => {
                entry.copy = Storage::Host(host);
                Ok(())
            }
            Storage::Host(_) => Ok(()),
            Storage::Device { residency, .. } => Err(SharedError::Transfer {
                name: name.to_string(),
                reason: format!("moved to {residency} concurrently"),
            }),
        }
    }

    /// Bytes of every copy the registry holds.
    pub fn bytes_total(&self) -> u64 {
        self.lock().entries.values().map(Entry::bytes).sum()
    }

    /// Bytes per publishing model.
    pub fn bytes_by_owner(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for e in self.lock().entries.values() {
            *out.entry(e.owner.clone()).or_insert(0) += e.bytes();
        }
        out
    }

    /// Bytes per residency (the host and each device holding at least one entry).
    pub fn bytes_by_device(&self) -> BTreeMap<Residency, u64> {
        let mut out = BTreeMap::new();
        for e in self.lock().entries.values() {
            *out.entry(e.residency()).or_insert(0) += e.bytes();
        }
        out
    }

    /// Every entry, by name.
    pub fn entries(&self) -> Vec<EntryInfo> {
        self.lock()
            .entries
            .iter()
            .map(|(name, e)| e.info(name))
            .collect()
    }

    /// One entry, if published.
    pub fn info(&self, name: &str) -> Option<EntryInfo> {
        self.lock().entries.get(name).map(|e| e.info(name))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether the registry has no entries.
    pub fn is_empty(&self) -> bool {
        self.lock().entries.is_empty()
    }

    /// Frees every entry with no holders (pinned ones: the only kind that can have none), then,
    /// per device, moves device tensors to the host in least-recently-used order until the device
    /// holds at most `budget_bytes_per_device` bytes. Runs under the registry's lock, so the
    /// decisions see one consistent state.
    pub fn optimize_memory(&self, budget_bytes_per_device: u64) -> MemoryReport {
        let mut report = MemoryReport {
            budget_bytes_per_device,
            ..MemoryReport::default()
        };
        let mut released = Vec::new();
        {
            let mut state = self.lock();
            let idle: Vec<String> = state
                .entries
                .iter()
                .filter(|(_, e)| e.refcount == 0)
                .map(|(n, _)| n.clone())
                .collect();
            for name in idle {
                if let Some(e) = state.entries.remove(&name) {
                    let bytes = e.bytes();
                    report.bytes_freed += bytes;
                    report.freed.push(FreedEntry {
                        name,
                        owner: e.owner.clone(),
                        residency: e.residency(),
                        bytes,
                    });
                    released.push(e);
                }
            }

            let mut per_device: BTreeMap<Residency, (u64, Vec<(u64, String)>)> = BTreeMap::new();
            for (name, e) in &state.entries {
                if let Storage::Device { residency, .. } = e.copy {
                    let slot = per_device.entry(residency).or_default();
                    slot.0 += e.bytes();
                    slot.1.push((e.last_used, name.clone()));
                }
            }
            for (residency, (mut used, mut lru)) in per_device {
                lru.sort();
                for (last_used, name) in lru {
                    if used <= budget_bytes_per_device {
                        break;
                    }
                    let Some(e) = state.entries.get_mut(&name) else {
                        continue;
                    };
                    let Storage::Device { copy, .. } = &e.copy else {
                        continue;
                    };
                    let copy = copy.clone();
                    let bytes = copy.bytes();
                    match copy.download() {
                        Ok(host) => {
                            e.copy = Storage::Host(host);
                            used -= bytes;
                            report.bytes_moved += bytes;
                            report.moved.push(MovedEntry {
                                name,
                                from: residency,
                                bytes,
                                last_used,
                            });
                        }
                        Err(err) => report.failed.push(FailedMove {
                            name,
                            from: residency,
                            reason: err.to_string(),
                        }),
                    }
                }
                if used > 0 {
                    report.device_bytes.insert(residency, used);
                }
            }
        }
        drop(released);
        report
    }
}

/// One holder's reference to a shared tensor. Cloning adds a reference for the same holder;
/// dropping releases it, and the last release of an unpinned entry frees it.
pub struct SharedHandle {
    registry: SharedTensors,
    id: u64,
    name: Arc<str>,
    holder: Arc<str>,
    owner: Arc<str>,
    shape: Vec<usize>,
    dtype: DType,
}

impl fmt::Debug for SharedHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedHandle")
            .field("name", &self.name)
            .field("holder", &self.holder)
            .field("owner", &self.owner)
            .field("shape", &self.shape)
            .field("dtype", &self.dtype)
            .finish()
    }
}

impl Clone for SharedHandle {
    fn clone(&self) -> Self {
        let mut state = self.registry.lock();
        if let Some(e) = state.entries.get_mut(&*self.name) {
            if e.id == self.id {
                e.refcount += 1;
                *e.holders.entry(self.holder.to_string()).or_insert(0) += 1;
            }
        }
        SharedHandle {
            registry: self.registry.clone(),
            id: self.id,
            name: self.name.clone(),
            holder: self.holder.clone(),
            owner: self.owner.clone(),
            shape: self.shape.clone(),
            dtype: self.dtype,
        }
    }
}

impl Drop for SharedHandle {
    fn drop(&mut self) {
        let removed = {
            let mut state = self.registry.lock();
            match state.entries.get_mut(&*self.name) {
                Some(e) if e.id == self.id => {
                    e.refcount = e.refcount.saturating_sub(1);
                    if let Some(n) = e.holders.get_mut(&*self.holder) {
                        *n -= 1;
                        if *n == 0 {
                            e.holders.remove(&*self.holder);
                        }
                    }
                    if e.refcount == 0 && !e.pinned {
                        state.entries.remove(&*self.name)
                    } else {
                        None
                    }
                }
                _ => None,
            }
        };
        // The entry's storage is released here, outside the lock.
        drop(removed);
    }
}

impl SharedHandle {
    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Who holds this handle.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Who published the tensor.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The dtype as published.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The registry this handle belongs to.
    pub fn registry(&self) -> &SharedTensors {
        &self.registry
    }

    /// Live handles on the entry (all holders, views included).
    pub fn refcount(&self) -> usize {
        let state = self.registry.lock();
        match state.entries.get(&*self.name) {
            Some(e) if e.id == self.id => e.refcount,
            _ => 0,
        }
    }

    /// Where the entry's copy is now.
    pub fn residency(&self) -> Residency {
        let state = self.registry.lock();
        match state.entries.get(&*self.name) {
            Some(e) if e.id == self.id => e.residency(),
            _ => Residency::Host,
        }
    }

    /// The host copy (shares its storage). On a device it is [`SharedError::NotOnHost`]. Marks the
    /// entry as used.
    pub fn host(&self) -> SharedResult<HostTensor> {
        let mut state = self.registry.lock();
        let entry = state.touch(&self.name, self.id)?;
        match &entry.copy {
            Storage::Host(t) => Ok(t.clone()),
            Storage::Device { residency, .. } => Err(SharedError::NotOnHost {
                name: self.name.to_string(),
                residency: *residency,
            }),
        }
    }

    /// The device copy as a `Tensor<B, D, K>` (a cheap handle clone). On the host it is
    /// [`SharedError::NotOnDevice`]; another type is [`SharedError::DeviceTypeMismatch`]. Marks
    /// the entry as used.
    pub fn device_tensor<B: BurnBackend, const D: usize, K: BasicOps<B> + 'static>(
        &self,
    ) -> SharedResult<Tensor<B, D, K>> {
        let copy = self.device_copy()?;
        match copy.as_any().downcast_ref::<BurnDeviceCopy<B, D, K>>() {
            Some(c) => Ok(c.tensor()),
            None => Err(SharedError::DeviceTypeMismatch {
                name: self.name.to_string(),
                residency: self.residency(),
                requested: type_name::<Tensor<B, D, K>>(),
            }),
        }
    }

    /// The type-erased device copy (for copies installed with
    /// [`SharedTensors::to_device_with`]). Marks the entry as used.
    pub fn device_copy(&self) -> SharedResult<Arc<dyn DeviceCopy>> {
        let mut state = self.registry.lock();
        let entry = state.touch(&self.name, self.id)?;
        match &entry.copy {
            Storage::Device { copy, .. } => Ok(copy.clone()),
            Storage::Host(_) => Err(SharedError::NotOnDevice {
                name: self.name.to_string(),
            }),
        }
    }

    /// [`SharedTensors::to_device`] for this handle's entry.
    pub fn to_device<B: BurnBackend, const D: usize, K: BasicOps<B> + 'static>(
        &self,
        device: &B::Device,
        kind: BackendKind,
        ordinal: usize,
    ) -> SharedResult<()> {
        self.registry
            .to_device::<B, D, K>(&self.name, device, kind, ordinal)
    }

    /// [`SharedTensors::to_host`] for this handle's entry.
    pub fn to_host(&self) -> SharedResult<()> {
        self.registry.to_host(&self.name)
    }

    /// A view of the whole tensor over the host storage (no copy). The view holds a handle, so
    /// the entry stays alive while it exists. On a device it is [`SharedError::NotOnHost`].
    pub fn view(&self) -> SharedResult<TensorView> {
        let host = self.host()?;
        let strides = contiguous_strides(host.shape());
        Ok(TensorView {
            handle: self.clone(),
            storage: host.bytes().clone(),
            shape: host.shape().to_vec(),
            strides,
            offset: 0,
            dtype: host.dtype(),
        })
    }

    /// `len` entries of dimension `dim` from `start`, sharing storage (see [`TensorView::narrow`]).
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> SharedResult<TensorView> {
        self.view()?.narrow(dim, start, len)
    }

    /// One range per leading dimension, sharing storage (see [`TensorView::slice`]).
    pub fn slice(&self, ranges: &[Range<usize>]) -> SharedResult<TensorView> {
        self.view()?.slice(ranges)
    }
}

fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// A strided view of a shared tensor's host storage: no copy is made to create it, for a narrow
/// of any dimension. It holds a [`SharedHandle`] (counted as a reference of the handle's holder).
#[derive(Clone)]
pub struct TensorView {
    handle: SharedHandle,
    storage: Bytes,
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
    dtype: DType,
}

impl fmt::Debug for TensorView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorView")
            .field("name", &self.handle.name())
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .field("offset", &self.offset)
            .field("dtype", &self.dtype)
            .finish()
    }
}

impl TensorView {
    /// The handle the view keeps alive.
    pub fn handle(&self) -> &SharedHandle {
        &self.handle
    }

    /// The view's shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Element strides into the storage.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Element offset of the first element into the storage.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Address of the view's first element (inside the shared storage).
    pub fn as_ptr(&self) -> *const u8 {
        self.storage
            .as_ptr()
            .wrapping_add(self.offset * self.dtype.size())
    }

    /// Address of the start of the shared storage (the source tensor's first byte).
    pub fn storage_ptr(&self) -> *const u8 {
        self.storage.as_ptr()
    }

    /// Whether the elements are one dense run in row-major order.
    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let dense = contiguous_strides(&self.shape);
        self.shape
            .iter()
            .zip(self.strides.iter().zip(&dense))
            .all(|(&d, (&s, &c))| d == 1 || s == c)
    }

    fn bad(&self, reason: String) -> SharedError {
        SharedError::BadView {
            name: self.handle.name().to_string(),
            reason,
        }
    }

    /// `len` entries of dimension `dim` starting at `start`; shares storage.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> SharedResult<TensorView> {
        let Some(&size) = self.shape.get(dim) else {
            return Err(self.bad(format!(
                "dimension {dim} out of range for shape {:?}",
                self.shape
            )));
        };
        match start.checked_add(len) {
            Some(end) if end <= size => {}
            _ => {
                return Err(self.bad(format!(
                    "range {start}..{start}+{len} out of bounds for dimension {dim} of size {size}"
                )))
            }
        }
        let mut view = self.clone();
        view.shape[dim] = len;
        if len > 0 {
            view.offset += start * self.strides[dim];
        }
        Ok(view)
    }

    /// Narrows dimension `i` to `ranges[i]` for each given range (at most the rank); shares
    /// storage.
    pub fn slice(&self, ranges: &[Range<usize>]) -> SharedResult<TensorView> {
        if ranges.len() > self.shape.len() {
            return Err(self.bad(format!(
                "{} ranges for shape {:?}",
                ranges.len(),
                self.shape
            )));
        }
        let mut view = self.clone();
        for (dim, r) in ranges.iter().enumerate() {
            if r.start > r.end {
                return Err(self.bad(format!("empty range {r:?} on dimension {dim}")));
            }
            view = view.narrow(dim, r.start, r.end - r.start)?;
        }
        Ok(view)
    }

    /// The view as a [`HostTensor`] over the same storage (a byte slice, no copy) when it is
    /// contiguous; `None` when it is strided.
    pub fn as_host_tensor(&self) -> Option<HostTensor> {
        if !self.is_contiguous() {
            return None;
        }
        let es = self.dtype.size();
        let start = if self.numel() == 0 {
            0
        } else {
            self.offset * es
        };
        let bytes = self.storage.slice(start..start + self.numel() * es);
        HostTensor::from_bytes(self.handle.name(), self.shape.clone(), self.dtype, bytes).ok()
    }

    /// The view as a [`HostTensor`]: zero-copy when contiguous, otherwise the elements gathered
    /// into new storage.
    pub fn to_host_tensor(&self) -> HostTensor {
        if let Some(t) = self.as_host_tensor() {
            return t;
        }
        let es = self.dtype.size();
        let mut out = Vec::with_capacity(self.numel() * es);
        let rank = self.shape.len();
        let mut index = vec![0usize; rank];
        'outer: loop {
            let at: usize = self.offset
                + index
                    .iter()
                    .zip(&self.strides)
                    .map(|(i, s)| i * s)
                    .sum::<usize>();
            out.extend_from_slice(&self.storage[at * es..(at + 1) * es]);
            for d in (0..rank).rev() {
                index[d] += 1;
                if index[d] < self.shape[d] {
                    continue 'outer;
                }
                index[d] = 0;
            }
            break;
        }
        HostTensor::from_bytes(
            self.handle.name(),
            self.shape.clone(),
            self.dtype,
            Bytes::from(out),
        )
        .unwrap_or_else(|_| unreachable!("gathered exactly numel elements"))
    }

    /// The values as f32 (see [`HostTensor::to_f32_vec`]).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        self.to_host_tensor().to_f32_vec()
    }
}
