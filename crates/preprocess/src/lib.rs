//! # ipfs-accelerate-preprocess
//!
//! Turning user input into model input. Text: [`TextTokenizer`] wraps HF `tokenizers` (tokenizer.json)
//! with batch padding to the longest row, truncation to the model's maximum length (reported, never
//! silent), sentence pairs for question answering, and character offsets for answer extraction.
//! Images: [`image`] decodes, resizes (PIL / torchvision-compatible), crops, normalises and batches
//! images as HF's image processors do (CLIP, ViT, DETR padding + pixel_mask, LLaVA-NeXT anyres).
//! Audio: [`audio`] decodes WAV, resamples, and computes Whisper log-mel / Wav2Vec2 input values.
//!
//! ## Limits
//!
//! Images, WAV files and `preprocessor_config.json` come from users and the network, so every size
//! they declare is checked against a [`Limits`] *before* anything is allocated from it (image
//! dimensions from the header, WAV rate and length from the header, config sizes when the config
//! is parsed and again when it is applied). Past a limit is an error
//! ([`image::ImageError::Limit`] / [`image::ImageError::TooLarge`], [`audio::AudioError::Limit`])
//! holding a [`LimitExceeded`] that names the limit, the value seen and how to raise it.
//!
//! | limit ([`Limits`] field / environment variable) | default | why |
//! |---|---|---|
//! | `max_image_pixels` / `IPFS_ACCELERATE_MAX_IMAGE_PIXELS` | 67 108 864 (8192², 64 Mi pixels) | above every camera frame in common use (≤ 50 MP) and 8K (33 MP); the RGB buffer stays ≤ 192 MiB, the widest decoded form (16-bit RGBA) ≤ 512 MiB |
//! | `max_image_side` / `IPFS_ACCELERATE_MAX_IMAGE_SIDE` | 16 384 pixels | panoramas within the pixel budget |
//! | `max_output_side` / `IPFS_ACCELERATE_MAX_OUTPUT_SIDE` | 4 096 pixels | resize / crop / pad targets, DETR `shortest_edge` / `longest_edge`, LLaVA-NeXT pinpoints and every size computed from them; HF checkpoints use ≤ 1 333 (DETR) and ≤ 2 304 (anyres grids) |
//! | `max_output_pixels` / `IPFS_ACCELERATE_MAX_OUTPUT_PIXELS` | 16 777 216 (4096²) | one processed image as f32 is ≤ 192 MiB |
//! | `max_anyres_views` / `IPFS_ACCELERATE_MAX_ANYRES_VIEWS` | 64 | LLaVA-NeXT / OneVision grids reach 6 × 6 tiles + the base view |
//! | `min_sample_rate` / `IPFS_ACCELERATE_MIN_SAMPLE_RATE` | 1 000 Hz | below it, resampling tables grow with the rate ratio's period (1 Hz → 16 kHz asked for 128 GB) |
//! | `max_sample_rate` / `IPFS_ACCELERATE_MAX_SAMPLE_RATE` | 384 000 Hz | the highest rate of studio converters; bounds the resampler's FFT |
//! | `max_audio_secs` / `IPFS_ACCELERATE_MAX_AUDIO_SECS` | 600 s | one decoded or resampled input (≤ 880 MiB of f32 at 384 kHz) and the longest window a feature extractor config may set; read only a prefix ([`audio::read_wav_prefix`]) for longer files |
//! | `max_wav2vec2_secs` / `IPFS_ACCELERATE_MAX_WAV2VEC2_SECS` | 60 s | Wav2Vec2 has no window: its attention is quadratic in the input (60 s = 3 000 frames, 12 × 3 000² scores) |
//! | `max_n_fft` / `IPFS_ACCELERATE_MAX_N_FFT` | 16 384 samples | STFT window (Whisper 400, CLAP 1 024) |
//! | `max_mel_bins` / `IPFS_ACCELERATE_MAX_MEL_BINS` | 512 | mel filters (Whisper 80 / 128, CLAP 64) |
//! | `max_spectrogram_frames` / `IPFS_ACCELERATE_MAX_SPECTROGRAM_FRAMES` | 65 536 | frames of one spectrogram = window samples / hop (Whisper 3 000, CLAP 1 001) |
//! | `max_video_frames` / `IPFS_ACCELERATE_MAX_VIDEO_FRAMES` | 256 | frames of one video (X-CLIP takes 8–32) |
//!
//! To raise a limit, set its environment variable (read once per process; a malformed value is
//! logged and the default kept), call [`Limits::set_current`], or give limits to one object
//! ([`image::ImageProcessor::with_limits`], [`image::decode_image_with_limits`],
//! [`audio::decode_wav_with_limits`], the feature extractors' `with_limits`).
//!
//! Audio models with a window work on at most that window: [`audio::WhisperFeatureExtractor`] and
//! [`audio::ClapFeatureExtractor`] cut the waveform to the window *before* resampling it
//! (`extract_any_rate`), so a long input costs no more than one window.

pub mod audio;
pub mod chat;
pub mod image;
mod limits;
mod text;
pub mod video;

pub use limits::{Limit, LimitExceeded, Limits, LimitsEnvError};
pub use text::{plan_chunks, Encoded, PreprocessError, TextTokenizer, DEFAULT_MAX_INPUT_BYTES};
