//! Hostile and malformed inputs, generated here: WAV headers with absurd rates, channels, depths
//! and lengths, truncated files, PNG / JPEG headers declaring huge images, processor and feature
//! extractor configs with zero, huge, negative and non-numeric sizes. Every case must end in a
//! typed error without a panic, and allocate little on its way there: a counting allocator
//! records the peak of the bytes each case holds at once (on the thread running it), which must
//! stay under [`CASE_BUDGET`].

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Cursor;

use ::image::{DynamicImage, ImageBuffer, ImageFormat, Rgb};
use ipfs_accelerate_preprocess::audio::{
    conform_rate, decode_wav, decode_wav_prefix, resample, resample_prefix, AudioError,
    ClapFeatureConfig, ClapFeatureExtractor, Wav2Vec2FeatureConfig, Wav2Vec2FeatureExtractor,
    WhisperFeatureConfig, WhisperFeatureExtractor,
};
use ipfs_accelerate_preprocess::image::{
    decode_image, pad_u8, resize, ImageError, ImageProcessor, ImageProcessorConfig, ProcessorKind,
    Resample, RgbImage, SizeRule,
};
use ipfs_accelerate_preprocess::video::{load_frames, load_sampled_frames};
use ipfs_accelerate_preprocess::{Limit, Limits};

// ---------------------------------------------------------------------------------------------
// Allocation accounting (per thread, so tests running beside each other do not mix).

struct Counting;

