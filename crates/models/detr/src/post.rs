//! `DetrImageProcessor.post_process_object_detection`: class softmax without the no-object class,
//! best class per query, a score threshold, and boxes from relative (cx, cy, w, h) to absolute
//! (x0, y0, x1, y1).

use ipfs_accelerate_core::{Error, HostTensor, Result, TensorMap};

/// One detected object.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Detection {
    /// Class index (into the config's `id2label`).
    pub label_id: usize,
    /// Class name from the config's `id2label` (`LABEL_i` when unnamed).
    pub label: String,
    /// Softmax probability of the class.
    pub score: f32,
    /// (x0, y0, x1, y1): in pixels of the target size when one is given, else relative to the image.
    pub box_xyxy: [f32; 4],
}

/// Post-processes row-major `logits` `[batch, queries, classes + 1]` and `boxes`
/// `[batch, queries, 4]` (cx, cy, w, h in [0, 1]) into per-image detections, in query order,
/// keeping those whose score is above `threshold`. `target_sizes` (one `[height, width]` per
/// image) scales boxes to pixels; `label` names a class index.
pub fn post_process_object_detection(
    logits: &[f32],
    boxes: &[f32],
    [batch, queries, classes]: [usize; 3],
    threshold: f64,
    target_sizes: Option<&[[usize; 2]]>,
    label: &dyn Fn(usize) -> String,
) -> Result<Vec<Vec<Detection>>> {
    if classes < 2 {
        return Err(Error::InvalidInput(format!(
            "logits have {classes} classes: need at least one class plus no-object"
        )));
    }
    if logits.len() != batch * queries * classes || boxes.len() != batch * queries * 4 {
        return Err(Error::InvalidInput(format!(
            "logits ({}) and boxes ({}) do not hold [{batch}, {queries}, {classes}] and [{batch}, {queries}, 4]",
            logits.len(),
            boxes.len()
        )));
    }
    if let Some(sizes) = target_sizes {
        if sizes.len() != batch {
            return Err(Error::InvalidInput(format!(
                "{} target sizes for a batch of {batch} (one (height, width) per image)",
                sizes.len()
            )));
        }
    }
    let mut results = Vec::with_capacity(batch);
    for b in 0..batch {
        let (sx, sy) = match target_sizes {
            Some(s) => (s[b][1] as f64, s[b][0] as f64),
            None => (1.0, 1.0),
        };
        let mut kept = Vec::new();
        for q in 0..queries {
            let row = &logits[(b * queries + q) * classes..(b * queries + q + 1) * classes];
            let max = row
                .iter()
                .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
            let exps: Vec<f64> = row.iter().map(|&v| (f64::from(v) - max).exp()).collect();
            let sum: f64 = exps.iter().sum();
            // argmax over the object classes, first index on ties (torch.max).
            let (label_id, best) = exps[..classes - 1].iter().enumerate().fold(
                (0, f64::NEG_INFINITY),
                |(bi, bv), (i, &v)| {
                    if v > bv {
                        (i, v)
                    } else {
                        (bi, bv)
                    }
                },
            );
            let score = best / sum;
            if score.is_nan() || score <= threshold {
                continue;
            }
            let bx = &boxes[(b * queries + q) * 4..(b * queries + q + 1) * 4];
            let [cx, cy, w, h] = [bx[0], bx[1], bx[2], bx[3]].map(f64::from);
            let box_xyxy = [
                (cx - 0.5 * w) * sx,
                (cy - 0.5 * h) * sy,
                (cx + 0.5 * w) * sx,
                (cy + 0.5 * h) * sy,
            ]
            .map(|v| v as f32);
            kept.push(Detection {
                label_id,
                label: label(label_id),
                score: score as f32,
                box_xyxy,
            });
        }
        results.push(kept);
    }
    Ok(results)
}

/// The score threshold of `post_process_object_detection` when none is given.
pub const DEFAULT_THRESHOLD: f64 = 0.5;

