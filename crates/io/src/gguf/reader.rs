//! The GGUF container: header, metadata key/values and tensor infos, parsed with every count and
//! length bounded by the bytes that remain (a lying header is an error, never a huge allocation).

use std::collections::BTreeMap;

use super::dequant::GgmlType;
use super::value::{GgufValue, GgufValueType};

/// `GGUF` in the first four bytes.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a ggml tensor has.
pub const MAX_DIMS: usize = 4;
/// Deepest nesting of arrays accepted in metadata.
const MAX_ARRAY_DEPTH: usize = 8;

/// One tensor's entry in the file's tensor table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensorInfo {
    /// The name exactly as stored (`blk.0.attn_q.weight`).
    pub name: String,
    /// Row-major shape (PyTorch order): GGUF's `ne` reversed, so the last entry is the contiguous
    /// dimension. A token embedding is `[vocab, hidden]`, a linear weight `[out, in]`.
    pub shape: Vec<usize>,
    /// Storage type.
    pub ggml_type: GgmlType,
    /// Offset of the data relative to the start of the (aligned) data section.
    pub offset: u64,
    /// Size of the data in bytes.
    pub size: usize,
}

impl GgufTensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Everything before the tensor data.
pub(crate) struct Parsed {
    pub version: u32,
    pub metadata: BTreeMap<String, GgufValue>,
    pub tensors: Vec<GgufTensorInfo>,
    pub alignment: u64,
    pub data_start: usize,
}

/// A bounds-checked little-endian cursor; errors are plain reasons, the caller adds the path.
struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

type R<T> = Result<T, String>;

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> R<&'a [u8]> {
        if n > self.remaining() {
            return Err(format!(
                "truncated: {} needs {n} bytes at offset {}, only {} remain",
                what(),
                self.pos,
                self.remaining()
            ));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> R<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> R<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> R<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count that must fit in what remains, each item taking at least `min_item` bytes.
    fn count(&mut self, min_item: usize, what: &dyn Fn() -> String) -> R<usize> {
        let n = self.u64(what)?;
        let fits = (self.remaining() / min_item.max(1)) as u64;
        if n > fits {
            return Err(format!(
                "{} is {n}, but the {} bytes left can hold at most {fits} (truncated file or corrupt count)",
                what(),
                self.remaining()
            ));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> R<String> {
        let len = self.u64(&|| format!("length of {}", what()))?;
        if len > self.remaining() as u64 {
            return Err(format!(
                "truncated: {} claims {len} bytes at offset {}, only {} remain",
                what(),
                self.pos,
                self.remaining()
            ));
        }
        let bytes = self.take(len as usize, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| format!("{} is not valid UTF-8: {e}", what()))
    }

    fn value(
        &mut self,
        ty: GgufValueType,
        depth: usize,
        what: &dyn Fn() -> String,
    ) -> R<GgufValue> {
        Ok(match ty {
            GgufValueType::U8 => GgufValue::U8(self.array::<1>(what)?[0]),
            GgufValueType::I8 => GgufValue::I8(self.array::<1>(what)?[0] as i8),
            GgufValueType::U16 => GgufValue::U16(u16::from_le_bytes(self.array(what)?)),
            GgufValueType::I16 => GgufValue::I16(i16::from_le_bytes(self.array(what)?)),
            GgufValueType::U32 => GgufValue::U32(u32::from_le_bytes(self.array(what)?)),
            GgufValueType::I32 => GgufValue::I32(i32::from_le_bytes(self.array(what)?)),
            GgufValueType::F32 => GgufValue::F32(f32::from_le_bytes(self.array(what)?)),
            GgufValueType::U64 => GgufValue::U64(u64::from_le_bytes(self.array(what)?)),
            GgufValueType::I64 => GgufValue::I64(i64::from_le_bytes(self.array(what)?)),
            GgufValueType::F64 => GgufValue::F64(f64::from_le_bytes(self.array(what)?)),
            GgufValueType::Bool => match self.array::<1>(what)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                other => return Err(format!("{} is a bool stored as {other}", what())),
            },
            GgufValueType::String => GgufValue::String(self.string(what)?),
            GgufValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(format!(
                        "{} nests arrays deeper than {MAX_ARRAY_DEPTH} levels",
                        what()
                    ));
                }
                let elem = self.u32(&|| format!("element type of {}", what()))?;
                let elem = GgufValueType::from_id(elem)
                    .ok_or_else(|| format!("{} has unknown element type {elem}", what()))?;
                let n = self.count(elem.min_size(), &|| format!("element count of {}", what()))?;
                let mut items = Vec::with_capacity(n);
                for i in 0..n {
                    items.push(self.value(elem, depth + 1, &|| format!("{}[{i}]", what()))?);
                }
                GgufValue::Array(items)
            }
        })
    }
}

