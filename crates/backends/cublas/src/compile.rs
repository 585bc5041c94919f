//! The engine's kernels from source to loaded modules: the CUDA source of a kernel set, split into
//! parts that NVRTC compiles at once on several threads, straight to the device's machine code
//! (CUBIN: the driver has nothing left to translate), cached on disk by source.
//!
//! On a fresh machine this is most of an engine's first call: one NVRTC program of the decoder's
//! kernels took 1.7 s, and the driver's translation of its PTX another 2.1 s on the lent H100.
//! The entry points are in groups (`IN_GROUP(g)` in kernels.cu and decoder.cu); a part compiles
//! some groups (`KERNEL_GROUPS`, a bit mask) and the helpers they call.

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys, Ptx};

use crate::engine::Elem;
use crate::EngineError;

const KERNELS: &str = include_str!("kernels.cu");
const DECODER_KERNELS: &str = include_str!("decoder.cu");
const GGML_BLOCKS: &str = include_str!("ggml_blocks.cuh");

/// Which of the engine's kernels a module holds: an encoder's (`kernels.cu`) or a decoder's
/// (`decoder.cu` and the products of the ggml block formats a model stores, on `kernels.cu`'s
/// helpers), or both (the host-side tests). A module compiles only what its engine launches: on a
/// fresh machine NVRTC's work on the other set is a second of the first call.
#[derive(Clone, Copy)]
pub(crate) struct KernelSet<'a> {
    /// `kernels.cu`'s entry points (embeddings, row kernels, softmax).
    pub encoder: bool,
    /// `decoder.cu` with the products of these block formats (dense weights always).
    pub decoder: Option<&'a [crate::BlockFormat]>,
}

/// The entry-point groups of `kernels.cu` (0–6: the encoder's; 3, `gather_rows`, serves both).
const ENCODER_GROUPS: [u32; 7] = [0, 1, 2, 3, 4, 5, 6];
/// The groups of `decoder.cu` (with `gather_rows`); a block format adds two (`format_groups`).
const DECODER_GROUPS: [u32; 13] = [3, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18];

/// NVRTC's time for each group to CUBIN for sm_90, in centiseconds (one program of each alone,
/// f16, on a 2-core EPYC; block formats from 19 on): only their ratios matter, to share the
/// groups out evenly when there are fewer threads than groups.
const GROUP_COST: [u32; 35] = [
    27, 75, 96, 5, 49, 37, 53, 23, 48, 19, 32, 59, 53, 73, 73, 67, 67, 106, 68, 95, 65, 94, 71, 79,
    69, 79, 86, 86, 72, 107, 62, 79, 81, 79, 67,
];

/// The two groups of a block format's kernels: its few-row product, then its one-row product with
/// its row reader (`WEIGHT_KERNELS_FEW` / `_ONE` in decoder.cu).
fn format_groups(format: &crate::BlockFormat) -> [u32; 2] {
    let first = 19 + 2 * format.index as u32;
    [first, first + 1]
}

impl KernelSet<'_> {
    /// The encoder engine's kernels.
    pub const ENCODER: KernelSet<'static> = KernelSet {
        encoder: true,
        decoder: None,
    };

    /// The decoder's kernels with the products of `formats`.
    pub fn decoder(formats: &[crate::BlockFormat]) -> KernelSet<'_> {
        KernelSet {
            encoder: false,
            decoder: Some(formats),
        }
    }

    /// The entry-point groups this set compiles, each once, ascending.
    fn groups(&self) -> Vec<u32> {
        let mut groups = Vec::new();
        if self.encoder {
            groups.extend(ENCODER_GROUPS);
        }
        if let Some(formats) = self.decoder {
            groups.extend(DECODER_GROUPS);
            groups.extend(formats.iter().flat_map(format_groups));
        }
        groups.sort_unstable();
        groups.dedup();
        groups
    }
}

/// The CUDA source of the kernels of `set` for storage type `T`: `kernels.cu` (its entry points
/// when `set.encoder`), then for a decoder `decoder.cu` with the products and row read
/// (`gemv_<name>`, `gemv1_<name>`, `dequant_<name>`) of dense weights and of each block format.
/// Every group of the set is in it; [`part_sources`] defines which each part compiles.
pub(crate) fn kernel_source<T: Elem>(set: KernelSet<'_>) -> String {
    let encoder = if set.encoder {
        "#define ENCODER_KERNELS\n"
    } else {
        ""
    };
    let mut source = format!(
        "#define NEG_INF __int_as_float(0xff800000)\n{encoder}{}{KERNELS}\n",
        T::PREFIX
    );
    if let Some(formats) = set.decoder {
        source.push_str(&format!("{GGML_BLOCKS}\n{DECODER_KERNELS}"));
        for f in formats {
            let [few, one] = format_groups(f);
            source.push_str(&format!(
                "#if IN_GROUP({few})\nWEIGHT_KERNELS_FEW({name}, {id})\n#endif\n\
                 #if IN_GROUP({one})\nWEIGHT_KERNELS_ONE({name}, {id})\n#endif\n",
                name = f.name,
                id = f.id
            ));
        }
    }
    source
}

