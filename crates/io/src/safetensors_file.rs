//! Memory-mapped safetensors files and sharded weight stores.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use ipfs_accelerate_core::{DType, Error, HostTensor, Result as CoreResult, TensorSource};
use safetensors::tensor::{Dtype, SafeTensors};

use crate::IoError;

/// Suffix of the scales that accompany an int8 tensor in the compact format: tensor `W` stored as
/// I8 `[rows, cols]` plus `W#scale` (F32 or F16) `[rows, blocks]` means
/// `W[r, c] = q[r, c] * scale[r, c / (cols / blocks)]` — per-row scales when `blocks` is 1.
pub const SCALE_SUFFIX: &str = "#scale";

#[derive(Debug, Clone)]
struct Entry {
    dtype: DType,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// One safetensors file, memory-mapped (or borrowed from static bytes), validated at open.
pub struct SafeTensorsFile {
    name: String,
    data: Bytes,
    entries: HashMap<String, Entry>,
    metadata: HashMap<String, String>,
    identity: Option<String>,
}

impl SafeTensorsFile {
    /// Memory-maps (see [`crate::mmap_enabled`]) and validates `path`. A truncated file, a header whose offsets do not match the
    /// data, or an unsupported dtype is an [`IoError::MalformedSafetensors`] naming the file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, IoError> {
        let path = path.as_ref();
        let (data, file) = crate::mapped::file_bytes(path)?;
        let mut opened = Self::from_bytes(path.display().to_string(), data)?;
        opened.identity = file_identity(path, &file);
        Ok(opened)
    }

    /// Parses a safetensors image held in memory (for example `include_bytes!`).
    pub fn from_bytes(name: impl Into<String>, data: Bytes) -> Result<Self, IoError> {
        let name = name.into();
        let malformed = |reason: String| IoError::MalformedSafetensors {
            path: PathBuf::from(&name),
            reason,
        };
        check_offsets(&data).map_err(malformed)?;
        let (header_len, meta) =
            SafeTensors::read_metadata(&data).map_err(|e| malformed(describe(&e)))?;
        let base = 8 + header_len;
        let mut entries = HashMap::new();
        for (tensor_name, info) in meta.tensors() {
            let dtype = map_dtype(info.dtype).ok_or_else(|| {
                malformed(format!(
                    "tensor `{tensor_name}` has unsupported dtype {:?}",
                    info.dtype
                ))
            })?;
            let (s, e) = info.data_offsets;
            entries.insert(
                tensor_name,
                Entry {
                    dtype,
                    shape: info.shape.clone(),
                    start: base + s,
                    end: base + e,
                },
            );
        }
        let metadata = meta.metadata().clone().unwrap_or_default();
        Ok(SafeTensorsFile {
            name,
            data,
            entries,
            metadata,
            identity: None,
        })
    }

    /// The `__metadata__` map of the header.
    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.metadata
    }

    /// The tensor's bytes as stored, without dequantisation (zero-copy).
    pub fn raw(&self, name: &str) -> CoreResult<HostTensor> {
        let entry = self.entries.get(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_string(),
            source_name: self.name.clone(),
        })?;
        HostTensor::from_bytes(
            name,
            entry.shape.clone(),
            entry.dtype,
            self.data.slice(entry.start..entry.end),
        )
    }
}

/// Checks every `data_offsets` pair of the header against the file's size before the safetensors
/// crate sums them (its `end + 8 + header_len` overflows, and panics in checked builds, on
/// offsets near 2^64). Header problems other than offsets are left to the crate's own messages.
fn check_offsets(data: &[u8]) -> Result<(), String> {
    let Some(len_bytes) = data.get(..8) else {
        return Ok(());
    };
    let mut n = [0u8; 8];
    n.copy_from_slice(len_bytes);
    let header_len = u64::from_le_bytes(n);
    let Some(header) = usize::try_from(header_len)
        .ok()
        .and_then(|h| h.checked_add(8))
        .and_then(|end| data.get(8..end))
    else {
        return Ok(());
    };
    let Ok(serde_json::Value::Object(map)) = serde_json::from_slice::<serde_json::Value>(header)
    else {
        return Ok(());
    };
    let room = (data.len() as u64).saturating_sub(8 + header_len);
    for (name, info) in &map {
        let Some(offsets) = info.get("data_offsets").and_then(|o| o.as_array()) else {
            continue;
        };
        for o in offsets {
            match o.as_u64() {
                Some(v) if v <= room => {}
                _ => {
                    return Err(format!(
                        "tensor `{name}` has data offset {o} outside the {room} bytes of data"
                    ))
                }
            }
        }
    }
    Ok(())
}

