//! Decoding PNG / JPEG into 8-bit RGB, with the header checked against size bounds first.

use std::io::Cursor;
use std::path::Path;

use ::image::{DynamicImage, ImageDecoder, ImageReader, Limits as Limits_};

use super::error::{ImageError, ImageResult};
use crate::limits::{Limit, LimitExceeded, Limits};

/// An 8-bit RGB image: `height` rows of `width` pixels, channels interleaved (`[h, w, 3]`).
#[derive(Clone, PartialEq, Eq)]
pub struct RgbImage {
    width: usize,
    height: usize,
    data: Vec<u8>,
}

impl std::fmt::Debug for RgbImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RgbImage({}x{})", self.width, self.height)
    }
}

impl RgbImage {
    /// Wraps interleaved RGB bytes (`width * height * 3` of them). Zero-sized images are an error.
    pub fn new(width: usize, height: usize, data: Vec<u8>) -> ImageResult<Self> {
        if width == 0 || height == 0 {
            return Err(ImageError::Empty { width, height });
        }
        let expected = width
            .checked_mul(height)
            .and_then(|n| n.checked_mul(3))
            .ok_or_else(|| ImageError::InvalidInput(format!("{width}x{height} overflows")))?;
        if data.len() != expected {
            return Err(ImageError::InvalidInput(format!(
                "{} bytes do not hold a {width}x{height} RGB image ({expected} needed)",
                data.len()
            )));
        }
        Ok(RgbImage {
            width,
            height,
            data,
        })
    }

    /// Width in pixels.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Height in pixels.
    pub fn height(&self) -> usize {
        self.height
    }

    /// `(height, width)`, the order HF uses for image sizes.
    pub fn size(&self) -> (usize, usize) {
        (self.height, self.width)
    }

    /// The interleaved bytes, row-major.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// The RGB value at column `x`, row `y` (`None` outside the image).
    pub fn pixel(&self, x: usize, y: usize) -> Option<[u8; 3]> {
        if x >= self.width || y >= self.height {
            return None;
        }
        let i = (y * self.width + x) * 3;
        Some([self.data[i], self.data[i + 1], self.data[i + 2]])
    }

    /// Converts any decoded image to RGB the way HF's `convert_to_rgb` does: grey is replicated
    /// into three channels, transparency is composited onto a white background, and 16-bit or
    /// float samples are scaled to 8 bits.
    pub fn from_dynamic(img: DynamicImage) -> ImageResult<Self> {
        let (w, h) = (img.width() as usize, img.height() as usize);
        let data: Vec<u8> = match img {
            DynamicImage::ImageRgb8(b) => b.into_raw(),
            DynamicImage::ImageLuma8(b) => b.into_raw().iter().flat_map(|&v| [v; 3]).collect(),
            DynamicImage::ImageLumaA8(b) => b
                .into_raw()
                .chunks_exact(2)
                .flat_map(|p| [over_white(p[0], p[1]); 3])
                .collect(),
            DynamicImage::ImageRgba8(b) => rgba_over_white(b.as_raw()),
            DynamicImage::ImageLuma16(b) => b.as_raw().iter().flat_map(|&v| [to8(v); 3]).collect(),
            DynamicImage::ImageLumaA16(b) => b
                .as_raw()
                .chunks_exact(2)
                .flat_map(|p| [over_white(to8(p[0]), to8(p[1])); 3])
                .collect(),
            DynamicImage::ImageRgb16(b) => b.as_raw().iter().map(|&v| to8(v)).collect(),
            DynamicImage::ImageRgba16(b) => {
                let v: Vec<u8> = b.as_raw().iter().map(|&v| to8(v)).collect();
                rgba_over_white(&v)
            }
            other => rgba_over_white(other.to_rgba8().as_raw()),
        };
        RgbImage::new(w, h, data)
    }
}

/// 16-bit sample to 8 bits, rounded (`v * 255 / 65535`).
fn to8(v: u16) -> u8 {
    ((v as u32 * 255 + 32767) / 65535) as u8
}

/// One channel composited over white with alpha `a` (PIL's `alpha_composite` onto an opaque
/// white background): `round((c·a + 255·(255 − a)) / 255)`.
fn over_white(c: u8, a: u8) -> u8 {
    let (c, a) = (c as u32, a as u32);
    ((c * a + 255 * (255 - a) + 127) / 255) as u8
}

fn rgba_over_white(rgba: &[u8]) -> Vec<u8> {
    rgba.chunks_exact(4)
        .flat_map(|p| {
            [
                over_white(p[0], p[3]),
                over_white(p[1], p[3]),
                over_white(p[2], p[3]),
            ]
        })
        .collect()
}

/// Bounds an image header must satisfy before any pixel is decoded (see
/// [`Limits::max_image_side`] and [`Limits::max_image_pixels`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Largest accepted width.
    pub max_width: u32,
    /// Largest accepted height.
    pub max_height: u32,
    /// Largest accepted `width * height`.
    pub max_pixels: u64,
}

