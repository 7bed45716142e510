//! Process-wide settings for running the model on the CPU, applied once at startup.
//!
//! - Memory: candle allocates a fresh buffer for the result of every tensor operation and frees
//!   it soon after. glibc serves blocks above 128 KiB straight from `mmap` and hands them back
//!   to the kernel on `free`, so every operation on a multi-megabyte activation pays page
//!   faults and page zeroing again (up to a quarter of the CPU time of a training step,
//!   measured). Raising the thresholds keeps freed memory in the heap for the next operation.
//! - Threads: candle runs element-wise operations on a pool of pinned worker threads that
//!   spin while they wait. On a small machine shared with anything else (a build, the harness
//!   runtime, a second whale) the spinning steals the cores the work needs: a training step of
//!   the base model took 3.3 s with two workers and 1.2 s with one on a loaded 2-core machine.
//!   Matrix products keep every core (they use rayon, not this pool).
//! - Core count: when `RAYON_NUM_THREADS` is unset, candle works out the number of physical
//!   cores for every matrix product by reading `/proc/cpuinfo` (1-2% of a training step of the
//!   base model, measured). Setting the variable to that same count once makes it a lookup; rayon's
//!   pool (the fused kernels') then has one thread per physical core too.

/// The environment variable of candle's element-wise thread pool; an explicit setting wins.
const CANDLE_THREADS_VAR: &str = "CANDLE_NUM_THREADS";

/// The environment variable of rayon's pool and candle's matrix products; an explicit setting wins.
const RAYON_THREADS_VAR: &str = "RAYON_NUM_THREADS";

/// Applies the three settings; call first thing in `main`, before any thread starts.
pub fn configure_cpu() {
    keep_freed_memory();
    if std::env::var_os(CANDLE_THREADS_VAR).is_none() {
        std::env::set_var(CANDLE_THREADS_VAR, "1");
    }
    if std::env::var_os(RAYON_THREADS_VAR).is_none() {
        std::env::set_var(RAYON_THREADS_VAR, candle_core::utils::get_num_threads().to_string());
    }
}

/// Keeps freed memory for reuse instead of returning it to the kernel (glibc only).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    extern "C" {
        fn mallopt(param: i32, value: i32) -> i32;
    }
    const M_TRIM_THRESHOLD: i32 = -1;
    const M_MMAP_THRESHOLD: i32 = -3;
    // glibc's largest accepted mmap threshold (HEAP_MAX_SIZE / 2 on 64-bit targets).
    const LARGEST_MMAP_THRESHOLD: i32 = 32 << 20;
    // SAFETY: mallopt only sets glibc's allocation thresholds; it takes plain integers and
    // touches no memory of ours.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, LARGEST_MMAP_THRESHOLD);
        mallopt(M_TRIM_THRESHOLD, i32::MAX);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}

/// Hands the memory freed since the last call back to the kernel (glibc's `malloc_trim`, every
/// arena): the counterpart of [`configure_cpu`]'s thresholds, for the end of a unit of work.
/// Kept freed memory serves the next operation of a pass, but across passes of other shapes
/// (a training step, then generation, then the next step's copies of the weights) a process
/// that never trims grew without bound: a SmolLM2 run by about a gigabyte per weight step,
/// until the kernel killed it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn release_freed_memory() {
    extern "C" {
        fn malloc_trim(pad: usize) -> i32;
    }
    // SAFETY: malloc_trim only returns free pages of glibc's heaps to the kernel; it takes a
    // plain integer and touches no memory of ours.
    unsafe {
        malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_freed_memory() {}
