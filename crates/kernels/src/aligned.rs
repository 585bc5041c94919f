//! Buffers on 64-byte boundaries: the AMX kernels load tiles row by row, and a row of 64 bytes
//! that straddles two cache lines costs two loads.

use std::marker::PhantomData;

/// One cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Element types for which all-zero bytes are a valid value.
pub(crate) trait Plain: Copy {}
impl Plain for u16 {}
impl Plain for i8 {}

/// A zero-initialised buffer of `len` values of `T` that starts on a cache line.
#[derive(Clone)]
pub(crate) struct AlignedVec<T: Plain> {
    lines: Vec<Line>,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Plain> AlignedVec<T> {
    /// `len` zeros.
    pub(crate) fn zeroed(len: usize) -> Self {
        let bytes = len * std::mem::size_of::<T>();
        AlignedVec {
            lines: vec![Line([0; 64]); bytes.div_ceil(64)],
            len,
            _t: PhantomData,
        }
    }
}

impl<T: Plain> std::ops::Deref for AlignedVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the lines hold at least `len` values of `T` (a plain type, any bytes of which
        // `zeroed` made valid), aligned to 64 ≥ align_of::<T>().
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const T, self.len) }
    }
}

impl<T: Plain> std::ops::DerefMut for AlignedVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, borrowed uniquely.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut T, self.len) }
    }
}

impl<T: Plain + std::fmt::Debug> std::fmt::Debug for AlignedVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedVec(len {})", self.len)
    }
}

impl<T: Plain + PartialEq> PartialEq for AlignedVec<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}
