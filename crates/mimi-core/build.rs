//! Tells the tests which of the kernels' instruction sets the build machine has, as cfgs
//! (`mimi_cpu_avx2`, `mimi_cpu_avx512`, `mimi_cpu_avx512bf16`), so a test of a variant this
//! CPU cannot run is reported as ignored rather than passing without running. The kernels
//! themselves choose at run time (`kernels::cpu`); nothing else reads these cfgs.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    for name in ["mimi_cpu_avx2", "mimi_cpu_avx512", "mimi_cpu_avx512bf16"] {
        println!("cargo::rustc-check-cfg=cfg({name})");
    }
    let native = std::env::var("HOST").ok() == std::env::var("TARGET").ok();
    #[cfg(target_arch = "x86_64")]
    if native {
        use std::arch::is_x86_feature_detected as has;
        let avx2 = has!("avx2") && has!("fma");
        let avx512 = avx2 && has!("avx512f");
        let bf16 = avx512 && has!("avx512bf16");
        for (on, name) in [
            (avx2, "mimi_cpu_avx2"),
            (avx512, "mimi_cpu_avx512"),
            (bf16, "mimi_cpu_avx512bf16"),
        ] {
            if on {
                println!("cargo::rustc-cfg={name}");
            }
        }
    }
    let _ = native;
}
