//! Metadata values of a GGUF file.

/// A metadata value (`gguf_type`): a scalar, a string, or an array of values (arrays may nest).
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// `uint8`.
    U8(u8),
    /// `int8`.
    I8(i8),
    /// `uint16`.
    U16(u16),
    /// `int16`.
    I16(i16),
    /// `uint32`.
    U32(u32),
    /// `int32`.
    I32(i32),
    /// `uint64`.
    U64(u64),
    /// `int64`.
    I64(i64),
    /// `float32`.
    F32(f32),
    /// `float64`.
    F64(f64),
    /// `bool` (one byte, 0 or 1).
    Bool(bool),
    /// UTF-8 string.
    String(String),
    /// Array of values of one type.
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as an unsigned integer: any integer type that is non-negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer: any integer type that fits in `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::I64(v) => Some(v),
            GgufValue::U64(v) => i64::try_from(v).ok(),
            _ => self.as_u64().map(|v| v as i64),
        }
    }

    /// The value as a float: any float or integer type.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            GgufValue::U64(v) => Some(v as f64),
            GgufValue::I64(v) => Some(v as f64),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// The value as a bool (only `Bool`).
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a string slice (only `String`).
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements of an `Array`.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The GGUF type name (`u32`, `string`, `array`, ...), for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            GgufValue::U8(_) => "u8",
            GgufValue::I8(_) => "i8",
            GgufValue::U16(_) => "u16",
            GgufValue::I16(_) => "i16",
            GgufValue::U32(_) => "u32",
            GgufValue::I32(_) => "i32",
            GgufValue::U64(_) => "u64",
            GgufValue::I64(_) => "i64",
            GgufValue::F32(_) => "f32",
            GgufValue::F64(_) => "f64",
            GgufValue::Bool(_) => "bool",
            GgufValue::String(_) => "string",
            GgufValue::Array(_) => "array",
        }
    }

    /// The type id written in the file for this value.
    pub(crate) fn value_type(&self) -> GgufValueType {
        match self {
            GgufValue::U8(_) => GgufValueType::U8,
            GgufValue::I8(_) => GgufValueType::I8,
            GgufValue::U16(_) => GgufValueType::U16,
            GgufValue::I16(_) => GgufValueType::I16,
            GgufValue::U32(_) => GgufValueType::U32,
            GgufValue::I32(_) => GgufValueType::I32,
            GgufValue::U64(_) => GgufValueType::U64,
            GgufValue::I64(_) => GgufValueType::I64,
            GgufValue::F32(_) => GgufValueType::F32,
            GgufValue::F64(_) => GgufValueType::F64,
            GgufValue::Bool(_) => GgufValueType::Bool,
            GgufValue::String(_) => GgufValueType::String,
            GgufValue::Array(_) => GgufValueType::Array,
        }
    }
}

impl From<&str> for GgufValue {
    fn from(s: &str) -> Self {
        GgufValue::String(s.to_string())
    }
}

impl From<String> for GgufValue {
    fn from(s: String) -> Self {
        GgufValue::String(s)
    }
}

impl From<u32> for GgufValue {
    fn from(v: u32) -> Self {
        GgufValue::U32(v)
    }
}

impl From<f32> for GgufValue {
    fn from(v: f32) -> Self {
        GgufValue::F32(v)
    }
}

impl From<bool> for GgufValue {
    fn from(v: bool) -> Self {
        GgufValue::Bool(v)
    }
}

impl From<u8> for GgufValue {
    fn from(v: u8) -> Self {
        GgufValue::U8(v)
    }
}

impl From<i32> for GgufValue {
    fn from(v: i32) -> Self {
        GgufValue::I32(v)
    }
}

impl From<u64> for GgufValue {
    fn from(v: u64) -> Self {
        GgufValue::U64(v)
    }
}

impl From<i64> for GgufValue {
    fn from(v: i64) -> Self {
        GgufValue::I64(v)
    }
}

impl From<f64> for GgufValue {
    fn from(v: f64) -> Self {
        GgufValue::F64(v)
    }
}

impl<T: Into<GgufValue>> From<Vec<T>> for GgufValue {
    fn from(v: Vec<T>) -> Self {
        GgufValue::Array(v.into_iter().map(Into::into).collect())
    }
}

/// Value type ids (`enum gguf_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GgufValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl GgufValueType {
    pub(crate) fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::U8,
            1 => Self::I8,
            2 => Self::U16,
            3 => Self::I16,
            4 => Self::U32,
            5 => Self::I32,
            6 => Self::F32,
            7 => Self::Bool,
            8 => Self::String,
            9 => Self::Array,
            10 => Self::U64,
            11 => Self::I64,
            12 => Self::F64,
            _ => return None,
        })
    }

    /// Fewest bytes one value of this type takes in the file.
    pub(crate) fn min_size(self) -> usize {
        match self {
            Self::U8 | Self::I8 | Self::Bool => 1,
            Self::U16 | Self::I16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 | Self::String => 8,
            Self::Array => 12,
        }
    }
}
