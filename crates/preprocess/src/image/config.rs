//! `preprocessor_config.json` of HF image processors.

use std::path::Path;

use serde_json::Value;

use super::anyres::anyres_view_count;
use super::error::{ImageError, ImageResult};
use super::ops::{Normalization, SizeRule};
use super::resize::Resample;
use crate::limits::{Limit, Limits};

/// Which HF image processor a config belongs to; it fixes the defaults of absent fields and the
/// pipeline (plain, DETR padding, LLaVA-NeXT anyres).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessorKind {
    /// `CLIPImageProcessor`: shortest-edge resize, centre crop, CLIP mean / std.
    Clip,
    /// `ViTImageProcessor`: fixed-size resize, ImageNet "standard" mean / std (0.5).
    Vit,
    /// `DetrImageProcessor`: shortest / longest-edge resize, pad to the batch's largest image,
    /// `pixel_mask`.
    Detr,
    /// `LlavaNextImageProcessor`: anyres tiles plus a base view, `image_sizes`.
    LlavaNext,
    /// Any other processor type: only the fields present in the file apply.
    Other,
}

impl ProcessorKind {
    /// The kind named by `image_processor_type` (with or without the `Fast` suffix).
    pub fn from_type_name(name: &str) -> ProcessorKind {
        match name.trim_end_matches("Fast") {
            "CLIPImageProcessor" => ProcessorKind::Clip,
            "ViTImageProcessor" => ProcessorKind::Vit,
            "DetrImageProcessor" => ProcessorKind::Detr,
            "LlavaNextImageProcessor" => ProcessorKind::LlavaNext,
            _ => ProcessorKind::Other,
        }
    }
}

const OPENAI_CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
const OPENAI_CLIP_STD: [f32; 3] = [0.268_629_54, 0.261_302_6, 0.275_777_1];
const IMAGENET_DEFAULT_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
const IMAGENET_DEFAULT_STD: [f32; 3] = [0.229, 0.224, 0.225];
const IMAGENET_STANDARD: [f32; 3] = [0.5, 0.5, 0.5];

/// A resolved image processor configuration: the file's fields over the class defaults of its
/// [`ProcessorKind`].
#[derive(Debug, Clone, PartialEq)]
pub struct ImageProcessorConfig {
    /// The processor class.
    pub kind: ProcessorKind,
    /// Resize at all.
    pub do_resize: bool,
    /// How the resized size is chosen.
    pub size: SizeRule,
    /// Resampling filter.
    pub resample: Resample,
    /// Centre-crop after resizing.
    pub do_center_crop: bool,
    /// `(height, width)` of the crop (and of LLaVA-NeXT's tiles).
    pub crop_size: Option<(usize, usize)>,
    /// Multiply by `rescale_factor`.
    pub do_rescale: bool,
    /// Usually `1/255`.
    pub rescale_factor: f64,
    /// Subtract `image_mean`, divide by `image_std`.
    pub do_normalize: bool,
    /// Per-channel mean.
    pub image_mean: [f32; 3],
    /// Per-channel standard deviation.
    pub image_std: [f32; 3],
    /// Pad the batch (DETR: to the largest image, with `pixel_mask`; LLaVA-NeXT: to the most
    /// tiles).
    pub do_pad: bool,
    /// Fixed `(height, width)` to pad to instead of the batch's largest.
    pub pad_size: Option<(usize, usize)>,
    /// LLaVA-NeXT's candidate `(height, width)` resolutions.
    pub image_grid_pinpoints: Vec<(usize, usize)>,
}

fn bad(origin: &str, reason: impl Into<String>) -> ImageError {
    ImageError::Config {
        origin: origin.to_string(),
        reason: reason.into(),
    }
}

fn positive(origin: &str, key: &str, v: &Value) -> ImageResult<usize> {
    match v.as_u64() {
        Some(n) if n > 0 => {
            usize::try_from(n).map_err(|_| bad(origin, format!("`{key}` is too large")))
        }
        _ => Err(bad(
            origin,
            format!("`{key}` must be a positive integer, got {v}"),
        )),
    }
}