/// `set`'s groups shared out among at most `parts` parts, largest first, each to the part with
/// the least work so far (their costs from [`GROUP_COST`]): each part's group mask.
fn share_groups(set: KernelSet<'_>, parts: usize) -> Vec<u64> {
    let mut groups = set.groups();
    let cost = |g: u32| GROUP_COST.get(g as usize).copied().unwrap_or(100);
    groups.sort_by_key(|&g| std::cmp::Reverse(cost(g)));
    let mut masks = vec![(0u32, 0u64); parts.clamp(1, groups.len().max(1))];
    for g in groups {
        let lightest = masks
            .iter_mut()
            .min_by_key(|(work, _)| *work)
            .expect("at least one part");
        lightest.0 += cost(g);
        lightest.1 |= 1u64 << g;
    }
    masks.into_iter().map(|(_, mask)| mask).collect()
}

/// The sources of `set`'s parts for `parts` threads: the whole source, each with its own
/// `KERNEL_GROUPS`.
pub(crate) fn part_sources<T: Elem>(set: KernelSet<'_>, parts: usize) -> Vec<String> {
    let source = kernel_source::<T>(set);
    share_groups(set, parts)
        .into_iter()
        .map(|mask| format!("#define KERNEL_GROUPS {mask:#x}ull\n{source}"))
        .collect()
}

/// The loaded parts of a kernel set.
pub(crate) struct KernelModule {
    parts: Vec<Arc<CudaModule>>,
}

impl KernelModule {
    /// The entry point `name`, from whichever part holds it.
    pub(crate) fn load_function(&self, name: &str) -> Result<CudaFunction, EngineError> {
        let mut last = None;
        for part in &self.parts {
            match part.load_function(name) {
                Ok(f) => return Ok(f),
                Err(e) => last = Some(e),
            }
        }
        Err(match last {
            Some(e) => EngineError::Compile(format!("no kernel {name} in the compiled parts: {e}")),
            None => EngineError::Compile(format!("no kernel {name}: nothing compiled")),
        })
    }
}

/// Environment variable capping the threads (and so the parts) NVRTC compiles a kernel set in:
/// `1` compiles each set as one program, as before parts.
pub const COMPILE_THREADS_ENV: &str = "IPFS_ACCELERATE_CUDA_COMPILE_THREADS";

