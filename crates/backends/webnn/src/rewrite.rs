//! Graph rewrites for WebNN: exact reformulations of ONNX patterns that Chromium's WebNN cannot
//! build or that ONNX Runtime cannot place on WebNN, applied to the model bytes before a WebNN
//! session is created (the other providers get the file as it is).
//!
//! - **`GatherElements`** with computed indices: Chromium's WebNN builds `gatherElements` only
//!   with constant indices (`MLGraphBuilder.build` rejects the graph, and onnxruntime-web 1.30
//!   never settles the session: the RoBERTa position-id / `token_type_ids` gather of CLAP's text
//!   tower hung for the whole call timeout). It becomes a `GatherND` over coordinates made of the
//!   indices (negative ones wrapped) and index grids of the other axes (`CumSum` of ones, which
//!   ONNX Runtime folds into constants once the shapes are static).
//! - **`masked_scatter`** as PyTorch exports it (`ScatterND(data, Transpose(NonZero(Expand(mask,
//!   Shape(data)))), updates)`, LLaVA's image-feature merge): `NonZero` has a data-dependent shape,
//!   so ONNX Runtime keeps that chain on the CPU. It becomes the static-shape form: flattened
//!   mask, `CumSum` of it as the running index into the flattened updates, `Gather`, `Where`.
//!
//! Nodes left without consumers are removed afterwards (not in graphs with subgraphs, whose
//! bodies may read outer values implicitly).

use std::collections::{HashMap, HashSet};

use crate::onnx_proto::{string, Field, Reader};

/// ONNX `TensorProto.DataType` of int64.
const INT64: i64 = 7;
/// Prefix of the names the rewrites give their nodes, tensors and constants.
const PREFIX: &str = "ipfs_webnn_";
/// Highest rank of WebNN `gatherND` indices in Chromium (the coordinates have the data's rank + 1).
const MAX_GATHER_ND_RANK: usize = 4;

/// A rewritten model.
#[derive(Debug, Clone)]
pub struct Rewritten {
    /// The rewritten model file.
    pub bytes: Vec<u8>,
    /// One line per rewrite made (`GatherElements node_x → GatherND`).
    pub applied: Vec<String>,
}

/// Rewrites the ONNX model `model` for WebNN; `None` when nothing needed rewriting.
pub fn rewrite_for_webnn(model: &[u8]) -> Result<Option<Rewritten>, String> {
    let mut graph_bytes = None;
    let mut opset = None;
    let mut r = Reader::new(model);
    while let Some((num, field)) = r.next()? {
        match (num, field) {
            (7, Field::Bytes(g)) => graph_bytes = Some(g),
            (8, Field::Bytes(o)) => {
                let (domain, version) = opset_import(o)?;
                if domain.is_empty() || domain == "ai.onnx" {
                    opset = Some(version);
                }
            }
            _ => {}
        }
    }
    let graph_bytes = graph_bytes.ok_or("no graph in the model")?;
    // Unsqueeze with axes as an input (13) is the newest form the rewrites use.
    if opset.is_none_or(|v| v < 13) {
        return Ok(None);
    }
    let mut graph = Graph::parse(graph_bytes)?;
    let applied = graph.rewrite();
    if applied.is_empty() {
        return Ok(None);
    }
    graph.remove_dead_nodes();
    let new_graph = graph.encode(graph_bytes)?;
    let mut out = Vec::with_capacity(model.len() + 1024);
    let mut r = Reader::new(model);
    while let Some((num, _, raw)) = r.next_raw()? {
        if num == 7 {
            put_bytes(&mut out, 7, &new_graph);
        } else {
            out.extend_from_slice(raw);
        }
    }
    Ok(Some(Rewritten {
        bytes: out,
        applied,
    }))
}

fn opset_import(bytes: &[u8]) -> Result<(String, i64), String> {
    let (mut domain, mut version) = (String::new(), 0);
    let mut r = Reader::new(bytes);
    while let Some((num, field)) = r.next()? {
        match (num, field) {
            (1, Field::Bytes(d)) => domain = string(d),
            (2, Field::Varint(v)) => version = v as i64,
            _ => {}
        }
    }
    Ok((domain, version))
}

/// Repeated integers, packed or not.
fn push_ints(out: &mut Vec<i64>, field: Field<'_>) -> Result<(), String> {
    match field {
        Field::Varint(v) => out.push(v as i64),
        Field::Bytes(b) => {
            let mut r = Reader::new(b);
            while !r.at_end() {
                out.push(r.varint()? as i64);
            }
        }
        Field::Other => {}
    }
    Ok(())
}

/// An integer constant (an initializer or a `Constant` node's value).
#[derive(Debug, Clone, Default)]
struct Const {
    dims: Vec<i64>,
    /// Its values, when it is an int32 / int64 tensor stored in the file.
    ints: Option<Vec<i64>>,
}