/// HF's `get_size_dict`: an integer, a `[height, width]` list, or a dict with one of the valid key
/// sets.
fn size_rule(
    origin: &str,
    key: &str,
    v: &Value,
    default_to_square: bool,
    max_size: Option<usize>,
) -> ImageResult<SizeRule> {
    let get = |k: &str| v.get(k).map(|x| positive(origin, &format!("{key}.{k}"), x));
    match v {
        Value::Number(_) => {
            let n = positive(origin, key, v)?;
            Ok(match (default_to_square, max_size) {
                (true, _) => SizeRule::Exact {
                    height: n,
                    width: n,
                },
                (false, Some(longest)) => SizeRule::ShortestLongest {
                    shortest: n,
                    longest,
                },
                (false, None) => SizeRule::ShortestEdge(n),
            })
        }
        Value::Array(a) if a.len() == 2 => Ok(SizeRule::Exact {
            height: positive(origin, key, &a[0])?,
            width: positive(origin, key, &a[1])?,
        }),
        Value::Object(m) => {
            let mut keys: Vec<&str> = m.keys().map(String::as_str).collect();
            keys.sort_unstable();
            match keys.as_slice() {
                ["height", "width"] => Ok(SizeRule::Exact {
                    height: get("height").transpose()?.unwrap_or(0),
                    width: get("width").transpose()?.unwrap_or(0),
                }),
                ["shortest_edge"] => Ok(SizeRule::ShortestEdge(
                    get("shortest_edge").transpose()?.unwrap_or(0),
                )),
                ["longest_edge", "shortest_edge"] => Ok(SizeRule::ShortestLongest {
                    shortest: get("shortest_edge").transpose()?.unwrap_or(0),
                    longest: get("longest_edge").transpose()?.unwrap_or(0),
                }),
                ["longest_edge"] => Ok(SizeRule::LongestEdge(
                    get("longest_edge").transpose()?.unwrap_or(0),
                )),
                ["max_height", "max_width"] => Ok(SizeRule::MaxHeightWidth {
                    max_height: get("max_height").transpose()?.unwrap_or(0),
                    max_width: get("max_width").transpose()?.unwrap_or(0),
                }),
                other => Err(bad(
                    origin,
                    format!("`{key}` has keys {other:?}; expected height/width, shortest_edge, shortest_edge/longest_edge, longest_edge or max_height/max_width"),
                )),
            }
        }
        other => Err(bad(origin, format!("`{key}` cannot be {other}"))),
    }
}

fn height_width(origin: &str, key: &str, v: &Value) -> ImageResult<(usize, usize)> {
    match size_rule(origin, key, v, true, None)? {
        SizeRule::Exact { height, width } => Ok((height, width)),
        other => Err(bad(
            origin,
            format!("`{key}` must give height and width, got {other:?}"),
        )),
    }
}

fn channels(origin: &str, key: &str, v: &Value) -> ImageResult<[f32; 3]> {
    let num = |x: &Value| {
        x.as_f64()
            .filter(|f| f.is_finite())
            .map(|f| f as f32)
            .ok_or_else(|| bad(origin, format!("`{key}` holds a non-number {x}")))
    };
    match v {
        Value::Number(_) => Ok([num(v)?; 3]),
        Value::Array(a) if a.len() == 1 => Ok([num(&a[0])?; 3]),
        Value::Array(a) if a.len() == 3 => Ok([num(&a[0])?, num(&a[1])?, num(&a[2])?]),
        other => Err(bad(
            origin,
            format!("`{key}` must be a number or 3 numbers, got {other}"),
        )),
    }
}

