//! OpenVINO's own device report, read through its C API (`libopenvino_c`, shipped next to the
//! OpenVINO build of ONNX Runtime), so `devices` shows what OpenVINO itself sees.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;

/// What OpenVINO reports about this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenVinoReport {
    /// OpenVINO's build number.
    pub version: String,
    /// Each available device (`CPU`, `GPU.0`, `NPU`, ...) with its `FULL_DEVICE_NAME`.
    pub devices: Vec<(String, String)>,
}

#[repr(C)]
struct AvailableDevices {
    devices: *mut *mut c_char,
    size: usize,
}

#[repr(C)]
struct Version {
    build_number: *const c_char,
    description: *const c_char,
}

type CoreCreate = unsafe extern "C" fn(*mut *mut c_void) -> c_int;
type CoreFree = unsafe extern "C" fn(*mut c_void);
type GetDevices = unsafe extern "C" fn(*const c_void, *mut AvailableDevices) -> c_int;
type FreeDevices = unsafe extern "C" fn(*mut AvailableDevices);
type GetProperty =
    unsafe extern "C" fn(*const c_void, *const c_char, *const c_char, *mut *mut c_char) -> c_int;
type Free = unsafe extern "C" fn(*const c_char);
type GetVersion = unsafe extern "C" fn(*mut Version) -> c_int;
type FreeVersion = unsafe extern "C" fn(*mut Version);

/// Asks OpenVINO (the `libopenvino_c` in the folder of the ONNX Runtime library `ort_library`)
/// for its version and devices.
pub fn openvino_report(ort_library: &Path) -> Result<OpenVinoReport, String> {
    let dir = ort_library
        .parent()
        .ok_or_else(|| format!("{} has no parent folder", ort_library.display()))?;
    let file = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with("libopenvino_c.so")
                    || n == "openvino_c.dll"
                    || n.starts_with("libopenvino_c.")
            })
        })
        .min()
        .ok_or_else(|| format!("no libopenvino_c next to {}", ort_library.display()))?;
    // SAFETY: libopenvino_c's documented C API; every pointer it returns is freed with its own
    // free function, and nothing is used after the library is dropped.
    unsafe {
        let lib =
            libloading::Library::new(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let sym = |name: &[u8]| -> Result<*mut c_void, String> {
            lib.get::<*mut c_void>(name)
                .map(|s| *s)
                .map_err(|e| format!("{}: {e}", String::from_utf8_lossy(name)))
        };
        let core_create: CoreCreate = std::mem::transmute(sym(b"ov_core_create\0")?);
        let core_free: CoreFree = std::mem::transmute(sym(b"ov_core_free\0")?);
        let get_devices: GetDevices = std::mem::transmute(sym(b"ov_core_get_available_devices\0")?);
        let free_devices: FreeDevices = std::mem::transmute(sym(b"ov_available_devices_free\0")?);
        let get_property: GetProperty = std::mem::transmute(sym(b"ov_core_get_property\0")?);
        let free: Free = std::mem::transmute(sym(b"ov_free\0")?);
        let get_version: GetVersion = std::mem::transmute(sym(b"ov_get_openvino_version\0")?);
        let free_version: FreeVersion = std::mem::transmute(sym(b"ov_version_free\0")?);

        let mut v = Version {
            build_number: std::ptr::null(),
            description: std::ptr::null(),
        };
        let version = if get_version(&mut v) == 0 && !v.build_number.is_null() {
            let s = CStr::from_ptr(v.build_number)
                .to_string_lossy()
                .into_owned();
            free_version(&mut v);
            s
        } else {
            "unknown".into()
        };

        let mut core: *mut c_void = std::ptr::null_mut();
        let status = core_create(&mut core);
        if status != 0 || core.is_null() {
            return Err(format!("ov_core_create failed with status {status}"));
        }
        let mut list = AvailableDevices {
            devices: std::ptr::null_mut(),
            size: 0,
        };
        let status = get_devices(core, &mut list);
        if status != 0 {
            core_free(core);
            return Err(format!(
                "ov_core_get_available_devices failed with status {status}"
            ));
        }
        let key = CString::new("FULL_DEVICE_NAME").map_err(|e| e.to_string())?;
        let mut devices = Vec::new();
        for i in 0..list.size {
            let name_ptr = *list.devices.add(i);
            if name_ptr.is_null() {
                continue;
            }
            let name = CStr::from_ptr(name_ptr).to_string_lossy().into_owned();
            let mut value: *mut c_char = std::ptr::null_mut();
            let full = if get_property(core, name_ptr, key.as_ptr(), &mut value) == 0
                && !value.is_null()
            {
                let s = CStr::from_ptr(value).to_string_lossy().into_owned();
                free(value);
                s
            } else {
                String::new()
            };
            devices.push((name, full));
        }
        free_devices(&mut list);
        core_free(core);
        if devices.is_empty() {
            return Err("OpenVINO lists no devices".into());
        }
        Ok(OpenVinoReport { version, devices })
    }
}