/// Parses header, metadata and tensor infos of `data`, checking that every tensor's bytes lie
/// inside the data section.
pub(crate) fn parse(data: &[u8]) -> R<Parsed> {
    let mut c = Cursor { data, pos: 0 };
    let magic = c.array::<4>(&|| "the magic".into())?;
    if magic != GGUF_MAGIC {
        return Err(format!(
            "bad magic {magic:02x?} (expected \"GGUF\"); not a GGUF file"
        ));
    }
    let version = c.u32(&|| "the version".into())?;
    match version {
        2 | 3 => {}
        1 => return Err("GGUF version 1 is not supported (only versions 2 and 3)".into()),
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            return Err(format!(
                "big-endian GGUF (version {}) is not supported",
                v.swap_bytes()
            ))
        }
        v => return Err(format!("unsupported GGUF version {v} (only 2 and 3)")),
    }
    let n_tensors_raw = c.u64(&|| "the tensor count".into())?;
    let n_kv = c.count(13, &|| "the metadata key/value count".into())?;

    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = c.string(&|| format!("metadata key #{i}"))?;
        let ty = c.u32(&|| format!("type of metadata `{key}`"))?;
        let ty = GgufValueType::from_id(ty)
            .ok_or_else(|| format!("metadata `{key}` has unknown value type {ty}"))?;
        let value = c.value(ty, 0, &|| format!("metadata `{key}`"))?;
        if metadata.contains_key(&key) {
            return Err(format!("metadata key `{key}` appears twice"));
        }
        metadata.insert(key, value);
    }

    // Minimum tensor info: empty name (8), n_dims (4), type (4), offset (8).
    let fits = (c.remaining() / 24) as u64;
    if n_tensors_raw > fits {
        return Err(format!(
            "the tensor count is {n_tensors_raw}, but the {} bytes left can hold at most {fits} (truncated file or corrupt count)",
            c.remaining()
        ));
    }
    let n_tensors = n_tensors_raw as usize;
    let mut tensors = Vec::with_capacity(n_tensors);
    let mut seen = std::collections::HashSet::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = c.string(&|| format!("name of tensor #{i}"))?;
        let n_dims = c.u32(&|| format!("dimension count of tensor `{name}`"))? as usize;
        if n_dims > MAX_DIMS {
            return Err(format!(
                "tensor `{name}` has {n_dims} dimensions (at most {MAX_DIMS})"
            ));
        }
        let mut ne = Vec::with_capacity(n_dims);
        for d in 0..n_dims {
            let v = c.u64(&|| format!("dimension {d} of tensor `{name}`"))?;
            let v = usize::try_from(v)
                .ok()
                .filter(|&v| v <= i64::MAX as usize)
                .ok_or_else(|| format!("tensor `{name}` has dimension {d} of {v}"))?;
            ne.push(v);
        }
        let ty = c.u32(&|| format!("type of tensor `{name}`"))?;
        let ggml_type = GgmlType::from_id(ty)
            .ok_or_else(|| format!("tensor `{name}` has unknown ggml type {ty}"))?;
        let offset = c.u64(&|| format!("offset of tensor `{name}`"))?;
        let n_elements = ne
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| format!("tensor `{name}` has too many elements ({ne:?})"))?;
        if ne
            .first()
            .is_some_and(|&d| !d.is_multiple_of(ggml_type.block_size()))
        {
            return Err(format!(
                "tensor `{name}`: row length {} is not a multiple of the {ggml_type} block size {}",
                ne[0],
                ggml_type.block_size()
            ));
        }
        let size = ggml_type.bytes_for(n_elements).ok_or_else(|| {
            format!("tensor `{name}`: {n_elements} elements are not whole {ggml_type} blocks")
        })?;
        if !seen.insert(name.clone()) {
            return Err(format!("tensor `{name}` appears twice"));
        }
        ne.reverse();
        tensors.push(GgufTensorInfo {
            name,
            shape: ne,
            ggml_type,
            offset,
            size,
        });
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(GgufValue::U32(a)) if *a > 0 && a.is_power_of_two() => u64::from(*a),
        Some(other) => {
            return Err(format!(
                "general.alignment must be a power-of-two u32, found {other:?}"
            ))
        }
    };
    let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
    let data_len = (data.len() as u64).saturating_sub(data_start);
    if !tensors.is_empty() && data_start > data.len() as u64 {
        return Err(format!(
            "truncated: the data section starts at {data_start}, past the end of the file ({} bytes)",
            data.len()
        ));
    }
    for t in &tensors {
        if !t.offset.is_multiple_of(alignment) {
            return Err(format!(
                "tensor `{}` has offset {}, not a multiple of the alignment {alignment}",
                t.name, t.offset
            ));
        }
        let end = t.offset.checked_add(t.size as u64);
        if end.is_none_or(|e| e > data_len) {
            return Err(format!(
                "tensor `{}` ({} bytes at data offset {}) runs past the end of the data section ({data_len} bytes; truncated file or bad offset)",
                t.name, t.size, t.offset
            ));
        }
    }
    Ok(Parsed {
        version,
        metadata,
        tensors,
        alignment,
        data_start: data_start.min(data.len() as u64) as usize,
    })
}
