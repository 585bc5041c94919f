//! Pulling named, shape-checked weights out of a [`TensorSource`] onto a burn device.

use std::sync::Arc;

use burn::tensor::{backend::Backend, Tensor, TensorData};
use ipfs_accelerate_core::{Error, Result, TensorSource};

/// A cursor into a weight source: a name prefix plus the device tensors are created on.
/// `vb.pp("encoder").pp("layer.0").tensor("attention.self.query.weight", [h, h])`.
pub struct VarBuilder<B: Backend> {
    source: Arc<dyn TensorSource>,
    prefix: String,
    device: B::Device,
}

impl<B: Backend> Clone for VarBuilder<B> {
    fn clone(&self) -> Self {
        VarBuilder {
            source: self.source.clone(),
            prefix: self.prefix.clone(),
            device: self.device.clone(),
        }
    }
}

impl<B: Backend> VarBuilder<B> {
    /// A builder at the root of `source`.
    pub fn new(source: Arc<dyn TensorSource>, device: &B::Device) -> Self {
        VarBuilder {
            source,
            prefix: String::new(),
            device: device.clone(),
        }
    }

    /// A builder one level down (`prefix.name`).
    pub fn pp(&self, name: impl AsRef<str>) -> Self {
        VarBuilder {
            source: self.source.clone(),
            prefix: self.path(name.as_ref()),
            device: self.device.clone(),
        }
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
        let host = self.source.tensor_shaped(&full, &shape)?;
        if host.shape() != shape {
            return Err(Error::ShapeMismatch {
                name: full,
                expected: shape.to_vec(),
                actual: host.shape().to_vec(),
            });
        }
        if !host.dtype().is_float() {
            return Err(Error::UnsupportedDType {
                name: full,
                dtype: host.dtype(),
                context: "is not a float type (weights must be f32, f16, bf16 or int8 blocks with scales)".into(),
            });
        }
        let data = TensorData::new(host.to_f32_vec(), shape);
        Ok(Tensor::from_data(data, &self.device))
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
