//! Headless Chromium: screenshots of the HTML report, and a check that a screenshot shows
//! something (the report's plots) rather than a blank page.
//!
//! The browser is looked up in `$IPFS_ACCELERATE_CHROMIUM`, then as `chromium`,
//! `chromium-browser` or `google-chrome` on `PATH`, then at `/usr/bin/chromium`. It runs headless
//! with a fresh temporary profile, without sandbox (so it works as root in containers), without
//! GPU and without any network service, and is killed after a timeout (60 s by default).
//!
//! ```no_run
//! use std::path::Path;
//! use ipfs_accelerate_bench::chromium;
//!
//! # fn main() -> Result<(), chromium::ChromiumError> {
//! chromium::screenshot(Path::new("report.html"), Path::new("report.png"), 1280, 2000)?;
//! let stats = chromium::analyze_screenshot(Path::new("report.png"))?;
//! assert!(!stats.is_blank());
//! # Ok(())
//! # }
//! ```

use ipfs_accelerate_chromium::{is_executable, log_tail, system_chromium};
pub use ipfs_accelerate_chromium::{CHROMIUM_ENV, CHROMIUM_FALLBACK, CHROMIUM_NAMES};
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a screenshot may take before Chromium is killed.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// What can go wrong finding or running Chromium, or reading its screenshot.
#[derive(Debug, thiserror::Error)]
pub enum ChromiumError {
    /// No Chromium executable was found.
    #[error(
        "no Chromium found (looked at {searched}); set {CHROMIUM_ENV} to its executable or \
         install it (`apt-get install chromium`)"
    )]
    NotFound {
        /// Where it was looked for.
        searched: String,
    },
    /// `$IPFS_ACCELERATE_CHROMIUM` names something that is not an executable file.
    #[error("{CHROMIUM_ENV}={} is not an executable file", path.display())]
    EnvNotExecutable {
        /// The value of the variable.
        path: PathBuf,
    },
    /// The window size has a zero side or is too large to render.
    #[error("invalid window size {width}x{height} (each side must be 1..=16384)")]
    BadWindowSize {
        /// Width asked for.
        width: u32,
        /// Height asked for.
        height: u32,
    },
    /// A file could not be read, written or created.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Chromium did not finish in time and was killed.
    #[error("Chromium ran longer than {seconds} s and was killed; its stderr ends with: {stderr}")]
    Timeout {
        /// The timeout in seconds.
        seconds: u64,
        /// The end of its standard error.
        stderr: String,
    },
    /// Chromium exited with a failure status.
    #[error("Chromium exited with {status}; its stderr ends with: {stderr}")]
    Failed {
        /// The exit status.
        status: String,
        /// The end of its standard error.
        stderr: String,
    },
    /// Chromium exited successfully but wrote no (or an empty) screenshot.
    #[error("Chromium wrote no screenshot at {}; its stderr ends with: {stderr}", path.display())]
    NoScreenshot {
        /// Where the screenshot should be.
        path: PathBuf,
        /// The end of its standard error.
        stderr: String,
    },
    /// The screenshot could not be decoded.
    #[error("cannot decode the image {}: {message}", path.display())]
    Image {
        /// The image file.
        path: PathBuf,
        /// The decoder's message.
        message: String,
    },
}

/// Result of this module.
pub type Result<T> = std::result::Result<T, ChromiumError>;

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> ChromiumError {
    let context = context.into();
    move |source| ChromiumError::Io { context, source }
}

/// Finds the Chromium executable: `$IPFS_ACCELERATE_CHROMIUM` (which must then be executable),
/// then [`CHROMIUM_NAMES`] on `PATH`, then [`CHROMIUM_FALLBACK`].
pub fn find_chromium() -> Result<PathBuf> {
    if let Some(value) = std::env::var_os(CHROMIUM_ENV).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(value);
        return if is_executable(&path) {
            Ok(path)
        } else {
            Err(ChromiumError::EnvNotExecutable { path })
        };
    }
    if let Some(found) = system_chromium() {
        return Ok(found);
    }
    Err(ChromiumError::NotFound {
        searched: format!(
            "${CHROMIUM_ENV} (unset), {} on PATH, {CHROMIUM_FALLBACK}",
            CHROMIUM_NAMES.join(", ")
        ),
    })
}

/// A Chromium executable and the timeout of its runs.
#[derive(Debug, Clone)]
pub struct Chromium {
    path: PathBuf,
    timeout: Duration,
}

impl Chromium {
    /// The Chromium [`find_chromium`] finds, with [`DEFAULT_TIMEOUT`].
    pub fn find() -> Result<Chromium> {
        Ok(Chromium::at(find_chromium()?))
    }

