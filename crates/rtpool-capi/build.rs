//! Compiles the varargs shim (`csrc/grpc_varargs.c`: `grpc_call`, `grpc_call_async`) into the
//! library; it includes the checked-in header `include/rtpool_grpc.h`.

fn main() {
    println!("cargo:rerun-if-changed=csrc/grpc_varargs.c");
    println!("cargo:rerun-if-changed=../../include/rtpool_grpc.h");
    cc::Build::new()
        .file("csrc/grpc_varargs.c")
        .warnings(true)
        .extra_warnings(true)
        .flag_if_supported("-std=c99")
        .compile("rtpool_grpc_varargs");
}
