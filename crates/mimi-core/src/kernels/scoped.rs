//! A thread's role and scratch for the length of one call: [`with_flag`], [`with_scratch`].

/// Runs `f` with the thread-local `flag` set, then restores it (also when `f` panics): a
/// thread's role for the length of a call (`team`'s owner, `conv::tiles`' group of rows).
pub(crate) fn with_flag<R>(
    flag: &'static std::thread::LocalKey<std::cell::Cell<bool>>,
    f: impl FnOnce() -> R,
) -> R {
    struct Restore(&'static std::thread::LocalKey<std::cell::Cell<bool>>, bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            self.0.set(self.1);
        }
    }
    let _restore = Restore(flag, flag.replace(true));
    f()
}

/// Runs `f` on the thread's `scratch`, taken out of its cell for the call and put back after
/// (a buffer kept between calls, so a warm call allocates nothing). A nested call on the same
/// thread, as rayon's work stealing may make, finds the cell empty and uses a fresh one.
pub(crate) fn with_scratch<T: Default, R>(
    scratch: &'static std::thread::LocalKey<std::cell::Cell<T>>,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    let mut s = scratch.take();
    let r = f(&mut s);
    scratch.set(s);
    r
}
