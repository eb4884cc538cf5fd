//! `norsk-auto-manager demo` runs its whole script against the in-process
//! simulator and exits 0, its timeline showing each rule at work.

use std::process::Command;

#[test]
fn demo_runs_its_script_and_exits_zero() {
    let output = Command::new(env!("CARGO_BIN_EXE_norsk-auto-manager"))
        .args(["demo", "--time-scale", "1000"])
        .output()
        .expect("demo runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "demo failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    for expected in [
        // The examples: the backup of the cross-cloud channel in OCI, the GPU
        // job on a provisioned GPU shape.
        "default/ch1/1/encode on new VM.Standard.E4.Flex",
        "studio/gpu-transcode/0/transcode on new g4dn.xlarge",
        "recovered    demo/ch",
        "(on-demand)",
        "BROKEN       demo/crashy: restart ceiling reached",
        "BROKEN       demo/badspec: unknown codec h266",
        "== Metrics",
    ] {
        assert!(stdout.contains(expected), "{expected:?} missing from:\n{stdout}");
    }
}