/// A `TensorProto`: its name and, for integer tensors, the values.
fn tensor(bytes: &[u8]) -> Result<(String, Const), String> {
    let (mut name, mut dims, mut data_type, mut raw, mut listed) =
        (String::new(), Vec::new(), 0, None, Vec::new());
    let mut external = false;
    let mut r = Reader::new(bytes);
    while let Some((num, field)) = r.next()? {
        match (num, field) {
            (1, f) => push_ints(&mut dims, f)?,
            (2, Field::Varint(v)) => data_type = v as i64,
            (5 | 7, f) => push_ints(&mut listed, f)?,
            (8, Field::Bytes(n)) => name = string(n),
            (9, Field::Bytes(b)) => raw = Some(b),
            (14, Field::Varint(1)) => external = true,
            _ => {}
        }
    }
    let ints = match (data_type, raw) {
        _ if external => None,
        (7, Some(b)) => Some(
            b.chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect(),
        ),
        (6, Some(b)) => Some(
            b.chunks_exact(4)
                .map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap_or([0; 4]))))
                .collect(),
        ),
        // int32 values are stored sign-extended as varints in int32_data.
        (6 | 7, None) => Some(listed),
        _ => None,
    };
    Ok((name, Const { dims, ints }))
}

/// One attribute of a node (what the rewrites read).
#[derive(Debug, Clone, Default)]
struct Attr {
    name: String,
    int: Option<i64>,
    ints: Vec<i64>,
    string: Option<String>,
    tensor: Option<Const>,
    subgraph: bool,
}

fn attribute(bytes: &[u8]) -> Result<Attr, String> {
    let mut a = Attr::default();
    let mut r = Reader::new(bytes);
    while let Some((num, field)) = r.next()? {
        match (num, field) {
            (1, Field::Bytes(n)) => a.name = string(n),
            (3, Field::Varint(v)) => a.int = Some(v as i64),
            (4, Field::Bytes(s)) => a.string = Some(string(s)),
            (5, Field::Bytes(t)) => a.tensor = Some(tensor(t)?.1),
            (6 | 11, _) => a.subgraph = true,
            (8, f) => push_ints(&mut a.ints, f)?,
            _ => {}
        }
    }
    Ok(a)
}

/// A node: parsed, and its encoding when it is kept as it was.
#[derive(Debug, Clone, Default)]
struct Node {
    inputs: Vec<String>,
    outputs: Vec<String>,
    name: String,
    op_type: String,
    domain: String,
    attrs: Vec<Attr>,
    /// The `NodeProto` bytes of an original node.
    raw: Option<Vec<u8>>,
    /// Attributes of a new node: (name, value).
    new_attrs: Vec<(String, AttrValue)>,
}

/// The value of an attribute of a new node.
#[derive(Debug, Clone)]
enum AttrValue {
    Int(i64),
}

impl Node {
    /// A new node `name` running `op` with integer attributes `attrs`.
    fn new(
        op: &str,
        name: String,
        inputs: &[&str],
        outputs: Vec<String>,
        attrs: &[(&str, i64)],
    ) -> Node {
        Node {
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            outputs,
            name,
            op_type: op.into(),
            new_attrs: attrs
                .iter()
                .map(|(k, v)| (k.to_string(), AttrValue::Int(*v)))
                .collect(),
            ..Node::default()
        }
    }

    fn parse(bytes: &[u8]) -> Result<Node, String> {
        let mut n = Node {
            raw: Some(bytes.to_vec()),
            ..Node::default()
        };
        let mut r = Reader::new(bytes);
        while let Some((num, field)) = r.next()? {
            match (num, field) {
                (1, Field::Bytes(s)) => n.inputs.push(string(s)),
                (2, Field::Bytes(s)) => n.outputs.push(string(s)),
                (3, Field::Bytes(s)) => n.name = string(s),
                (4, Field::Bytes(s)) => n.op_type = string(s),
                (5, Field::Bytes(a)) => n.attrs.push(attribute(a)?),
                (7, Field::Bytes(s)) => n.domain = string(s),
                _ => {}
            }
        }
        Ok(n)
    }

    /// True for an operator of the default ONNX domain.
    fn is(&self, op: &str) -> bool {
        self.op_type == op && (self.domain.is_empty() || self.domain == "ai.onnx")
    }

    fn attr(&self, name: &str) -> Option<&Attr> {
        self.attrs.iter().find(|a| a.name == name)
    }

    fn input(&self, i: usize) -> Option<&str> {
        self.inputs
            .get(i)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }

    fn has_subgraph(&self) -> bool {
        self.attrs.iter().any(|a| a.subgraph)
    }

