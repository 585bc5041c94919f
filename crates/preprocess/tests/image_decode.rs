//! Decoding edge cases: every bad image is a typed error, every odd but valid one is converted.

use std::io::Cursor;

use ::image::{DynamicImage, ImageBuffer, ImageFormat, Luma, LumaA, Rgb, Rgba};
use ipfs_accelerate_preprocess::image::{
    decode_image, decode_image_with_limits, DecodeLimits, ImageError, ImageProcessor,
    ImageProcessorConfig, RgbImage,
};

fn png(img: DynamicImage) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, ImageFormat::Png).unwrap();
    out.into_inner()
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A valid PNG whose IHDR is rewritten to declare `width × height` (with a correct CRC).
fn png_declaring(width: u32, height: u32) -> Vec<u8> {
    let mut bytes = png(DynamicImage::ImageRgb8(ImageBuffer::from_pixel(
        2,
        2,
        Rgb([1u8, 2, 3]),
    )));
    // Signature (8) + length (4) + "IHDR" (4), then width and height.
    bytes[16..20].copy_from_slice(&width.to_be_bytes());
    bytes[20..24].copy_from_slice(&height.to_be_bytes());
    let crc = crc32(&bytes[12..29]);
    bytes[29..33].copy_from_slice(&crc.to_be_bytes());
    bytes
}

#[test]
fn rgb_png_round_trips() {
    let src = ImageBuffer::from_fn(3, 2, |x, y| Rgb([x as u8 * 10, y as u8 * 20, 7]));
    let img = decode_image(&png(DynamicImage::ImageRgb8(src))).unwrap();
    assert_eq!((img.width(), img.height()), (3, 2));
    assert_eq!(img.pixel(2, 1), Some([20, 20, 7]));
}

#[test]
fn grayscale_is_replicated() {
    let src = ImageBuffer::from_fn(2, 2, |x, _| Luma([x as u8 * 100 + 5]));
    let img = decode_image(&png(DynamicImage::ImageLuma8(src))).unwrap();
    assert_eq!(img.pixel(1, 0), Some([105, 105, 105]));
}

#[test]
fn sixteen_bit_is_scaled_to_eight() {
    let src = ImageBuffer::from_fn(2, 1, |x, _| {
        Luma([if x == 0 { 65535u16 } else { 257 * 100 }])
    });
    let img = decode_image(&png(DynamicImage::ImageLuma16(src))).unwrap();
    assert_eq!(img.pixel(0, 0), Some([255, 255, 255]));
    assert_eq!(img.pixel(1, 0), Some([100, 100, 100]));
    let rgb16 = ImageBuffer::from_pixel(1, 1, Rgb([0u16, 32896, 65535]));
    let img = decode_image(&png(DynamicImage::ImageRgb16(rgb16))).unwrap();
    assert_eq!(img.pixel(0, 0), Some([0, 128, 255]));
}

#[test]
fn transparency_is_composited_on_white() {
    let src = ImageBuffer::from_fn(2, 1, |x, _| {
        if x == 0 {
            Rgba([0u8, 0, 0, 0])
        } else {
            Rgba([10, 20, 30, 255])
        }
    });
    let img = decode_image(&png(DynamicImage::ImageRgba8(src))).unwrap();
    assert_eq!(img.pixel(0, 0), Some([255, 255, 255]));
    assert_eq!(img.pixel(1, 0), Some([10, 20, 30]));
    let half = ImageBuffer::from_pixel(1, 1, LumaA([0u8, 128]));
    let img = decode_image(&png(DynamicImage::ImageLumaA8(half))).unwrap();
    assert_eq!(img.pixel(0, 0), Some([127, 127, 127]));
}

#[test]
fn jpeg_decodes() {
    let src = ImageBuffer::from_pixel(8, 8, Rgb([200u8, 100, 50]));
    let mut out = Cursor::new(Vec::new());
    DynamicImage::ImageRgb8(src)
        .write_to(&mut out, ImageFormat::Jpeg)
        .unwrap();
    let img = decode_image(&out.into_inner()).unwrap();
    let [r, g, b] = img.pixel(4, 4).unwrap();
    assert!(r.abs_diff(200) <= 3 && g.abs_diff(100) <= 3 && b.abs_diff(50) <= 3);
}

