//! Conversions between host tensors and burn tensors.

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use ipfs_accelerate_core::{check_finite, Error, HostTensor, Result, TensorMap};

/// A host tensor (any float or integer dtype) as a float burn tensor of rank `D`.
pub fn float_from_host<B: Backend, const D: usize>(
    t: &HostTensor,
    device: &B::Device,
) -> Result<Tensor<B, D>> {
    let shape = dims::<D>(t)?;
    Ok(Tensor::from_data(
        TensorData::new(t.to_f32_vec(), shape),
        device,
    ))
}

/// An integer host tensor as an Int burn tensor of rank `D`.
pub fn int_from_host<B: Backend, const D: usize>(
    t: &HostTensor,
    device: &B::Device,
) -> Result<Tensor<B, D, Int>> {
    let shape = dims::<D>(t)?;
    Ok(Tensor::from_data(
        TensorData::new(t.to_i64_vec()?, shape),
        device,
    ))
}

/// Integer values as an Int burn tensor.
pub fn int_tensor<B: Backend, const D: usize>(
    values: Vec<i64>,
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, D, Int> {
    Tensor::from_data(TensorData::new(values, shape), device)
}

/// A float burn tensor copied to the host as f32. NaN or infinite values are an
/// [`Error::NonFinite`] (as for [`float_to_vec`]).
pub fn float_to_host<B: Backend, const D: usize>(t: Tensor<B, D>) -> Result<HostTensor> {
    let shape = t.dims().to_vec();
    let data = float_to_vec(t)?;
    HostTensor::from_f32(shape, &data)
}

/// A float burn tensor's values as a flat f32 vector. Every model output reaches the host
/// through here, so NaN or infinite values (NaN weights, an f16 overflow) are an
/// [`Error::NonFinite`] naming the output's shape instead of numbers a caller would trust.
pub fn float_to_vec<B: Backend, const D: usize>(t: Tensor<B, D>) -> Result<Vec<f32>> {
    let shape = t.dims();
    let values = t
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .map_err(|e| Error::Compute(format!("reading a tensor back: {e:?}")))?;
    check_finite(&values, &format!("an output of shape {shape:?}"))?;
    Ok(values)
}

/// One `Vec` per row of a float `[rows, width]` tensor (embeddings or probabilities per input).
pub fn float_rows<B: Backend>(t: Tensor<B, 2>) -> Result<Vec<Vec<f32>>> {
    let [_, width] = t.dims();
    let values = float_to_vec(t)?;
    Ok(values.chunks(width.max(1)).map(<[f32]>::to_vec).collect())
}

/// Named float tensors (of one rank) copied to the host, as a [`TensorMap`] of model outputs.
pub fn float_map<B: Backend, const D: usize>(
    outputs: impl IntoIterator<Item = (&'static str, Tensor<B, D>)>,
) -> Result<TensorMap> {
    outputs
        .into_iter()
        .map(|(name, t)| {
            let host = float_to_host(t).map_err(|e| e.for_output(name))?;
            Ok((name.to_string(), host))
        })
        .collect()
}

/// An Int burn tensor copied to the host as i64.
pub fn int_to_host<B: Backend, const D: usize>(t: Tensor<B, D, Int>) -> Result<HostTensor> {
    let shape = t.dims().to_vec();
    let data = t
        .into_data()
        .convert::<i64>()
        .to_vec::<i64>()
        .map_err(|e| Error::Compute(format!("reading a tensor back: {e:?}")))?;
    HostTensor::from_i64(shape, &data)
}

fn dims<const D: usize>(t: &HostTensor) -> Result<[usize; D]> {
    t.shape().try_into().map_err(|_| {
        Error::InvalidInput(format!(
            "expected a rank-{D} tensor, got shape {:?}",
            t.shape()
        ))
    })
}
