//! Host arrays: C-ordered values with their shape, as a caller without candle holds them
//! (the Python binding's numpy arrays, a Rust user's `Vec`s).

/// C-ordered `data` of shape `shape`.
#[derive(Clone, Debug, PartialEq)]
pub struct HostArray<T> {
    pub data: Vec<T>,
    pub shape: Vec<usize>,
}

impl<T> HostArray<T> {
    pub fn new(data: Vec<T>, shape: Vec<usize>) -> Self {
        debug_assert_eq!(data.len(), shape.iter().product::<usize>());
        Self { data, shape }
    }
}
