//! WAV decoding with `hound`: 8/16/24/32-bit integer PCM and 32-bit float, any channel count,
//! mixed down to mono float samples in [-1, 1) while reading (no interleaved copy). The header's
//! sampling rate and length are checked against [`Limits`] before any sample is read.

use std::io::{BufReader, Cursor, Read};
use std::path::Path;

use hound::{SampleFormat, WavReader};

use super::error::{AudioError, AudioResult};
use crate::limits::{Limit, Limits};

/// Mono audio: float samples and their sampling rate.
#[derive(Debug, Clone, PartialEq)]
pub struct Audio {
    /// Samples, channels averaged (integer PCM scaled by `1 / 2^(bits - 1)`).
    pub samples: Vec<f32>,
    /// Samples per second.
    pub sample_rate: u32,
    /// Channels in the source before mixing down.
    pub channels: u16,
    /// Whether the file holds more than was decoded ([`decode_wav_prefix`] stopped early).
    pub truncated: bool,
}

impl Audio {
    /// Duration in seconds (of the decoded samples).
    pub fn duration_secs(&self) -> f64 {
        self.samples.len() as f64 / f64::from(self.sample_rate.max(1))
    }
}

/// Decodes WAV bytes to mono samples (the mean of the channels, as librosa's `to_mono`) within
/// [`Limits::current`]: a header past `min_sample_rate..=max_sample_rate` or declaring more
/// than `max_audio_secs` is an [`AudioError::Limit`] before any sample is read.
pub fn decode_wav(bytes: &[u8]) -> AudioResult<Audio> {
    decode_wav_with_limits(bytes, &Limits::current())
}

/// [`decode_wav`] within `limits`.
pub fn decode_wav_with_limits(bytes: &[u8], limits: &Limits) -> AudioResult<Audio> {
    decode(Cursor::new(bytes), limits, None)
}

/// Decodes at most the first `max_secs` seconds of WAV bytes ([`Audio::truncated`] says whether
/// the file holds more): a file of any length costs only that prefix. `max_secs` itself must be
/// within `max_audio_secs`.
pub fn decode_wav_prefix(bytes: &[u8], max_secs: f64) -> AudioResult<Audio> {
    decode(Cursor::new(bytes), &Limits::current(), Some(max_secs))
}

/// Reads and decodes a WAV file (see [`decode_wav`]); samples are read from the file as they are
/// decoded.
pub fn read_wav(path: &Path) -> AudioResult<Audio> {
    decode(open(path)?, &Limits::current(), None)
}

/// Reads at most the first `max_secs` seconds of a WAV file (see [`decode_wav_prefix`]); the rest
/// of the file is not read.
pub fn read_wav_prefix(path: &Path, max_secs: f64) -> AudioResult<Audio> {
    decode(open(path)?, &Limits::current(), Some(max_secs))
}

fn open(path: &Path) -> AudioResult<BufReader<std::fs::File>> {
    std::fs::File::open(path)
        .map(BufReader::new)
        .map_err(|source| AudioError::Io {
            path: path.to_path_buf(),
            source,
        })
}

/// Samples reserved up front at most: the rest grows with what the file really holds, whatever
/// its header declares.
const INITIAL_CAPACITY: usize = 1 << 20;

