//! A small GGUF writer: builds test models and fixtures in memory (v2 or v3, little-endian).

use std::path::Path;

use super::dequant::GgmlType;
use super::reader::{DEFAULT_ALIGNMENT, GGUF_MAGIC};
use super::value::GgufValue;
use crate::IoError;

/// Builds a GGUF image: metadata key/values in insertion order, then tensors with row-major shapes
/// (written as GGUF's reversed `ne`), each tensor's data padded to the alignment
/// (`general.alignment` when set as a `U32`, else 32).
#[derive(Debug, Clone)]
pub struct GgufBuilder {
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    tensors: Vec<(String, Vec<usize>, GgmlType, Vec<u8>)>,
}

impl Default for GgufBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufBuilder {
    /// An empty version-3 file.
    pub fn new() -> Self {
        GgufBuilder {
            version: 3,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Sets the version written in the header (the reader accepts 2 and 3).
    pub fn version(&mut self, version: u32) -> &mut Self {
        self.version = version;
        self
    }

    /// Adds a metadata key/value.
    pub fn metadata(&mut self, key: impl Into<String>, value: impl Into<GgufValue>) -> &mut Self {
        self.metadata.push((key.into(), value.into()));
        self
    }

    /// Adds a tensor with a row-major `shape` and data already in `ty`'s block layout; the byte
    /// length must match the shape.
    pub fn tensor(
        &mut self,
        name: impl Into<String>,
        shape: &[usize],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> Result<&mut Self, IoError> {
        let name = name.into();
        let n: usize = shape.iter().product();
        let rows_ok = shape
            .last()
            .is_none_or(|&r| r.is_multiple_of(ty.block_size()));
        if !rows_ok || ty.bytes_for(n) != Some(data.len()) {
            return Err(IoError::MalformedGguf {
                path: "<builder>".into(),
                reason: format!(
                    "tensor `{name}` of shape {shape:?} cannot be stored as {ty} in {} bytes",
                    data.len()
                ),
            });
        }
        self.tensors.push((name, shape.to_vec(), ty, data));
        Ok(self)
    }

    /// Adds an F32 tensor.
    pub fn tensor_f32(
        &mut self,
        name: impl Into<String>,
        shape: &[usize],
        values: &[f32],
    ) -> Result<&mut Self, IoError> {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name, shape, GgmlType::F32, data)
    }

    fn alignment(&self) -> usize {
        self.metadata
            .iter()
            .rev()
            .find_map(|(k, v)| match (k.as_str(), v) {
                ("general.alignment", GgufValue::U32(a)) if *a > 0 => Some(*a as usize),
                _ => None,
            })
            .unwrap_or(DEFAULT_ALIGNMENT as usize)
    }

    /// The file image. Arrays must hold values of one type (an empty array is written as `u8`).
    pub fn to_bytes(&self) -> Result<Vec<u8>, IoError> {
        let align = self.alignment();
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            write_str(&mut out, key);
            out.extend_from_slice(&(value.value_type() as u32).to_le_bytes());
            write_value(&mut out, key, value)?;
        }
        let mut offset = 0usize;
        for (name, shape, ty, data) in &self.tensors {
            write_str(&mut out, name);
            out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for &d in shape.iter().rev() {
                out.extend_from_slice(&(d as u64).to_le_bytes());
            }
            out.extend_from_slice(&ty.id().to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offset += data.len().next_multiple_of(align);
        }
        out.resize(out.len().next_multiple_of(align), 0);
        for (_, _, _, data) in &self.tensors {
            out.extend_from_slice(data);
            out.resize(out.len().next_multiple_of(align), 0);
        }
        Ok(out)
    }

    /// Writes the image to `path`.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), IoError> {
        let path = path.as_ref();
        std::fs::write(path, self.to_bytes()?).map_err(|e| IoError::read(path, e))
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, key: &str, v: &GgufValue) -> Result<(), IoError> {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.push(*x as u8),
        GgufValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(u8::from(*x)),
        GgufValue::String(s) => write_str(out, s),
        GgufValue::Array(items) => {
            let ty = items
                .first()
                .map_or(super::value::GgufValueType::U8, GgufValue::value_type);
            if items.iter().any(|i| i.value_type() != ty) {
                return Err(IoError::MalformedGguf {
                    path: "<builder>".into(),
                    reason: format!("metadata `{key}`: array elements of different types"),
                });
            }
            out.extend_from_slice(&(ty as u32).to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                write_value(out, key, item)?;
            }
        }
    }
    Ok(())
}