/// Threads for NVRTC: the machine's parallelism, at most 16, or [`COMPILE_THREADS_ENV`]'s number.
fn compile_threads() -> usize {
    let machine = std::thread::available_parallelism().map_or(1, |n| n.get().min(16));
    std::env::var(COMPILE_THREADS_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(machine)
}

/// The compute capability of device `ordinal` as NVRTC names its machine code (`sm_90`), read
/// without a context (so compiling can start before the context exists).
fn device_arch(ordinal: usize) -> Result<String, EngineError> {
    use cudarc::driver::{result, sys::CUdevice_attribute as A};
    result::init()?;
    let device = result::device::get(ordinal as i32)?;
    // SAFETY: `device` is a valid handle from cuDeviceGet; the attributes are plain integers.
    let (major, minor) = unsafe {
        (
            result::device::get_attribute(device, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            result::device::get_attribute(device, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        )
    };
    Ok(format!("sm_{major}{minor}"))
}

/// A kernel set compiling on its own threads (one per part, each read from the disk cache when
/// compiled before) while the engine opens its context and uploads its weights.
pub(crate) struct PendingKernels {
    compiling: std::thread::JoinHandle<Result<Vec<Vec<u8>>, EngineError>>,
}

/// Starts compiling the kernels of `set` for `T` to machine code for device `ordinal`.
pub(crate) fn start_compile<T: Elem>(
    ordinal: usize,
    set: KernelSet<'_>,
) -> Result<PendingKernels, EngineError> {
    let arch = device_arch(ordinal)?;
    let sources = part_sources::<T>(set, compile_threads());
    let what = format!(
        "compiled its kernels for {arch} (NVRTC, {} parts at once)",
        sources.len()
    );
    let cache = kernel_cache_dir();
    let compiling = std::thread::Builder::new()
        .name("nvrtc".into())
        .spawn(move || {
            let clock = Instant::now();
            let images = std::thread::scope(|scope| {
                let parts: Vec<_> = sources
                    .iter()
                    .map(|source| scope.spawn(|| compile_cached(cache.as_deref(), source, &arch)))
                    .collect();
                parts
                    .into_iter()
                    .map(|part| {
                        part.join().unwrap_or_else(|_| {
                            Err(EngineError::Compile("an NVRTC thread panicked".into()))
                        })
                    })
                    .collect()
            });
            slow_step(&what, clock);
            images
        })
        .map_err(|e| EngineError::Compile(format!("no thread for NVRTC: {e}")))?;
    Ok(PendingKernels { compiling })
}

impl PendingKernels {
    /// Waits for the parts and loads them on `ctx`.
    pub(crate) fn load(self, ctx: &Arc<CudaContext>) -> Result<KernelModule, EngineError> {
        let images = self
            .compiling
            .join()
            .map_err(|_| EngineError::Compile("the NVRTC thread panicked".into()))??;
        let clock = Instant::now();
        let parts = images
            .into_iter()
            .map(|image| Ok(ctx.load_module(Ptx::from_binary(image))?))
            .collect::<Result<Vec<_>, EngineError>>()?;
        slow_step("loaded the kernels into the driver", clock);
        Ok(KernelModule { parts })
    }
}

/// A progress line on stderr for a step that took more than a second (kernel compiles on a
/// fresh machine), so a slow first call says where its time went.
pub(crate) fn slow_step(what: &str, clock: Instant) {
    let took = clock.elapsed();
    if took.as_secs_f64() > 1.0 {
        eprintln!("cuBLAS engine: {what} in {:.1} s", took.as_secs_f64());
    }
}

/// Environment variable naming the kernel cache directory (shared with the CubeCL backends).
pub const KERNEL_CACHE_ENV: &str = "IPFS_ACCELERATE_KERNEL_CACHE";

/// Where the engine keeps what NVRTC made: `cublas/` under `$IPFS_ACCELERATE_KERNEL_CACHE`, or
/// under `ipfs-accelerate/kernels` in the user's cache directory; `None` without either.
fn kernel_cache_dir() -> Option<PathBuf> {
    let root = match std::env::var_os(KERNEL_CACHE_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => dirs::cache_dir()?.join("ipfs-accelerate").join("kernels"),
    };
    Some(root.join("cublas"))
}

/// The machine code (CUBIN) of `source` for `arch` (`sm_90`): read from `cache` when this NVRTC
/// compiled the same source for the same architecture before, else compiled and stored there
/// (a process start then skips NVRTC). The file name holds a 64-bit FNV-1a hash of the source, its
/// length, the architecture and NVRTC's version; a file that is not an ELF image is compiled
/// again and replaced, and a cache that cannot be written is skipped.
pub(crate) fn compile_cached(
    cache: Option<&Path>,
    source: &str,
    arch: &str,
) -> Result<Vec<u8>, EngineError> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two integers; a failure leaves them 0 (still a valid key).
    let _ = unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) };
    let hash = source.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let file = cache.map(|dir| {
        dir.join(format!(
            "{hash:016x}-{}-{arch}-nvrtc{major}.{minor}.cubin",
            source.len()
        ))
    });
    if let Some(image) = file.as_ref().and_then(|f| std::fs::read(f).ok()) {
        if image.starts_with(b"\x7fELF") {
            return Ok(image);
        }
    }
    let image = nvrtc_cubin(source, arch)?;
    if let Some(file) = file {
        // Written whole, then renamed: a concurrent process never reads half a file.
        let tmp = file.with_extension(format!(
            "{}.{:?}.tmp",
            std::process::id(),
            std::thread::current().id()
        ));
        let stored = file
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&tmp, &image))
            .and_then(|()| std::fs::rename(&tmp, &file));
        if let Err(e) = stored {
            let _ = std::fs::remove_file(&tmp);
            tracing::debug!(
                "cuBLAS engine: kernel cache {} not written: {e}",
                file.display()
            );
        }
    }
    Ok(image)
}