    fn encode(&self) -> Vec<u8> {
        if let Some(raw) = &self.raw {
            return raw.clone();
        }
        let mut out = Vec::new();
        for i in &self.inputs {
            put_bytes(&mut out, 1, i.as_bytes());
        }
        for o in &self.outputs {
            put_bytes(&mut out, 2, o.as_bytes());
        }
        put_bytes(&mut out, 3, self.name.as_bytes());
        put_bytes(&mut out, 4, self.op_type.as_bytes());
        for (name, value) in &self.new_attrs {
            let mut a = Vec::new();
            put_bytes(&mut a, 1, name.as_bytes());
            match value {
                AttrValue::Int(v) => {
                    put_varint_field(&mut a, 3, *v as u64);
                    put_varint_field(&mut a, 20, 2); // AttributeType INT
                }
            }
            put_bytes(&mut out, 5, &a);
        }
        out
    }
}

/// The graph being rewritten.
struct Graph {
    nodes: Vec<Node>,
    /// Graph output names.
    outputs: Vec<String>,
    /// Integer constants by name.
    consts: HashMap<String, Const>,
    /// Ranks known from value infos, graph inputs / outputs and initializers.
    ranks: HashMap<String, usize>,
    /// Every name in use (tensors and nodes).
    names: HashSet<String>,
    /// New initializers (encoded `TensorProto`s), and the names of new constants by value.
    new_inits: Vec<Vec<u8>>,
    new_consts: HashMap<(Vec<i64>, Vec<i64>), String>,
    counter: usize,
}

