//! # ipfs-accelerate-chromium
//!
//! What the benchmark report's renderer and the browser backends share about Chromium: where
//! to look for it, whether a path is runnable, and the readable end of its log.
//!
//! ```
//! // `None` on a machine without Chromium; never panics.
//! let _found = ipfs_accelerate_chromium::system_chromium();
//! ```

use std::path::{Path, PathBuf};

/// Environment variable naming the Chromium executable to use.
pub const CHROMIUM_ENV: &str = "IPFS_ACCELERATE_CHROMIUM";
/// Executable names looked up on `PATH`, in order.
pub const CHROMIUM_NAMES: [&str; 3] = ["chromium", "chromium-browser", "google-chrome"];
/// The last place looked at.
pub const CHROMIUM_FALLBACK: &str = "/usr/bin/chromium";

/// True when `path` is a regular file with an execute bit (any file on non-Unix systems).
pub fn is_executable(path: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        meta.is_file() && meta.permissions().mode() & 0o111 != 0
    }
    #[cfg(not(unix))]
    {
        meta.is_file()
    }
}

/// The system's Chromium: [`CHROMIUM_NAMES`] on `PATH`, then [`CHROMIUM_FALLBACK`].
pub fn system_chromium() -> Option<PathBuf> {
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    CHROMIUM_NAMES
        .iter()
        .flat_map(|name| std::env::split_paths(&path_var).map(move |dir| dir.join(name)))
        .chain(std::iter::once(PathBuf::from(CHROMIUM_FALLBACK)))
        .find(|p| is_executable(p))
}

/// Sends SIGKILL to the process group `pgid` (a group started for a browser, so its helper
/// processes go too), ignoring errors; does nothing on non-Unix systems.
pub fn kill_group(pgid: u32) {
    #[cfg(unix)]
    {
        use std::process::{Command, Stdio};
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{pgid}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    #[cfg(not(unix))]
    let _ = pgid;
}

/// The last `max_chars` characters of a browser log, without Chromium's harmless D-Bus chatter
/// and blank lines (empty when the file cannot be read).
pub fn log_tail(path: &Path, max_chars: usize) -> String {
    let text = std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| !l.contains("dbus") && !l.trim().is_empty())
        .collect();
    let joined = kept.join("\n");
    let start = match max_chars.checked_sub(1) {
        Some(n) => joined.char_indices().rev().nth(n).map_or(0, |(i, _)| i),
        None => joined.len(),
    };
    joined[start..].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tail_keeps_the_end_without_dbus_lines() {
        let dir = std::env::temp_dir().join(format!("chromium-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("log");
        std::fs::write(&log, "first\n[dbus] noise\n\nsecond line\nthird").unwrap();
        assert_eq!(log_tail(&log, 1000), "first\nsecond line\nthird");
        assert_eq!(log_tail(&log, 5), "third");
        assert_eq!(log_tail(&dir.join("missing"), 10), "");
        assert!(!is_executable(&log));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