impl Default for DecodeLimits {
    /// The bounds of [`Limits::default`]: 16384 pixels per side, 8192² = 64 Mi pixels in all.
    fn default() -> Self {
        Limits::default().decode_limits()
    }
}

impl Limits {
    /// The header bounds of image decoding.
    pub fn decode_limits(&self) -> DecodeLimits {
        DecodeLimits {
            max_width: self.max_image_side,
            max_height: self.max_image_side,
            max_pixels: self.max_image_pixels,
        }
    }
}

impl DecodeLimits {
    /// Checks declared header dimensions: zero is [`ImageError::Empty`], past a bound
    /// [`ImageError::TooLarge`].
    pub fn check(&self, width: u32, height: u32) -> ImageResult<()> {
        if width == 0 || height == 0 {
            return Err(ImageError::Empty {
                width: width as usize,
                height: height as usize,
            });
        }
        let pixels = u64::from(width) * u64::from(height);
        let exceeded = if width > self.max_width {
            Some((
                Limit::ImageSide,
                "width",
                u64::from(width),
                u64::from(self.max_width),
            ))
        } else if height > self.max_height {
            Some((
                Limit::ImageSide,
                "height",
                u64::from(height),
                u64::from(self.max_height),
            ))
        } else if pixels > self.max_pixels {
            Some((Limit::ImagePixels, "pixel count", pixels, self.max_pixels))
        } else {
            None
        };
        match exceeded {
            Some((limit, what, value, bound)) => Err(ImageError::TooLarge {
                width: width.into(),
                height: height.into(),
                limit: LimitExceeded {
                    limit,
                    what: format!("the image header's {what}"),
                    value: value.to_string(),
                    bound: bound.to_string(),
                },
            }),
            None => Ok(()),
        }
    }

    fn decoder_limits(&self) -> Limits_ {
        let mut limits = Limits_::default();
        limits.max_image_width = Some(self.max_width);
        limits.max_image_height = Some(self.max_height);
        // Room for the widest decoded form (16-bit RGBA) plus the decoder's own buffers.
        limits.max_alloc = Some(self.max_pixels.saturating_mul(8).saturating_add(64 << 20));
        limits
    }
}

fn decode_error(e: ::image::ImageError, limits: &DecodeLimits, (w, h): (u32, u32)) -> ImageError {
    match e {
        ::image::ImageError::Unsupported(u) => ImageError::UnsupportedFormat(u.to_string()),
        ::image::ImageError::Limits(l) => ImageError::TooLarge {
            width: w.into(),
            height: h.into(),
            limit: LimitExceeded {
                limit: Limit::ImagePixels,
                what: format!("decoding needs more memory than the pixel budget allows ({l})"),
                value: (u64::from(w) * u64::from(h)).to_string(),
                bound: limits.max_pixels.to_string(),
            },
        },
        other => ImageError::Decode(other.to_string()),
    }
}

/// Decodes PNG or JPEG bytes into RGB within the bounds of [`Limits::current`].
pub fn decode_image(bytes: &[u8]) -> ImageResult<RgbImage> {
    decode_image_with_limits(bytes, &Limits::current().decode_limits())
}

/// Decodes PNG or JPEG bytes into RGB. The header's dimensions are checked against `limits`
/// before any pixel is decoded; EXIF orientation is applied (as HF's `load_image` does), then the
/// image is converted with [`RgbImage::from_dynamic`].
pub fn decode_image_with_limits(bytes: &[u8], limits: &DecodeLimits) -> ImageResult<RgbImage> {
    if bytes.is_empty() {
        return Err(ImageError::Decode("no bytes".into()));
    }
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ImageError::Decode(e.to_string()))?;
    let Some(format) = reader.format() else {
        return Err(ImageError::UnsupportedFormat(
            "the bytes are not PNG or JPEG".into(),
        ));
    };
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    // Reading the header needs no pixel buffer: bound only the decoder's allocations here, so that
    // the declared size is reported by `limits.check` with the numbers, then bound the rest.
    let mut header_limits = Limits_::default();
    header_limits.max_alloc = limits.decoder_limits().max_alloc;
    reader.limits(header_limits);
    let mut decoder = reader
        .into_decoder()
        .map_err(|e| decode_error(e, limits, (0, 0)))?;
    let (w, h) = decoder.dimensions();
    limits.check(w, h)?;
    let err = |e| decode_error(e, limits, (w, h));
    decoder.set_limits(limits.decoder_limits()).map_err(err)?;
    let orientation = decoder.orientation().map_err(err)?;
    let mut img = DynamicImage::from_decoder(decoder).map_err(err)?;
    img.apply_orientation(orientation);
    RgbImage::from_dynamic(img)
}

/// Reads and decodes an image file (see [`decode_image`]).
pub fn load_image(path: impl AsRef<Path>) -> ImageResult<RgbImage> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| ImageError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    decode_image(&bytes)
}