fn decode<R: Read>(input: R, limits: &Limits, max_secs: Option<f64>) -> AudioResult<Audio> {
    let mut reader = WavReader::new(input).map_err(|e| match e {
        hound::Error::Unsupported => AudioError::Unsupported(
            "the WAV header declares a compressed or otherwise unsupported encoding".into(),
        ),
        other => AudioError::Decode(other.to_string()),
    })?;
    let spec = reader.spec();
    if spec.channels == 0 {
        return Err(AudioError::Decode("the header declares 0 channels".into()));
    }
    if spec.sample_rate == 0 {
        return Err(AudioError::Decode(
            "the header declares a sampling rate of 0 Hz".into(),
        ));
    }
    limits.check_sample_rate(
        || "the WAV header's sampling rate".into(),
        spec.sample_rate.into(),
    )?;
    let int_scale = match (spec.sample_format, spec.bits_per_sample) {
        (SampleFormat::Int, bits @ (8 | 16 | 24 | 32)) => Some(1.0 / f64::from(1u32 << (bits - 1))),
        (SampleFormat::Float, 32) => None,
        (format, bits) => {
            return Err(AudioError::Unsupported(format!(
                "{bits}-bit {} samples (supported: 8/16/24/32-bit integer PCM, 32-bit float)",
                match format {
                    SampleFormat::Int => "integer",
                    SampleFormat::Float => "float",
                }
            )))
        }
    };
    let declared = u64::from(reader.duration());
    let wanted = match max_secs {
        None => {
            limits.check_secs(
                Limit::AudioSecs,
                || "the WAV header's duration".into(),
                Limits::secs(declared, spec.sample_rate),
            )?;
            declared
        }
        Some(secs) => {
            limits.check_secs(
                Limit::AudioSecs,
                || "the requested audio prefix".into(),
                secs,
            )?;
            if secs <= 0.0 {
                return Err(AudioError::Empty(format!(
                    "a prefix of {secs} s holds no samples"
                )));
            }
            declared.min((secs * f64::from(spec.sample_rate)).ceil() as u64)
        }
    };
    let channels = usize::from(spec.channels);
    let frames = usize::try_from(wanted)
        .map_err(|_| AudioError::Decode(format!("{wanted} frames do not fit in memory")))?;
    let mut samples = Vec::with_capacity(frames.min(INITIAL_CAPACITY));
    let mut index = 0usize;
    let mut frame = vec![0f32; channels];
    let read_err = |e: hound::Error| AudioError::Decode(e.to_string());
    let mid_frame = || AudioError::Decode("the sample data ends mid-frame".into());
    match int_scale {
        Some(scale) => {
            let mut it = reader.samples::<i32>();
            for _ in 0..frames {
                for slot in frame.iter_mut() {
                    let v = it.next().ok_or_else(mid_frame)?;
                    *slot = (f64::from(v.map_err(read_err)?) * scale) as f32;
                }
                push_frame(&mut samples, &frame, &mut index)?;
            }
        }
        None => {
            let mut it = reader.samples::<f32>();
            for _ in 0..frames {
                for slot in frame.iter_mut() {
                    let v = it.next().ok_or_else(mid_frame)?;
                    *slot = v.map_err(read_err)?;
                }
                push_frame(&mut samples, &frame, &mut index)?;
            }
        }
    }
    if samples.is_empty() {
        return Err(AudioError::Empty("the WAV file holds no samples".into()));
    }
    Ok(Audio {
        samples,
        sample_rate: spec.sample_rate,
        channels: spec.channels,
        truncated: wanted < declared,
    })
}