    /// The Chromium at `path`, with [`DEFAULT_TIMEOUT`].
    pub fn at(path: impl Into<PathBuf>) -> Chromium {
        Chromium {
            path: path.into(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The same browser with another timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Chromium {
        self.timeout = timeout;
        self
    }

    /// The executable.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The command-line arguments of a screenshot run (profile in `profile_dir`).
    pub fn screenshot_args(
        profile_dir: &Path,
        page_url: &str,
        png_path: &Path,
        width: u32,
        height: u32,
    ) -> Vec<String> {
        vec![
            "--headless".into(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-dev-shm-usage".into(),
            "--force-device-scale-factor=1".into(),
            format!("--user-data-dir={}", profile_dir.display()),
            "--hide-scrollbars".into(),
            format!("--window-size={width},{height}"),
            format!("--screenshot={}", png_path.display()),
            page_url.into(),
        ]
    }

    /// Renders the page `html_path` in a `width`×`height` window and writes what the window
    /// shows to `png_path` (replaced when it exists).
    pub fn screenshot(
        &self,
        html_path: &Path,
        png_path: &Path,
        width: u32,
        height: u32,
    ) -> Result<()> {
        if width == 0 || height == 0 || width > 16384 || height > 16384 {
            return Err(ChromiumError::BadWindowSize { width, height });
        }
        let page = std::fs::canonicalize(html_path).map_err(io_err(format!(
            "cannot open the page {}",
            html_path.display()
        )))?;
        if !page.is_file() {
            return Err(ChromiumError::Io {
                context: format!("the page {}", page.display()),
                source: io::Error::new(io::ErrorKind::InvalidInput, "not a file"),
            });
        }
        let png = absolute(png_path)?;
        match std::fs::remove_file(&png) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(format!("cannot replace {}", png.display()))(e)),
        }

        let work = tempfile::Builder::new()
            .prefix("ipfs-accelerate-chromium-")
            .tempdir()
            .map_err(io_err("cannot create a temporary Chromium profile"))?;
        let profile = work.path().join("profile");
        let stderr_path = work.path().join("stderr.log");
        let stderr_file =
            File::create(&stderr_path).map_err(io_err("cannot create Chromium's log file"))?;

        let mut command = Command::new(&self.path);
        command
            .args(Self::screenshot_args(
                &profile,
                &file_url(&page),
                &png,
                width,
                height,
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr_file);
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            // Its own process group, so that its helper processes can be ended with it.
            command.process_group(0);
        }
        let mut child = command.spawn().map_err(io_err(format!(
            "cannot start Chromium {}",
            self.path.display()
        )))?;

        let started = Instant::now();
        let status: Option<ExitStatus> = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if started.elapsed() >= self.timeout => break None,
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => {
                    end_group(child.id());
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(io_err("cannot wait for Chromium")(e));
                }
            }
        };
        // Helpers (zygote, renderer, crashpad) can outlive the browser process.
        end_group(child.id());
        let stderr = || stderr_tail(&stderr_path);
        let Some(status) = status else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(ChromiumError::Timeout {
                seconds: self.timeout.as_secs(),
                stderr: stderr(),
            });
        };
        if !status.success() {
            return Err(ChromiumError::Failed {
                status: status.to_string(),
                stderr: stderr(),
            });
        }
        match std::fs::metadata(&png) {
            Ok(meta) if meta.len() > 0 => Ok(()),
            _ => Err(ChromiumError::NoScreenshot {
                path: png,
                stderr: stderr(),
            }),
        }
    }
}

/// Screenshots `html_path` into `png_path` with the Chromium [`find_chromium`] finds, in a
/// `width`×`height` window, killing it after [`DEFAULT_TIMEOUT`].
pub fn screenshot(html_path: &Path, png_path: &Path, width: u32, height: u32) -> Result<()> {
    Chromium::find()?.screenshot(html_path, png_path, width, height)
}

/// Kills the process group `pgid` (a group this module created for a browser it started).
fn end_group(pgid: u32) {
    ipfs_accelerate_chromium::kill_group(pgid);
}

fn absolute(path: &Path) -> Result<PathBuf> {
    if path.is_absolute() {
        return Ok(path.to_path_buf());
    }
    let cwd = std::env::current_dir().map_err(io_err("cannot read the current directory"))?;
    Ok(cwd.join(path))
}

/// The last 2000 characters of the log, without Chromium's harmless D-Bus chatter.
fn stderr_tail(path: &Path) -> String {
    log_tail(path, 2000)
}

/// `file://` URL of an absolute path, percent-encoding every byte outside `A-Za-z0-9-._~/`.
pub fn file_url(path: &Path) -> String {
    let text = path.to_string_lossy();
    let mut url = String::from("file://");
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            url.push(byte as char);
        } else {
            url.push_str(&format!("%{byte:02X}"));
        }
    }
    url
}

