//! An [`EncoderSpec`] run by its f64 reference ([`EncoderSpec::reference_forward`]) behind the
//! [`ModelRunner`] interface, with HF's input and output names: checks that a family's spec
//! computes its fixtures' outputs, without the engine that runs it on a GPU.

use ipfs_accelerate_core::{
    BackendKind, EncoderHead, EncoderInput, EncoderSpec, Error, HostTensor, ModelRunner,
    ReferenceInput, ReferenceOutput, Result, TensorMap, TokenBatch,
};

/// A spec executed by its reference; outputs in f32 (`last_hidden_state`, `pooler_output`,
/// `logits` or `start_logits` / `end_logits`, and the projection's output name).
pub struct SpecReference {
    spec: EncoderSpec,
}

impl SpecReference {
    /// Wraps a spec (validated).
    pub fn new(spec: EncoderSpec) -> Result<Self> {
        spec.validate()?;
        Ok(SpecReference { spec })
    }
}

/// Asserts that the spec `read` makes of each of `family`'s fixtures, run by its reference,
/// computes the fixture's outputs within its tolerances (every fixture folder found, as
/// [`crate::family_fixtures`] finds them for the test named `test`).
pub fn assert_spec_computes_fixtures(
    test: &str,
    family: &str,
    read: impl Fn(&std::path::Path) -> Result<EncoderSpec>,
) {
    for fixture in crate::family_fixtures(test, family) {
        let runner = SpecReference::new(read(&fixture.dir).unwrap()).unwrap();
        let checks = crate::verify_runner(&fixture, BackendKind::Cpu, &runner).unwrap();
        assert!(!checks.is_empty(), "{}", fixture.variant);
        crate::assert_checks(&checks);
    }
}

/// The float input `name`: its first dimension (the batch) and its values.
fn batched_floats(inputs: &TensorMap, name: &str) -> Result<(usize, Vec<f32>)> {
    let t = inputs
        .get(name)
        .ok_or_else(|| Error::InvalidInput(format!("missing input `{name}`")))?;
    Ok((t.shape().first().copied().unwrap_or(0), t.to_f32_vec()))
}

fn f32_tensor(shape: Vec<usize>, values: &[f64]) -> Result<HostTensor> {
    let v: Vec<f32> = values.iter().map(|&v| v as f32).collect();
    HostTensor::from_f32(shape, &v)
}

impl ModelRunner for SpecReference {
    fn family(&self) -> &str {
        &self.spec.family
    }

    fn backend(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn engine(&self) -> Option<&str> {
        Some("spec-reference")
    }

    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        let s = &self.spec;
        // A float input `[batch, ...]` named `name`, read as `input` makes it, into `tokens` rows.
        let floats = |name: &str,
                      tokens: usize,
                      input: for<'v> fn(usize, &'v [f32]) -> ReferenceInput<'v>|
         -> Result<(ReferenceOutput, usize, usize)> {
            let (batch, values) = batched_floats(inputs, name)?;
            Ok((s.reference_forward(&input(batch, &values))?, batch, tokens))
        };
        let (out, batch, seq) = match &s.input {
            EncoderInput::Tokens(_) => {
                let t = TokenBatch::from_tensors(inputs)?;
                let types = t.optional(inputs, "token_type_ids", 0)?;
                let out = s.reference_forward(&ReferenceInput::Tokens {
                    batch: t.batch,
                    seq: t.seq,
                    ids: &t.input_ids,
                    types: &types,
                    mask: &t.attention_mask,
                })?;
                (out, t.batch, t.seq)
            }
            EncoderInput::Patches(p) => floats("pixel_values", p.tokens(), |batch, values| {
                ReferenceInput::Pixels { batch, values }
            })?,
            EncoderInput::Frames(f) => floats("input_features", f.tokens(), |batch, values| {
                ReferenceInput::Frames { batch, values }
            })?,
            EncoderInput::Rows(r) => floats("inputs_embeds", r.tokens, |batch, values| {
                ReferenceInput::Rows { batch, values }
            })?,
            EncoderInput::Waveform(w) => {
                let (batch, values) = batched_floats(inputs, "input_values")?;
                let tokens = w.tokens(values.len() / batch.max(1));
                let out = s.reference_forward(&ReferenceInput::Samples {
                    batch,
                    values: &values,
                })?;
                (out, batch, tokens)
            }
        };
        let h = s.hidden;
        let mut map = TensorMap::new();
        map.insert(
            "last_hidden_state".into(),
            f32_tensor(vec![batch, seq, h], &out.last_hidden_state)?,
        );
        if let Some(p) = &out.pooler_output {
            let width = p.len() / batch.max(1);
            map.insert("pooler_output".into(), f32_tensor(vec![batch, width], p)?);
        }
        if let (Some(head), Some(l)) = (&s.head, &out.logits) {
            let n = head.dense().out_features;
            match head {
                EncoderHead::FirstToken(_) | EncoderHead::Pooled(_) => {
                    map.insert("logits".into(), f32_tensor(vec![batch, n], l)?);
                }
                EncoderHead::EveryToken(_) | EncoderHead::EveryTokenMlp { .. } => {
                    map.insert("logits".into(), f32_tensor(vec![batch, seq, n], l)?);
                }
                EncoderHead::Span(_) => {
                    let (start, end): (Vec<f64>, Vec<f64>) =
                        l.chunks_exact(2).map(|p| (p[0], p[1])).unzip();
                    map.insert("start_logits".into(), f32_tensor(vec![batch, seq], &start)?);
                    map.insert("end_logits".into(), f32_tensor(vec![batch, seq], &end)?);
                }
            }
        }
        if let (Some(p), Some(v)) = (&s.projection, &out.projection) {
            map.insert(
                p.output.clone(),
                f32_tensor(vec![batch, p.dense.out_features], v)?,
            );
        }
        Ok(map)
    }
}