impl TensorSource for SafeTensorsFile {
    fn source_name(&self) -> String {
        self.name.clone()
    }

    fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    fn shape_of(&self, name: &str) -> Option<Vec<usize>> {
        self.entries.get(name).map(|e| e.shape.clone())
    }

    fn tensor(&self, name: &str) -> CoreResult<HostTensor> {
        let raw = self.raw(name)?;
        let scale_name = format!("{name}{SCALE_SUFFIX}");
        if raw.dtype() != DType::I8 || !self.entries.contains_key(&scale_name) {
            return Ok(raw);
        }
        dequantize_blocks_i8(name, &raw, &self.raw(&scale_name)?)
    }

    fn names(&self) -> Vec<String> {
        self.entries
            .keys()
            .filter(|n| !n.ends_with(SCALE_SUFFIX))
            .cloned()
            .collect()
    }

    /// The file's canonical path, size and modification time (`None` for in-memory images).
    fn identity(&self) -> Option<String> {
        self.identity.clone()
    }
}

/// `canonical path|size|mtime` of an opened file (`None` when the file system cannot tell).
fn file_identity(path: &Path, file: &std::fs::File) -> Option<String> {
    let meta = file.metadata().ok()?;
    let modified = meta
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    let canonical = std::fs::canonicalize(path).ok()?;
    Some(format!(
        "{}|{}|{}",
        canonical.display(),
        meta.len(),
        modified.as_nanos()
    ))
}

fn dequantize_blocks_i8(name: &str, q: &HostTensor, scales: &HostTensor) -> CoreResult<HostTensor> {
    let rows = q.shape().first().copied().unwrap_or(0);
    let cols = q.numel().checked_div(rows).unwrap_or(0);
    let blocks = match scales.shape() {
        [r, b] if *r == rows && *b > 0 && cols.is_multiple_of(*b) => *b,
        [r] if *r == rows => 1,
        other => {
            return Err(Error::ShapeMismatch {
                name: format!("{name}{SCALE_SUFFIX}"),
                expected: vec![rows, 1],
                actual: other.to_vec(),
            })
        }
    };
    let block = cols / blocks;
    let scales = scales.to_f32_vec();
    let out: Vec<f32> = q
        .bytes()
        .chunks_exact(block.max(1))
        .zip(&scales)
        .flat_map(|(chunk, &s)| chunk.iter().map(move |&v| (v as i8) as f32 * s))
        .collect();
    HostTensor::from_f32(q.shape().to_vec(), &out)
}

/// Quantizes a `[rows, cols]` f32 tensor to int8 in blocks of `block` columns (symmetric,
/// `scale = max|block| / 127`); `block` must divide `cols` (use `cols` for per-row scales).
/// Returns the int8 values and the `[rows, cols / block]` scales.
pub fn quantize_blocks_i8(values: &[f32], block: usize) -> (Vec<i8>, Vec<f32>) {
    let mut q = Vec::with_capacity(values.len());
    let mut scales = Vec::with_capacity(values.len() / block.max(1));
    for chunk in values.chunks(block.max(1)) {
        let max = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = if max > 0.0 { max / 127.0 } else { 1.0 };
        scales.push(scale);
        q.extend(
            chunk
                .iter()
                .map(|v| (v / scale).round().clamp(-127.0, 127.0) as i8),
        );
    }
    (q, scales)
}

