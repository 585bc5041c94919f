//! The signal-processing pieces of HF's `audio_utils`: windows, the Slaney mel scale and filter
//! bank, and a centred short-time power spectrum, all in float64 as numpy computes them.

use std::sync::Arc;

use realfft::{RealFftPlanner, RealToComplex};

use super::error::{AudioError, AudioResult};
use crate::limits::{Limit, Limits};

/// The Hann window of `length` samples; `periodic` drops the last point of a `length + 1`
/// symmetric window (`np.hanning(length + 1)[:-1]`, `torch.hann_window(length)`).
pub fn hann_window(length: usize, periodic: bool) -> Vec<f64> {
    let n = if periodic { length + 1 } else { length };
    if n <= 1 {
        return vec![1.0; length];
    }
    let denom = (n - 1) as f64;
    (0..length)
        .map(|i| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / denom).cos())
        .collect()
}

const MIN_LOG_HERTZ: f64 = 1000.0;
const MIN_LOG_MEL: f64 = 15.0;

/// Hertz to mels on the Slaney scale (linear below 1 kHz, logarithmic above), as librosa.
pub fn hertz_to_mel_slaney(freq: f64) -> f64 {
    let logstep = 27.0 / 6.4f64.ln();
    if freq >= MIN_LOG_HERTZ {
        MIN_LOG_MEL + (freq / MIN_LOG_HERTZ).ln() * logstep
    } else {
        3.0 * freq / 200.0
    }
}

/// Mels on the Slaney scale back to hertz.
pub fn mel_to_hertz_slaney(mel: f64) -> f64 {
    let logstep = 6.4f64.ln() / 27.0;
    if mel >= MIN_LOG_MEL {
        MIN_LOG_HERTZ * (logstep * (mel - MIN_LOG_MEL)).exp()
    } else {
        200.0 * mel / 3.0
    }
}

/// `np.linspace(start, stop, num)`: `start + i * step`, with the last point exactly `stop`.
fn linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    match num {
        0 => Vec::new(),
        1 => vec![start],
        _ => {
            let step = (stop - start) / (num - 1) as f64;
            let mut v: Vec<f64> = (0..num).map(|i| start + i as f64 * step).collect();
            v[num - 1] = stop;
            v
        }
    }
}

/// A mel filter bank: `mels` triangular filters over `bins` frequency bins, stored per filter
/// as the first non-zero bin and the weights from there on (most weights are zero).
#[derive(Debug, Clone, PartialEq)]
pub struct MelFilterBank {
    bins: usize,
    filters: Vec<(usize, Vec<f64>)>,
}

impl MelFilterBank {
    /// HF's `mel_filter_bank(num_frequency_bins, num_mel_filters, min_frequency, max_frequency,
    /// sampling_rate, norm="slaney", mel_scale="slaney")`: filters evenly spaced on the Slaney mel
    /// scale between the two frequencies, triangles in hertz, area-normalised. The filter count
    /// and bins are bounded by [`Limits::current`] (`max_mel_bins`, `max_n_fft / 2 + 1`).
    pub fn slaney(
        num_frequency_bins: usize,
        num_mel_filters: usize,
        min_frequency: f64,
        max_frequency: f64,
        sampling_rate: u32,
    ) -> AudioResult<Self> {
        Self::slaney_with(
            num_frequency_bins,
            num_mel_filters,
            min_frequency,
            max_frequency,
            sampling_rate,
            &Limits::current(),
        )
    }

