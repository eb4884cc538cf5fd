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
    revision();
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

/// `NORSK_REVISION`, the commit the binary is built from: the variable of
/// that name when set (an image build without `.git` passes it), else
/// `git rev-parse HEAD`, else `unknown`. Rebuilt when HEAD moves.
fn revision() {
    println!("cargo:rerun-if-env-changed=NORSK_REVISION");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    };
    // A path that does not exist would re-run this script on every build.
    let watch = |file: Option<String>| {
        if let Some(file) = file.filter(|f| std::path::Path::new(f).exists()) {
            println!("cargo:rerun-if-changed={file}");
        }
    };
    let revision = std::env::var("NORSK_REVISION")
        .ok()
        .filter(|r| !r.is_empty())
        .or_else(|| {
            // The files whose change moves HEAD: HEAD itself and the branch it names.
            for path in ["HEAD", "refs/heads"] {
                watch(git(&["rev-parse", "--git-path", path]));
            }
            if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
                watch(git(&["rev-parse", "--git-path", &branch]));
            }
            git(&["rev-parse", "HEAD"])
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=NORSK_REVISION={revision}");
}