thread_local! {
    static HELD: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn note(delta: isize) {
    // `try_with`: the thread-locals may be gone while a thread is torn down.
    let _ = HELD.try_with(|h| {
        let now = h.get() + delta;
        h.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        note(-(layout.size() as isize));
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            note(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The most a malformed case may hold at once beyond what it held when it started.
const CASE_BUDGET: isize = 32 << 20;

/// What a case ended in.
#[derive(Debug)]
enum Outcome {
    Image(ImageError),
    Audio(AudioError),
}

impl From<ImageError> for Outcome {
    fn from(e: ImageError) -> Self {
        Outcome::Image(e)
    }
}

impl From<AudioError> for Outcome {
    fn from(e: AudioError) -> Self {
        Outcome::Audio(e)
    }
}

impl Outcome {
    /// The limit named by the error, if it is a limit error.
    fn limit(&self) -> Option<Limit> {
        match self {
            Outcome::Image(ImageError::Limit(l)) | Outcome::Audio(AudioError::Limit(l)) => {
                Some(l.limit)
            }
            Outcome::Image(ImageError::TooLarge { limit, .. }) => Some(limit.limit),
            _ => None,
        }
    }
}

/// What a case must end in: a limit error naming this limit, or any other typed error.
#[derive(Debug, Clone, Copy)]
enum Expect {
    Limit(Limit),
    Typed,
}

/// Runs `run` (which must fail), measuring what it allocates, and checks the error.
fn case<T: std::fmt::Debug>(
    name: &str,
    expect: Expect,
    run: impl FnOnce() -> Result<T, Outcome>,
) -> usize {
    let start = HELD.with(Cell::get);
    PEAK.with(|p| p.set(start));
    let result = run();
    let peak = PEAK.with(Cell::get) - start;
    let err = match result {
        Ok(v) => panic!("{name}: expected an error, got {v:?}"),
        Err(e) => e,
    };
    let message = match &err {
        Outcome::Image(e) => e.to_string(),
        Outcome::Audio(e) => e.to_string(),
    };
    if let Expect::Limit(limit) = expect {
        assert_eq!(err.limit(), Some(limit), "{name}: {err:?}");
        assert!(
            message.contains(limit.env_var()) && message.contains(limit.field()),
            "{name}: the message does not say how to raise the limit: {message}"
        );
    }
    assert!(
        peak <= CASE_BUDGET,
        "{name}: held {} MiB at once ({message})",
        peak >> 20
    );
    println!("{name}: {} KiB peak: {message}", peak >> 10);
    1
}

// ---------------------------------------------------------------------------------------------
// Input builders.

/// WAV bytes with a hand-written header: `format` tag, channels, rate, bits, the data chunk's
/// declared length, then `data` as it is.
fn wav(format: u16, channels: u16, rate: u32, bits: u16, declared: u32, data: &[u8]) -> Vec<u8> {
    let block_align = channels.wrapping_mul(bits / 8);
    let byte_rate = u32::from(block_align).wrapping_mul(rate);
    let mut b = b"RIFF".to_vec();
    b.extend((36u32.wrapping_add(data.len() as u32)).to_le_bytes());
    b.extend(b"WAVEfmt ");
    b.extend(16u32.to_le_bytes());
    b.extend(format.to_le_bytes());
    b.extend(channels.to_le_bytes());
    b.extend(rate.to_le_bytes());
    b.extend(byte_rate.to_le_bytes());
    b.extend(block_align.to_le_bytes());
    b.extend(bits.to_le_bytes());
    b.extend(b"data");
    b.extend(declared.to_le_bytes());
    b.extend(data);
    b
}

/// 16-bit mono PCM at `rate` with `n` samples, declared truthfully.
fn pcm16(rate: u32, n: usize) -> Vec<u8> {
    let data: Vec<u8> = (0..n)
        .flat_map(|i| ((i as i16).wrapping_mul(97)).to_le_bytes())
        .collect();
    wav(1, 1, rate, 16, data.len() as u32, &data)
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

fn encode(format: ImageFormat) -> Vec<u8> {
    let img = DynamicImage::ImageRgb8(ImageBuffer::from_fn(8, 8, |x, y| {
        Rgb([x as u8 * 30, y as u8 * 30, 9])
    }));
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, format).unwrap();
    out.into_inner()
}

/// A valid 8×8 PNG whose IHDR declares `width × height`, with a correct (or, when `bad_crc`,
/// a wrong) CRC.
fn png_declaring(width: u32, height: u32, bad_crc: bool) -> Vec<u8> {
    let mut bytes = encode(ImageFormat::Png);
    bytes[16..20].copy_from_slice(&width.to_be_bytes());
    bytes[20..24].copy_from_slice(&height.to_be_bytes());
    let crc = crc32(&bytes[12..29]) ^ u32::from(bad_crc);
    bytes[29..33].copy_from_slice(&crc.to_be_bytes());
    bytes
}

/// A valid 8×8 baseline JPEG whose SOF0 frame header declares `width × height`.
fn jpeg_declaring(width: u16, height: u16) -> Vec<u8> {
    let mut bytes = encode(ImageFormat::Jpeg);
    let sof = bytes
        .windows(2)
        .position(|w| w == [0xFF, 0xC0])
        .expect("SOF0 marker");
    // FF C0, length (2), precision (1), height (2), width (2).
    bytes[sof + 5..sof + 7].copy_from_slice(&height.to_be_bytes());
    bytes[sof + 7..sof + 9].copy_from_slice(&width.to_be_bytes());
    bytes
}

fn processor(json: &str) -> Result<ImageProcessor, Outcome> {
    Ok(ImageProcessor::new(ImageProcessorConfig::from_json(
        json, "test",
    )?))
}

fn small_image() -> RgbImage {
    RgbImage::new(4, 3, vec![128; 36]).unwrap()
}

// ---------------------------------------------------------------------------------------------
// The cases.

fn wav_cases() -> usize {
    let decode = |b: Vec<u8>| move || decode_wav(&b).map_err(Outcome::from);
    let some = [0u8; 64];
    let mut n = 0;
    n += case(
        "wav: 4294967291 Hz",
        Expect::Limit(Limit::MaxSampleRate),
        decode(wav(1, 1, 4_294_967_291, 8, 64, &some)),
    );
    n += case(
        "wav: 1 Hz",
        Expect::Limit(Limit::MinSampleRate),
        decode(wav(1, 1, 1, 16, 64, &some)),
    );
    n += case(
        "wav: 999 Hz",
        Expect::Limit(Limit::MinSampleRate),
        decode(wav(1, 2, 999, 16, 64, &some)),
    );
    n += case(
        "wav: 384001 Hz",
        Expect::Limit(Limit::MaxSampleRate),
        decode(wav(1, 1, 384_001, 16, 64, &some)),
    );
    n += case(
        "wav: 0 Hz",
        Expect::Typed,
        decode(wav(1, 1, 0, 16, 64, &some)),
    );
    n += case(
        "wav: 0 channels",
        Expect::Typed,
        decode(wav(1, 0, 16_000, 16, 64, &some)),
    );
    n += case(
        "wav: 65535 channels",
        Expect::Typed,
        decode(wav(1, 65_535, 16_000, 16, 64, &some)),
    );
    n += case(
        "wav: 255 channels, 8-bit, one partial frame",
        Expect::Typed,
        decode(wav(1, 255, 16_000, 8, 64, &some)),
    );
    n += case(
        "wav: 12-bit PCM",
        Expect::Typed,
        decode(wav(1, 1, 16_000, 12, 64, &some)),
    );
    n += case(
        "wav: 0-bit PCM",
        Expect::Typed,
        decode(wav(1, 1, 16_000, 0, 64, &some)),
    );
    n += case(
        "wav: 64-bit float",
        Expect::Typed,
        decode(wav(3, 1, 16_000, 64, 64, &some)),
    );
    n += case(
        "wav: 65528-bit PCM",
        Expect::Typed,
        decode(wav(1, 1, 16_000, 65_528, 64, &some)),
    );
    n += case(
        "wav: ADPCM",
        Expect::Typed,
        decode(wav(2, 1, 16_000, 16, 64, &some)),
    );
    n += case(
        "wav: unknown format tag",
        Expect::Typed,
        decode(wav(0x1234, 1, 16_000, 16, 64, &some)),
    );
    n += case(
        "wav: data chunk declaring 4 GiB (37 hours at 16 kHz)",
        Expect::Limit(Limit::AudioSecs),
        decode(wav(1, 1, 16_000, 16, u32::MAX - 1, &some)),
    );
    n += case(
        "wav: 8-bit at 1 kHz declaring 4 GiB",
        Expect::Limit(Limit::AudioSecs),
        decode(wav(1, 1, 1_000, 8, u32::MAX - 3, &some)),
    );
    n += case(
        "wav: declares 500 s, holds 32 samples",
        Expect::Typed,
        decode(wav(1, 1, 16_000, 16, 16_000_000, &some)),
    );
    n += case(
        "wav: truncated mid-sample",
        Expect::Typed,
        decode({
            let mut b = pcm16(16_000, 100);
            b.truncate(b.len() - 101);
            b
        }),
    );
    n += case(
        "wav: header only",
        Expect::Typed,
        decode(pcm16(16_000, 10)[..20].to_vec()),
    );
    n += case(
        "wav: no data chunk",
        Expect::Typed,
        decode(pcm16(16_000, 10)[..36].to_vec()),
    );
    n += case(
        "wav: empty data",
        Expect::Typed,
        decode(wav(1, 1, 16_000, 16, 0, &[])),
    );
    n += case(
        "wav: unknown chunk declaring 4 GiB",
        Expect::Typed,
        decode({
            let mut b = b"RIFF\xff\xff\xff\xffWAVEjunk\xf0\xff\xff\xff".to_vec();
            b.extend([0u8; 32]);
            b
        }),
    );
    n += case(
        "wav: NaN float sample",
        Expect::Typed,
        decode(wav(
            3,
            1,
            16_000,
            32,
            8,
            &[0.0f32.to_le_bytes(), f32::NAN.to_le_bytes()].concat(),
        )),
    );
    n += case(
        "wav: infinite float sample in the second channel",
        Expect::Typed,
        decode(wav(
            3,
            2,
            16_000,
            32,
            8,
            &[0.5f32.to_le_bytes(), f32::INFINITY.to_le_bytes()].concat(),
        )),
    );
    n += case(
        "wav: not RIFF",
        Expect::Typed,
        decode(b"RIFX....WAVE".to_vec()),
    );
    n += case(
        "wav prefix: NaN seconds",
        Expect::Limit(Limit::AudioSecs),
        || decode_wav_prefix(&pcm16(16_000, 10), f64::NAN).map_err(Outcome::from),
    );
    n += case(
        "wav prefix: 10 hours asked",
        Expect::Limit(Limit::AudioSecs),
        || decode_wav_prefix(&pcm16(16_000, 10), 36_000.0).map_err(Outcome::from),
    );
    n += case("wav prefix: -1 s", Expect::Typed, || {
        decode_wav_prefix(&pcm16(16_000, 10), -1.0).map_err(Outcome::from)
    });
    n
}

fn resample_cases() -> usize {
    let x = vec![0.25f32; 1000];
    let mut n = 0;
    n += case(
        "resample: from 1 Hz",
        Expect::Limit(Limit::MinSampleRate),
        || resample(&x, 1, 16_000).map_err(Outcome::from),
    );
    n += case(
        "resample: to 4294967291 Hz",
        Expect::Limit(Limit::MaxSampleRate),
        || resample(&x, 16_000, 4_294_967_291).map_err(Outcome::from),
    );
    n += case(
        "conform_rate: from 4294967291 Hz",
        Expect::Limit(Limit::MaxSampleRate),
        || conform_rate(&x, 4_294_967_291, 16_000, true).map_err(Outcome::from),
    );
    n += case("resample: from 0 Hz", Expect::Typed, || {
        resample(&x, 0, 16_000).map_err(Outcome::from)
    });
    // 700 s at 1 kHz (2.8 MB of input): past max_audio_secs when resampled whole.
    let long = vec![0.1f32; 700_000];
    n += case("resample: 700 s", Expect::Limit(Limit::AudioSecs), || {
        resample(&long, 1_000, 16_000).map_err(Outcome::from)
    });
    n
}

fn whisper_cases() -> usize {
    let cfg = |json: &'static str| {
        move || {
            WhisperFeatureConfig::from_json(json, "test")
                .and_then(WhisperFeatureExtractor::new)
                .map(|_| ())
                .map_err(Outcome::from)
        }
    };
    let mut n = 0;
    for (name, json, expect) in [
        ("n_fft 0", r#"{"n_fft": 0}"#, Expect::Typed),
        ("n_fft 1", r#"{"n_fft": 1}"#, Expect::Typed),
        (
            "n_fft 2^40",
            r#"{"n_fft": 1099511627776}"#,
            Expect::Limit(Limit::NFft),
        ),
        (
            "n_fft 2^64",
            r#"{"n_fft": 18446744073709551616}"#,
            Expect::Typed,
        ),
        ("n_fft -400", r#"{"n_fft": -400}"#, Expect::Typed),
        ("n_fft 400.5", r#"{"n_fft": 400.5}"#, Expect::Typed),
        ("n_fft \"400\"", r#"{"n_fft": "400"}"#, Expect::Typed),
        ("feature_size 0", r#"{"feature_size": 0}"#, Expect::Typed),
        (
            "feature_size 100000",
            r#"{"feature_size": 100000}"#,
            Expect::Limit(Limit::MelBins),
        ),
        ("hop_length 0", r#"{"hop_length": 0}"#, Expect::Typed),
        (
            "hop_length 1",
            r#"{"hop_length": 1}"#,
            Expect::Limit(Limit::SpectrogramFrames),
        ),
        (
            "chunk_length 1e12",
            r#"{"chunk_length": 1e12}"#,
            Expect::Limit(Limit::AudioSecs),
        ),
        (
            "chunk_length -30",
            r#"{"chunk_length": -30}"#,
            Expect::Typed,
        ),
        (
            "chunk_length \"30\"",
            r#"{"chunk_length": "30"}"#,
            Expect::Typed,
        ),
        (
            "sampling_rate 4294967291",
            r#"{"sampling_rate": 4294967291}"#,
            Expect::Limit(Limit::MaxSampleRate),
        ),
        (
            "sampling_rate 1",
            r#"{"sampling_rate": 1, "chunk_length": 30}"#,
            Expect::Limit(Limit::MinSampleRate),
        ),
        (
            "sampling_rate 2^40",
            r#"{"sampling_rate": 1099511627776}"#,
            Expect::Typed,
        ),
        ("not an object", "[80, 400]", Expect::Typed),
    ] {
        n += case(&format!("whisper config: {name}"), expect, cfg(json));
    }
    n += case(
        "whisper for_model: usize::MAX frames",
        Expect::Typed,
        || WhisperFeatureConfig::for_model(80, usize::MAX).map_err(Outcome::from),
    );
    n
}

fn clap_cases() -> usize {
    let cfg = |json: &'static str| {
        move || {
            ClapFeatureConfig::from_json(json, "test")
                .and_then(ClapFeatureExtractor::new)
                .map(|_| ())
                .map_err(Outcome::from)
        }
    };
    let mut n = 0;
    for (name, json, expect) in [
        (
            "fft_window_size 2^40",
            r#"{"fft_window_size": 1099511627776}"#,
            Expect::Limit(Limit::NFft),
        ),
        (
            "fft_window_size 0",
            r#"{"fft_window_size": 0}"#,
            Expect::Typed,
        ),
        (
            "feature_size 1000000",
            r#"{"feature_size": 1000000}"#,
            Expect::Limit(Limit::MelBins),
        ),
        ("feature_size 0", r#"{"feature_size": 0}"#, Expect::Typed),
        (
            "max_length_s 1e9",
            r#"{"max_length_s": 1e9}"#,
            Expect::Limit(Limit::AudioSecs),
        ),
        (
            "hop_length 1",
            r#"{"hop_length": 1}"#,
            Expect::Limit(Limit::SpectrogramFrames),
        ),
        ("sampling_rate 0", r#"{"sampling_rate": 0}"#, Expect::Typed),
        (
            "sampling_rate 1000000000",
            r#"{"sampling_rate": 1000000000}"#,
            Expect::Limit(Limit::MaxSampleRate),
        ),
        (
            "frequency_max \"x\"",
            r#"{"frequency_max": "x"}"#,
            Expect::Typed,
        ),
        ("hop_length -480", r#"{"hop_length": -480}"#, Expect::Typed),
    ] {
        n += case(&format!("clap config: {name}"), expect, cfg(json));
    }
    for (name, json) in [("a list", "[64, 48000]"), ("a number", "64")] {
        n += case(&format!("clap config: {name}"), Expect::Typed, cfg(json));
    }
    n
}

fn wav2vec2_cases() -> usize {
    let mut n = 0;
    n += case(
        "wav2vec2 config: sampling_rate 4294967295",
        Expect::Limit(Limit::MaxSampleRate),
        || {
            Wav2Vec2FeatureConfig::from_json(r#"{"sampling_rate": 4294967295}"#, "test")
                .map_err(Outcome::from)
        },
    );
    n += case(
        "wav2vec2 config: sampling_rate 500",
        Expect::Limit(Limit::MinSampleRate),
        || {
            Wav2Vec2FeatureConfig::from_json(r#"{"sampling_rate": 500}"#, "test")
                .map_err(Outcome::from)
        },
    );
    let fe = Wav2Vec2FeatureExtractor::new(Wav2Vec2FeatureConfig::default());
    // 10 minutes at 8 kHz: refused before resampling.
    let ten_minutes = vec![0.01f32; 8_000 * 600];
    n += case(
        "wav2vec2: 10 minutes at 8 kHz",
        Expect::Limit(Limit::Wav2Vec2Secs),
        || {
            fe.extract_any_rate(&[&ten_minutes], 8_000, true)
                .map_err(Outcome::from)
        },
    );
    let minute = vec![0.01f32; 16_000 * 61];
    n += case(
        "wav2vec2: 61 s at 16 kHz",
        Expect::Limit(Limit::Wav2Vec2Secs),
        || fe.extract(&[&minute], 16_000).map_err(Outcome::from),
    );
    n += case(
        "wav2vec2: rate 1 Hz",
        Expect::Limit(Limit::MinSampleRate),
        || {
            fe.extract_any_rate(&[&[0.5; 4]], 1, true)
                .map_err(Outcome::from)
        },
    );
    n
}

fn image_decode_cases() -> usize {
    let decode = |b: Vec<u8>| move || decode_image(&b).map_err(Outcome::from);
    let mut n = 0;
    // Past PNG's own bound of 2^31 - 1, the png crate refuses the header itself.
    n += case(
        "png: IHDR declaring 4294967295x1",
        Expect::Typed,
        decode(png_declaring(u32::MAX, 1, false)),
    );
    for (w, h, limit) in [
        (100_000, 100_000, Limit::ImageSide),
        (1, 0x7fff_ffff, Limit::ImageSide),
        (10_000, 10_000, Limit::ImagePixels),
        (16_384, 4_097, Limit::ImagePixels),
    ] {
        n += case(
            &format!("png: IHDR declaring {w}x{h}"),
            Expect::Limit(limit),
            decode(png_declaring(w, h, false)),
        );
    }
    n += case(
        "png: IHDR declaring 0x5",
        Expect::Typed,
        decode(png_declaring(0, 5, false)),
    );
    n += case(
        "png: IHDR with a bad CRC",
        Expect::Typed,
        decode(png_declaring(100_000, 100_000, true)),
    );
    n += case(
        "png: signature only",
        Expect::Typed,
        decode(encode(ImageFormat::Png)[..8].to_vec()),
    );
    for (w, h, limit) in [
        (10_000, 10_000, Limit::ImagePixels),
        (65_535, 65_535, Limit::ImageSide),
        (65_535, 1, Limit::ImageSide),
    ] {
        n += case(
            &format!("jpeg: SOF0 declaring {w}x{h}"),
            Expect::Limit(limit),
            decode(jpeg_declaring(w, h)),
        );
    }
    n += case(
        "jpeg: SOF0 declaring 0 rows",
        Expect::Typed,
        decode(jpeg_declaring(8, 0)),
    );
    n += case(
        "jpeg: truncated after the header",
        Expect::Typed,
        decode({
            let b = jpeg_declaring(8, 8);
            let sos = b.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap();
            b[..sos].to_vec()
        }),
    );
    n
}

fn image_processor_cases() -> usize {
    let run = |json: &'static str| move || Ok(processor(json)?.preprocess(&[small_image()])?);
    let mut n = 0;
    for (name, json, expect) in [
        (
            "ViT size 100000",
            r#"{"image_processor_type": "ViTImageProcessor", "size": 100000}"#,
            Expect::Limit(Limit::OutputSide),
        ),
        (
            "ViT size 2^32",
            r#"{"image_processor_type": "ViTImageProcessor", "size": 4294967296}"#,
            Expect::Limit(Limit::OutputSide),
        ),
        (
            "ViT size 0",
            r#"{"image_processor_type": "ViTImageProcessor", "size": 0}"#,
            Expect::Typed,
        ),
        (
            "ViT size -224",
            r#"{"image_processor_type": "ViTImageProcessor", "size": -224}"#,
            Expect::Typed,
        ),
        (
            "ViT size \"224\"",
            r#"{"image_processor_type": "ViTImageProcessor", "size": "224"}"#,
            Expect::Typed,
        ),
        (
            "ViT size 224.5",
            r#"{"image_processor_type": "ViTImageProcessor", "size": 224.5}"#,
            Expect::Typed,
        ),
        (
            "ViT size height/width 4097x16",
            r#"{"image_processor_type": "ViTImageProcessor", "size": {"height": 4097, "width": 16}}"#,
            Expect::Limit(Limit::OutputSide),
        ),
        (
            "CLIP shortest_edge 2^40",
            r#"{"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 1099511627776}}"#,
            Expect::Limit(Limit::OutputSide),
        ),
        (
            "CLIP crop_size 100000",
            r#"{"image_processor_type": "CLIPImageProcessor", "crop_size": {"height": 100000, "width": 100000}}"#,
            Expect::Limit(Limit::OutputSide),
        ),
        (
            "DETR longest_edge 10^9",
            r#"{"image_processor_type": "DetrImageProcessor", "size": {"shortest_edge": 800, "longest_edge": 1000000000}}"#,
            Expect::Limit(Limit::OutputSide),
        ),
        (
            "DETR legacy max_size 2^40",
            r#"{"image_processor_type": "DetrImageProcessor", "size": 800, "max_size": 1099511627776}"#,
            Expect::Limit(Limit::OutputSide),
        ),
        (
            "DETR pad_size 65536",
            r#"{"image_processor_type": "DetrImageProcessor", "pad_size": {"height": 65536, "width": 65536}}"#,
            Expect::Limit(Limit::OutputSide),
        ),
        (
            "max_height/max_width 10^6",
            r#"{"do_resize": true, "size": {"max_height": 1000000, "max_width": 1000000}}"#,
            Expect::Limit(Limit::OutputSide),
        ),
        (
            "LLaVA-NeXT pinpoint 100000x100000",
            r#"{"image_processor_type": "LlavaNextImageProcessor", "image_grid_pinpoints": [[100000, 100000]]}"#,
            Expect::Limit(Limit::OutputSide),
        ),
        (
            "LLaVA-NeXT 1-pixel tiles of a 4096 grid",
            r#"{"image_processor_type": "LlavaNextImageProcessor", "crop_size": {"height": 1, "width": 1},
                "image_grid_pinpoints": [[4096, 4096]]}"#,
            Expect::Limit(Limit::AnyresViews),
        ),
        (
            "LLaVA-NeXT negative pinpoint",
            r#"{"image_processor_type": "LlavaNextImageProcessor", "image_grid_pinpoints": [[-336, 672]]}"#,
            Expect::Typed,
        ),
        (
            "resample 99",
            r#"{"image_processor_type": "ViTImageProcessor", "resample": 99}"#,
            Expect::Typed,
        ),
        (
            "rescale_factor \"x\"",
            r#"{"image_processor_type": "ViTImageProcessor", "rescale_factor": "x"}"#,
            Expect::Typed,
        ),
    ] {
        n += case(&format!("image config: {name}"), expect, run(json));
    }
    // Sizes computed from a valid config and an extreme image.
    n += case(
        "CLIP shortest_edge 224 on a 16384x1 image",
        Expect::Limit(Limit::OutputSide),
        || {
            let img = RgbImage::new(16_384, 1, vec![7; 16_384 * 3]).unwrap();
            Ok(
                processor(r#"{"image_processor_type": "CLIPImageProcessor"}"#)?
                    .preprocess(&[img])?,
            )
        },
    );
    n += case(
        "no resize, image over max_output_pixels",
        Expect::Limit(Limit::OutputPixels),
        || {
            let limits = Limits {
                max_output_pixels: 100,
                ..Limits::default()
            };
            let p = ImageProcessor::with_limits(
                ImageProcessorConfig::from_json(r#"{"do_resize": false}"#, "test")?,
                limits,
            )?;
            Ok(p.preprocess(&[RgbImage::new(20, 20, vec![1; 1200]).unwrap()])?)
        },
    );
    n += case(
        "resize to 100000x100000",
        Expect::Limit(Limit::OutputSide),
        || {
            Ok(resize(
                &small_image(),
                100_000,
                100_000,
                Resample::Bilinear,
            )?)
        },
    );
    n += case("pad by usize::MAX", Expect::Typed, || {
        Ok(pad_u8(&small_image(), (usize::MAX, 0, 1, 0))?)
    });
    n += case(
        "SizeRule::ShortestEdge(usize::MAX) through a processor",
        Expect::Limit(Limit::OutputSide),
        || {
            let mut c = ImageProcessorConfig::defaults(ProcessorKind::Vit);
            c.size = SizeRule::ShortestEdge(usize::MAX);
            Ok(ImageProcessor::new(c).preprocess(&[small_image()])?)
        },
    );
    n
}

fn video_cases() -> usize {
    let p = || processor(r#"{"image_processor_type": "CLIPImageProcessor"}"#);
    let mut n = 0;
    n += case(
        "video: sample 100000 frames",
        Expect::Limit(Limit::VideoFrames),
        || load_sampled_frames(&["a.png", "b.png"], 100_000, &p()?).map_err(Outcome::from),
    );
    n += case(
        "video: 1000 frame files",
        Expect::Limit(Limit::VideoFrames),
        || {
            let paths: Vec<String> = (0..1000).map(|i| format!("/nonexistent/{i}.png")).collect();
            load_frames(&paths, &p()?).map_err(Outcome::from)
        },
    );
    n
}

#[test]
fn malformed_inputs_end_in_typed_errors_with_small_memory() {
    let n = wav_cases()
        + resample_cases()
        + whisper_cases()
        + clap_cases()
        + wav2vec2_cases()
        + image_decode_cases()
        + image_processor_cases()
        + video_cases();
    println!("{n} malformed cases");
    assert!(n >= 40, "{n} cases");
}

// ---------------------------------------------------------------------------------------------
// Long inputs to windowed extractors: cut before resampling, same features as resampling whole.

#[test]
fn whisper_cuts_before_resampling() {
    let fe = WhisperFeatureExtractor::new(WhisperFeatureConfig::default()).unwrap();
    // 20 minutes at 8 kHz: past max_audio_secs, so resampling it whole is refused...
    let long: Vec<f32> = (0..8_000 * 1_200)
        .map(|i| ((i as f32) * 0.013).sin() * 0.3)
        .collect();
    let whole = conform_rate(&long, 8_000, 16_000, true);
    assert!(
        matches!(&whole, Err(AudioError::Limit(l)) if l.limit == Limit::AudioSecs),
        "{whole:?}"
    );
    // ...while the extractor resamples only its 30 s window, holding little beyond the input.
    let start = HELD.with(Cell::get);
    PEAK.with(|p| p.set(start));
    let out = fe.extract_any_rate(&long, 8_000, true).unwrap();
    let peak = PEAK.with(Cell::get) - start;
    assert!(out.truncated);
    assert_eq!((out.mels, out.frames), (80, 3000));
    assert!(peak < 64 << 20, "held {} MiB", peak >> 20);
    // The window's features equal those of the resampled whole (bit for bit: the same blocks).
    let head = &long[..8_000 * 40];
    let resampled = resample(head, 8_000, 16_000).unwrap();
    let want = fe.extract(&resampled, 16_000).unwrap();
    assert_eq!(out.data, want.data);
    assert_eq!(
        resample_prefix(head, 8_000, 16_000, 480_000).unwrap(),
        resampled[..480_000]
    );
    // Without permission to resample, another rate is an error.
    assert!(matches!(
        fe.extract_any_rate(&long, 8_000, false),
        Err(AudioError::SampleRate { .. })
    ));
}

#[test]
fn clap_cuts_before_resampling() {
    let cfg = ClapFeatureConfig {
        max_length_s: 1.0,
        ..ClapFeatureConfig::default()
    };
    let fe = ClapFeatureExtractor::new(cfg).unwrap();
    let long: Vec<f32> = (0..44_100 * 20)
        .map(|i| ((i as f32) * 0.021).sin() * 0.2)
        .collect();
    let out = fe.extract_any_rate(&long, 44_100, true).unwrap();
    assert!(out.is_longer);
    let head = &long[..44_100 * 3];
    let want = fe
        .extract(&resample(head, 44_100, 48_000).unwrap(), 48_000)
        .unwrap();
    assert_eq!(out.data, want.data);
    let (t, longer) = fe
        .input_features_any_rate(&[&long, &head[..1000]], 44_100, true)
        .unwrap();
    assert_eq!(t.shape(), &[2, 1, out.frames, out.mels]);
    assert_eq!(longer, vec![true, false]);
}

#[test]
fn a_wav_declaring_hours_decodes_only_the_prefix_asked_for() {
    // The header declares 10 hours; the file holds 2 s. Asking for 1 s reads 1 s.
    let data: Vec<u8> = (0..32_000u32)
        .flat_map(|i| ((i % 200) as i16 * 50).to_le_bytes())
        .collect();
    let bytes = wav(1, 1, 16_000, 16, 16_000 * 2 * 36_000, &data);
    assert!(matches!(
        decode_wav(&bytes),
        Err(AudioError::Limit(l)) if l.limit == Limit::AudioSecs
    ));
    let a = decode_wav_prefix(&bytes, 1.0).unwrap();
    assert_eq!(a.samples.len(), 16_000);
    assert!(a.truncated);
    // A short file read with a longer prefix is whole and not truncated.
    let b = decode_wav_prefix(&pcm16(16_000, 100), 30.0).unwrap();
    assert_eq!((b.samples.len(), b.truncated), (100, false));
}

#[test]
fn raised_limits_admit_what_defaults_refuse() {
    let limits = Limits {
        max_n_fft: 1 << 17,
        ..Limits::default()
    };
    let cfg = WhisperFeatureConfig {
        n_fft: 1 << 17,
        ..WhisperFeatureConfig::default()
    };
    assert!(WhisperFeatureExtractor::new(cfg.clone()).is_err());
    assert!(WhisperFeatureExtractor::with_limits(cfg, limits).is_ok());
    let big = png_declaring(10_000, 10_000, false);
    let e = decode_image(&big).unwrap_err();
    assert!(
        e.to_string().contains("IPFS_ACCELERATE_MAX_IMAGE_PIXELS"),
        "{e}"
    );
}
