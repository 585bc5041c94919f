//! What the machine is, for [`crate::RunInfo`]: host, OS, time, git commit, and the process's
//! memory high-water mark (the CPU model and cores come from the CPU backend's probe).

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch → `(year, month, day, hour, minute, second)` in UTC
/// (the civil-from-days algorithm of H. Hinnant).
fn civil(secs: u64) -> (i64, u32, u32, u32, u32, u32) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        month,
        day,
        (rem / 3600) as u32,
        (rem % 3600 / 60) as u32,
        (rem % 60) as u32,
    )
}

/// The current time as RFC 3339 UTC (`2026-11-22T10:47:33Z`) and as a compact id stem
/// (`20261122T104733Z`).
pub fn now_utc() -> (String, String) {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (y, mo, d, h, mi, s) = civil(secs);
    (
        format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z"),
        format!("{y:04}{mo:02}{d:02}T{h:02}{mi:02}{s:02}Z"),
    )
}

/// The host name (`/proc/sys/kernel/hostname`, `$HOSTNAME`, or "unknown").
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}

/// `os release arch` (`linux 6.1.0 x86_64`).
pub fn os_description() -> String {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    [
        std::env::consts::OS,
        release.as_str(),
        std::env::consts::ARCH,
    ]
    .iter()
    .filter(|s| !s.is_empty())
    .copied()
    .collect::<Vec<_>>()
    .join(" ")
}

/// `git rev-parse HEAD` in the current directory, when git and a repository are there.
pub fn git_commit() -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Resets the kernel's resident-set high-water mark of this process (Linux: `5` into
/// `/proc/self/clear_refs`), so [`peak_rss_bytes`] measures from now on. Returns whether it worked.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The resident-set high-water mark (`VmHWM`) of this process in bytes, on Linux.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    #[test]
    fn civil_dates() {
        assert_eq!(super::civil(0), (1970, 1, 1, 0, 0, 0));
        // 2026-11-22T10:47:33Z
        assert_eq!(super::civil(1_795_344_453), (2026, 11, 22, 10, 47, 33));
        // 2024-02-29 (leap day) 23:59:59
        assert_eq!(super::civil(1_709_251_199), (2024, 2, 29, 23, 59, 59));
    }
}
