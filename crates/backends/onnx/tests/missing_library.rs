//! A missing library names where it looked and how to install one.

use ipfs_accelerate_backend_onnx::{runtime, OnnxError};

#[test]
fn a_missing_library_says_how_to_install_one() {
    std::env::set_var("ORT_DYLIB_PATH", "/nonexistent/libonnxruntime.so.1.31.1");
    let err = runtime().unwrap_err();
    assert!(matches!(err, OnnxError::LibraryNotFound { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("cargo xtask fetch-ort"), "{msg}");
    assert!(
        msg.contains("/nonexistent/libonnxruntime.so.1.31.1"),
        "{msg}"
    );
}