#[test]
fn truncated_png_is_a_decode_error() {
    let bytes = png(DynamicImage::ImageRgb8(ImageBuffer::from_fn(
        16,
        16,
        |x, y| Rgb([x as u8, y as u8, 0]),
    )));
    let cut = &bytes[..bytes.len() / 2];
    assert!(matches!(decode_image(cut), Err(ImageError::Decode(_))));
    assert!(matches!(
        decode_image(&bytes[..20]),
        Err(ImageError::Decode(_))
    ));
}

#[test]
fn garbage_and_empty_bytes_are_errors() {
    assert!(matches!(
        decode_image(b"definitely not an image"),
        Err(ImageError::UnsupportedFormat(_))
    ));
    assert!(matches!(decode_image(&[]), Err(ImageError::Decode(_))));
}

#[test]
fn zero_size_is_an_error() {
    let e = decode_image(&png_declaring(0, 5));
    assert!(
        matches!(
            e,
            Err(ImageError::Empty { .. }) | Err(ImageError::Decode(_))
        ),
        "{e:?}"
    );
    assert!(matches!(
        RgbImage::new(0, 3, vec![]),
        Err(ImageError::Empty { .. })
    ));
}

#[test]
fn huge_dimensions_are_refused_from_the_header() {
    // 100k × 100k would need 30 GB: refused before any pixel is decoded.
    let e = decode_image(&png_declaring(100_000, 100_000));
    assert!(matches!(e, Err(ImageError::TooLarge { .. })), "{e:?}");
    // Within the per-side bound but over the pixel budget.
    let limits = DecodeLimits {
        max_width: 1000,
        max_height: 1000,
        max_pixels: 10,
    };
    let ok = png(DynamicImage::ImageRgb8(ImageBuffer::from_pixel(
        4,
        4,
        Rgb([0u8; 3]),
    )));
    assert!(matches!(
        decode_image_with_limits(&ok, &limits),
        Err(ImageError::TooLarge { .. })
    ));
}

#[test]
fn typed_errors_convert_into_core_errors() {
    let e: ipfs_accelerate_core::Error = decode_image(&[1, 2, 3]).unwrap_err().into();
    assert!(matches!(e, ipfs_accelerate_core::Error::InvalidInput(_)));
    let e: ipfs_accelerate_core::Error = ImageProcessorConfig::from_json("{", "cfg")
        .unwrap_err()
        .into();
    assert!(matches!(
        e,
        ipfs_accelerate_core::Error::InvalidConfig { .. }
    ));
}

#[test]
fn extreme_aspect_ratio_is_an_error_not_a_panic() {
    let p = ImageProcessor::new(
        ImageProcessorConfig::from_json(
            r#"{"image_processor_type": "DetrImageProcessor", "size": {"shortest_edge": 8, "longest_edge": 16}}"#,
            "t",
        )
        .unwrap(),
    );
    let thin = RgbImage::new(1000, 1, vec![0; 3000]).unwrap();
    assert!(matches!(
        p.preprocess(&[thin]),
        Err(ImageError::InvalidInput(_))
    ));
    assert!(matches!(
        p.preprocess(&[]),
        Err(ImageError::InvalidInput(_))
    ));
}

#[test]
fn detr_pads_a_batch_and_masks_it() {
    let p = ImageProcessor::new(
        ImageProcessorConfig::from_json(
            r#"{"image_processor_type": "DetrImageProcessor", "size": {"shortest_edge": 8, "longest_edge": 16}}"#,
            "t",
        )
        .unwrap(),
    );
    let a = RgbImage::new(4, 8, vec![255; 96]).unwrap(); // tall: resized to 16 x 8
    let b = RgbImage::new(8, 4, vec![0; 96]).unwrap(); // wide: resized to 8 x 16
    let out = p.preprocess(&[a, b]).unwrap();
    assert_eq!(out.pixel_values.shape(), &[2, 3, 16, 16]);
    assert_eq!(out.processed_sizes, vec![(16, 8), (8, 16)]);
    let mask = out.pixel_mask.unwrap();
    assert_eq!(mask.shape(), &[2, 16, 16]);
    let m = mask.to_i64_vec().unwrap();
    assert_eq!(m.iter().filter(|&&v| v == 1).count(), 2 * 128);
    assert_eq!(&m[..16], &[1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
    // Padding is zero after normalisation; white pixels are (1 - mean) / std.
    let v = out.pixel_values.to_f32_vec();
    assert_eq!(v[15], 0.0);
    assert!((v[0] - (1.0 - 0.485) / 0.229).abs() < 1e-4);
}
