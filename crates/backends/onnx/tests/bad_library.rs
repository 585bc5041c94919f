//! A file that is not ONNX Runtime gives a typed error that says what to install, and probing
//! reports the backend unavailable instead of panicking. (Its own test binary: the runtime is
//! loaded once per process.)

use ipfs_accelerate_backend_onnx::{runtime, OnnxBackend, OnnxError};
use ipfs_accelerate_core::{Availability, ExecutionProvider, ProbeBackend};

#[test]
fn a_bad_library_is_a_typed_error_and_an_unavailable_backend() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("libonnxruntime.so.1.99.0");
    std::fs::write(&fake, b"this is not a shared library").unwrap();
    std::env::set_var("ORT_DYLIB_PATH", &fake);
    let err = runtime().unwrap_err();
    assert!(matches!(err, OnnxError::BadLibrary { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("libonnxruntime.so.1.99.0"), "{msg}");
    assert!(msg.contains("onnxruntime"), "{msg}");
    // Remembered: a second call does not touch the library again, and probing never panics.
    assert!(runtime().is_err());
    match OnnxBackend::new(ExecutionProvider::OpenVino).probe() {
        Availability::Unavailable(reason) => assert!(reason.contains("cannot load"), "{reason}"),
        other => panic!("expected unavailable, got {other:?}"),
    }
}
