//! Sampling-rate conversion with `rubato`'s synchronous FFT resampler (band-limited, fixed ratio).

use rubato::{FftFixedInOut, Resampler};

use super::error::{check_finite, AudioError, AudioResult};
use crate::limits::{Limit, Limits};

/// Input frames per FFT block (rounded up by rubato to a multiple of the rate ratio's denominator).
const CHUNK: usize = 1024;

/// Resamples mono `samples` from `from` Hz to `to` Hz. The output has `ceil(len * to / from)`
/// samples, aligned with the input (the resampler's delay is removed). Equal rates return the
/// input unchanged. Both rates must be within [`Limits::current`]'s sample-rate range and the
/// input within its `max_audio_secs`.
pub fn resample(samples: &[f32], from: u32, to: u32) -> AudioResult<Vec<f32>> {
    resample_with(samples, from, to, usize::MAX, &Limits::current())
}

/// The first `max_len` samples of [`resample`]`(samples, from, to)`, bit for bit, computed from
/// only the input they depend on (a few resampler blocks past `max_len · from / to` samples):
/// what a consumer with a fixed window should call on a long input.
pub fn resample_prefix(
    samples: &[f32],
    from: u32,
    to: u32,
    max_len: usize,
) -> AudioResult<Vec<f32>> {
    resample_with(samples, from, to, max_len, &Limits::current())
}

/// Samples `len` input samples at `from` Hz become at `to` Hz (`ceil(len · to / from)`).
pub(crate) fn resampled_len(len: usize, from: u32, to: u32) -> u128 {
    (len as u128 * u128::from(to)).div_ceil(u128::from(from.max(1)))
}

/// [`resample_prefix`] within `limits`.
pub(crate) fn resample_with(
    samples: &[f32],
    from: u32,
    to: u32,
    max_len: usize,
    limits: &Limits,
) -> AudioResult<Vec<f32>> {
    if from == 0 || to == 0 {
        return Err(AudioError::Resample(format!(
            "sampling rates must be positive (from {from} Hz to {to} Hz)"
        )));
    }
    limits.check_sample_rate(|| "the rate resampled from".into(), from.into())?;
    limits.check_sample_rate(|| "the rate resampled to".into(), to.into())?;
    if samples.is_empty() {
        return Err(AudioError::Empty("nothing to resample".into()));
    }
    if from == to {
        let prefix = &samples[..samples.len().min(max_len)];
        check_finite(prefix)?;
        return Ok(prefix.to_vec());
    }
    let expected = resampled_len(samples.len(), from, to).min(max_len as u128);
    let expected = usize::try_from(expected)
        .map_err(|_| AudioError::Resample("the resampled signal would be too long".into()))?;
    // An even number of ratio periods per FFT block keeps both block sizes even, so the delay
    // rubato reports (half an output block) is exactly half an input block and the output stays
    // aligned to the input to a fraction of a sample.
    let period_in = (from / gcd(from, to)) as usize;
    let periods = CHUNK.div_ceil(period_in).next_multiple_of(2);
    let mut r = FftFixedInOut::<f64>::new(from as usize, to as usize, periods * period_in, 1)
        .map_err(|e| AudioError::Resample(e.to_string()))?;
    let delay = r.output_delay();
    // Only whole blocks of input up to the last block the wanted output needs: the blocks the
    // full signal would go through, so the prefix is the same.
    let (block_in, block_out) = (r.input_frames_next(), r.output_frames_next().max(1));
    let blocks = (expected as u128 + delay as u128).div_ceil(block_out as u128);
    let n = samples
        .len()
        .min(usize::try_from(blocks * block_in as u128).unwrap_or(usize::MAX));
    limits.check_secs(
        Limit::AudioSecs,
        || "the audio to resample".into(),
        Limits::secs(n as u64, from),
    )?;
    let samples = &samples[..n];
    check_finite(samples)?;
    let input: Vec<f64> = samples.iter().map(|&v| f64::from(v)).collect();
    let mut out: Vec<f64> = Vec::with_capacity(expected + delay + r.output_frames_max());
    let mut pos = 0;
    let err = |e: rubato::ResampleError| AudioError::Resample(e.to_string());
    while out.len() < expected + delay {
        let need = r.input_frames_next();
        let block = if pos + need <= n {
            let b = r.process(&[&input[pos..pos + need]], None).map_err(err)?;
            pos += need;
            b
        } else if pos < n {
            let b = r
                .process_partial(Some(&[&input[pos..]]), None)
                .map_err(err)?;
            pos = n;
            b
        } else {
            r.process_partial::<&[f64]>(None, None).map_err(err)?
        };
        match block.into_iter().next() {
            Some(ch) if !ch.is_empty() => out.extend(ch),
            _ => {
                return Err(AudioError::Resample(
                    "the resampler produced no output".into(),
                ))
            }
        }
    }
    Ok(out
        .into_iter()
        .skip(delay)
        .take(expected)
        .map(|v| v as f32)
        .collect())
}