impl ImageProcessorConfig {
    /// Reads `preprocessor_config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> ImageResult<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ImageError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&text, &path.display().to_string())
    }

    /// Parses config JSON (`origin` names it in errors), filling absent fields with the defaults
    /// of the processor class named by `image_processor_type`.
    pub fn from_json(text: &str, origin: &str) -> ImageResult<Self> {
        let v: Value = serde_json::from_str(text).map_err(|e| bad(origin, e.to_string()))?;
        if !v.is_object() {
            return Err(bad(origin, "not a JSON object"));
        }
        let kind = v
            .get("image_processor_type")
            .and_then(Value::as_str)
            .map(ProcessorKind::from_type_name)
            .unwrap_or(ProcessorKind::Other);
        Self::from_value(&v, kind, origin)
    }

    /// The class defaults of `kind` (what HF uses for fields a config leaves out).
    pub fn defaults(kind: ProcessorKind) -> Self {
        let mut c = ImageProcessorConfig {
            kind,
            do_resize: false,
            size: SizeRule::Exact {
                height: 224,
                width: 224,
            },
            resample: Resample::Bilinear,
            do_center_crop: false,
            crop_size: None,
            do_rescale: false,
            rescale_factor: 1.0 / 255.0,
            do_normalize: false,
            image_mean: IMAGENET_STANDARD,
            image_std: IMAGENET_STANDARD,
            do_pad: false,
            pad_size: None,
            image_grid_pinpoints: Vec::new(),
        };
        match kind {
            ProcessorKind::Clip | ProcessorKind::LlavaNext => {
                c.do_resize = true;
                c.size = SizeRule::ShortestEdge(224);
                c.resample = Resample::Bicubic;
                c.do_center_crop = true;
                c.crop_size = Some((224, 224));
                c.do_rescale = true;
                c.do_normalize = true;
                c.image_mean = OPENAI_CLIP_MEAN;
                c.image_std = OPENAI_CLIP_STD;
                if kind == ProcessorKind::LlavaNext {
                    c.do_pad = true;
                    c.image_grid_pinpoints =
                        vec![(336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008)];
                }
            }
            ProcessorKind::Vit => {
                c.do_resize = true;
                c.do_rescale = true;
                c.do_normalize = true;
            }
            ProcessorKind::Detr => {
                c.do_resize = true;
                c.size = SizeRule::ShortestLongest {
                    shortest: 800,
                    longest: 1333,
                };
                c.do_rescale = true;
                c.do_normalize = true;
                c.do_pad = true;
                c.image_mean = IMAGENET_DEFAULT_MEAN;
                c.image_std = IMAGENET_DEFAULT_STD;
            }
            ProcessorKind::Other => {}
        }
        c
    }

    fn from_value(v: &Value, kind: ProcessorKind, origin: &str) -> ImageResult<Self> {
        let mut c = Self::defaults(kind);
        let flag = |key: &str, default: bool| -> ImageResult<bool> {
            match v.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(Value::Bool(b)) => Ok(*b),
                Some(other) => Err(bad(
                    origin,
                    format!("`{key}` must be true or false, got {other}"),
                )),
            }
        };
        let present = |key: &str| v.get(key).filter(|x| !x.is_null());
        c.do_resize = flag("do_resize", c.do_resize)?;
        c.do_center_crop = flag("do_center_crop", c.do_center_crop)?;
        c.do_rescale = flag("do_rescale", c.do_rescale)?;
        c.do_normalize = flag("do_normalize", c.do_normalize)?;
        let legacy_pad = flag("pad_and_return_pixel_mask", c.do_pad)?;
        c.do_pad = flag("do_pad", legacy_pad)?;
        let default_to_square = !matches!(
            kind,
            ProcessorKind::Clip | ProcessorKind::Detr | ProcessorKind::LlavaNext
        );
        if let Some(size) = present("size") {
            // DETR's legacy `max_size` bounds an integer `size` (1333 when absent).
            let max_size = match (kind, present("max_size")) {
                (ProcessorKind::Detr, Some(m)) => Some(positive(origin, "max_size", m)?),
                (ProcessorKind::Detr, None) => Some(1333),
                _ => None,
            };
            c.size = size_rule(origin, "size", size, default_to_square, max_size)?;
        }
        if let Some(r) = present("resample") {
            let id = r
                .as_i64()
                .ok_or_else(|| bad(origin, format!("`resample` must be an integer, got {r}")))?;
            c.resample = Resample::from_pil(id).ok_or_else(|| {
                bad(
                    origin,
                    format!("`resample` {id} is not a PIL filter id (0-5)"),
                )
            })?;
        }
        if let Some(cs) = present("crop_size") {
            c.crop_size = Some(height_width(origin, "crop_size", cs)?);
        }
        if let Some(ps) = present("pad_size") {
            c.pad_size = Some(height_width(origin, "pad_size", ps)?);
        }
        if let Some(f) = present("rescale_factor") {
            c.rescale_factor = f
                .as_f64()
                .filter(|f| f.is_finite() && *f != 0.0)
                .ok_or_else(|| {
                    bad(
                        origin,
                        format!("`rescale_factor` must be a non-zero number, got {f}"),
                    )
                })?;
        }
        if let Some(m) = present("image_mean") {
            c.image_mean = channels(origin, "image_mean", m)?;
        }
        if let Some(s) = present("image_std") {
            c.image_std = channels(origin, "image_std", s)?;
        }
        if c.do_normalize && c.image_std.contains(&0.0) {
            return Err(bad(origin, "`image_std` has a zero entry"));
        }
        if let Some(p) = present("image_grid_pinpoints") {
            let list = p
                .as_array()
                .ok_or_else(|| bad(origin, "`image_grid_pinpoints` must be a list"))?;
            c.image_grid_pinpoints = list
                .iter()
                .map(|r| match r.as_array().map(Vec::as_slice) {
                    Some([h, w]) => Ok((
                        positive(origin, "image_grid_pinpoints", h)?,
                        positive(origin, "image_grid_pinpoints", w)?,
                    )),
                    _ => Err(bad(
                        origin,
                        format!("`image_grid_pinpoints` entry {r} is not [height, width]"),
                    )),
                })
                .collect::<ImageResult<_>>()?;
        }
        if c.do_center_crop && c.crop_size.is_none() {
            return Err(bad(
                origin,
                "`do_center_crop` is set but `crop_size` is absent",
            ));
        }
        if kind == ProcessorKind::LlavaNext && c.image_grid_pinpoints.is_empty() {
            return Err(bad(origin, "`image_grid_pinpoints` is empty"));
        }
        c.check_limits(&Limits::current(), origin)?;
        Ok(c)
    }

    /// LLaVA-NeXT's `(base view size, tile side)`: the base view is `size` (a square of
    /// `shortest_edge`), tiles are `crop_size`'s height (else the base view's).
    pub fn anyres_base_and_tile(&self) -> ImageResult<((usize, usize), usize)> {
        let base = match self.size {
            SizeRule::Exact { height, width } => (height, width),
            SizeRule::ShortestEdge(s) | SizeRule::ShortestLongest { shortest: s, .. } => (s, s),
            other => {
                return Err(ImageError::InvalidInput(format!(
                    "LLaVA-NeXT needs size as height/width or shortest_edge, got {other:?}"
                )))
            }
        };
        let tile = match (self.crop_size, self.size) {
            (Some((h, _)), _) => h,
            (None, SizeRule::Exact { height, .. }) => height,
            (None, _) => base.0,
        };
        Ok((base, tile))
    }

    /// Checks every size the config sets against `limits` (`origin` names the config in
    /// errors): resize, crop and pad targets and grid pinpoints within
    /// [`Limits::max_output_side`] / [`Limits::max_output_pixels`], LLaVA-NeXT's tiles per
    /// pinpoint within [`Limits::max_anyres_views`].
    pub fn check_limits(&self, limits: &Limits, origin: &str) -> ImageResult<()> {
        let side = |key: &str, v: usize| {
            limits.check(
                Limit::OutputSide,
                || format!("{origin}: `{key}`"),
                v as u128,
            )
        };
        let area = |key: &str, (h, w): (usize, usize)| {
            side(&format!("{key}.height"), h)?;
            side(&format!("{key}.width"), w)?;
            limits.check(
                Limit::OutputPixels,
                || format!("{origin}: `{key}` {w}x{h}"),
                h as u128 * w as u128,
            )
        };
        match self.size {
            SizeRule::Exact { height, width } => area("size", (height, width))?,
            SizeRule::ShortestEdge(s) => side("size.shortest_edge", s)?,
            SizeRule::ShortestLongest { shortest, longest } => {
                side("size.shortest_edge", shortest)?;
                side("size.longest_edge", longest)?;
            }
            SizeRule::LongestEdge(l) => side("size.longest_edge", l)?,
            SizeRule::MaxHeightWidth {
                max_height,
                max_width,
            } => area("size", (max_height, max_width))?,
        }
        if let Some(crop) = self.crop_size {
            area("crop_size", crop)?;
        }
        if let Some(pad) = self.pad_size {
            area("pad_size", pad)?;
        }
        for &p in &self.image_grid_pinpoints {
            area("image_grid_pinpoints", p)?;
        }
        if self.kind == ProcessorKind::LlavaNext {
            let (base, tile) = self.anyres_base_and_tile()?;
            area("size", base)?;
            if tile == 0 {
                return Err(bad(origin, "the anyres tile size is 0"));
            }
            for &p in &self.image_grid_pinpoints {
                limits.check(
                    Limit::AnyresViews,
                    || format!("{origin}: views of pinpoint {p:?} in {tile}-pixel tiles"),
                    anyres_view_count(p, tile),
                )?;
            }
        }
        Ok(())
    }

    /// The rescale / normalise step this config asks for.
    pub fn normalization(&self) -> Normalization {
        Normalization {
            rescale: self.do_rescale.then_some(self.rescale_factor),
            mean_std: self
                .do_normalize
                .then_some((self.image_mean, self.image_std)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_defaults_fill_absent_fields() {
        let c = ImageProcessorConfig::from_json(
            r#"{"image_processor_type": "CLIPImageProcessor", "size": 64}"#,
            "t",
        )
        .unwrap();
        assert_eq!(c.size, SizeRule::ShortestEdge(64));
        assert_eq!(c.crop_size, Some((224, 224)));
        assert_eq!(c.resample, Resample::Bicubic);
        let v = ImageProcessorConfig::from_json(
            r#"{"image_processor_type": "ViTImageProcessor", "size": 64}"#,
            "t",
        )
        .unwrap();
        assert_eq!(
            v.size,
            SizeRule::Exact {
                height: 64,
                width: 64
            }
        );
        let d = ImageProcessorConfig::from_json(
            r#"{"image_processor_type": "DetrImageProcessor", "size": 600}"#,
            "t",
        )
        .unwrap();
        assert_eq!(
            d.size,
            SizeRule::ShortestLongest {
                shortest: 600,
                longest: 1333
            }
        );
    }

    #[test]
    fn invalid_configs_are_typed_errors() {
        for bad in [
            "[]",
            "{",
            r#"{"size": {"shortest_edge": 0}}"#,
            r#"{"size": {"foo": 3}}"#,
            r#"{"resample": 9}"#,
            r#"{"do_normalize": true, "image_std": [0.5, 0, 0.5]}"#,
            r#"{"image_mean": [1, 2]}"#,
            r#"{"do_center_crop": true}"#,
            r#"{"image_processor_type": "LlavaNextImageProcessor", "image_grid_pinpoints": [[3]]}"#,
            r#"{"do_resize": "yes"}"#,
        ] {
            let e = ImageProcessorConfig::from_json(bad, "t");
            assert!(matches!(e, Err(ImageError::Config { .. })), "{bad}: {e:?}");
        }
    }
}
