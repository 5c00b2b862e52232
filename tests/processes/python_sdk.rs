//! The Python SDK (`sdk/python`) against this build of the binary: its
//! standard-library unittest suite, whose integration tests start `shoal
//! dev` and an https agent and drive them through `shoal.Client`, and run
//! jobs that use `shoal.env()` and `shoal.checkpoint` inside Shoal.

use crate::common::{one_at_a_time, shoal_bin};
use std::path::Path;
use std::process::Command;

#[test]
fn the_python_sdk_passes_its_tests_against_this_binary() {
    // Its tests start agents: not beside another test's cluster.
    let _serial = one_at_a_time();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "sdk/python/tests", "-v"])
        .current_dir(&root)
        .env("SHOAL_BIN", shoal_bin())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("SHOAL_API")
        .env_remove("SHOAL_TOKEN")
        .env_remove("SHOAL_CA_FILE")
        .env_remove("SHOAL_CLI_CONFIG")
        .env_remove("SHOAL_DATA_DIR")
        .output()
        .expect("this test cannot run here: python3 is not installed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // unittest reports on stderr.
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the Python SDK's tests failed:\n{report}\n{stdout}"
    );
    assert!(
        !report.contains("skipped"),
        "some of the Python SDK's tests were skipped, SHOAL_BIN notwithstanding:\n{report}"
    );
}
