//! Video input for video models (X-CLIP): choosing which frames of a clip to use
//! ([`sample_frames`]) and turning frame image files into `pixel_values` `[frames, 3, H, W]`
//! through an [`ImageProcessor`] ([`load_frames`], [`load_sampled_frames`]). Videos are given
//! as their frames (image files, e.g. extracted with `ffmpeg -i clip.mp4 frame_%04d.png`).
//!
//! ```no_run
//! use ipfs_accelerate_preprocess::image::ImageProcessor;
//! use ipfs_accelerate_preprocess::video::load_sampled_frames;
//! # fn main() -> Result<(), ipfs_accelerate_preprocess::image::ImageError> {
//! let processor = ImageProcessor::from_file("xclip/preprocessor_config.json")?;
//! let files: Vec<String> = (1..=300).map(|i| format!("frames/frame_{i:04}.png")).collect();
//! // 8 frames, one from the middle of each eighth of the clip: [8, 3, 224, 224].
//! let pixel_values = load_sampled_frames(&files, 8, &processor)?;
//! # let _ = pixel_values; Ok(()) }
//! ```

use std::path::Path;

use ipfs_accelerate_core::HostTensor;

use crate::image::{load_image, ImageError, ImageProcessor, ImageResult, RgbImage};
use crate::limits::{Limit, Limits};

/// `Err` when `frames` is over [`Limits::max_video_frames`] of `limits`.
fn check_frames(limits: &Limits, what: &str, frames: usize) -> ImageResult<()> {
    Ok(limits.check(Limit::VideoFrames, || what.to_string(), frames as u128)?)
}

/// Uniform segment sampling of `n_wanted` frame indices from a clip of `n_total` frames: the clip
/// is cut into `n_wanted` equal segments and the middle frame of each is taken, index
/// `i ↦ ⌊(i + ½) · n_total / n_wanted⌋` (computed exactly in integers). This is the test-time
/// rule of mmaction's `SampleFrames` (`clip_len = 1`, `num_clips = n_wanted`) that X-CLIP's
/// evaluation pipeline uses. Indices are ascending and `< n_total`; a clip shorter than
/// `n_wanted` repeats frames. Empty when either count is 0.
pub fn sample_frames(n_total: usize, n_wanted: usize) -> Vec<usize> {
    if n_total == 0 || n_wanted == 0 {
        return Vec::new();
    }
    let (total, wanted) = (n_total as u128, n_wanted as u128);
    (0..wanted)
        .map(|i| ((2 * i + 1) * total / (2 * wanted)) as usize)
        .collect()
}

/// Preprocesses decoded frames (in order) into `pixel_values` `[frames, 3, height, width]`; the
/// processor must give one equally sized view per image (not LLaVA-NeXT's anyres tiles). At most
/// [`Limits::max_video_frames`] (of the processor's limits) frames.
pub fn frames_to_pixels(
    frames: &[RgbImage],
    processor: &ImageProcessor,
) -> ImageResult<HostTensor> {
    if frames.is_empty() {
        return Err(ImageError::InvalidInput(
            "a video needs at least one frame".into(),
        ));
    }
    check_frames(
        processor.limits(),
        "video frames to preprocess",
        frames.len(),
    )?;
    let pixel_values = processor.preprocess(frames)?.pixel_values;
    if pixel_values.shape().len() != 4 {
        return Err(ImageError::InvalidInput(format!(
            "frames preprocessed to {:?}: video frames need one [3, H, W] view each",
            pixel_values.shape()
        )));
    }
    Ok(pixel_values)
}

/// Decodes and preprocesses frame image files (PNG / JPEG, in the given order) into
/// `pixel_values` `[frames, 3, height, width]`; the frame count is checked against
/// [`Limits::max_video_frames`] before any file is read.
pub fn load_frames<P: AsRef<Path>>(
    paths: &[P],
    processor: &ImageProcessor,
) -> ImageResult<HostTensor> {
    check_frames(processor.limits(), "video frame files", paths.len())?;
    let frames = paths
        .iter()
        .map(load_image)
        .collect::<ImageResult<Vec<_>>>()?;
    frames_to_pixels(&frames, processor)
}

