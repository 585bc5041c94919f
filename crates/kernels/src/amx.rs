//! Intel AMX (Advanced Matrix Extensions): whether this process may use the tiles, their
//! configuration, and the tile instructions as inline assembly (Rust's AMX intrinsics are not
//! stable).
//!
//! AMX adds eight tile registers (`tmm0..tmm7`, up to 16 rows of 64 bytes each) and a matrix unit
//! that multiplies two tiles into a third: `tdpbf16ps` (bf16 pairs, f32 sums) and `tdpbssd`
//! (signed 8-bit quadruples, i32 sums), 16 × 16 outputs × 32 (bf16) or 64 (int8) in-features per
//! instruction. Linux hands the tile state only to a process that asks for it
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`); [`amx_support`] asks once and keeps
//! the answer, so a refusal is reported (and the AVX-512 kernels run) instead of the first tile
//! instruction killing the process.

use std::sync::OnceLock;

/// What this process may use of AMX.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AmxSupport {
    /// The CPU has no AMX tiles.
    Absent,
    /// The CPU has AMX, but it may not be used: the reason (the OS refused the tile state, or
    /// `IPFS_ACCELERATE_NO_AMX` is set).
    Refused(String),
    /// The tiles are usable, with the dot-product instructions the CPU has.
    Ready {
        /// `tdpbf16ps` (AMX-BF16).
        bf16: bool,
        /// `tdpbssd` and its kin (AMX-INT8).
        int8: bool,
    },
}

impl AmxSupport {
    /// Whether `tdpbf16ps` may run (and the AVX-512 BF16 conversions the bf16 kernel rounds its
    /// activations with).
    pub fn bf16(&self) -> bool {
        matches!(self, AmxSupport::Ready { bf16: true, .. })
    }

    /// Whether `tdpbssd` may run.
    pub fn int8(&self) -> bool {
        matches!(self, AmxSupport::Ready { int8: true, .. })
    }

    /// One line for `devices`: `"absent"`, `"refused: <reason>"` or the instruction sets.
    pub fn describe(&self) -> String {
        match self {
            AmxSupport::Absent => "absent".into(),
            AmxSupport::Refused(why) => format!("refused: {why}"),
            AmxSupport::Ready { bf16, int8 } => {
                let sets: Vec<&str> = [(*bf16, "bf16"), (*int8, "int8")]
                    .iter()
                    .filter(|(on, _)| *on)
                    .map(|(_, name)| *name)
                    .collect();
                format!("ready ({})", sets.join(", "))
            }
        }
    }
}

/// Whether this process may use AMX; asks the OS for the tile state the first time.
pub fn amx_support() -> &'static AmxSupport {
    static SUPPORT: OnceLock<AmxSupport> = OnceLock::new();
    SUPPORT.get_or_init(probe)
}

#[cfg(target_arch = "x86_64")]
fn probe() -> AmxSupport {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // CPUID leaf 7, sub-leaf 0, EDX: bit 22 AMX-BF16, bit 24 AMX-TILE, bit 25 AMX-INT8.
    if __cpuid(0).eax < 7 {
        return AmxSupport::Absent;
    }
    let edx = __cpuid_count(7, 0).edx;
    let (bf16, tile, int8) = (edx >> 22 & 1 == 1, edx >> 24 & 1 == 1, edx >> 25 & 1 == 1);
    if !tile || !(bf16 || int8) {
        return AmxSupport::Absent;
    }
    // The kernels convert and finish their tiles with AVX-512.
    let avx512 = std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl");
    if !avx512 {
        return AmxSupport::Absent;
    }
    let bf16 = bf16 && std::arch::is_x86_feature_detected!("avx512bf16");
    if std::env::var_os("IPFS_ACCELERATE_NO_AMX").is_some_and(|v| !v.is_empty() && v != "0") {
        return AmxSupport::Refused("disabled by IPFS_ACCELERATE_NO_AMX".into());
    }
    if let Err(why) = request_tile_state() {
        return AmxSupport::Refused(why);
    }
    // OSXSAVE (CPUID.1:ECX bit 27) makes `xgetbv` legal; XCR0 bits 17 and 18 are the tile
    // configuration and data the OS saves on a context switch.
    if __cpuid(1).ecx >> 27 & 1 == 0 {
        return AmxSupport::Refused("the OS has not enabled XSAVE".into());
    }
    // SAFETY: OSXSAVE is set, so `xgetbv` with ECX = 0 is defined.
    let xcr0 = unsafe { xgetbv0() };
    if xcr0 >> 17 & 3 != 3 {
        return AmxSupport::Refused("the OS does not save the tile state (XCR0)".into());
    }
    AmxSupport::Ready { bf16, int8 }
}

#[cfg(not(target_arch = "x86_64"))]
fn probe() -> AmxSupport {
    AmxSupport::Absent
}

/// XCR0, read with `xgetbv` (the `_xgetbv` intrinsic needs the `xsave` target feature on every
/// caller).
///
/// # Safety
/// The OS has set CR4.OSXSAVE.
#[cfg(target_arch = "x86_64")]
unsafe fn xgetbv0() -> u64 {
    let (lo, hi): (u32, u32);
    std::arch::asm!("xgetbv", in("ecx") 0, out("eax") lo, out("edx") hi, options(nomem, nostack));
    u64::from(hi) << 32 | u64::from(lo)
}

/// Asks Linux for the AMX tile data state (permission for the whole process).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_state() -> Result<(), String> {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes the process's permitted state.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!(
            "Linux refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM: {})",
            std::io::Error::last_os_error()
        ))
    }
}

/// Other systems enable the tile state for every process when they support it (checked through
/// XCR0 by the caller).
#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn request_tile_state() -> Result<(), String> {
    Ok(())
}

/// A tile configuration (`ldtilecfg`'s 64-byte operand, palette 1): rows and bytes per row of
/// each tile register.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(crate) struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    /// Every tile unused.
    pub(crate) const fn new() -> Self {
        TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        }
    }

    /// Tile `tmm` holds `rows` rows of `bytes` bytes (at most 16 and 64).
    pub(crate) const fn tile(mut self, tmm: usize, rows: u8, bytes: u16) -> Self {
        self.rows[tmm] = rows;
        self.colsb[tmm] = bytes;
        self
    }
}

/// The tiles of the calling thread configured as `config` until it is dropped (which zeroes
/// them with `tilerelease`).
#[cfg(target_arch = "x86_64")]
pub(crate) struct TileScope(());

#[cfg(target_arch = "x86_64")]
impl TileScope {
    /// Loads `config`.
    ///
    /// # Safety
    /// [`amx_support`] is `Ready`, and nothing else uses this thread's tiles until the scope
    /// ends.
    pub(crate) unsafe fn enter(config: &TileConfig) -> Self {
        std::arch::asm!("ldtilecfg [{}]", in(reg) config, options(nostack, readonly));
        TileScope(())
    }
}

#[cfg(target_arch = "x86_64")]
impl Drop for TileScope {
    fn drop(&mut self) {
        // SAFETY: a scope exists only after `ldtilecfg` ran on a CPU with AMX.
        unsafe { std::arch::asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// The tile instructions. Each names its tile registers as const parameters.
///
/// # Safety (every function)
/// A [`TileScope`] whose configuration gives the named tiles compatible shapes is live on this
/// thread; loads read and stores write `rows` rows of `bytes` bytes at `ptr + r · stride`.
#[cfg(target_arch = "x86_64")]
pub(crate) mod tile {
    use std::arch::asm;

    /// `tmm[T] = 0`.
    #[inline(always)]
    pub(crate) unsafe fn zero<const T: u8>() {
        asm!("tilezero tmm{t}", t = const T, options(nostack, nomem));
    }

    /// Loads `tmm[T]` from `ptr` with `stride` bytes between rows.
    #[inline(always)]
    pub(crate) unsafe fn load<const T: u8>(ptr: *const u8, stride: usize) {
        asm!(
            "tileloadd tmm{t}, [{p} + {s} * 1]",
            t = const T,
            p = in(reg) ptr,
            s = in(reg) stride,
            options(nostack, readonly)
        );
    }

    /// Stores `tmm[T]` to `ptr` with `stride` bytes between rows.
    #[inline(always)]
    pub(crate) unsafe fn store<const T: u8>(ptr: *mut u8, stride: usize) {
        asm!(
            "tilestored [{p} + {s} * 1], tmm{t}",
            t = const T,
            p = in(reg) ptr,
            s = in(reg) stride,
            options(nostack)
        );
    }

    /// `tmm[C] += tmm[A] · tmm[B]` over bf16 pairs, f32 sums.
    #[inline(always)]
    pub(crate) unsafe fn dpbf16ps<const C: u8, const A: u8, const B: u8>() {
        asm!(
            "tdpbf16ps tmm{c}, tmm{a}, tmm{b}",
            c = const C,
            a = const A,
            b = const B,
            options(nostack, nomem)
        );
    }

    /// `tmm[C] += tmm[A] · tmm[B]` over signed 8-bit quadruples, i32 sums.
    #[inline(always)]
    pub(crate) unsafe fn dpbssd<const C: u8, const A: u8, const B: u8>() {
        asm!(
            "tdpbssd tmm{c}, tmm{a}, tmm{b}",
            c = const C,
            a = const A,
            b = const B,
            options(nostack, nomem)
        );
    }
}
