//! The soak examples' memory figure, written once: this one's and fencing-benches'
//! soak, which includes this file by path.

/// Resident set size of this process, in KiB (`VmRSS` in `/proc/self/status`:
/// Linux; 0 where there is no such file).
pub(crate) fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