/// NVRTC's CUBIN of `source` for `arch`, or its log as the error.
fn nvrtc_cubin(source: &str, arch: &str) -> Result<Vec<u8>, EngineError> {
    let failed = |what: &str, e: nvrtc::NvrtcError| EngineError::Compile(format!("{what}: {e:?}"));
    let text = CString::new(source)
        .map_err(|_| EngineError::Compile("the kernel source holds a NUL byte".into()))?;
    /// Destroys the program however the compile ends.
    struct Program(nvrtc_sys::nvrtcProgram);
    impl Drop for Program {
        fn drop(&mut self) {
            // SAFETY: the program was created by create_program and is destroyed once.
            let _ = unsafe { nvrtc::destroy_program(self.0) };
        }
    }
    let program = Program(nvrtc::create_program(&text, None).map_err(|e| failed("create", e))?);
    let options = [format!("--gpu-architecture={arch}")];
    // SAFETY: the program is live; the options are valid C strings once converted.
    if let Err(e) = unsafe { nvrtc::compile_program(program.0, &options) } {
        // SAFETY: the program is live; the log is NUL-terminated.
        let log = unsafe { nvrtc::get_program_log(program.0) }
            .map(|raw| {
                unsafe { CStr::from_ptr(raw.as_ptr()) }
                    .to_string_lossy()
                    .into_owned()
            })
            .unwrap_or_default();
        return Err(EngineError::Compile(format!("{e:?}: {log}")));
    }
    let mut size = 0usize;
    // SAFETY: the program compiled; NVRTC writes the image's size, then that many bytes.
    unsafe { nvrtc_sys::nvrtcGetCUBINSize(program.0, &mut size) }
        .result()
        .map_err(|e| failed("CUBIN size", e))?;
    let mut image = vec![0u8; size];
    // SAFETY: `image` holds the `size` bytes NVRTC reported.
    unsafe { nvrtc_sys::nvrtcGetCUBIN(program.0, image.as_mut_ptr().cast()) }
        .result()
        .map_err(|e| failed("CUBIN", e))?;
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BLOCK_FORMATS;

    /// Whether NVRTC loads on this machine.
    fn nvrtc_found() -> bool {
        // SAFETY: loading the library runs its initialisers only.
        cudarc::get_lib_name_candidates("nvrtc")
            .iter()
            .any(|n| unsafe { libloading::Library::new(n) }.is_ok())
    }

    /// Skips (says so) where NVRTC does not load, unless `IPFS_ACCELERATE_REQUIRE_NVRTC=1`.
    fn skip_without_nvrtc(test: &str) -> bool {
        if nvrtc_found() {
            return false;
        }
        assert!(
            std::env::var("IPFS_ACCELERATE_REQUIRE_NVRTC").as_deref() != Ok("1"),
            "NVRTC not found on the library path (IPFS_ACCELERATE_REQUIRE_NVRTC=1)"
        );
        eprintln!("skipped {test}: NVRTC is not on the library path");
        true
    }

    /// The entry points of a module's PTX.
    fn entries(ptx: &str) -> Vec<String> {
        ptx.lines()
            .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
            .map(|l| l.split('(').next().unwrap_or(l).to_string())
            .collect()
    }

    /// The kernels compile with NVRTC (for Hopper) in both storage types and any number of
    /// parts, on any machine where NVRTC loads (no device needed): each entry point the engines
    /// load is in exactly one part, and a set holds none of the other set's.
    #[test]
    fn kernels_compile_with_nvrtc_in_parts() {
        if skip_without_nvrtc("kernels_compile_with_nvrtc_in_parts") {
            return;
        }
        let compile = |source: &String| {
            let options = cudarc::nvrtc::CompileOptions {
                options: vec!["--gpu-architecture=compute_90".into()],
                ..Default::default()
            };
            cudarc::nvrtc::compile_ptx_with_opts(source, options)
                .map(|ptx| entries(&ptx.to_src()))
                .unwrap_or_else(|e| panic!("{e:?}"))
        };
        // The entry points the engines load from a set: the encoder's as `Kernels::compile`
        // names them, the decoder's with the products and row reader of dense weights and of
        // each of the set's block formats.
        let expected = |set: KernelSet<'_>| -> Vec<String> {
            let mut names = Vec::new();
            if set.encoder {
                names.extend(crate::engine::ENCODER_KERNEL_NAMES.map(String::from));
            }
            if let Some(formats) = set.decoder {
                names.extend(crate::decoder::DECODER_KERNEL_NAMES.map(String::from));
                for n in std::iter::once("dense").chain(formats.iter().map(|f| f.name)) {
                    names.extend([
                        format!("gemv_{n}"),
                        format!("gemv1_{n}"),
                        format!("dequant_{n}"),
                    ]);
                }
            }
            names.sort();
            names.dedup();
            names
        };
        let q4k = [BLOCK_FORMATS[5]];
        for (set, lacks, parts) in [
            (KernelSet::ENCODER, "gemv1_dense", 3),
            (KernelSet::decoder(&BLOCK_FORMATS), "masked_softmax", 1),
            (KernelSet::decoder(&BLOCK_FORMATS), "masked_softmax", 7),
            (KernelSet::decoder(&q4k), "gemv_q8_0", 40),
        ] {
            for (sources, ty) in [
                (part_sources::<f32>(set, parts), "f32"),
                (part_sources::<half::f16>(set, parts), "f16"),
            ] {
                let compiled: Vec<Vec<String>> = sources.iter().map(compile).collect();
                assert!(
                    compiled.iter().all(|e| !e.is_empty()),
                    "{ty}: an empty part"
                );
                let all: Vec<&String> = compiled.iter().flatten().collect();
                for name in expected(set) {
                    let n = all.iter().filter(|e| ***e == name).count();
                    assert_eq!(n, 1, "{ty}, {parts} parts: {name} in {n} parts");
                }
                assert!(!all.iter().any(|e| *e == lacks), "{ty}: {lacks}");
            }
        }
    }

    /// Parts are at most as many as asked and as groups, every group in exactly one, shared so
    /// no part holds much more than the largest group beyond an even share.
    #[test]
    fn groups_are_shared_out_evenly() {
        for set in [
            KernelSet::ENCODER,
            KernelSet::decoder(&[]),
            KernelSet::decoder(&BLOCK_FORMATS),
        ] {
            let groups = set.groups();
            let whole: u64 = groups.iter().map(|g| 1u64 << g).sum();
            let cost = |mask: u64| -> u32 {
                groups
                    .iter()
                    .filter(|&&g| mask >> g & 1 == 1)
                    .map(|&g| GROUP_COST[g as usize])
                    .sum()
            };
            for parts in [0, 1, 2, 3, 4, 8, 16, 64] {
                let masks = share_groups(set, parts);
                assert_eq!(masks.len(), parts.clamp(1, groups.len()));
                assert_eq!(masks.iter().fold(0, |a, m| a | m), whole);
                assert_eq!(
                    masks.iter().map(|m| m.count_ones()).sum::<u32>() as usize,
                    groups.len()
                );
                let largest = groups
                    .iter()
                    .map(|&g| GROUP_COST[g as usize])
                    .max()
                    .unwrap();
                let even = cost(whole) / masks.len() as u32;
                assert!(masks.iter().all(|&m| cost(m) <= even + largest), "{parts}");
            }
        }
    }

    /// The second compile of a source reads the cached image (no NVRTC), a changed source gets
    /// its own file, and a damaged file is compiled again and replaced.
    #[test]
    fn compiled_kernels_are_cached_by_source() {
        if skip_without_nvrtc("compiled_kernels_are_cached_by_source") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let source = "extern \"C\" __global__ void twice(float* x) { x[threadIdx.x] *= 2.f; }";
        let first = compile_cached(Some(dir.path()), source, "sm_90").unwrap();
        assert!(first.starts_with(b"\x7fELF"), "a CUBIN");
        let files = || {
            let mut f: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            f.sort();
            f
        };
        assert_eq!(files().len(), 1);
        // The file is what the next compile returns (marked, to tell it from a recompile).
        let mut marked = first.clone();
        marked.extend_from_slice(b"from the cache");
        std::fs::write(&files()[0], &marked).unwrap();
        assert_eq!(
            compile_cached(Some(dir.path()), source, "sm_90").unwrap(),
            marked
        );
        let other = source.replace("2.f", "3.f");
        compile_cached(Some(dir.path()), &other, "sm_90").unwrap();
        assert_eq!(files().len(), 2);
        std::fs::write(&files()[0], "not a cubin").unwrap();
        std::fs::write(&files()[1], "not a cubin").unwrap();
        let repaired = compile_cached(Some(dir.path()), source, "sm_90").unwrap();
        assert_eq!(repaired, first);
        assert!(files().iter().any(|f| std::fs::read(f).unwrap() == first));
        // No cache: compiled every time, nothing written.
        assert!(compile_cached(None, source, "sm_90").is_ok());
        // A compile error carries NVRTC's log.
        let broken = compile_cached(None, "extern \"C\" __global__ void f() { nope; }", "sm_90");
        let message = broken.unwrap_err().to_string();
        assert!(message.contains("nope"), "{message}");
    }
}