/// The post-processing outputs of the conformance interface from host `logits`
/// `[batch, queries, classes + 1]` and `pred_boxes` `[batch, queries, 4]` (from any backend,
/// ONNX Runtime included), with `threshold` (f64 `[1]`, default [`DEFAULT_THRESHOLD`]) and
/// `target_sizes` (i64 `[batch, 2]`) read from `inputs`: `logits`, `pred_boxes`, and every image's
/// detections in image order as `post_scores` `[n]`, `post_labels` `[n]`, `post_boxes` `[n, 4]`,
/// with `post_counts` `[batch]` giving how many belong to each image.
pub fn post_outputs(
    logits: HostTensor,
    pred_boxes: HostTensor,
    inputs: &TensorMap,
    label: &dyn Fn(usize) -> String,
) -> Result<TensorMap> {
    let threshold = threshold_from(inputs.get("threshold"))?;
    let target_sizes = inputs
        .get("target_sizes")
        .map(target_sizes_from)
        .transpose()?;
    let shape: [usize; 3] = match logits.shape() {
        &[b, q, c] => [b, q, c],
        other => {
            return Err(Error::InvalidInput(format!(
                "logits must be [batch, queries, classes], got {other:?}"
            )))
        }
    };
    let detections = post_process_object_detection(
        &logits.to_f32_vec(),
        &pred_boxes.to_f32_vec(),
        shape,
        threshold,
        target_sizes.as_deref(),
        label,
    )?;
    let mut map = TensorMap::new();
    map.insert("logits".into(), logits);
    map.insert("pred_boxes".into(), pred_boxes);
    let all = detections.iter().flatten();
    let scores: Vec<f32> = all.clone().map(|d| d.score).collect();
    let labels: Vec<i64> = all.clone().map(|d| d.label_id as i64).collect();
    let boxes: Vec<f32> = all.flat_map(|d| d.box_xyxy).collect();
    let counts: Vec<i64> = detections.iter().map(|d| d.len() as i64).collect();
    let n = scores.len();
    map.insert(
        "post_scores".into(),
        HostTensor::from_f32(vec![n], &scores)?,
    );
    map.insert(
        "post_labels".into(),
        HostTensor::from_i64(vec![n], &labels)?,
    );
    map.insert(
        "post_boxes".into(),
        HostTensor::from_f32(vec![n, 4], &boxes)?,
    );
    map.insert(
        "post_counts".into(),
        HostTensor::from_i64(vec![counts.len()], &counts)?,
    );
    Ok(map)
}

/// `target_sizes` `[n, 2]` (height, width) from a host tensor.
fn target_sizes_from(t: &HostTensor) -> Result<Vec<[usize; 2]>> {
    let values = t.to_i64_vec()?;
    if t.shape().len() != 2 || t.shape()[1] != 2 {
        return Err(Error::InvalidInput(format!(
            "target_sizes must be [images, 2] (height, width), got {:?}",
            t.shape()
        )));
    }
    values
        .chunks(2)
        .map(
            |hw| match (usize::try_from(hw[0]), usize::try_from(hw[1])) {
                (Ok(h), Ok(w)) => Ok([h, w]),
                _ => Err(Error::InvalidInput(format!(
                    "target size {hw:?} is negative"
                ))),
            },
        )
        .collect()
}

/// The `threshold` input (`[1]`), [`DEFAULT_THRESHOLD`] when absent.
fn threshold_from(t: Option<&HostTensor>) -> Result<f64> {
    match t {
        None => Ok(DEFAULT_THRESHOLD),
        Some(t) => match t.to_f64_vec().as_slice() {
            [v] if v.is_finite() => Ok(*v),
            other => Err(Error::InvalidInput(format!(
                "threshold must be one finite number, got {other:?}"
            ))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_threshold_and_boxes() {
        // One image, two queries, two classes + no-object.
        let logits = [2.0, 0.0, 0.0, 0.0, 0.0, 5.0];
        let boxes = [0.5, 0.5, 0.2, 0.4, 0.1, 0.1, 0.1, 0.1];
        let name = |i: usize| format!("c{i}");
        let out = post_process_object_detection(
            &logits,
            &boxes,
            [1, 2, 3],
            0.5,
            Some(&[[100, 200]]),
            &name,
        )
        .unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].len(), 1, "the second query is no-object");
        let d = &out[0][0];
        let e = 2f64.exp();
        let want = e / (e + 2.0);
        assert_eq!((d.label_id, d.label.as_str()), (0, "c0"));
        assert!((f64::from(d.score) - want).abs() < 1e-6);
        let want_box = [80.0, 30.0, 120.0, 70.0];
        for (g, w) in d.box_xyxy.iter().zip(want_box) {
            assert!((g - w).abs() < 1e-4, "{g} vs {w}");
        }
        // A wrong number of target sizes is an error.
        assert!(
            post_process_object_detection(&logits, &boxes, [1, 2, 3], 0.5, Some(&[]), &name)
                .is_err()
        );
    }
}