    /// [`MelFilterBank::slaney`] within `limits`.
    pub(crate) fn slaney_with(
        num_frequency_bins: usize,
        num_mel_filters: usize,
        min_frequency: f64,
        max_frequency: f64,
        sampling_rate: u32,
        limits: &Limits,
    ) -> AudioResult<Self> {
        limits.check(
            Limit::MelBins,
            || "mel filters".into(),
            num_mel_filters as u128,
        )?;
        limits.check(
            Limit::NFft,
            || "FFT size implied by the frequency bins".into(),
            (num_frequency_bins as u128).saturating_sub(1) * 2,
        )?;
        let bad = |reason: String| AudioError::Config {
            origin: "mel filter bank".into(),
            reason,
        };
        if num_frequency_bins < 2 {
            return Err(bad(format!(
                "{num_frequency_bins} frequency bins (at least 2 are needed)"
            )));
        }
        if num_mel_filters == 0 {
            return Err(bad("zero mel filters".into()));
        }
        if !(min_frequency.is_finite() && max_frequency.is_finite())
            || min_frequency < 0.0
            || min_frequency > max_frequency
        {
            return Err(bad(format!(
                "frequency range {min_frequency}..{max_frequency} Hz is invalid"
            )));
        }
        let mel_points = linspace(
            hertz_to_mel_slaney(min_frequency),
            hertz_to_mel_slaney(max_frequency),
            num_mel_filters + 2,
        );
        let filter_freqs: Vec<f64> = mel_points.into_iter().map(mel_to_hertz_slaney).collect();
        let fft_freqs = linspace(0.0, (sampling_rate / 2) as f64, num_frequency_bins);
        let mut filters = Vec::with_capacity(num_mel_filters);
        for m in 0..num_mel_filters {
            let (lo, mid, hi) = (filter_freqs[m], filter_freqs[m + 1], filter_freqs[m + 2]);
            let enorm = 2.0 / (hi - lo);
            let weights: Vec<f64> = fft_freqs
                .iter()
                .map(|&f| {
                    let down = (f - lo) / (mid - lo);
                    let up = (hi - f) / (hi - mid);
                    // np.maximum(0, np.minimum(down, up)); NaN (a zero-width band) propagates as numpy.
                    let tri = down.min(up);
                    let tri = if tri.is_nan() { tri } else { tri.max(0.0) };
                    tri * enorm
                })
                .collect();
            let first = weights
                .iter()
                .position(|w| *w != 0.0)
                .unwrap_or(weights.len());
            let last = weights
                .iter()
                .rposition(|w| *w != 0.0)
                .map_or(first, |i| i + 1);
            filters.push((first, weights[first..last].to_vec()));
        }
        Ok(MelFilterBank {
            bins: num_frequency_bins,
            filters,
        })
    }

    /// Number of filters.
    pub fn num_mels(&self) -> usize {
        self.filters.len()
    }

    /// Number of frequency bins each filter spans.
    pub fn num_bins(&self) -> usize {
        self.bins
    }

    /// The dense matrix `[bins, mels]` (HF's layout).
    pub fn to_dense(&self) -> Vec<f64> {
        let mels = self.num_mels();
        let mut out = vec![0.0; self.bins * mels];
        for (m, (first, w)) in self.filters.iter().enumerate() {
            for (i, v) in w.iter().enumerate() {
                out[(first + i) * mels + m] = *v;
            }
        }
        out
    }

    /// Applies the bank to one power spectrum of [`MelFilterBank::num_bins`] values.
    pub fn apply(&self, spectrum: &[f64], out: &mut [f64]) {
        for (o, (first, w)) in out.iter_mut().zip(&self.filters) {
            *o = w.iter().zip(&spectrum[*first..]).map(|(a, b)| a * b).sum();
        }
    }
}

/// `np.pad(x, (pad, pad), mode="reflect")` (edge not repeated), with repeated reflection when the
/// signal is shorter than the padding, as numpy does.
pub fn reflect_pad(x: &[f64], pad: usize) -> Vec<f64> {
    let n = x.len();
    if n <= 1 {
        // numpy pads a single sample with copies of itself.
        return vec![x.first().copied().unwrap_or(0.0); n + 2 * pad];
    }
    let period = 2 * (n - 1);
    let at = |i: isize| -> f64 {
        let m = i.rem_euclid(period as isize) as usize;
        x[if m < n { m } else { period - m }]
    };
    (0..n + 2 * pad)
        .map(|j| at(j as isize - pad as isize))
        .collect()
}

/// A mel power spectrogram as HF's audio feature extractors compute it: periodic Hann window of
/// `n_fft` samples, centred reflect-padded STFT every `hop_length`, Slaney mel filter bank.
#[derive(Debug)]
pub struct MelSpectrogram {
    stft: PowerStft,
    filters: MelFilterBank,
}