/// The name and rank (when it has a shape) of a `ValueInfoProto`.
fn value_rank(bytes: &[u8]) -> Result<(String, Option<usize>), String> {
    let (mut name, mut rank) = (String::new(), None);
    let mut r = Reader::new(bytes);
    while let Some((num, field)) = r.next()? {
        match (num, field) {
            (1, Field::Bytes(n)) => name = string(n),
            (2, Field::Bytes(ty)) => {
                let mut tr = Reader::new(ty);
                while let Some((1, Field::Bytes(t))) = tr.next()? {
                    let mut tt = Reader::new(t);
                    while let Some((num, field)) = tt.next()? {
                        if let (2, Field::Bytes(shape)) = (num, field) {
                            let mut sr = Reader::new(shape);
                            let mut n = 0;
                            while let Some((num, _)) = sr.next()? {
                                n += usize::from(num == 1);
                            }
                            rank = Some(n);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok((name, rank))
}

impl Graph {
    fn parse(bytes: &[u8]) -> Result<Graph, String> {
        let mut g = Graph {
            nodes: Vec::new(),
            outputs: Vec::new(),
            consts: HashMap::new(),
            ranks: HashMap::new(),
            names: HashSet::new(),
            new_inits: Vec::new(),
            new_consts: HashMap::new(),
            counter: 0,
        };
        let mut r = Reader::new(bytes);
        while let Some((num, field)) = r.next()? {
            match (num, field) {
                (1, Field::Bytes(n)) => g.nodes.push(Node::parse(n)?),
                (5, Field::Bytes(t)) => {
                    let (name, c) = tensor(t)?;
                    g.ranks.insert(name.clone(), c.dims.len());
                    g.names.insert(name.clone());
                    g.consts.insert(name, c);
                }
                (11..=13, Field::Bytes(v)) => {
                    let (name, rank) = value_rank(v)?;
                    if num == 12 {
                        g.outputs.push(name.clone());
                    }
                    if let Some(rank) = rank {
                        g.ranks.entry(name.clone()).or_insert(rank);
                    }
                    g.names.insert(name);
                }
                _ => {}
            }
        }
        for n in &g.nodes {
            g.names.extend(n.outputs.iter().cloned());
            g.names.insert(n.name.clone());
            if n.is("Constant") {
                if let (Some(out), Some(t)) = (
                    n.outputs.first(),
                    n.attr("value").and_then(|a| a.tensor.clone()),
                ) {
                    g.consts.insert(out.clone(), t);
                }
            }
        }
        Ok(g)
    }

    /// The integer values of the constant `name`.
    fn ints(&self, name: &str) -> Option<&[i64]> {
        self.consts.get(name)?.ints.as_deref()
    }

    /// A fresh name.
    fn fresh(&mut self, what: &str) -> String {
        loop {
            self.counter += 1;
            let name = format!("{PREFIX}{what}_{}", self.counter);
            if self.names.insert(name.clone()) {
                return name;
            }
        }
    }

    /// An int64 constant of shape `dims` (one initializer per distinct value).
    fn constant(&mut self, dims: &[i64], values: &[i64]) -> String {
        let key = (dims.to_vec(), values.to_vec());
        if let Some(name) = self.new_consts.get(&key) {
            return name.clone();
        }
        let name = self.fresh("const");
        let mut t = Vec::new();
        for &d in dims {
            put_varint_field(&mut t, 1, d as u64);
        }
        put_varint_field(&mut t, 2, INT64 as u64);
        put_bytes(&mut t, 8, name.as_bytes());
        let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        put_bytes(&mut t, 9, &raw);
        self.new_inits.push(t);
        self.new_consts.insert(key, name.clone());
        name
    }

    /// A new node `op(inputs)` with one output (`output`, or a fresh name), pushed to `out`.
    fn node(
        &mut self,
        out: &mut Vec<Node>,
        op: &str,
        inputs: &[&str],
        attrs: &[(&str, i64)],
        output: Option<&str>,
    ) -> String {
        let output = output.map_or_else(|| self.fresh("t"), str::to_string);
        let name = self.fresh(&op.to_lowercase());
        out.push(Node::new(op, name, inputs, vec![output.clone()], attrs));
        output
    }

    /// Applies every rewrite; returns what was done.
    fn rewrite(&mut self) -> Vec<String> {
        let producer: HashMap<String, usize> = self
            .nodes
            .iter()
            .enumerate()
            .flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.clone(), i)))
            .collect();
        let old = std::mem::take(&mut self.nodes);
        let mut nodes = Vec::with_capacity(old.len());
        let mut applied = Vec::new();
        for node in &old {
            let made = if node.is("GatherElements") {
                self.gather_elements(node, &mut nodes)
            } else if node.is("ScatterND") {
                self.masked_scatter(node, &old, &producer, &mut nodes)
            } else {
                None
            };
            match made {
                Some(what) => applied.push(format!("{} `{}`: {what}", node.op_type, node.name)),
                None => nodes.push(node.clone()),
            }
        }
        self.nodes = nodes;
        applied
    }

    /// `GatherElements(data, indices, axis)` → `GatherND(data, coordinates)`.
    fn gather_elements(&mut self, node: &Node, out: &mut Vec<Node>) -> Option<String> {
        let (data, idx) = (node.input(0)?, node.input(1)?);
        let output = node.outputs.first()?;
        if self.consts.contains_key(idx) {
            return None; // constant indices build as they are
        }
        let rank = [idx, output.as_str(), data]
            .iter()
            .find_map(|n| self.ranks.get(*n).copied())?;
        if rank == 0 || rank > MAX_GATHER_ND_RANK {
            return None;
        }
        let axis = node.attr("axis").and_then(|a| a.int).unwrap_or(0);
        let axis = if axis < 0 { axis + rank as i64 } else { axis };
        if !(0..rank as i64).contains(&axis) {
            return None;
        }
        let (one, zero, last) = (
            self.constant(&[], &[1]),
            self.constant(&[], &[0]),
            self.constant(&[1], &[-1]),
        );
        let mut new = Vec::new();
        let shape = self.node(&mut new, "Shape", &[idx], &[], None);
        let ones = self.node(&mut new, "Expand", &[&one, &shape], &[], None);
        let idx64 = self.node(&mut new, "Cast", &[idx], &[("to", INT64)], None);
        // Negative indices count from the end of the axis.
        let data_shape = self.node(&mut new, "Shape", &[data], &[], None);
        let axis_c = self.constant(&[], &[axis]);
        let size = self.node(
            &mut new,
            "Gather",
            &[&data_shape, &axis_c],
            &[("axis", 0)],
            None,
        );
        let negative = self.node(&mut new, "Less", &[&idx64, &zero], &[], None);
        let wrapped = self.node(&mut new, "Add", &[&idx64, &size], &[], None);
        let index = self.node(&mut new, "Where", &[&negative, &wrapped, &idx64], &[], None);
        let mut parts = Vec::with_capacity(rank);
        for d in 0..rank as i64 {
            let coord = if d == axis {
                index.clone()
            } else {
                let d_c = self.constant(&[], &[d]);
                let sum = self.node(&mut new, "CumSum", &[&ones, &d_c], &[], None);
                self.node(&mut new, "Sub", &[&sum, &one], &[], None)
            };
            parts.push(self.node(&mut new, "Unsqueeze", &[&coord, &last], &[], None));
        }
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        let coords = self.node(&mut new, "Concat", &parts, &[("axis", -1)], None);
        self.node(
            &mut new,
            "GatherND",
            &[data, &coords],
            &[("batch_dims", 0)],
            Some(output),
        );
        out.extend(new);
        Some("GatherND over computed coordinates".into())
    }

    /// PyTorch's `masked_scatter` (`ScatterND` at `NonZero` of the broadcast mask) → the
    /// static-shape `CumSum` / `Gather` / `Where` form.
    fn masked_scatter(
        &mut self,
        node: &Node,
        old: &[Node],
        producer: &HashMap<String, usize>,
        out: &mut Vec<Node>,
    ) -> Option<String> {
        let made_by = |name: &str, op: &str| -> Option<&Node> {
            old.get(*producer.get(name)?).filter(|n| n.is(op))
        };
        if node
            .attr("reduction")
            .and_then(|a| a.string.as_deref())
            .is_some_and(|r| r != "none")
        {
            return None;
        }
        let (data, indices, updates) = (node.input(0)?, node.input(1)?, node.input(2)?);
        let output = node.outputs.first()?;
        let transpose = made_by(indices, "Transpose")?;
        if transpose
            .attr("perm")
            .is_some_and(|p| p.ints.as_slice() != [1, 0])
        {
            return None;
        }
        let mask = made_by(transpose.input(0)?, "NonZero")?.input(0)?;
        // The mask is broadcast to the data's shape, so NonZero's coordinates are the data's
        // elements in row-major order.
        let expand = made_by(mask, "Expand")?;
        let shape = expand.input(1)?;
        let shape_of = made_by(shape, "Shape")?;
        if shape_of.input(0)? != data
            || shape_of.attr("start").and_then(|a| a.int).unwrap_or(0) != 0
            || shape_of.attr("end").is_some()
        {
            return None;
        }
        // The updates are the first `count` values of a flattened source: gather from the
        // source itself (static shape) when that is visible.
        let source = made_by(updates, "Slice")
            .filter(|s| {
                let flat = s
                    .input(0)
                    .and_then(|x| made_by(x, "Reshape"))
                    .and_then(|r| r.input(1))
                    .and_then(|sh| self.ints(sh))
                    == Some(&[-1][..]);
                let starts = s.input(1).and_then(|n| self.ints(n)) == Some(&[0][..]);
                let axes = s
                    .input(3)
                    .is_none_or(|n| matches!(self.ints(n), Some([0]) | Some([-1])));
                let steps = s.input(4).is_none_or(|n| self.ints(n) == Some(&[1][..]));
                flat && starts && axes && steps
            })
            .and_then(|s| s.input(0))
            .unwrap_or(updates)
            .to_string();
        let (one, zero, last) = (
            self.constant(&[], &[1]),
            self.constant(&[], &[0]),
            self.constant(&[1], &[-1]),
        );
        let mut new = Vec::new();
        let flat_mask = self.node(&mut new, "Reshape", &[mask, &last], &[], None);
        let counts = self.node(&mut new, "Cast", &[&flat_mask], &[("to", INT64)], None);
        let running = self.node(&mut new, "CumSum", &[&counts, &zero], &[], None);
        let position = self.node(&mut new, "Sub", &[&running, &one], &[], None);
        // Before the first masked element the position is -1; the value there is not used.
        let position = self.node(&mut new, "Max", &[&position, &zero], &[], None);
        let picked = self.node(
            &mut new,
            "Gather",
            &[&source, &position],
            &[("axis", 0)],
            None,
        );
        let flat_data = self.node(&mut new, "Reshape", &[data, &last], &[], None);
        let merged = self.node(
            &mut new,
            "Where",
            &[&flat_mask, &picked, &flat_data],
            &[],
            None,
        );
        self.node(&mut new, "Reshape", &[&merged, shape], &[], Some(output));
        out.extend(new);
        Some("masked_scatter as CumSum / Gather / Where".into())
    }

    /// Removes the nodes whose outputs nothing reads (kept as they are in graphs with
    /// subgraphs, which may read outer values without listing them).
    fn remove_dead_nodes(&mut self) {
        if self.nodes.iter().any(Node::has_subgraph) {
            return;
        }
        let mut live: HashSet<&str> = self.outputs.iter().map(String::as_str).collect();
        let mut keep = vec![false; self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate().rev() {
            if n.outputs.is_empty() || n.outputs.iter().any(|o| live.contains(o.as_str())) {
                keep[i] = true;
                live.extend(n.inputs.iter().map(String::as_str));
            }
        }
        let mut k = keep.into_iter();
        self.nodes.retain(|_| k.next().unwrap_or(true));
    }

    /// The graph's bytes: `original` with the nodes replaced, the new constants added and the
    /// value infos of tensors that are gone dropped.
    fn encode(&self, original: &[u8]) -> Result<Vec<u8>, String> {
        let mut present: HashSet<&str> = HashSet::new();
        for n in &self.nodes {
            present.extend(n.inputs.iter().map(String::as_str));
            present.extend(n.outputs.iter().map(String::as_str));
        }
        let mut out = Vec::with_capacity(original.len() + 4096);
        let mut nodes_written = false;
        let mut r = Reader::new(original);
        while let Some((num, field, raw)) = r.next_raw()? {
            match (num, field) {
                (1, _) => {
                    if !nodes_written {
                        for n in &self.nodes {
                            put_bytes(&mut out, 1, &n.encode());
                        }
                        nodes_written = true;
                    }
                }
                (13, Field::Bytes(v)) => {
                    let (name, _) = value_rank(v)?;
                    if present.contains(name.as_str()) {
                        out.extend_from_slice(raw);
                    }
                }
                _ => out.extend_from_slice(raw),
            }
        }
        for t in &self.new_inits {
            put_bytes(&mut out, 5, t);
        }
        Ok(out)
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_varint_field(out: &mut Vec<u8>, num: u64, v: u64) {
    put_varint(out, num << 3);
    put_varint(out, v);
}

fn put_bytes(out: &mut Vec<u8>, num: u64, bytes: &[u8]) {
    put_varint(out, num << 3 | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vi(name: &str, elem: u64, dims: &[i64]) -> Vec<u8> {
        let mut shape = Vec::new();
        for &d in dims {
            let mut dim = Vec::new();
            put_varint_field(&mut dim, 1, d as u64);
            put_bytes(&mut shape, 1, &dim);
        }
        let mut tensor = Vec::new();
        put_varint_field(&mut tensor, 1, elem);
        put_bytes(&mut tensor, 2, &shape);
        let mut ty = Vec::new();
        put_bytes(&mut ty, 1, &tensor);
        let mut v = Vec::new();
        put_bytes(&mut v, 1, name.as_bytes());
        put_bytes(&mut v, 2, &ty);
        v
    }

    fn node(op: &str, inputs: &[&str], outputs: &[&str], attrs: &[(&str, i64)]) -> Vec<u8> {
        let names = outputs.iter().map(|s| s.to_string()).collect();
        Node::new(op, format!("n_{}", outputs[0]), inputs, names, attrs).encode()
    }

    fn init(name: &str, dims: &[i64], values: &[i64]) -> Vec<u8> {
        let mut t = Vec::new();
        for &d in dims {
            put_varint_field(&mut t, 1, d as u64);
        }
        put_varint_field(&mut t, 2, 7);
        put_bytes(&mut t, 8, name.as_bytes());
        let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        put_bytes(&mut t, 9, &raw);
        t
    }

    fn model(
        nodes: &[Vec<u8>],
        inits: &[Vec<u8>],
        inputs: &[Vec<u8>],
        outputs: &[&str],
    ) -> Vec<u8> {
        let mut g = Vec::new();
        for n in nodes {
            put_bytes(&mut g, 1, n);
        }
        for t in inits {
            put_bytes(&mut g, 5, t);
        }
        for i in inputs {
            put_bytes(&mut g, 11, i);
        }
        for o in outputs {
            let mut v = Vec::new();
            put_bytes(&mut v, 1, o.as_bytes());
            put_bytes(&mut g, 12, &v);
        }
        let mut opset = Vec::new();
        put_varint_field(&mut opset, 2, 18);
        let mut m = Vec::new();
        put_varint_field(&mut m, 1, 9);
        put_bytes(&mut m, 8, &opset);
        put_bytes(&mut m, 7, &g);
        m
    }

    fn ops(model: &[u8]) -> Vec<String> {
        let mut r = Reader::new(model);
        let mut graph = None;
        while let Some((num, field)) = r.next().unwrap() {
            if let (7, Field::Bytes(g)) = (num, field) {
                graph = Some(g);
            }
        }
        Graph::parse(graph.unwrap())
            .unwrap()
            .nodes
            .iter()
            .map(|n| n.op_type.clone())
            .collect()
    }

    #[test]
    fn gather_elements_with_computed_indices_becomes_gather_nd() {
        let m = model(
            &[
                node("Add", &["ids", "one"], &["pos"], &[]),
                node(
                    "GatherElements",
                    &["table", "pos"],
                    &["out"],
                    &[("axis", 1)],
                ),
            ],
            &[init("one", &[], &[1])],
            &[vi("table", 1, &[2, 9]), vi("ids", 7, &[2, 5])],
            &["out"],
        );
        let r = rewrite_for_webnn(&m).unwrap().expect("rewritten");
        assert_eq!(r.applied.len(), 1, "{:?}", r.applied);
        let ops = ops(&r.bytes);
        assert!(!ops.contains(&"GatherElements".to_string()), "{ops:?}");
        assert_eq!(ops.last().map(String::as_str), Some("GatherND"));
        // One CumSum grid for the other axis.
        assert_eq!(ops.iter().filter(|o| *o == "CumSum").count(), 1);
        // The inputs and the opset survive.
        let inputs = crate::onnx_proto::graph_inputs(&r.bytes).unwrap();
        assert_eq!(inputs.len(), 2);
    }

    #[test]
    fn constant_indices_and_unknown_ranks_are_left_alone() {
        let constant = model(
            &[node(
                "GatherElements",
                &["table", "pos"],
                &["out"],
                &[("axis", 0)],
            )],
            &[init("pos", &[2], &[0, 1])],
            &[vi("table", 1, &[3])],
            &["out"],
        );
        assert!(rewrite_for_webnn(&constant).unwrap().is_none());
        let unknown = model(
            &[node(
                "GatherElements",
                &["table", "pos"],
                &["out"],
                &[("axis", 0)],
            )],
            &[],
            &[],
            &["out"],
        );
        assert!(rewrite_for_webnn(&unknown).unwrap().is_none());
        assert!(rewrite_for_webnn(b"").is_err());
    }

    fn masked_scatter_model() -> Vec<u8> {
        model(
            &[
                node("Equal", &["ids", "image"], &["eq"], &[]),
                node("Unsqueeze", &["eq", "last"], &["mask1"], &[]),
                node("Shape", &["embeds"], &["shape"], &[]),
                node("Expand", &["mask1", "shape"], &["mask"], &[]),
                node("NonZero", &["mask"], &["nz"], &[]),
                node("Transpose", &["nz"], &["coords"], &[]),
                node("Reshape", &["features", "last"], &["flat"], &[]),
                node("Shape", &["coords"], &["cshape"], &[]),
                node("Gather", &["cshape", "zero1"], &["count"], &[("axis", 0)]),
                node("Slice", &["flat", "zero1", "count", "zero1"], &["upd"], &[]),
                node("ScatterND", &["embeds", "coords", "upd"], &["merged"], &[]),
            ],
            &[
                init("image", &[], &[5]),
                init("last", &[1], &[-1]),
                init("zero", &[], &[0]),
                init("zero1", &[1], &[0]),
            ],
            &[
                vi("ids", 7, &[1, 6]),
                vi("embeds", 1, &[1, 6, 4]),
                vi("features", 1, &[3, 4]),
            ],
            &["merged"],
        )
    }

    #[test]
    fn masked_scatter_becomes_static_and_the_nonzero_chain_goes() {
        let r = rewrite_for_webnn(&masked_scatter_model())
            .unwrap()
            .expect("rewritten");
        let ops = ops(&r.bytes);
        for gone in ["NonZero", "Transpose", "ScatterND", "Slice"] {
            assert!(!ops.contains(&gone.to_string()), "{gone} left: {ops:?}");
        }
        assert!(ops.contains(&"CumSum".to_string()) && ops.contains(&"Where".to_string()));
    }

    /// GatherElements over computed indices (negative ones too) along both axes; without
    /// `known_ranks` it gathers from tensors whose ranks only ONNX Runtime's shape inference
    /// knows, which the rewrite leaves for WebNN to reject.
    fn gather_model(known_ranks: bool) -> Vec<u8> {
        let (data, idx) = if known_ranks {
            ("x", "i")
        } else {
            ("xs", "is")
        };
        model(
            &[
                node("Add", &["x", "fzero"], &["xs"], &[]),
                node("Add", &["i", "izero"], &["is"], &[]),
                node("Sub", &[idx, "two"], &["shifted"], &[]),
                node(
                    "GatherElements",
                    &[data, "shifted"],
                    &["along1"],
                    &[("axis", 1)],
                ),
                node("Min", &[idx, "two"], &["rows"], &[]),
                node(
                    "GatherElements",
                    &[data, "rows"],
                    &["along0"],
                    &[("axis", -2)],
                ),
            ],
            &[init("izero", &[], &[0]), init("two", &[], &[2]), {
                let mut t = Vec::new();
                put_varint_field(&mut t, 2, 1); // float
                put_bytes(&mut t, 8, b"fzero");
                put_bytes(&mut t, 9, &0f32.to_le_bytes());
                t
            }],
            &[vi("x", 1, &[3, 5]), vi("i", 7, &[3, 5])],
            &["along1", "along0"],
        )
    }

    /// The browser and onnxruntime-web, or `None` (the test is skipped) when not installed.
    fn browser(test: &str) -> Option<std::sync::Arc<crate::Browser>> {
        if let Err(e) = crate::discover::find_browser().and(crate::discover::find_ort_web()) {
            if std::env::var("IPFS_ACCELERATE_REQUIRE_BROWSER").as_deref() == Ok("1") {
                panic!("{test}: {e}");
            }
            eprintln!("skipped {test}: {e}");
            return None;
        }
        Some(std::sync::Arc::new(
            crate::Browser::launch(&crate::BrowserOptions {
                call_timeout: std::time::Duration::from_secs(120),
                ..Default::default()
            })
            .unwrap(),
        ))
    }

    fn run(
        browser: &std::sync::Arc<crate::Browser>,
        model: &[u8],
        provider: ipfs_accelerate_core::BrowserProvider,
        inputs: &ipfs_accelerate_core::TensorMap,
    ) -> Result<(ipfs_accelerate_core::TensorMap, crate::BrowserGraph), crate::BrowserError> {
        let file = tempfile::Builder::new().suffix(".onnx").tempfile().unwrap();
        std::fs::write(file.path(), model).unwrap();
        let graph = crate::BrowserGraph::load(
            std::sync::Arc::clone(browser),
            file.path(),
            provider,
            crate::GraphOptions {
                require_full_placement: matches!(
                    provider,
                    ipfs_accelerate_core::BrowserProvider::WebNn(_)
                ),
            },
        )?;
        Ok((graph.run(inputs)?, graph))
    }

    #[test]
    fn rewritten_graphs_match_the_originals_in_the_browser() {
        use ipfs_accelerate_core::{BrowserProvider, HostTensor, TensorMap, WebNnDevice};
        let Some(browser) = browser("rewritten_graphs_match_the_originals_in_the_browser") else {
            return;
        };
        let webnn = BrowserProvider::WebNn(WebNnDevice::Cpu);
        let mut inputs = TensorMap::new();
        let x: Vec<f32> = (0..15).map(|v| v as f32 * 0.5 - 3.0).collect();
        inputs.insert("x".into(), HostTensor::from_f32(vec![3, 5], &x).unwrap());
        // Minus two gives indices in -2..=2: negative ones count from the end.
        let i = [0, 1, 2, 3, 4, 0, 2, 4, 1, 3, 3, 1, 0, 0, 2];
        inputs.insert("i".into(), HostTensor::from_i64(vec![3, 5], &i).unwrap());
        let model = gather_model(true);
        let (want, _) = run(&browser, &model, BrowserProvider::Wasm, &inputs).unwrap();
        let (got, graph) = run(&browser, &model, webnn, &inputs).unwrap();
        assert_eq!(graph.rewrites().len(), 2, "{:?}", graph.rewrites());
        assert!(graph.fully_placed(), "{:?}", graph.placement());
        for name in ["along1", "along0"] {
            assert_eq!(got[name].shape(), want[name].shape(), "{name}");
            assert_eq!(got[name].to_f32_vec(), want[name].to_f32_vec(), "{name}");
        }
        // Row 0 of along1: x[0][i - 2] with -2, -1 wrapping to 3, 4.
        assert_eq!(&want["along1"].to_f32_vec()[..4], &[-1.5, -1.0, -3.0, -2.5]);

        let mut inputs = TensorMap::new();
        let ids = [3, 5, 5, 4, 5, 1];
        inputs.insert(
            "ids".into(),
            HostTensor::from_i64(vec![1, 6], &ids).unwrap(),
        );
        let embeds: Vec<f32> = (0..24).map(|v| v as f32).collect();
        inputs.insert(
            "embeds".into(),
            HostTensor::from_f32(vec![1, 6, 4], &embeds).unwrap(),
        );
        let features: Vec<f32> = (0..12).map(|v| -1.0 - v as f32).collect();
        inputs.insert(
            "features".into(),
            HostTensor::from_f32(vec![3, 4], &features).unwrap(),
        );
        let model = masked_scatter_model();
        let (want, _) = run(&browser, &model, BrowserProvider::Wasm, &inputs).unwrap();
        let (got, graph) = run(&browser, &model, webnn, &inputs).unwrap();
        assert_eq!(graph.rewrites().len(), 1, "{:?}", graph.rewrites());
        assert!(graph.fully_placed(), "{:?}", graph.placement());
        assert_eq!(got["merged"].to_f32_vec(), want["merged"].to_f32_vec());
        // Image tokens at positions 1, 2, 4 take feature rows 0, 1, 2.
        assert_eq!(
            &want["merged"].to_f32_vec()[4..8],
            &[-1.0, -2.0, -3.0, -4.0]
        );
        assert_eq!(
            &want["merged"].to_f32_vec()[16..20],
            &[-9.0, -10.0, -11.0, -12.0]
        );
    }

    #[test]
    fn a_graph_webnn_cannot_build_fails_fast_with_a_typed_error() {
        use ipfs_accelerate_core::{BrowserProvider, HostTensor, TensorMap, WebNnDevice};
        let test = "a_graph_webnn_cannot_build_fails_fast_with_a_typed_error";
        let Some(browser) = browser(test) else {
            return;
        };
        let model = gather_model(false);
        assert!(rewrite_for_webnn(&model).unwrap().is_none());
        let mut inputs = TensorMap::new();
        inputs.insert(
            "x".into(),
            HostTensor::from_f32(vec![3, 5], &[0.0; 15]).unwrap(),
        );
        inputs.insert(
            "i".into(),
            HostTensor::from_i64(vec![3, 5], &[2; 15]).unwrap(),
        );
        let started = std::time::Instant::now();
        let webnn = BrowserProvider::WebNn(WebNnDevice::Cpu);
        let err = run(&browser, &model, webnn, &inputs).unwrap_err();
        match &err {
            crate::BrowserError::GraphBuild { reason, model, .. } => {
                assert!(reason.contains("gatherElements"), "{reason}");
                assert!(model.ends_with(".onnx"), "{model}");
            }
            other => panic!("{test}: {other}"),
        }
        assert!(started.elapsed().as_secs() < 60, "{:?}", started.elapsed());
        // The page goes on serving other graphs.
        let (out, _) = run(&browser, &gather_model(true), webnn, &inputs).unwrap();
        assert_eq!(out["along1"].to_f32_vec(), vec![0.0; 15]);
    }
}
