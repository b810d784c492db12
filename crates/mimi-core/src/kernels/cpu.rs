//! The CPU features the kernels may use, declared once: what this CPU has (detected at run
//! time, once), capped by `MIMI_PY_ISA` so that a test or a comparison can run the portable
//! (or AVX2) kernels on a machine that has more. Every kernel asks [`has`] before it calls
//! a variant compiled with `#[target_feature]`; [`has`] is never true for a feature the CPU
//! lacks, whatever the switch says. `gemm`, which the convolutions call, picks its own.

use std::sync::OnceLock;

/// The instruction sets the kernels are written for, in the order each implies the ones
/// before it (AVX-512 kernels also use AVX2 and FMA).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Plain Rust: every machine.
    Portable,
    /// AVX2 and FMA.
    Avx2,
    /// AVX-512F (with AVX2 and FMA).
    Avx512,
    /// AVX-512F and AVX-512 BF16 (`vdpbf16ps`).
    Avx512Bf16,
}

impl Level {
    /// Every level, lowest first.
    pub const ALL: [Level; 4] = [
        Level::Portable,
        Level::Avx2,
        Level::Avx512,
        Level::Avx512Bf16,
    ];

    /// The level's name, as `MIMI_PY_ISA` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Level::Portable => "portable",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
            Level::Avx512Bf16 => "avx512bf16",
        }
    }

    /// The level a `MIMI_PY_ISA` value names (`None` for `auto` or anything else).
    pub fn from_name(name: &str) -> Option<Level> {
        Level::ALL.into_iter().find(|l| l.name() == name)
    }
}

/// The best level this CPU runs, whatever `MIMI_PY_ISA` says.
pub fn detected() -> Level {
    static DETECTED: OnceLock<Level> = OnceLock::new();
    *DETECTED.get_or_init(detect)
}

fn detect() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if !(has!("avx2") && has!("fma")) {
            return Level::Portable;
        }
        if !has!("avx512f") {
            return Level::Avx2;
        }
        if has!("avx512bf16") {
            return Level::Avx512Bf16;
        }
        Level::Avx512
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Level::Portable
    }
}

/// Whether this CPU is AMD's (CPUID's vendor string), where `vdpbf16ps` runs at twice the
/// f32 FMA rate (Zen 4 and 5); Intel's run it at half ([`super::bf16dot::Path::best`]).
pub fn vendor_is_amd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let id = std::arch::x86_64::__cpuid(0); // leaf 0 exists on every x86-64 CPU

        [id.ebx, id.edx, id.ecx] == [0x6874_7541, 0x6974_6e65, 0x444d_4163] // "AuthenticAMD"
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The level the kernels run at: [`detected`], capped by `MIMI_PY_ISA`.
pub fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(
        || match Level::from_name(&crate::runtime::settings::get().isa) {
            Some(cap) => cap.min(detected()),
            None => detected(),
        },
    )
}

/// Whether the kernels may use `l`'s instructions (the CPU has them and the switch allows).
pub fn has(l: Level) -> bool {
    level() >= l
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_levels_are_ordered_and_named_once() {
        for w in Level::ALL.windows(2) {
            assert!(w[0] < w[1]);
        }
        for l in Level::ALL {
            assert_eq!(Level::from_name(l.name()), Some(l));
        }
        assert_eq!(Level::from_name("auto"), None);
        assert!(level() <= detected());
        assert!(has(Level::Portable));
    }

    /// Which of the kernels' instruction sets the variant tests of this build cover: one
    /// test per level, ignored (reported as such, not passed) where this CPU lacks it.
    fn covered(l: Level) {
        assert!(
            detected() >= l,
            "the build machine had {} but this CPU has only {}: rebuild the tests here",
            l.name(),
            detected().name()
        );
    }

    #[test]
    #[cfg_attr(
        not(mimi_cpu_avx2),
        ignore = "this CPU has no AVX2/FMA: those variants not run"
    )]
    fn this_cpu_runs_the_avx2_variants() {
        covered(Level::Avx2)
    }

    #[test]
    #[cfg_attr(
        not(mimi_cpu_avx512),
        ignore = "this CPU has no AVX-512: those variants not run"
    )]
    fn this_cpu_runs_the_avx512_variants() {
        covered(Level::Avx512)
    }

    #[test]
    #[cfg_attr(
        not(mimi_cpu_avx512bf16),
        ignore = "this CPU has no AVX-512 BF16: those variants not run"
    )]
    fn this_cpu_runs_the_avx512bf16_variants() {
        covered(Level::Avx512Bf16)
    }
}