impl MelSpectrogram {
    /// The window, FFT plan and `mels` Slaney filters between `min_frequency` and `max_frequency`;
    /// `n_fft` and `mels` are checked against [`Limits::current`] before the window is built.
    pub fn slaney(
        n_fft: usize,
        hop_length: usize,
        mels: usize,
        min_frequency: f64,
        max_frequency: f64,
        sampling_rate: u32,
    ) -> AudioResult<Self> {
        Self::slaney_with(
            n_fft,
            hop_length,
            mels,
            (min_frequency, max_frequency),
            sampling_rate,
            &Limits::current(),
        )
    }

    /// [`MelSpectrogram::slaney`] within `limits`.
    pub(crate) fn slaney_with(
        n_fft: usize,
        hop_length: usize,
        mels: usize,
        (min_frequency, max_frequency): (f64, f64),
        sampling_rate: u32,
        limits: &Limits,
    ) -> AudioResult<Self> {
        limits.check(Limit::NFft, || "n_fft".into(), n_fft as u128)?;
        limits.check(Limit::MelBins, || "mel bins".into(), mels as u128)?;
        let stft = PowerStft::new(hann_window(n_fft, true), hop_length)?;
        let filters = MelFilterBank::slaney_with(
            stft.num_bins(),
            mels,
            min_frequency,
            max_frequency,
            sampling_rate,
            limits,
        )?;
        Ok(MelSpectrogram { stft, filters })
    }

    /// The filter bank.
    pub fn filters(&self) -> &MelFilterBank {
        &self.filters
    }

    /// The STFT.
    pub fn stft(&self) -> &PowerStft {
        &self.stft
    }

    /// Mel bins per frame.
    pub fn num_mels(&self) -> usize {
        self.filters.num_mels()
    }

    /// The mel power of each of the first `max_frames` frames of `signal` (see
    /// [`PowerStft::centered_power`]): calls `each(frame_index, mels)` in order.
    pub fn centered_mels(
        &self,
        signal: &[f64],
        max_frames: usize,
        mut each: impl FnMut(usize, &[f64]),
    ) -> AudioResult<()> {
        let mut mel = vec![0f64; self.num_mels()];
        self.stft.centered_power(signal, max_frames, |t, power| {
            self.filters.apply(power, &mut mel);
            each(t, &mel);
        })
    }
}

/// A short-time Fourier transform producing power spectra: frames of `frame_length` samples every
/// `hop_length`, multiplied by a window, real FFT of the same length, `|X|²`.
pub struct PowerStft {
    frame_length: usize,
    hop_length: usize,
    window: Vec<f64>,
    fft: Arc<dyn RealToComplex<f64>>,
}

impl std::fmt::Debug for PowerStft {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PowerStft")
            .field("frame_length", &self.frame_length)
            .field("hop_length", &self.hop_length)
            .finish()
    }
}

impl PowerStft {
    /// An STFT with `window` (its length is the frame and FFT length) and `hop_length`.
    pub fn new(window: Vec<f64>, hop_length: usize) -> AudioResult<Self> {
        if window.is_empty() || hop_length == 0 {
            return Err(AudioError::Config {
                origin: "STFT".into(),
                reason: format!(
                    "frame length {} and hop length {hop_length} must be positive",
                    window.len()
                ),
            });
        }
        let fft = RealFftPlanner::<f64>::new().plan_fft_forward(window.len());
        Ok(PowerStft {
            frame_length: window.len(),
            hop_length,
            window,
            fft,
        })
    }

    /// Frequency bins per frame (`frame_length / 2 + 1`).
    pub fn num_bins(&self) -> usize {
        self.frame_length / 2 + 1
    }

    /// Frames produced for a signal of `len` samples with centring (`1 + len / hop`).
    pub fn num_frames_centered(&self, len: usize) -> usize {
        1 + len / self.hop_length
    }

