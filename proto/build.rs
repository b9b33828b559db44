//! Generates the gRPC code with `protox` (a pure-Rust protobuf compiler), so building needs no
//! system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = "proto/tributary/v1/tributary.proto";
    println!("cargo:rerun-if-changed={file}");
    let descriptors = protox::compile([file], ["proto"])?;
    tonic_prost_build::configure()
        .bytes(".")
        .compile_fds(descriptors)?;
    Ok(())
}
