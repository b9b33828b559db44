//! Generates the gRPC code with `protox` (a pure-Rust protobuf compiler), so building needs no
//! system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/tributary/v1/tributary.proto",
        "proto/tributary/peer/v1/peer.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .bytes(".")
        .compile_fds(descriptors)?;
    Ok(())
}
