//! Instruction-set tiers. The scalar tier is the reference every other tier is tested against.

use std::fmt;

/// A tier of SIMD support, ordered: a higher tier may use everything a lower one does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Isa {
    #[default]
    Scalar,
    /// AVX2 + FMA + F16C (x86-64-v3).
    Avx2,
    /// AVX-512 F/BW/VL + VNNI.
    Avx512,
    /// The AVX-512 tier plus AMX-INT8 tiles for prompts' q4 products, where the kernel grants
    /// the tile state ([`crate::amx::granted`]).
    Amx,
}

impl Isa {
    /// The best tier this CPU supports.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512vnni")
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                return if crate::amx::granted() { Isa::Amx } else { Isa::Avx512 };
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// The detected tier, capped by `cap` (e.g. from `MOESCOPE_ISA`).
    pub fn detect_capped(cap: Option<Isa>) -> Isa {
        let best = Isa::detect();
        match cap {
            Some(c) if c < best => c,
            _ => best,
        }
    }

    /// Whether this tier may use AVX-512 VBMI's byte permutes (`vpermb`, `vpermt2b`): the
    /// AVX-512 tier on a CPU that has them (Ice Lake and Zen 4 on; Cascade Lake lacks them).
    pub fn vbmi(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            self >= Isa::Avx512 && std::arch::is_x86_feature_detected!("avx512vbmi")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// Every tier this CPU can run, lowest first (tests run each).
    pub fn available() -> Vec<Isa> {
        let best = Isa::detect();
        [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx].into_iter().filter(|i| *i <= best).collect()
    }

    /// Whether the AVX2 kernels may run (true for every tier above scalar on x86-64).
    #[inline]
    pub fn has_avx2(self) -> bool {
        cfg!(target_arch = "x86_64") && self >= Isa::Avx2
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Amx => "amx",
        }
    }
}

impl std::str::FromStr for Isa {
    type Err = String;
    fn from_str(s: &str) -> Result<Isa, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" => Ok(Isa::Scalar),
            "avx2" => Ok(Isa::Avx2),
            "avx512" => Ok(Isa::Avx512),
            "amx" => Ok(Isa::Amx),
            other => Err(format!("unknown ISA tier '{other}' (expected scalar, avx2, avx512 or amx)")),
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
