//! A counting global allocator for tests that bound what a decoder may
//! allocate: every allocation is passed to the system allocator and its
//! size is added to a per-thread tally, so [`peak_during`] measures one
//! closure on the calling thread while other tests run on theirs.
//!
//! A test binary opts in with
//! `#[global_allocator] static A: agent_sim_testkit::alloc::CountingAlloc = CountingAlloc;`.
//! Without that line [`peak_during`] measures nothing (returns 0).

// Safety: a GlobalAlloc impl is unsafe by definition; it only forwards to
// `System` and adds numbers.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Heap a decoder may hold at once per input byte. The worst case is a
/// repeated message field of empty elements: 2 wire bytes (key, length 0)
/// become a whole struct (a Sensu `AssetRef` with its optional `ObjectMeta`
/// is ≈170 bytes, a Consul sub-message ≈100–200), and a growing `Vec`
/// briefly holds its old and new buffers.
pub const ALLOC_PER_BYTE: usize = 256;
/// Fixed allowance on top (first allocations, error values).
pub const ALLOC_SLACK: usize = 16 * 1024;

/// The most heap decoding `len` input bytes may hold at once:
/// [`ALLOC_PER_BYTE`] per byte plus [`ALLOC_SLACK`].
pub fn decode_bound(len: usize) -> usize {
    len * ALLOC_PER_BYTE + ALLOC_SLACK
}

thread_local! {
    // `const` initialisers: no lazy registration, so no allocation happens
    // inside the allocator.
    static CURRENT: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn add(n: isize) {
    let _ = CURRENT.try_with(|c| {
        let v = c.get() + n;
        c.set(v);
        let _ = PEAK.try_with(|p| {
            if v > p.get() {
                p.set(v);
            }
        });
    });
}

/// The system allocator, counting bytes per thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAlloc;

// SAFETY: every call is forwarded unchanged to `System`; the tally touches
// only const-initialised thread-locals (no allocation, no re-entry).
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on to System.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            add(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            add(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) };
        add(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // Counted as the new block arriving before the old one leaves,
            // which is what the peak of a moving realloc is.
            add(new_size as isize);
            add(-(layout.size() as isize));
        }
        p
    }
}

/// Runs `f` and returns its result with the most bytes it had allocated at
/// once on this thread (beyond what was allocated before it started).
pub fn peak_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let start = CURRENT.with(Cell::get);
    PEAK.with(|p| p.set(start));
    let r = f();
    let peak = PEAK.with(Cell::get);
    (r, (peak - start).max(0) as usize)
}
