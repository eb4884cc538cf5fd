//! Compiles `proto/` with protox (pure Rust, no `protoc`) and generates the
//! tonic client and server code. The encoded descriptor set is written next
//! to the generated code so tests can check the wire contract against the
//! published API.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "proto/norsk/api/common.proto",
    "proto/norsk/api/worker.proto",
    "proto/norsk/api/manager.proto",
    "proto/norsk/sim/admin.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    let encoded = prost::Message::encode_to_vec(&descriptors);
    std::fs::write(out_dir.join("norsk_descriptor.bin"), &encoded)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
