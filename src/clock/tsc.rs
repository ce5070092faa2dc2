//! Reading quanta's counter in line, and scaling it with one multiply.
//!
//! When quanta reads the TSC, [`Tsc::nanos_since`] executes the same
//! `rdtsc` in line (`quanta::Clock::raw` is not `#[inline]`) and scales by a
//! 64.64 fixed-point factor derived once from quanta's own calibration:
//! nanoseconds are the high word of one `mul`, with no variable shift.
//!
//! The factor is quanta's scaling of 2⁴⁸ ticks, shifted up by 16: it agrees
//! with quanta to 2⁻⁴⁸ relative and is monotonic in the reading. It needs a
//! TSC above 1 GHz (so the factor fits 64 bits); else, or when quanta does
//! not read the TSC (its CPUID test, plus a reading of quanta's taken
//! between two of ours), every read goes through quanta.

use std::sync::OnceLock;

/// How a `DefaultClock` reads and scales its counter; decided once.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tsc {
    /// Nanoseconds per tick in 64.64 fixed point (`< 1`); 0: use quanta.
    scale: u64,
}

const PROBE_TICKS: u64 = 1 << 48;

impl Tsc {
    /// Reads through quanta (no TSC of its own).
    #[cfg(miri)]
    pub(super) const OS: Self = Self { scale: 0 };

    /// Decides for `clock`, once per process: every `quanta::Clock` picks
    /// the same counter, and CPUIDs (VM exits under a hypervisor) would cost
    /// more than the reads they speed up on per-request paths.
    pub(super) fn detect(clock: &quanta::Clock) -> Self {
        static SCALE: OnceLock<u64> = OnceLock::new();
        let scale = *SCALE.get_or_init(|| Self::probe(clock));
        Self { scale }
    }

    fn probe(clock: &quanta::Clock) -> u64 {
        let probe = clock.delta_as_nanos(0, PROBE_TICKS);
        if imp::same_counter(clock) && probe > 0 && probe < PROBE_TICKS {
            probe << 16
        } else {
            0
        }
    }

    /// The counter's raw reading, as quanta reads it.
    #[inline]
    pub(super) fn raw(self, clock: &quanta::Clock) -> u64 {
        if self.scale != 0 {
            imp::rdtsc()
        } else {
            clock.raw()
        }
    }

    /// Nanoseconds since the raw reading `origin` (0 if the counter reads
    /// at or before it).
    #[inline]
    pub(super) fn nanos_since(self, clock: &quanta::Clock, origin: u64) -> u64 {
        if self.scale != 0 {
            self.scaled(imp::rdtsc().saturating_sub(origin))
        } else {
            clock.delta_as_nanos(origin, clock.raw())
        }
    }

    /// `delta` ticks in nanoseconds (`scale != 0`).
    #[inline]
    fn scaled(self, delta: u64) -> u64 {
        ((delta as u128 * self.scale as u128) >> 64) as u64
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "sse2", not(miri)))]
mod imp {
    use core::arch::x86_64::{__cpuid, _rdtsc, CpuidResult};

    /// quanta's `has_counter_support`: an invariant TSC and `rdtscp`.
    fn counter_support() -> bool {
        // `__cpuid` is a safe fn on newer compilers, `unsafe` on the MSRV.
        #[allow(unused_unsafe)]
        // SAFETY: `cpuid` exists on every x86_64 CPU; leaves above the
        // maximum extended leaf are not queried.
        let leaf = |n: u32| -> CpuidResult { unsafe { __cpuid(n) } };
        let max_extended = leaf(0x8000_0000).eax;
        if max_extended < 0x8000_0007 {
            return false;
        }
        let invariant_tsc = leaf(0x8000_0007).edx & (1 << 8) != 0;
        let rdtscp = leaf(0x8000_0001).edx & (1 << 27) != 0;
        invariant_tsc && rdtscp
    }

    pub(super) fn same_counter(clock: &quanta::Clock) -> bool {
        if !counter_support() {
            return false;
        }
        let before = rdtsc();
        let theirs = clock.raw();
        let after = rdtsc();
        before <= theirs && theirs <= after
    }

    #[inline]
    pub(super) fn rdtsc() -> u64 {
        // SAFETY: `rdtsc` exists on every x86_64 CPU (quanta executes the
        // same intrinsic); it reads a counter and touches no memory.
        unsafe { _rdtsc() }
    }
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "sse2", not(miri))))]
mod imp {
    pub(super) fn same_counter(_: &quanta::Clock) -> bool {
        false
    }

    #[inline]
    pub(super) fn rdtsc() -> u64 {
        unreachable!("the inline counter is only chosen on x86_64")
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    /// The one-multiply scaling agrees with quanta's, from one tick to
    /// centuries (vacuous where quanta does not read the TSC).
    #[test]
    #[cfg_attr(miri, ignore = "quanta reads the TSC with inline asm")]
    fn scaling_matches_quanta() {
        let clock = quanta::Clock::new();
        let tsc = Tsc::detect(&clock);
        if tsc.scale == 0 {
            return;
        }
        let mut delta = 1u64;
        while delta < 1 << 62 {
            for d in [delta - 1, delta, delta + 1, delta / 3 * 2] {
                let theirs = clock.delta_as_nanos(0, d);
                let ours = tsc.scaled(d);
                // At most a nanosecond apart, plus 2^-40 relative.
                assert!(
                    ours.abs_diff(theirs) <= 1 + theirs / (1 << 40),
                    "{d}: {ours} vs {theirs}"
                );
                assert!(tsc.scaled(d) <= tsc.scaled(d + 1), "monotonic at {d}");
            }
            delta = delta * 3 + 1;
        }
    }
}