fn map_dtype(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F64 => DType::F64,
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I64 => DType::I64,
        Dtype::I32 => DType::I32,
        Dtype::I8 => DType::I8,
        Dtype::U8 => DType::U8,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

fn describe(e: &safetensors::SafeTensorError) -> String {
    use safetensors::SafeTensorError as E;
    match e {
        E::HeaderTooSmall => "file is shorter than the 8-byte header length (truncated)".into(),
        E::InvalidHeaderLength => {
            "header length points past the end of the file (truncated or not safetensors)".into()
        }
        E::MetadataIncompleteBuffer => {
            "tensor data does not match the header's offsets (truncated, or the header lies about sizes)".into()
        }
        other => other.to_string(),
    }
}

/// The weights of one model: one or several safetensors files (shards) behind one name lookup.
pub struct WeightStore {
    files: Vec<SafeTensorsFile>,
    index: HashMap<String, usize>,
    name: String,
}

impl WeightStore {
    /// Opens every file, checking that no tensor name appears twice.
    pub fn open(paths: &[PathBuf]) -> Result<Self, IoError> {
        let files = paths
            .iter()
            .map(SafeTensorsFile::open)
            .collect::<Result<Vec<_>, _>>()?;
        Self::from_files(files)
    }

    /// Builds a store from already opened files.
    pub fn from_files(files: Vec<SafeTensorsFile>) -> Result<Self, IoError> {
        let mut index = HashMap::new();
        for (i, f) in files.iter().enumerate() {
            for n in f.entries.keys() {
                if index.insert(n.clone(), i).is_some() {
                    return Err(IoError::MalformedSafetensors {
                        path: PathBuf::from(&f.name),
                        reason: format!("tensor `{n}` appears in more than one shard"),
                    });
                }
            }
        }
        let name = match files.as_slice() {
            [one] => one.name.clone(),
            many => format!(
                "{} shards ({})",
                many.len(),
                many.iter()
                    .map(|f| f.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        Ok(WeightStore { files, index, name })
    }

    /// Wraps the store for sharing with models.
    pub fn into_source(self) -> Arc<dyn TensorSource> {
        Arc::new(self)
    }
}

impl TensorSource for WeightStore {
    fn source_name(&self) -> String {
        self.name.clone()
    }

    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn shape_of(&self, name: &str) -> Option<Vec<usize>> {
        self.index
            .get(name)
            .and_then(|&i| self.files[i].shape_of(name))
    }

    fn tensor(&self, name: &str) -> CoreResult<HostTensor> {
        match self.index.get(name) {
            Some(&i) => self.files[i].tensor(name),
            None => Err(Error::MissingTensor {
                name: name.to_string(),
                source_name: self.name.clone(),
            }),
        }
    }

    fn names(&self) -> Vec<String> {
        self.files.iter().flat_map(|f| f.names()).collect()
    }

    /// The identities of every shard, when each has one.
    fn identity(&self) -> Option<String> {
        let parts = self
            .files
            .iter()
            .map(TensorSource::identity)
            .collect::<Option<Vec<_>>>()?;
        Some(parts.join(";"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;

    fn image(tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize(views, None).unwrap()
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn reads_f32_f16_and_bf16() {
        let halfs: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect();
        let bhalfs: Vec<u8> = [0.25f32, 4.0]
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect();
        let img = image(&[
            ("a", Dtype::F32, vec![2, 2], f32_bytes(&[1., 2., 3., 4.])),
            ("h", Dtype::F16, vec![2], halfs),
            ("b", Dtype::BF16, vec![2], bhalfs),
        ]);
        let f = SafeTensorsFile::from_bytes("mem", Bytes::from(img)).unwrap();
        assert_eq!(f.tensor("a").unwrap().to_f32_vec(), vec![1., 2., 3., 4.]);
        assert_eq!(f.tensor("h").unwrap().to_f32_vec(), vec![1.5, -2.0]);
        assert_eq!(f.tensor("b").unwrap().to_f32_vec(), vec![0.25, 4.0]);
        let err = f.tensor("missing").unwrap_err().to_string();
        assert!(err.contains("missing tensor `missing`"), "{err}");
    }

    #[test]
    fn int8_blocks_dequantize() {
        let w = [0.5f32, -1.0, 0.25, 2.0, 0.0, -4.0];
        let (q, s) = quantize_blocks_i8(&w, 3);
        let img = image(&[
            (
                "w",
                Dtype::I8,
                vec![2, 3],
                q.iter().map(|v| *v as u8).collect(),
            ),
            ("w#scale", Dtype::F32, vec![2, 1], f32_bytes(&s)),
        ]);
        let f = SafeTensorsFile::from_bytes("mem", Bytes::from(img)).unwrap();
        let back = f.tensor("w").unwrap();
        assert_eq!(back.dtype(), DType::F32);
        for (a, b) in back.to_f32_vec().iter().zip(w) {
            assert!((a - b).abs() < 0.02, "{a} vs {b}");
        }
        assert_eq!(f.names(), vec!["w".to_string()]);
    }

    #[test]
    fn truncated_and_lying_headers_are_errors() {
        let img = image(&[("a", Dtype::F32, vec![4], f32_bytes(&[1., 2., 3., 4.]))]);
        for cut in [0usize, 4, 12, img.len() - 3] {
            let err =
                SafeTensorsFile::from_bytes("cut.safetensors", Bytes::from(img[..cut].to_vec()))
                    .err()
                    .expect("truncated file must fail");
            let msg = err.to_string();
            assert!(msg.contains("cut.safetensors"), "{msg}");
        }
        // A header claiming a larger shape than the data it points at.
        let mut lie = img.clone();
        let at = lie.windows(3).position(|w| w == b"[4]").unwrap();
        lie[at + 1] = b'9';
        let err = SafeTensorsFile::from_bytes("lie.safetensors", Bytes::from(lie))
            .err()
            .expect("lying header must fail");
        assert!(matches!(err, IoError::MalformedSafetensors { .. }), "{err}");
    }
}