/// What a screenshot shows, as far as [`ScreenshotStats::is_blank`] is concerned.
#[derive(Debug, Clone, PartialEq)]
pub struct ScreenshotStats {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// The most frequent colour, taken as the background.
    pub background: [u8; 3],
    /// Share of pixels differing from the background by more than
    /// [`ScreenshotStats::CONTENT_DIFF`] in some channel.
    pub content_fraction: f64,
    /// Distinct saturated colours (channels quantised to 8 levels; max − min channel ≥
    /// [`ScreenshotStats::SATURATION`]) covering at least [`ScreenshotStats::MIN_COLOUR_PIXELS`]
    /// pixels each: the plots' lines and bars, which text and grid lines (grey) never give.
    pub saturated_colours: usize,
}

impl ScreenshotStats {
    /// Channel difference from the background that makes a pixel content.
    pub const CONTENT_DIFF: u8 = 32;
    /// Max − min channel of a pixel counted as coloured.
    pub const SATURATION: u8 = 64;
    /// Pixels a quantised colour needs to count.
    pub const MIN_COLOUR_PIXELS: usize = 16;
    /// Share of content pixels a non-blank page needs.
    pub const MIN_CONTENT_FRACTION: f64 = 0.005;
    /// Distinct saturated colours a non-blank page needs.
    pub const MIN_COLOURS: usize = 3;

    /// Blank: less than 0.5 % of the pixels differ from the background, or fewer than three
    /// distinct saturated colours appear (a page of text only does not show the plots).
    pub fn is_blank(&self) -> bool {
        self.content_fraction < Self::MIN_CONTENT_FRACTION
            || self.saturated_colours < Self::MIN_COLOURS
    }
}

fn load_rgb(png: &Path) -> Result<image::RgbImage> {
    let reader =
        image::ImageReader::open(png).map_err(io_err(format!("cannot open {}", png.display())))?;
    let reader = reader
        .with_guessed_format()
        .map_err(io_err(format!("cannot read {}", png.display())))?;
    let img = reader.decode().map_err(|e| ChromiumError::Image {
        path: png.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok(img.to_rgb8())
}

/// Measures the screenshot `png` (see [`ScreenshotStats`]).
pub fn analyze_screenshot(png: &Path) -> Result<ScreenshotStats> {
    let img = load_rgb(png)?;
    let (width, height) = img.dimensions();
    let total = (width as usize) * (height as usize);
    if total == 0 {
        return Err(ChromiumError::Image {
            path: png.to_path_buf(),
            message: "the image has no pixels".into(),
        });
    }
    let mut counts: HashMap<[u8; 3], usize> = HashMap::new();
    for p in img.pixels() {
        *counts.entry(p.0).or_default() += 1;
    }
    let background = counts
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
        .map(|(c, _)| *c)
        .unwrap_or([255, 255, 255]);
    let mut content = 0usize;
    let mut buckets: HashMap<[u8; 3], usize> = HashMap::new();
    for p in img.pixels() {
        let c = p.0;
        let diff = (0..3)
            .map(|i| c[i].abs_diff(background[i]))
            .max()
            .unwrap_or(0);
        if diff <= ScreenshotStats::CONTENT_DIFF {
            continue;
        }
        content += 1;
        let hi = c.iter().copied().max().unwrap_or(0);
        let lo = c.iter().copied().min().unwrap_or(0);
        if hi - lo >= ScreenshotStats::SATURATION {
            *buckets
                .entry([c[0] >> 5, c[1] >> 5, c[2] >> 5])
                .or_default() += 1;
        }
    }
    Ok(ScreenshotStats {
        width,
        height,
        background,
        content_fraction: content as f64 / total as f64,
        saturated_colours: buckets
            .values()
            .filter(|n| **n >= ScreenshotStats::MIN_COLOUR_PIXELS)
            .count(),
    })
}

/// True when the screenshot `png` is blank by [`ScreenshotStats::is_blank`].
pub fn screenshot_is_blank(png: &Path) -> Result<bool> {
    Ok(analyze_screenshot(png)?.is_blank())
}

/// Pixels of `png` within `tolerance` of `rgb` in every channel.
pub fn count_colour_near(png: &Path, rgb: (u8, u8, u8), tolerance: u8) -> Result<usize> {
    let img = load_rgb(png)?;
    let want = [rgb.0, rgb.1, rgb.2];
    Ok(img
        .pixels()
        .filter(|p| (0..3).all(|i| p.0[i].abs_diff(want[i]) <= tolerance))
        .count())
}