/// Picks `n_wanted` of the clip's frame files with [`sample_frames`] (only those are decoded)
/// and loads them as [`load_frames`] does: `[n_wanted, 3, height, width]`.
pub fn load_sampled_frames<P: AsRef<Path>>(
    paths: &[P],
    n_wanted: usize,
    processor: &ImageProcessor,
) -> ImageResult<HostTensor> {
    if paths.is_empty() || n_wanted == 0 {
        return Err(ImageError::InvalidInput(format!(
            "cannot sample {n_wanted} frames from a clip of {} frames",
            paths.len()
        )));
    }
    check_frames(processor.limits(), "video frames to sample", n_wanted)?;
    let chosen: Vec<&P> = sample_frames(paths.len(), n_wanted)
        .into_iter()
        .map(|i| &paths[i])
        .collect();
    load_frames(&chosen, processor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::ImageProcessorConfig;

    #[test]
    fn sampling_takes_segment_middles() {
        assert_eq!(sample_frames(16, 8), vec![1, 3, 5, 7, 9, 11, 13, 15]);
        assert_eq!(
            sample_frames(300, 8),
            vec![18, 56, 93, 131, 168, 206, 243, 281]
        );
        assert_eq!(sample_frames(10, 3), vec![1, 5, 8]);
        assert_eq!(sample_frames(8, 8), (0..8).collect::<Vec<_>>());
        // Shorter clips repeat frames.
        assert_eq!(sample_frames(3, 8), vec![0, 0, 0, 1, 1, 2, 2, 2]);
        assert_eq!(sample_frames(1, 4), vec![0; 4]);
        assert!(sample_frames(0, 8).is_empty());
        assert!(sample_frames(8, 0).is_empty());
        for (t, n) in [(7, 3), (1000, 16), (5, 5), (2, 9), (usize::MAX, 3)] {
            let s = sample_frames(t, n);
            assert_eq!(s.len(), n);
            assert!(s.windows(2).all(|w| w[0] <= w[1]) && s.iter().all(|&i| i < t));
        }
    }

    fn processor() -> ImageProcessor {
        let json = r#"{"image_processor_type": "CLIPImageProcessor",
            "size": {"shortest_edge": 8}, "crop_size": {"height": 8, "width": 8}}"#;
        ImageProcessor::new(ImageProcessorConfig::from_json(json, "test").unwrap())
    }

    #[test]
    fn frames_load_in_order_through_the_processor() {
        let dir =
            std::env::temp_dir().join(format!("ipfs-accelerate-video-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut paths = Vec::new();
        let mut images = Vec::new();
        for f in 0..5u8 {
            let (w, h) = (12, 10);
            let data: Vec<u8> = (0..w * h * 3)
                .map(|i| (i as u8).wrapping_mul(7).wrapping_add(f * 40))
                .collect();
            let path = dir.join(format!("frame_{f}.png"));
            image::RgbImage::from_raw(w as u32, h as u32, data.clone())
                .unwrap()
                .save(&path)
                .unwrap();
            images.push(RgbImage::new(w, h, data).unwrap());
            paths.push(path);
        }
        let p = processor();
        let all = load_frames(&paths, &p).unwrap();
        assert_eq!(all.shape(), [5, 3, 8, 8]);
        let per = 3 * 8 * 8;
        let values = all.to_f32_vec();
        for (i, img) in images.iter().enumerate() {
            let want = p.process_one(img).unwrap().data;
            assert_eq!(&values[i * per..(i + 1) * per], &want[..], "frame {i}");
        }
        // Sampling 2 of 5 decodes frames 1 and 3.
        let two = load_sampled_frames(&paths, 2, &p).unwrap().to_f32_vec();
        assert_eq!(&two[..per], &values[per..2 * per]);
        assert_eq!(&two[per..], &values[3 * per..4 * per]);
        // Bad input: no frames, zero wanted, a missing file.
        assert!(load_frames::<&Path>(&[], &p).is_err());
        assert!(load_sampled_frames(&paths, 0, &p).is_err());
        assert!(load_sampled_frames::<&Path>(&[], 3, &p).is_err());
        assert!(matches!(
            load_frames(&[dir.join("missing.png")], &p),
            Err(ImageError::Io { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
