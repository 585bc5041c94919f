//! Pulling named, shape-checked weights out of a [`TensorSource`] onto a burn device.

use std::sync::Arc;

use burn::tensor::{backend::Backend, Tensor, TensorData};
use ipfs_accelerate_core::{DType, Error, HostTensor, Result, TensorSource};

use crate::ggml::GgmlWeight;
use crate::quant::LinearWeight;
use crate::weights::{Kind, LoadContext, LoadedWeights};
use crate::WeightQuantization;

/// A cursor into a weight source: a name prefix plus the device tensors are created on.
/// `vb.pp("encoder").pp("layer.0").tensor("attention.self.query.weight", [h, h])`.
///
/// A root builder made inside [`weights::load_scope`](crate::weights::load_scope) takes the
/// scope's quantization and sharing settings; sub-builders ([`VarBuilder::pp`]) inherit the
/// quantization and share one [`LoadedWeights`] record.
pub struct VarBuilder<B: Backend> {
    source: Arc<dyn TensorSource>,
    prefix: String,
    device: B::Device,
    quantization: WeightQuantization,
    load: Arc<LoadContext>,
}

impl<B: Backend> Clone for VarBuilder<B> {
    fn clone(&self) -> Self {
        VarBuilder {
            source: self.source.clone(),
            prefix: self.prefix.clone(),
            device: self.device.clone(),
            quantization: self.quantization,
            load: self.load.clone(),
        }
    }
}

impl<B: Backend> VarBuilder<B> {
    /// A builder at the root of `source` (with the enclosing load scope's settings, if any).
    pub fn new(source: Arc<dyn TensorSource>, device: &B::Device) -> Self {
        let (quantization, load) = LoadContext::current();
        VarBuilder {
            source,
            prefix: String::new(),
            device: device.clone(),
            quantization,
            load,
        }
    }

    /// A builder one level down (`prefix.name`).
    pub fn pp(&self, name: impl AsRef<str>) -> Self {
        VarBuilder {
            prefix: self.path(name.as_ref()),
            ..self.clone()
        }
    }

    /// This builder with linear layers' weights kept as `q` (inherited by its sub-builders).
    pub fn with_quantization(mut self, q: WeightQuantization) -> Self {
        self.quantization = q;
        self
    }

    /// How [`Linear::load`](crate::Linear::load) keeps the weights it loads through this builder.
    pub fn quantization(&self) -> WeightQuantization {
        self.quantization
    }

    /// What the loads through this builder (and every builder of the same root or load scope)
    /// hold so far.
    pub fn weights(&self) -> LoadedWeights {
        self.load.weights().clone()
    }

    /// The device tensors are created on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// The full tensor name for `name` under this prefix.
    pub fn path(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else if name.is_empty() {
            self.prefix.clone()
        } else {
            format!("{}.{}", self.prefix, name)
        }
    }

    /// Whether `name` exists under this prefix.
    pub fn contains(&self, name: &str) -> bool {
        self.source.contains(&self.path(name))
    }

    /// The stored shape of `name`, if present.
    pub fn shape_of(&self, name: &str) -> Option<Vec<usize>> {
        self.source.shape_of(&self.path(name))
    }

    /// Loads `name` as float32, checking it has exactly `shape`.
    pub fn tensor<const D: usize>(&self, name: &str, shape: [usize; D]) -> Result<Tensor<B, D>> {
        let full = self.path(name);
        self.load.fetch::<B, Tensor<B, D>>(
            self.source.as_ref(),
            &full,
            &shape,
            "f32",
            &self.device,
            Kind::Tensor,
            || self.host(&full, &shape),
            |host| {
                let data = TensorData::new(host.to_f32_vec(), shape);
                Ok(Tensor::from_data(data, &self.device))
            },
        )
    }

