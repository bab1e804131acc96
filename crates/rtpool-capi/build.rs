//! Compiles the varargs shim (`csrc/grpc_varargs.c`: `grpc_call`, `grpc_call_async`) into the
//! library; it includes the checked-in header `include/rtpool_grpc.h`. On x86-64 and aarch64
//! the exported names are naked Rust tail jumps into it (src/varargs.rs, so the `.so` exports
//! them too); elsewhere `RTPOOL_VA_DIRECT` has the shim define them (static library only).

fn main() {
    println!("cargo:rerun-if-changed=csrc/grpc_varargs.c");
    println!("cargo:rerun-if-changed=../../include/rtpool_grpc.h");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let mut build = cc::Build::new();
    if arch != "x86_64" && arch != "aarch64" {
        build.define("RTPOOL_VA_DIRECT", None);
    }
    build
        .file("csrc/grpc_varargs.c")
        .warnings(true)
        .extra_warnings(true)
        .flag_if_supported("-std=c99")
        .compile("rtpool_grpc_varargs");
}
