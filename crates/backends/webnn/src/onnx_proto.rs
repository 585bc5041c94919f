//! The graph inputs of an ONNX file (name, element type, dimensions with their symbolic names),
//! read straight from the protobuf wire format: what WebNN's static shapes need
//! (`freeDimensionOverrides`) and what the inputs are converted to.

use std::collections::HashSet;

/// One dimension of a graph input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dim {
    /// A fixed size.
    Fixed(i64),
    /// A named free dimension (`batch_size`, `sequence_length`, ...).
    Named(String),
    /// A dimension without size or name.
    Unknown,
}

/// One graph input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphInput {
    /// Its name.
    pub name: String,
    /// ONNX `TensorProto.DataType` (1 float, 6 int32, 7 int64, 9 bool, 11 double, ...).
    pub elem_type: i32,
    /// Its dimensions.
    pub dims: Vec<Dim>,
}

impl GraphInput {
    /// onnxruntime-web's name of the element type, when the page handles it.
    pub fn web_dtype(&self) -> Option<&'static str> {
        match self.elem_type {
            1 => Some("float32"),
            2 => Some("uint8"),
            3 => Some("int8"),
            6 => Some("int32"),
            7 => Some("int64"),
            9 => Some("bool"),
            11 => Some("float64"),
            _ => None,
        }
    }
}

/// A reader of protobuf wire-format fields.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// A field: number and payload (varint value, or bytes of a length-delimited field).
pub(crate) enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Other,
}

/// A field read by [`Reader::next_raw`]: its number, its value and its whole encoding.
pub(crate) type RawField<'a> = (u64, Field<'a>, &'a [u8]);

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// The next field together with its whole encoding (key and payload).
    pub(crate) fn next_raw(&mut self) -> Result<Option<RawField<'a>>, String> {
        let start = self.pos;
        Ok(self
            .next()?
            .map(|(num, field)| (num, field, &self.buf[start..self.pos])))
    }

    /// True when every byte has been read.
    pub(crate) fn at_end(&self) -> bool {
        self.pos >= self.buf.len()
    }

    pub(crate) fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.buf.get(self.pos).ok_or("truncated varint")?;
            self.pos += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("varint longer than 10 bytes".into())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or("field runs past the end")?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    pub(crate) fn next(&mut self) -> Result<Option<(u64, Field<'a>)>, String> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Field::Other
            }
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| "length overflow")?;
                Field::Bytes(self.take(len)?)
            }
            5 => {
                self.take(4)?;
                Field::Other
            }
            w => return Err(format!("unsupported wire type {w}")),
        };
        Ok(Some((key >> 3, field)))
    }
}

pub(crate) fn string(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn dims(shape: &[u8]) -> Result<Vec<Dim>, String> {
    let mut out = Vec::new();
    let mut r = Reader::new(shape);
    while let Some((num, field)) = r.next()? {
        let (1, Field::Bytes(dim)) = (num, field) else {
            continue;
        };
        let mut d = Dim::Unknown;
        let mut dr = Reader::new(dim);
        while let Some((num, field)) = dr.next()? {
            match (num, field) {
                (1, Field::Varint(v)) => d = Dim::Fixed(v as i64),
                (2, Field::Bytes(s)) => d = Dim::Named(string(s)),
                _ => {}
            }
        }
        out.push(d);
    }
    Ok(out)
}

/// A `ValueInfoProto`: name, element type and dimensions (none when it has no shape).
pub(crate) fn value_info(bytes: &[u8]) -> Result<GraphInput, String> {
    let mut input = GraphInput {
        name: String::new(),
        elem_type: 0,
        dims: Vec::new(),
    };
    let mut r = Reader::new(bytes);
    while let Some((num, field)) = r.next()? {
        match (num, field) {
            (1, Field::Bytes(s)) => input.name = string(s),
            (2, Field::Bytes(ty)) => {
                let mut tr = Reader::new(ty);
                while let Some((num, field)) = tr.next()? {
                    let (1, Field::Bytes(tensor)) = (num, field) else {
                        continue;
                    };
                    let mut tt = Reader::new(tensor);
                    while let Some((num, field)) = tt.next()? {
                        match (num, field) {
                            (1, Field::Varint(v)) => input.elem_type = v as i32,
                            (2, Field::Bytes(shape)) => input.dims = dims(shape)?,
                            _ => {}
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(input)
}

/// The graph inputs of the ONNX model `bytes` (initializers listed as inputs left out).
pub fn graph_inputs(bytes: &[u8]) -> Result<Vec<GraphInput>, String> {
    let mut r = Reader::new(bytes);
    let mut graph = None;
    while let Some((num, field)) = r.next()? {
        if let (7, Field::Bytes(g)) = (num, field) {
            graph = Some(g);
        }
    }
    let graph = graph.ok_or("no graph in the model")?;
    let mut inputs = Vec::new();
    let mut initializers = HashSet::new();
    let mut r = Reader::new(graph);
    while let Some((num, field)) = r.next()? {
        match (num, field) {
            (11, Field::Bytes(v)) => inputs.push(value_info(v)?),
            (5, Field::Bytes(t)) => {
                let mut tr = Reader::new(t);
                while let Some((num, field)) = tr.next()? {
                    if let (8, Field::Bytes(name)) = (num, field) {
                        initializers.insert(string(name));
                    }
                }
            }
            _ => {}
        }
    }
    inputs.retain(|i| !initializers.contains(&i.name));
    Ok(inputs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(num: u64, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![(num << 3 | 2) as u8, payload.len() as u8];
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn reads_names_types_and_free_dimensions() {
        let dim_named = field(1, &field(2, b"batch"));
        let dim_fixed = field(1, &[1 << 3, 7]);
        let shape = [dim_named, dim_fixed].concat();
        let tensor = [vec![1 << 3, 7], field(2, &shape)].concat();
        let ty = field(1, &tensor);
        let vi = [field(1, b"input_ids"), field(2, &ty)].concat();
        let init = field(8, b"w");
        let init_input = [field(1, b"w")].concat();
        let graph = [field(11, &vi), field(11, &init_input), field(5, &init)].concat();
        let model = [vec![1 << 3, 8], field(7, &graph)].concat();
        let inputs = graph_inputs(&model).unwrap();
        assert_eq!(
            inputs,
            vec![GraphInput {
                name: "input_ids".into(),
                elem_type: 7,
                dims: vec![Dim::Named("batch".into()), Dim::Fixed(7)],
            }]
        );
        assert_eq!(inputs[0].web_dtype(), Some("int64"));
        assert!(graph_inputs(&model[..model.len() - 3]).is_err());
        assert!(graph_inputs(b"").is_err());
    }
}