/// Mixes one frame down (the mean of its channels in f64) after checking every value is finite;
/// `index` counts interleaved samples (the position reported for a non-finite one).
fn push_frame(samples: &mut Vec<f32>, frame: &[f32], index: &mut usize) -> AudioResult<()> {
    for &v in frame {
        if !v.is_finite() {
            return Err(AudioError::NonFinite {
                index: *index,
                value: v,
            });
        }
        *index += 1;
    }
    samples.push(if frame.len() == 1 {
        frame[0]
    } else {
        (frame.iter().map(|&v| f64::from(v)).sum::<f64>() / frame.len() as f64) as f32
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hound::{WavSpec, WavWriter};

    fn wav(spec: WavSpec, write: impl FnOnce(&mut WavWriter<&mut Cursor<Vec<u8>>>)) -> Vec<u8> {
        let mut cur = Cursor::new(Vec::new());
        {
            let mut w = WavWriter::new(&mut cur, spec).unwrap();
            write(&mut w);
            w.finalize().unwrap();
        }
        cur.into_inner()
    }

    fn spec(channels: u16, bits: u16, format: SampleFormat) -> WavSpec {
        WavSpec {
            channels,
            sample_rate: 16000,
            bits_per_sample: bits,
            sample_format: format,
        }
    }

    #[test]
    fn integer_depths_scale_to_unit_range() {
        let b16 = wav(spec(1, 16, SampleFormat::Int), |w| {
            for v in [0i16, 16384, -32768, 32767] {
                w.write_sample(v).unwrap();
            }
        });
        let a = decode_wav(&b16).unwrap();
        assert_eq!(a.sample_rate, 16000);
        assert_eq!(a.samples[..3], [0.0, 0.5, -1.0]);
        assert!((a.samples[3] - 32767.0 / 32768.0).abs() < 1e-7);

        let b8 = wav(spec(1, 8, SampleFormat::Int), |w| {
            for v in [0i8, 64, -128] {
                w.write_sample(v).unwrap();
            }
        });
        assert_eq!(decode_wav(&b8).unwrap().samples, vec![0.0, 0.5, -1.0]);

        let b24 = wav(spec(1, 24, SampleFormat::Int), |w| {
            for v in [0i32, 1 << 22, -(1 << 23)] {
                w.write_sample(v).unwrap();
            }
        });
        assert_eq!(decode_wav(&b24).unwrap().samples, vec![0.0, 0.5, -1.0]);

        let b32 = wav(spec(1, 32, SampleFormat::Int), |w| {
            for v in [0i32, 1 << 30, i32::MIN] {
                w.write_sample(v).unwrap();
            }
        });
        assert_eq!(decode_wav(&b32).unwrap().samples, vec![0.0, 0.5, -1.0]);
    }

    #[test]
    fn float_and_stereo_mix_to_mono() {
        let f = wav(spec(2, 32, SampleFormat::Float), |w| {
            for v in [0.5f32, -0.5, 1.0, 0.0, 0.25, 0.75] {
                w.write_sample(v).unwrap();
            }
        });
        let a = decode_wav(&f).unwrap();
        assert_eq!(a.channels, 2);
        assert_eq!(a.samples, vec![0.0, 0.5, 0.5]);
    }

    #[test]
    fn bad_files_are_typed_errors() {
        assert!(matches!(
            decode_wav(b"this is not a wav file at all"),
            Err(AudioError::Decode(_))
        ));
        assert!(matches!(decode_wav(&[]), Err(AudioError::Decode(_))));
        // A WAV of a compressed encoding (ADPCM, format tag 2).
        let mut adpcm = b"RIFF".to_vec();
        adpcm.extend(36u32.to_le_bytes());
        adpcm.extend(b"WAVEfmt ");
        adpcm.extend(16u32.to_le_bytes());
        for v in [2u16, 1] {
            adpcm.extend(v.to_le_bytes());
        }
        adpcm.extend(16_000u32.to_le_bytes());
        adpcm.extend(32_000u32.to_le_bytes());
        for v in [2u16, 16] {
            adpcm.extend(v.to_le_bytes());
        }
        adpcm.extend(b"data");
        adpcm.extend(0u32.to_le_bytes());
        assert!(matches!(
            decode_wav(&adpcm),
            Err(AudioError::Unsupported(_))
        ));
        let empty = wav(spec(1, 16, SampleFormat::Int), |_| {});
        assert!(matches!(decode_wav(&empty), Err(AudioError::Empty(_))));
        let nan = wav(spec(1, 32, SampleFormat::Float), |w| {
            w.write_sample(0.0f32).unwrap();
            w.write_sample(f32::NAN).unwrap();
        });
        assert!(matches!(
            decode_wav(&nan),
            Err(AudioError::NonFinite { index: 1, .. })
        ));
        // Truncated: the header promises more data than there is.
        let good = wav(spec(1, 16, SampleFormat::Int), |w| {
            for _ in 0..100 {
                w.write_sample(1i16).unwrap();
            }
        });
        let cut = &good[..good.len() - 51];
        assert!(decode_wav(cut).is_err());
        assert!(matches!(
            read_wav(Path::new("/nonexistent/file.wav")),
            Err(AudioError::Io { .. })
        ));
    }
}