    /// Power spectra of `signal` padded by `frame_length / 2` on each side with reflection
    /// (`center=True, pad_mode="reflect"`); calls `each(frame_index, spectrum)` per frame, in order,
    /// for the first `max_frames` frames.
    pub fn centered_power(
        &self,
        signal: &[f64],
        max_frames: usize,
        mut each: impl FnMut(usize, &[f64]),
    ) -> AudioResult<()> {
        let padded = reflect_pad(signal, self.frame_length / 2);
        let frames = if padded.len() < self.frame_length {
            0
        } else {
            1 + (padded.len() - self.frame_length) / self.hop_length
        };
        let mut input = self.fft.make_input_vec();
        let mut output = self.fft.make_output_vec();
        let mut scratch = self.fft.make_scratch_vec();
        let mut power = vec![0.0; self.num_bins()];
        for t in 0..frames.min(max_frames) {
            let start = t * self.hop_length;
            for ((dst, src), w) in input
                .iter_mut()
                .zip(&padded[start..start + self.frame_length])
                .zip(&self.window)
            {
                *dst = src * w;
            }
            self.fft
                .process_with_scratch(&mut input, &mut output, &mut scratch)
                .map_err(|e| AudioError::Transform(e.to_string()))?;
            for (p, c) in power.iter_mut().zip(&output) {
                *p = c.re * c.re + c.im * c.im;
            }
            each(t, &power);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slaney_scale_round_trips_and_is_continuous_at_1khz() {
        for f in [0.0, 200.0, 999.0, 1000.0, 4000.0, 8000.0] {
            let back = mel_to_hertz_slaney(hertz_to_mel_slaney(f));
            assert!((back - f).abs() < 1e-9, "{f} -> {back}");
        }
        assert!((hertz_to_mel_slaney(1000.0) - 15.0).abs() < 1e-12);
        assert!((hertz_to_mel_slaney(999.999) - 15.0).abs() < 1e-3);
    }

    #[test]
    fn hann_is_periodic() {
        let w = hann_window(4, true);
        let want = [0.0, 0.5, 1.0, 0.5];
        for (a, b) in w.iter().zip(want) {
            assert!((a - b).abs() < 1e-12);
        }
        let s = hann_window(3, false);
        assert!((s[1] - 1.0).abs() < 1e-12 && s[0].abs() < 1e-12 && s[2].abs() < 1e-12);
    }

    #[test]
    fn reflect_pad_matches_numpy() {
        let x = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(
            reflect_pad(&x, 2),
            vec![3.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 2.0]
        );
        // Longer than the signal: numpy reflects again.
        assert_eq!(
            reflect_pad(&[1.0, 2.0], 3),
            vec![2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0]
        );
    }

    #[test]
    fn filter_bank_triangles_have_slaney_area() {
        let bank = MelFilterBank::slaney(201, 10, 0.0, 8000.0, 16000).unwrap();
        let dense = bank.to_dense();
        assert_eq!(dense.len(), 201 * 10);
        assert!(dense.iter().all(|v| *v >= 0.0));
        // Each filter peaks between its neighbours and every filter is non-zero somewhere.
        for m in 0..10 {
            assert!((0..201).any(|b| dense[b * 10 + m] > 0.0));
        }
        assert!(MelFilterBank::slaney(1, 10, 0.0, 8000.0, 16000).is_err());
        assert!(MelFilterBank::slaney(201, 10, 9000.0, 8000.0, 16000).is_err());
    }

    #[test]
    fn stft_of_a_sine_peaks_at_its_bin() {
        let n = 64;
        let stft = PowerStft::new(hann_window(n, true), 16).unwrap();
        // 8 cycles per 64 samples: bin 8.
        let x: Vec<f64> = (0..512)
            .map(|i| (2.0 * std::f64::consts::PI * 8.0 * i as f64 / n as f64).sin())
            .collect();
        let mut frames = 0;
        stft.centered_power(&x, usize::MAX, |t, p| {
            frames += 1;
            if t > 4 && t < 25 {
                let best = (0..p.len()).max_by(|&a, &b| p[a].total_cmp(&p[b])).unwrap();
                assert_eq!(best, 8);
            }
        })
        .unwrap();
        assert_eq!(frames, stft.num_frames_centered(512));
    }
}