    /// Loads the linear weight `name` (PyTorch's `[out_dim, in_dim]`) kept as
    /// [`VarBuilder::quantization`] asks; float when the in-features are not a multiple of the
    /// block size ([`WeightQuantization::fits`]; counted in [`crate::weights::WeightStats`]).
    /// With no quantization asked, a weight the source stores as ggml blocks is kept as those
    /// blocks on the CPU backend (precedence: a calibration, then the asked quantization, then
    /// the file's blocks, then f32; see [`crate::ggml`]).
    pub fn linear_weight(
        &self,
        name: &str,
        in_dim: usize,
        out_dim: usize,
    ) -> Result<LinearWeight<B>> {
        let full = self.path(name);
        let asked = self.quantization;
        asked.validate()?;
        let f32_bytes = (out_dim as u64)
            .saturating_mul(in_dim as u64)
            .saturating_mul(4);
        if asked == WeightQuantization::None {
            let kind = || Kind::Linear {
                name: full.clone(),
                f32_bytes,
                kept_float: false,
            };
            if let Some(w) = self.ggml_weight(&full, [out_dim, in_dim], kind)? {
                return Ok(w);
            }
        }
        let fitted = asked.fitted(in_dim);
        let q = if fitted.fits(in_dim) {
            fitted
        } else {
            WeightQuantization::None
        };
        let form = match q {
            WeightQuantization::None if crate::fast::bf16_linears::<B>() => "linear-bf16".into(),
            WeightQuantization::None => "linear-f32".to_string(),
            WeightQuantization::Int8 { block_size } => format!("linear-int8-{block_size}"),
            WeightQuantization::Int4 { block_size } => format!("linear-int4-{block_size}"),
        };
        let shape = [out_dim, in_dim];
        let kind = Kind::Linear {
            name: full.clone(),
            f32_bytes,
            kept_float: q == WeightQuantization::None && asked != WeightQuantization::None,
        };
        self.load.fetch::<B, LinearWeight<B>>(
            self.source.as_ref(),
            &full,
            &shape,
            &form,
            &self.device,
            kind,
            || self.host(&full, &shape),
            |host| LinearWeight::from_out_in(&host.to_f32_vec(), out_dim, in_dim, q, &self.device),
        )
    }

    /// The table `name` (`[num, dim]`) as its ggml blocks, when the source stores it that way
    /// and the backend runs the CPU kernels (see [`crate::ggml`]); `None` otherwise (load it
    /// with [`tensor`](Self::tensor)). Whatever the quantization asked for linear layers.
    pub fn ggml_table(
        &self,
        name: &str,
        num: usize,
        dim: usize,
    ) -> Result<Option<LinearWeight<B>>> {
        self.ggml_weight(&self.path(name), [num, dim], || Kind::Tensor)
    }

    /// `full` (`shape` `[rows, cols]`) kept as the ggml blocks the source hands over, when it
    /// does and `B` runs the CPU kernels. The load's registry entry holds the raw bytes (`u8`).
    fn ggml_weight(
        &self,
        full: &str,
        shape: [usize; 2],
        kind: impl FnOnce() -> Kind,
    ) -> Result<Option<LinearWeight<B>>> {
        if !crate::fast::ggml_kernel::<B>() {
            return Ok(None);
        }
        let Some(blocks) = self.source.quantized_blocks_shaped(full, shape)? else {
            return Ok(None);
        };
        if blocks.shape != shape {
            return Err(Error::ShapeMismatch {
                name: full.to_string(),
                expected: shape.to_vec(),
                actual: blocks.shape.to_vec(),
            });
        }
        let weight = GgmlWeight::new(full, blocks)?;
        let form = format!("ggml-{}", weight.ty());
        let raw = weight.data().clone();
        self.load
            .fetch::<B, LinearWeight<B>>(
                self.source.as_ref(),
                full,
                &shape,
                &form,
                &self.device,
                kind(),
                || HostTensor::from_bytes(full, vec![raw.len()], DType::U8, raw),
                |_| Ok(LinearWeight::from_ggml(weight, &self.device)),
            )
            .map(Some)
    }

    /// The host copy of `full`, checked to be a float tensor of exactly `shape`, as f32.
    fn host(&self, full: &str, shape: &[usize]) -> Result<HostTensor> {
        let host = self.source.tensor_shaped(full, shape)?;
        if host.shape() != shape {
            return Err(Error::ShapeMismatch {
                name: full.to_string(),
                expected: shape.to_vec(),
                actual: host.shape().to_vec(),
            });
        }
        if !host.dtype().is_float() {
            return Err(Error::UnsupportedDType {
                name: full.to_string(),
                dtype: host.dtype(),
                context: "is not a float type (weights must be f32, f16, bf16 or int8 blocks with scales)".into(),
            });
        }
        match host.dtype() {
            DType::F32 => Ok(host),
            _ => HostTensor::from_f32(host.shape().to_vec(), &host.to_f32_vec()),
        }
    }

    /// Loads the first of `names` that exists (for checkpoints that spell a tensor differently).
    pub fn tensor_first_of<const D: usize>(
        &self,
        names: &[&str],
        shape: [usize; D],
    ) -> Result<Tensor<B, D>> {
        let found = names.iter().find(|n| self.contains(n)).unwrap_or(&names[0]);
        self.tensor(found, shape)
    }
}
