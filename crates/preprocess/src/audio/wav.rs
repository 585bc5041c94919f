//! WAV decoding with `hound`: 8/16/24/32-bit integer PCM and 32-bit float, any channel count,
//! mixed down to mono float samples in [-1, 1).

use std::io::Cursor;
use std::path::Path;

use hound::{SampleFormat, WavReader};

use super::error::{check_finite, AudioError, AudioResult};

/// Mono audio: float samples and their sampling rate.
#[derive(Debug, Clone, PartialEq)]
pub struct Audio {
    /// Samples, channels averaged (integer PCM scaled by `1 / 2^(bits - 1)`).
    pub samples: Vec<f32>,
    /// Samples per second.
    pub sample_rate: u32,
    /// Channels in the source before mixing down.
    pub channels: u16,
}

impl Audio {
    /// Duration in seconds.
    pub fn duration_secs(&self) -> f64 {
        self.samples.len() as f64 / f64::from(self.sample_rate.max(1))
    }
}

/// Decodes WAV bytes to mono samples (the mean of the channels, as librosa's `to_mono`).
pub fn decode_wav(bytes: &[u8]) -> AudioResult<Audio> {
    let reader = WavReader::new(Cursor::new(bytes)).map_err(|e| match e {
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
    let interleaved: Vec<f32> = match (spec.sample_format, spec.bits_per_sample) {
        (SampleFormat::Int, bits @ (8 | 16 | 24 | 32)) => {
            let scale = 1.0 / f64::from(1u32 << (bits - 1));
            reader
                .into_samples::<i32>()
                .map(|s| {
                    s.map(|v| (f64::from(v) * scale) as f32)
                        .map_err(|e| AudioError::Decode(e.to_string()))
                })
                .collect::<AudioResult<_>>()?
        }
        (SampleFormat::Float, 32) => reader
            .into_samples::<f32>()
            .map(|s| s.map_err(|e| AudioError::Decode(e.to_string())))
            .collect::<AudioResult<_>>()?,
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
    let channels = usize::from(spec.channels);
    if interleaved.len() < channels {
        return Err(AudioError::Empty("the WAV file holds no samples".into()));
    }
    check_finite(&interleaved)?;
    let samples = if channels == 1 {
        interleaved
    } else {
        // A trailing partial frame (a truncated file) is dropped.
        interleaved
            .chunks_exact(channels)
            .map(|frame| {
                (frame.iter().map(|&v| f64::from(v)).sum::<f64>() / channels as f64) as f32
            })
            .collect()
    };
    Ok(Audio {
        samples,
        sample_rate: spec.sample_rate,
        channels: spec.channels,
    })
}

/// Reads and decodes a WAV file.
pub fn read_wav(path: &Path) -> AudioResult<Audio> {
    let bytes = std::fs::read(path).map_err(|source| AudioError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    decode_wav(&bytes)
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