/// At most `max_len` samples of `samples` (at `rate` Hz) at `target` Hz, resampling only the
/// input they need, and the length the whole input would have at `target` Hz. A different rate
/// without `allow_resample` is [`AudioError::SampleRate`].
pub(crate) fn conform_prefix<'a>(
    samples: &'a [f32],
    rate: u32,
    target: u32,
    allow_resample: bool,
    max_len: usize,
    limits: &Limits,
) -> AudioResult<(std::borrow::Cow<'a, [f32]>, u128)> {
    if samples.is_empty() {
        return Err(AudioError::Empty("the waveform has no samples".into()));
    }
    if rate == target {
        let full = samples.len() as u128;
        return Ok((
            std::borrow::Cow::Borrowed(&samples[..samples.len().min(max_len)]),
            full,
        ));
    }
    if !allow_resample {
        return Err(AudioError::SampleRate {
            expected: target,
            got: rate,
        });
    }
    let out = resample_with(samples, rate, target, max_len, limits)?;
    Ok((
        std::borrow::Cow::Owned(out),
        resampled_len(samples.len(), rate, target),
    ))
}

fn gcd(mut a: u32, mut b: u32) -> u32 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Audio at `rate` Hz made ready for a consumer expecting `target` Hz: returned as is when the
/// rates agree, resampled when `allow_resample`, otherwise an [`AudioError::SampleRate`] error.
pub fn conform_rate(
    samples: &[f32],
    rate: u32,
    target: u32,
    allow_resample: bool,
) -> AudioResult<std::borrow::Cow<'_, [f32]>> {
    if rate == target {
        Ok(std::borrow::Cow::Borrowed(samples))
    } else if allow_resample {
        Ok(std::borrow::Cow::Owned(resample(samples, rate, target)?))
    } else {
        Err(AudioError::SampleRate {
            expected: target,
            got: rate,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sine(freq: f64, rate: u32, secs: f64) -> Vec<f32> {
        let n = (secs * f64::from(rate)) as usize;
        (0..n)
            .map(|i| (2.0 * std::f64::consts::PI * freq * i as f64 / f64::from(rate)).sin() as f32)
            .collect()
    }

    #[test]
    fn a_sine_survives_resampling() {
        for (from, to) in [
            (44_100, 16_000),
            (8_000, 16_000),
            (48_000, 16_000),
            (22_050, 16_000),
        ] {
            let x = sine(440.0, from, 0.5);
            let y = resample(&x, from, to).unwrap();
            let want = (x.len() as u64 * u64::from(to)).div_ceil(u64::from(from)) as usize;
            assert_eq!(y.len(), want, "{from} -> {to}");
            let reference = sine(440.0, to, 0.5);
            // Away from the edges the resampled signal is the same sine at the new rate.
            let (lo, hi) = (y.len() / 8, y.len() * 7 / 8);
            let err = y[lo..hi]
                .iter()
                .zip(&reference[lo..hi])
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(err < 1e-3, "{from} -> {to}: max error {err}");
        }
    }

    #[test]
    fn rate_checks() {
        let x = vec![0.1f32; 100];
        assert_eq!(resample(&x, 16_000, 16_000).unwrap(), x);
        assert!(matches!(
            resample(&[], 8_000, 16_000),
            Err(AudioError::Empty(_))
        ));
        assert!(matches!(
            resample(&x, 0, 16_000),
            Err(AudioError::Resample(_))
        ));
        assert!(matches!(
            resample(&[0.0, f32::NAN], 8_000, 16_000),
            Err(AudioError::NonFinite { .. })
        ));
        assert!(matches!(
            conform_rate(&x, 8_000, 16_000, false),
            Err(AudioError::SampleRate {
                expected: 16_000,
                got: 8_000
            })
        ));
        assert_eq!(conform_rate(&x, 8_000, 16_000, true).unwrap().len(), 200);
        assert!(matches!(
            conform_rate(&x, 16_000, 16_000, false).unwrap(),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}
