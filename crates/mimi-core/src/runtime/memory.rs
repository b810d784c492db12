//! Memory: the up-front estimate check that turns "would not fit" into an error before any
//! allocation, the resident size, and the working-memory policy of offline calls (what the
//! allocator may keep for the next call, [`keep_heap_policy`]).

use crate::error::{Error, Result};

/// Bytes this process can still allocate, as far as the OS tells: `MemAvailable`, and the
/// address-space limit (`ulimit -v`) minus what is mapped. `None` where unknown (not Linux).
pub fn available_memory() -> Option<u64> {
    let kb = |text: &str, key: &str| -> Option<u64> {
        text.lines()
            .find(|l| l.starts_with(key))?
            .split_whitespace()
            .nth(1)?
            .parse::<u64>()
            .ok()
            .map(|v| v * 1024)
    };
    let mut avail = read_proc("/proc/meminfo", |t| kb(t, "MemAvailable:"))?;
    let as_limit = read_proc("/proc/self/limits", |t| {
        t.lines()
            .find(|l| l.starts_with("Max address space"))
            .and_then(|l| l.split_whitespace().nth(3))
            .and_then(|v| v.parse::<u64>().ok())
    });
    if let Some(limit) = as_limit {
        if let Some(used) = read_proc("/proc/self/status", |t| kb(t, "VmSize:")) {
            avail = avail.min(limit.saturating_sub(used));
        }
    }
    Some(avail)
}

thread_local! {
    /// The text of the last /proc file read on this thread, its capacity kept: a streaming
    /// step of many rows checks its memory every call, and allocates nothing doing so.
    static PROC_TEXT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// `f` of the text of `path` (None if it cannot be read), read into [`PROC_TEXT`].
fn read_proc<R>(path: &str, f: impl FnOnce(&str) -> Option<R>) -> Option<R> {
    use std::io::Read;
    PROC_TEXT.with(|cell| {
        let mut text = cell.try_borrow_mut().ok()?;
        text.clear();
        std::fs::File::open(path)
            .ok()?
            .read_to_string(&mut text)
            .ok()?;
        f(&text)
    })
}

/// Refuses work estimated to need more than the available memory.
pub fn check_memory(needed: u64, what: &str, hint: &str) -> Result<()> {
    // Small requests (a streaming step) skip the three /proc reads.
    if needed < 1 << 24 {
        return Ok(());
    }
    if let Some(avail) = available_memory() {
        if needed > avail {
            let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
            return Err(Error::Resource(format!(
                "{what} would need about {:.1} GiB of memory but only {:.1} GiB is available; {hint}",
                gib(needed),
                gib(avail)
            )));
        }
    }
    Ok(())
}

/// Resident memory of this process in bytes (`/proc/self/statm`); `None` where unknown.
pub fn resident_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        Some(pages * u64::try_from(page).ok()?)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// How much an offline call may leave in the allocator's free lists for the next call
/// (`MIMI_PY_HEAP_KEEP_MB`, see [`settings`](super::settings)).
fn heap_keep_bytes() -> u64 {
    super::settings::get().heap_keep_mb << 20
}

/// Returns the allocator's free memory to the OS (glibc keeps freed memory of large buffers
/// in its per-thread arenas) once an offline call that started at `before` resident bytes
/// grew the process by more than [`heap_keep_bytes`]. Below that, the memory stays for the
/// next call: a 10 s encode leaves ~95 MB, and faulting it back in (zeroed pages, ~20 000
/// faults) cost 10-14% of the next call. A large batch leaves more and is trimmed.
pub fn trim_heap_after(before: Option<u64>) {
    let grown = match (before, resident_bytes()) {
        (Some(b), Some(now)) => now.saturating_sub(b),
        _ => u64::MAX,
    };
    if grown > heap_keep_bytes() || heap_keep_bytes() == 0 {
        trim_heap();
    }
}

/// Returns all of the allocator's free memory to the OS.
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases memory that is free; it is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn resident_memory_is_read() {
        let before = resident_bytes().expect("statm");
        let v = std::hint::black_box(vec![1u8; 64 << 20]);
        let after = resident_bytes().expect("statm");
        assert!(after >= before + (60 << 20), "{before} -> {after}");
        assert_eq!(std::hint::black_box(&v)[12345], 1);
    }
}
